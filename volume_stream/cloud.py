"""Cloud volumes: `s3://` fed by SQS, `oss://` fed by MNS (DESIGN §6).

The notification classes say where a volume's events arrive; the backends build the
connectors' listers, readers and listeners from a volume's spec. Options that are not
volume-stream's own (endpoint, region, profile, credentials) go to the connector; credentials
are used in this process only and never written to the catalog.

    cat.create_volume("raw", "s3://bucket/raw/",
                      notification=SqsNotification("https://sqs.../raw-events"))
    cat.create_volume("img", "oss://bucket/img/", endpoint="https://oss-cn-hangzhou.aliyuncs.com",
                      notification=MnsNotification("https://123.mns.cn-hangzhou.aliyuncs.com",
                                                   "img-events"))
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from connectors.base import Listener, Lister, ObjectReader
from volume_stream.errors import ConfigError
from volume_stream.volumes import (
    SECRET_OPTION_KEYS,
    Backend,
    VolumeSpec,
    register_backend,
    register_notification,
)

__all__ = ["MnsNotification", "SqsNotification"]

#: volume options volume-stream itself reads; everything else goes to the connector
OWN_OPTIONS = frozenset({"include", "exclude", "data_retention_days", "spark_diff_threshold"})


class _Notification:
    """A queue a volume's events arrive on: where, plus connector options."""

    type = ""

    def __init__(self, **options: Any):
        self.options = dict(options)

    def to_dict(self) -> dict[str, Any]:
        """The persisted form: no secrets, no credential ids."""
        kept = {k: v for k, v in self.options.items() if k not in SECRET_OPTION_KEYS}
        return {"type": self.type, **self._where(), **kept}

    def _where(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict() \
            and other.options == self.options

    def __repr__(self) -> str:
        shown = {k: ("***" if k in SECRET_OPTION_KEYS else v) for k, v in self.options.items()}
        return f"{type(self).__name__}({self._where()}, options={shown})"


class SqsNotification(_Notification):
    """S3 event notifications delivered to an SQS queue (raw, SNS- or EventBridge-wrapped).

    Args:
        queue_url: The queue's URL.
        **options: `SqsListener` options (max_workers, wait_time_seconds, visibility_timeout)
            and boto3 client options (endpoint_url, region_name, profile_name, credentials);
            by default boto3's standard configuration chain.
    """

    type = "AWS_SQS"

    def __init__(self, queue_url: str, **options: Any):
        super().__init__(**options)
        self.queue_url = queue_url

    def _where(self) -> dict[str, Any]:
        return {"queue_url": self.queue_url}


class MnsNotification(_Notification):
    """OSS event notifications delivered to an MNS queue.

    Args:
        endpoint: The MNS endpoint, e.g. "https://1234.mns.cn-hangzhou.aliyuncs.com".
        queue_name: The queue.
        **options: `MnsListener` options (wait_seconds, batch_size, max_workers) and
            credentials (else ALIBABA_CLOUD_ACCESS_KEY_ID / _SECRET / _SECURITY_TOKEN).
    """

    type = "ALICLOUD_MNS"

    def __init__(self, endpoint: str, queue_name: str, **options: Any):
        super().__init__(**options)
        self.endpoint, self.queue_name = endpoint, queue_name

    def _where(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "queue_name": self.queue_name}


register_notification(SqsNotification.type, SqsNotification)
register_notification(MnsNotification.type, MnsNotification)


def _bucket_prefix(spec: VolumeSpec) -> tuple[str, str]:
    url = urlparse(spec.location)
    return url.netloc, url.path.lstrip("/")


def _connector_options(spec: VolumeSpec) -> dict[str, Any]:
    return {k: v for k, v in spec.options.items() if k not in OWN_OPTIONS}


def _expect(spec: VolumeSpec, notification: Any, cls: type) -> Any:
    if notification is None:
        raise ConfigError(f"volume {spec.name!r} has no notification queue to watch; pass "
                          f"notification={cls.__name__}(...) to create_volume, or use refresh")
    if not isinstance(notification, cls):
        raise ConfigError(f"volume {spec.name!r} is on {spec.scheme}://; its notification must "
                          f"be {cls.type}, not {getattr(notification, 'type', notification)!r}")
    return notification


# ---------------------------------------------------------------------------- S3 + SQS
def _s3_lister(spec: VolumeSpec) -> Lister:
    from connectors.s3 import S3Lister

    bucket, prefix = _bucket_prefix(spec)
    return S3Lister(bucket, prefix, recursive=spec.recursive, **_connector_options(spec))


def _s3_reader(spec: VolumeSpec) -> ObjectReader:
    from connectors.s3 import S3Reader

    bucket, prefix = _bucket_prefix(spec)
    return S3Reader(bucket, prefix, **_connector_options(spec))


def _sqs_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.sqs import SqsListener

    note = _expect(spec, notification, SqsNotification)
    bucket, prefix = _bucket_prefix(spec)
    options = {**_connector_options(spec), **note.options}
    return SqsListener(note.queue_url, bucket=bucket, prefix=prefix, recursive=spec.recursive,
                       **options)


# ---------------------------------------------------------------------------- OSS + MNS
_OSS_ACCESS = ("access_key_id", "access_key_secret", "security_token")


def _oss_options(spec: VolumeSpec) -> dict[str, Any]:
    options = _connector_options(spec)
    if "endpoint" not in options:
        raise ConfigError(f"volume {spec.name!r} on oss:// needs the OSS endpoint option, e.g. "
                          f"endpoint='https://oss-cn-hangzhou.aliyuncs.com'")
    return options


def _oss_lister(spec: VolumeSpec) -> Lister:
    from connectors.oss import OssLister

    bucket, prefix = _bucket_prefix(spec)
    return OssLister(bucket, prefix, recursive=spec.recursive, **_oss_options(spec))


def _oss_reader(spec: VolumeSpec) -> ObjectReader:
    from connectors.oss import OssReader

    bucket, prefix = _bucket_prefix(spec)
    return OssReader(bucket, prefix, **_oss_options(spec))


def _mns_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.mns import MnsListener

    note = _expect(spec, notification, MnsNotification)
    bucket, prefix = _bucket_prefix(spec)
    # the volume's credentials serve the queue too, unless the notification has its own
    creds = {k: v for k, v in spec.options.items() if k in _OSS_ACCESS}
    return MnsListener(note.endpoint, note.queue_name, bucket=bucket, prefix=prefix,
                       recursive=spec.recursive, **{**creds, **note.options})


register_backend("s3", Backend(_s3_lister, _s3_reader, _sqs_listener))
register_backend("oss", Backend(_oss_lister, _oss_reader, _mns_listener))
