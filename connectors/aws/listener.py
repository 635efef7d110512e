"""Amazon SQS listener for S3 event notifications (DESIGN §6).

`SqsListener` is a `connectors._queue.QueueListener`: the base drains, dedupes, filters by
scope, maps events to handles and retries acks; this module supplies the boto3 calls and the
pure parser (`connectors.aws.events.parse_message`). Unparseable messages are logged with their
MessageId, counted and left on the queue for its redrive policy. The boto3 calls it makes are
ReceiveMessage, DeleteMessageBatch, ChangeMessageVisibilityBatch and GetQueueAttributes
(`backlog`, and the queue's visibility timeout): deploy/aws/listener-policy.json grants exactly
those.
Use it like any listener: receive, commit the events, then `ack(batch.handles)`.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from connectors._queue import QueueListener
from connectors.aws.client import ClientOptions, region_from_queue_url, translate_errors
from connectors.aws.events import ParsedMessage, parse_message, to_file_event
from connectors.aws.store import S3Scope

__all__ = ["SqsListener"]

logger = logging.getLogger("connectors.sqs")


class SqsListener(QueueListener):
    """Receive the S3 events of one volume from an SQS queue (`Listener` protocol).

    Args:
        queue_url: The queue's URL.
        bucket: The volume's bucket; events of other buckets are ignored.
        prefix: The volume's key prefix; events outside it are ignored.
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only keys ending with this (or one of these).
        max_workers: Parallel ReceiveMessage calls while draining a backlog.
        wait_time_seconds: Long-poll wait of the first call (at most 20, bounded by timeout).
        visibility_timeout: VisibilityTimeout for received messages; None keeps the queue's.
        max_batch_messages: Stop draining once this many messages are received.
        **client_options: `ClientOptions` fields (endpoint_url, region_name, credentials...).

    Example:
        >>> with SqsListener(url, bucket="bkt", prefix="in/") as listener:  # doctest: +SKIP
        ...     batch = listener.receive(timeout=5)
    """

    max_messages = 10  # SQS limit per ReceiveMessage / *Batch call
    thread_prefix = "volume-stream-sqs"
    extra_counters = ("test_events",)
    log: ClassVar[logging.Logger] = logger
    parse_message = staticmethod(parse_message)
    to_file_event = staticmethod(to_file_event)

    def __init__(self, queue_url: str, *, bucket: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, max_workers: int = 4,
                 wait_time_seconds: int = 20, visibility_timeout: int | None = None,
                 max_batch_messages: int = 1000, **client_options: Any) -> None:
        if not 0 <= wait_time_seconds <= 20:
            raise ValueError(f"wait_time_seconds must be in 0..20: {wait_time_seconds}")
        self._setup(S3Scope(bucket, prefix, recursive, suffix), batch_size=self.max_messages,
                    wait_seconds=wait_time_seconds, max_workers=max_workers,
                    max_batch_messages=max_batch_messages, visibility_timeout=visibility_timeout)
        self.queue_url = self.name = queue_url
        self.wait_time_seconds = wait_time_seconds
        client_options.setdefault("max_pool_connections", max_workers + 2)
        self._options = ClientOptions.of(**client_options)
        with translate_errors("sqs", "configure client", self._options):
            session = self._options.session()
            if not self._options.region_name and not session.region_name:
                region = region_from_queue_url(queue_url)
                if region:
                    self._options = self._options.replace(region_name=region)
                    session = None
        self._client = self._options.client("sqs", session=session)

    def __repr__(self) -> str:
        return f"SqsListener({self.queue_url!r}, {self.scope!r}, {self._options!r})"

    def backlog(self) -> int:
        """Messages waiting on the queue (its ApproximateNumberOfMessages), for metrics.

        Raises:
            ConnectorError: the attributes cannot be read (e.g. no sqs:GetQueueAttributes).
        """
        return int(self._attribute("ApproximateNumberOfMessages", 0))

    def _read_visibility(self) -> int:
        return int(self._attribute("VisibilityTimeout", self.default_visibility))

    def _attribute(self, name: str, default: Any) -> Any:
        with translate_errors("sqs", f"GetQueueAttributes {self.queue_url}", self._options):
            attributes = self._client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=[name]).get("Attributes", {})
        return attributes.get(name, default)

    # -- QueueListener hooks ------------------------------------------------------------------
    def _receive_call(self, count: int, wait: int) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "QueueUrl": self.queue_url, "MaxNumberOfMessages": count, "WaitTimeSeconds": wait,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if self.visibility_timeout is not None:
            kwargs["VisibilityTimeout"] = self.visibility_timeout
        with translate_errors("sqs", f"ReceiveMessage {self.queue_url}", self._options):
            return self._client.receive_message(**kwargs).get("Messages", [])

    def _message_id(self, raw: dict[str, Any]) -> str | None:
        return raw.get("MessageId")

    def _handle(self, raw: dict[str, Any]) -> str:
        return raw["ReceiptHandle"]

    def _body(self, raw: dict[str, Any]) -> Any:
        return raw.get("Body")

    def _receive_count(self, raw: dict[str, Any]) -> Any:
        return raw.get("Attributes", {}).get("ApproximateReceiveCount")

    def _count(self, parsed: ParsedMessage, info: dict[str, int]) -> None:
        info["test_events"] += parsed.is_test_event

    def _delete(self, chunk: list[str]) -> list[str]:
        return self._batch_call("DeleteMessageBatch", chunk, {})

    def _change_visibility(self, chunk: list[str], seconds: int) -> list[str]:
        return self._batch_call("ChangeMessageVisibilityBatch", chunk,
                                {"VisibilityTimeout": seconds})

    def _batch_call(self, action: str, chunk: list[str], extra: dict[str, Any]) -> list[str]:
        """One *Batch call; returns the handles failing on the service side (worth a retry);
        handles SQS rejects as invalid or expired are logged and dropped."""
        call = (self._client.delete_message_batch if action == "DeleteMessageBatch"
                else self._client.change_message_visibility_batch)
        pending = {str(i): handle for i, handle in enumerate(chunk)}
        entries = [{"Id": i, "ReceiptHandle": h, **extra} for i, h in pending.items()]
        with translate_errors("sqs", f"{action} {self.queue_url}", self._options):
            response = call(QueueUrl=self.queue_url, Entries=entries)
        for ok in response.get("Successful", []):
            pending.pop(ok["Id"], None)
        for failed in response.get("Failed", []):
            if failed.get("SenderFault"):  # invalid or expired handle: retrying won't help
                self.log.warning("%s on %s: entry rejected: %s %s", action, self.queue_url,
                                 failed.get("Code"), failed.get("Message"))
                pending.pop(failed["Id"], None)
        return list(pending.values())
