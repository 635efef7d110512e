"""Backends: how to list, read and listen to the volumes of one URL scheme (DESIGN §2, §6).

`file://` is served by the local connector, `s3://` by S3 + SQS, `oss://` by OSS + MNS, `gs://`
by GCS + Pub/Sub and `abfss://` / `az://` by Azure Blob Storage + a Storage Queue Event Grid
writes to. Each backend builds the connector's lister (for refresh), reader (for pipelines) and
listener (for watch) from a volume's spec. Options that are not volume-stream's own (`OWN_OPTIONS`: endpoint,
region, profile, credentials...) go to the connector.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from connectors.protocols import Listener, Lister, ObjectReader
from volume_stream.errors import ConfigError, InvalidInputError
from volume_stream.volumes.notifications import (
    AzureQueueNotification,
    LocalNotification,
    MnsNotification,
    PubSubNotification,
    SqsNotification,
)
from volume_stream.volumes.spec import VolumeSpec

__all__ = ["BACKENDS", "OWN_OPTIONS", "Backend", "backend_for", "check_options",
           "normalize_location"]

#: volume options volume-stream itself reads; everything else goes to the connector
OWN_OPTIONS = frozenset({"include", "exclude", "data_retention_days", "spark_diff_threshold",
                         "list_workers", "deletion_vectors"})


@dataclass(frozen=True)
class Backend:
    """How to list, read and listen to volumes of one URL scheme.

    `options` returns the connector options its lister and reader take (besides
    `OWN_OPTIONS`); `create_volume` refuses any other (`check_options`).
    """

    lister: Callable[[VolumeSpec], Lister]
    reader: Callable[[VolumeSpec], ObjectReader]
    listener: Callable[[VolumeSpec, Any], Listener]
    options: Callable[[], frozenset[str]] = frozenset


def _local_path(spec: VolumeSpec) -> str:
    return unquote(urlparse(spec.location).path)


def _local_lister(spec: VolumeSpec) -> Lister:
    from connectors.local import LocalLister

    return LocalLister(_local_path(spec), recursive=spec.recursive,
                       hash_content=_content_hash(spec), workers=_list_workers(spec, 1))


def _list_workers(spec: VolumeSpec, default: int) -> int:
    """`list_workers`: threads of a refresh's listing. Object stores default to 8 (each call
    waits on the network); local folders to 1: on a local disk with a warm cache a serial
    walk is the fastest (measured: threads only contend for the GIL), on a network or cold
    disk more help."""
    value = spec.options.get("list_workers", default)
    try:
        workers = int(value)
    except (TypeError, ValueError):
        workers = 0
    if workers < 1 or str(workers) != str(value).strip():
        # raised inside `converted(f"volume {name!r}")`, which names the volume
        raise InvalidInputError(f"list_workers must be an integer >= 1, not {value!r}")
    return workers


def _local_reader(spec: VolumeSpec) -> ObjectReader:
    from connectors.local import LocalReader

    return LocalReader(_local_path(spec))


def _local_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.local import LocalListener

    note = notification or LocalNotification()
    if not isinstance(note, LocalNotification):
        raise ConfigError(f"volume {spec.name!r} is local; its notification must be LOCAL, "
                          f"not {getattr(note, 'type', note)!r}")
    return LocalListener(_local_path(spec), recursive=spec.recursive, debounce_s=note.debounce_s,
                         polling=note.polling or None, poll_interval_s=note.poll_interval_s,
                         hash_content=_content_hash(spec))


def _content_hash(spec: VolumeSpec) -> bool:
    """`content_hash=True`: a local volume's ETags hash the bytes (DESIGN §2), not mtime+size."""
    value = spec.options.get("content_hash", False)
    if not isinstance(value, bool):
        if str(value).lower() not in ("true", "false"):
            raise InvalidInputError(f"volume {spec.name!r}: content_hash must be true or false, "
                                    f"not {value!r}")
        value = str(value).lower() == "true"
    return value




def check_options(spec: VolumeSpec) -> None:
    """Refuse options nobody reads (a misspelled `exlude=` would be stored and ignored),
    naming the known ones and the closest matches."""
    known = OWN_OPTIONS | backend_for(spec).options()
    unknown = sorted(set(spec.options) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:  # `recursive` is an argument of its own, so also a candidate
        close = difflib.get_close_matches(name, sorted(known | {"recursive"}), n=2)
        hints.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)"
                                    if close else ""))
    raise InvalidInputError(f"volume {spec.name!r}: unknown option(s) {', '.join(hints)}; "
                            f"known options for {spec.scheme}:// volumes: "
                            f"{', '.join(sorted(known))} (and the argument recursive)")


def register_backend(scheme: str, backend: Backend) -> None:
    BACKENDS[scheme] = backend


def backend_for(spec: VolumeSpec) -> Backend:
    try:
        return BACKENDS[spec.scheme]
    except KeyError:
        raise ConfigError(f"volume {spec.name!r}: no backend for {spec.scheme}:// "
                          f"(known: {sorted(BACKENDS)})") from None


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


# ------------------------------------------------------------------ object stores
def _store_connectors(module: str, lister: str, reader: str,
                      options: Callable[[VolumeSpec], dict[str, Any]],
                      ) -> tuple[Callable[[VolumeSpec], Lister], Callable[[VolumeSpec], ObjectReader]]:
    """The lister and reader factories of an object store whose connector classes take
    `(bucket, prefix, **options)` (`connectors.aws.store`, `connectors.alicloud.store`),
    imported on first use."""

    def cls(name: str) -> type:
        return getattr(importlib.import_module(module), name)

    def make_lister(spec: VolumeSpec) -> Lister:
        bucket, prefix = _bucket_prefix(spec)
        return cls(lister)(bucket, prefix, recursive=spec.recursive,
                           list_workers=_list_workers(spec, 8), **options(spec))

    def make_reader(spec: VolumeSpec) -> ObjectReader:
        bucket, prefix = _bucket_prefix(spec)
        return cls(reader)(bucket, prefix, **options(spec))

    return make_lister, make_reader


# ---------------------------------------------------------------------------- S3 + SQS
def _s3_options() -> frozenset[str]:
    from connectors.aws.client import ClientOptions

    return frozenset({f.name for f in dataclasses.fields(ClientOptions)})


def _sqs_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.aws.listener import SqsListener

    note = _expect(spec, notification, SqsNotification)
    bucket, prefix = _bucket_prefix(spec)
    options = {**_connector_options(spec), **note.options}
    return SqsListener(note.queue_url, bucket=bucket, prefix=prefix, recursive=spec.recursive,
                       **options)


# ---------------------------------------------------------------------------- OSS + MNS
_OSS_ACCESS = ("access_key_id", "access_key_secret", "security_token")
#: a RAM role the OSS reader, lister and MNS listener assume (`connectors.alicloud.sts`)
_OSS_ROLE = ("role_arn", "role_session_name", "role_duration_seconds", "role_refresh_seconds",
             "sts_endpoint")


def _oss_options(spec: VolumeSpec) -> dict[str, Any]:
    options = _connector_options(spec)
    if "endpoint" not in options:
        raise ConfigError(f"volume {spec.name!r} on oss:// needs the OSS endpoint option, e.g. "
                          f"endpoint='https://oss-cn-hangzhou.aliyuncs.com'")
    return options


_s3_lister, _s3_reader = _store_connectors("connectors.aws.store", "S3Lister", "S3Reader",
                                          _connector_options)
_oss_lister, _oss_reader = _store_connectors("connectors.alicloud.store", "OssLister",
                                            "OssReader", _oss_options)


def _oss_known() -> frozenset[str]:
    return frozenset({"endpoint", "connect_timeout", "is_path_style", *_OSS_ACCESS, *_OSS_ROLE})


def _mns_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.alicloud.listener import MnsListener

    note = _expect(spec, notification, MnsNotification)
    bucket, prefix = _bucket_prefix(spec)
    # the volume's credentials serve the queue too, unless the notification has its own
    creds = {k: v for k, v in spec.options.items() if k in (*_OSS_ACCESS, *_OSS_ROLE)}
    return MnsListener(note.endpoint, note.queue_name, bucket=bucket, prefix=prefix,
                       recursive=spec.recursive, **{**creds, **note.options})


# ---------------------------------------------------------------------- GCS + Pub/Sub
_gcs_lister, _gcs_reader = _store_connectors("connectors.gcp.store", "GcsLister", "GcsReader",
                                            _connector_options)


def _gcs_options() -> frozenset[str]:
    from connectors.gcp.client import GcpOptions

    return frozenset({f.name for f in dataclasses.fields(GcpOptions)})


def _pubsub_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.gcp.listener import PubSubListener

    note = _expect(spec, notification, PubSubNotification)
    bucket, prefix = _bucket_prefix(spec)
    # the volume's client options (project, credentials, emulators) serve Pub/Sub too
    return PubSubListener(note.subscription, bucket=bucket, prefix=prefix,
                          recursive=spec.recursive, **{**_connector_options(spec), **note.options})


# ------------------------------------------------- Azure Blob / ADLS Gen2 + Storage Queue
def _azure_where(spec: VolumeSpec) -> tuple[str, str, dict[str, Any]]:
    """(container, prefix, scope keywords) of `abfss://container@account.dfs.<suffix>/prefix/`
    or `az://container/prefix/` (whose account comes from the options or the environment)."""
    url = urlparse(spec.location)
    prefix = url.path.lstrip("/")
    if url.scheme == "az":
        return url.netloc, prefix, {"account": spec.options.get("account_name")}
    container, at, host = url.netloc.partition("@")
    account, _, suffix = host.partition(".")
    if not (at and container and account and suffix.startswith("dfs.")):
        raise InvalidInputError(f"volume {spec.name!r}: an abfss:// location is "
                                f"abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/prefix/, not "
                                f"{spec.location!r}")
    return container, prefix, {"account": account, "url_scheme": "abfss", "dfs_suffix": suffix}


def _azure_options(spec: VolumeSpec) -> dict[str, Any]:
    return {k: v for k, v in _connector_options(spec).items() if k != "account_name"}


def _azure_lister(spec: VolumeSpec) -> Lister:
    from connectors.azure.store import AzureLister

    container, prefix, where = _azure_where(spec)
    return AzureLister(container, prefix, recursive=spec.recursive, account=where["account"],
                       list_workers=_list_workers(spec, 8), **_azure_options(spec))


def _azure_reader(spec: VolumeSpec) -> ObjectReader:
    from connectors.azure.store import AzureReader

    container, prefix, where = _azure_where(spec)
    return AzureReader(container, prefix, account=where["account"], **_azure_options(spec))


def _azure_listener(spec: VolumeSpec, notification: Any) -> Listener:
    from connectors.azure.listener import AzureQueueListener

    note = _expect(spec, notification, AzureQueueNotification)
    container, prefix, where = _azure_where(spec)
    # the volume's endpoints and credentials serve the queue too, unless the notification
    # names its own (a queue in another account)
    options = {**_azure_options(spec), **note.options}
    return AzureQueueListener(note.queue_name, container=container, prefix=prefix,
                              recursive=spec.recursive, account=where["account"], **options)


def _azure_known() -> frozenset[str]:
    from connectors.azure.client import AzureOptions

    return frozenset({f.name for f in dataclasses.fields(AzureOptions)})


_AZURE = Backend(_azure_lister, _azure_reader, _azure_listener, _azure_known)

BACKENDS: dict[str, Backend] = {
    "file": Backend(_local_lister, _local_reader, _local_listener,
                    lambda: frozenset({"content_hash"})),
    "s3": Backend(_s3_lister, _s3_reader, _sqs_listener, _s3_options),
    "oss": Backend(_oss_lister, _oss_reader, _mns_listener, _oss_known),
    "gs": Backend(_gcs_lister, _gcs_reader, _pubsub_listener, _gcs_options),
    "abfss": _AZURE,
    "az": _AZURE,
}


def normalize_location(location: str | os.PathLike) -> str:
    """A canonical URL with a trailing '/': 'file:///abs/dir/', 's3://b/p/', 'oss://b/p/'."""
    text = os.fspath(location)
    parsed = urlparse(text)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else text).expanduser()
        path = path.resolve()
        if not path.exists():
            raise InvalidInputError(f"location {text!r} does not exist")
        if not path.is_dir():
            raise InvalidInputError(f"location {text!r} is not a folder")
        if not os.access(path, os.R_OK | os.X_OK):
            raise InvalidInputError(f"location {text!r} is not readable")
        return f"file://{path.as_posix().rstrip('/')}/"
    if parsed.scheme in BACKENDS:
        if not parsed.netloc:
            raise InvalidInputError(f"location {text!r} has no bucket")
        prefix = parsed.path.lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return f"{parsed.scheme}://{parsed.netloc}/{prefix}"
    raise InvalidInputError(
        f"location {text!r}: unsupported scheme {parsed.scheme!r}; supported: a local path, "
        f"{', '.join(s + '://' for s in sorted(BACKENDS))}")


