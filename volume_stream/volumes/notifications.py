"""Notifications: where a volume's file events arrive (DESIGN §2, §6).

`LocalNotification` watches a local folder; `SqsNotification` (S3 events on an SQS queue),
`MnsNotification` (OSS events on an MNS queue), `PubSubNotification` (GCS events on a Pub/Sub
subscription) and `AzureQueueNotification` (Azure Blob events Event Grid writes to a Storage
Queue) name a queue plus connector options. Secrets given to them are used in this process only:
`to_dict`, the persisted form, drops them.

    cat.create_volume("raw", "s3://bucket/raw/",
                      notification=SqsNotification("https://sqs.../raw-events"))
    cat.create_volume("img", "oss://bucket/img/", endpoint="https://oss-cn-hangzhou.aliyuncs.com",
                      notification=MnsNotification("https://123.mns.cn-hangzhou.aliyuncs.com",
                                                   "img-events"))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from connectors.secrets import hide, is_secret
from volume_stream.errors import ConfigError, InvalidInputError

__all__ = ["BY_SCHEME", "AzureQueueNotification", "LocalNotification", "MnsNotification",
           "PubSubNotification", "SqsNotification", "notification_for",
           "notification_from_dict", "notification_types"]


@dataclass(frozen=True)
class LocalNotification:
    """Watch a local folder with inotify (watchdog); `polling=True` forces the stat-polling
    fallback (network file systems, containers without inotify). A closed file is reported
    at once; `debounce_s` is the quiet time asked of a path in a burst of writes (closed again
    within `debounce_s`) and of events that do not prove a file complete (`LocalListener`)."""

    polling: bool = False
    debounce_s: float = 0.2
    poll_interval_s: float = 1.0
    type: str = field(default="LOCAL", init=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Notification:
    """A queue a volume's events arrive on: where, plus connector options."""

    type = ""

    def __init__(self, **options: Any):
        self.options = hide(options)

    def to_dict(self) -> dict[str, Any]:
        """The persisted form: no secrets, no credential ids."""
        kept = {k: v for k, v in self.options.items() if not is_secret(k)}
        return {"type": self.type, **self._where(), **kept}

    def _where(self) -> dict[str, Any]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict() \
            and other.options == self.options

    def __repr__(self) -> str:
        shown = {k: ("***" if is_secret(k) else v) for k, v in self.options.items()}
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


class PubSubNotification(_Notification):
    """GCS object notifications (a bucket's notification config, `JSON_API_V1` payload)
    delivered to a Pub/Sub subscription.

    Args:
        subscription: "projects/PROJECT/subscriptions/NAME".
        **options: `PubSubListener` options (max_workers, wait_time_seconds,
            visibility_timeout, batch_size) and client options (project, credentials_file,
            pubsub_endpoint for an emulator); by default Application Default Credentials.
    """

    type = "GCP_PUBSUB"

    def __init__(self, subscription: str, **options: Any):
        super().__init__(**options)
        self.subscription = subscription

    def _where(self) -> dict[str, Any]:
        return {"subscription": self.subscription}


class AzureQueueNotification(_Notification):
    """Azure Blob Storage events (Event Grid `BlobCreated` / `BlobDeleted`, Event Grid or
    CloudEvents schema) delivered to a Storage Queue.

    Args:
        queue_name: The queue the Event Grid subscription delivers to.
        **options: `AzureQueueListener` options (wait_seconds, poll_interval_s,
            visibility_timeout, max_dequeue_count, poison_queue, queue_account...) and client
            options (queue_endpoint, connection_string, account_key, sas_token,
            use_emulator...); by default the volume's, then AZURE_STORAGE_CONNECTION_STRING,
            then DefaultAzureCredential.
    """

    type = "AZURE_STORAGE_QUEUE"

    def __init__(self, queue_name: str, **options: Any):
        if not queue_name or not isinstance(queue_name, str):
            raise InvalidInputError(f"AzureQueueNotification needs a queue name, not "
                                    f"{queue_name!r}")
        unknown = sorted(set(options) - azure_queue_options())
        if unknown:
            raise InvalidInputError(f"unknown AzureQueueNotification option(s) {unknown}; "
                                    f"known: {sorted(azure_queue_options())}")
        super().__init__(**options)
        self.queue_name = queue_name

    def _where(self) -> dict[str, Any]:
        return {"queue_name": self.queue_name}


def azure_queue_options() -> frozenset[str]:
    """What an `AzureQueueNotification` may pass on: the listener's keyword parameters and the
    Azure client options (imported when first asked: the Azure SDK is not loaded before)."""
    import dataclasses
    import inspect

    from connectors.azure.client import AzureOptions
    from connectors.azure.listener import AzureQueueListener

    params = inspect.signature(AzureQueueListener.__init__).parameters.values()
    named = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    return frozenset(named - {"container", "prefix", "recursive", "suffix", "account"}
                     | {f.name for f in dataclasses.fields(AzureOptions)})


NOTIFICATIONS: dict[str, type] = {
    LocalNotification.type: LocalNotification,
    SqsNotification.type: SqsNotification,
    MnsNotification.type: MnsNotification,
    PubSubNotification.type: PubSubNotification,
    AzureQueueNotification.type: AzureQueueNotification,
}


#: the notification a queue's address alone makes, by volume scheme (`volume create
#: --notification`): an SQS queue URL, a Pub/Sub subscription, a Storage Queue's name
BY_SCHEME: dict[str, type] = {"s3": SqsNotification, "gs": PubSubNotification,
                              "abfss": AzureQueueNotification, "az": AzureQueueNotification}


def notification_for(scheme: str, queue: str) -> Any:
    """The notification of a `scheme://` volume whose events arrive on `queue` (its address).

    Raises:
        ConfigError: the scheme's queues need more than an address (or it has none).
    """
    cls = BY_SCHEME.get(scheme)
    if cls is None:
        known = ", ".join(f"{name}://" for name in sorted(BY_SCHEME))
        raise ConfigError(f"--notification takes the queue of {known} volumes; a {scheme}:// "
                          "volume's is given as the notification's keys (type=...,KEY=VALUE) "
                          "or set in the daemon's configuration, SQL or Python")
    return cls(queue)


def notification_types() -> dict[str, type]:
    """Every notification type by name."""
    return dict(NOTIFICATIONS)


def notification_from_dict(data: dict[str, Any] | None):
    """The notification a stored spec describes (None when it has none)."""
    if not data:
        return None
    data = dict(data)
    kind = data.pop("type")
    cls = NOTIFICATIONS.get(kind)
    if cls is None:
        raise ConfigError(f"unknown notification type {kind!r}; known: {sorted(NOTIFICATIONS)}")
    return cls(**data)
