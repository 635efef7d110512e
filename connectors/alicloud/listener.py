"""Alibaba Cloud MNS listener for OSS event notifications (DESIGN §6).

`MnsListener` is a `connectors._queue.QueueListener` on aliyun-mns-sdk: the base drains (one
long poll, then parallel short polls on `volume-stream-mns-*` threads that stop at half the
queue's visibility timeout), dedupes, filters by scope, maps events to handles and retries
acks; this module supplies the SDK calls, the pure parser (`connectors.alicloud.events`) and
the ordering hook: within one `Received`, events are sorted by (event_time refined by MNS
EnqueueTime, EnqueueTime, arrival), so the caller's "same time -> arrival order" rule follows
the order OSS published in. Each worker thread has its own SDK client (the SDK's HTTP
connection is not thread-safe). Handles are `MnsHandle` objects whose receipt handle `extend`
updates in place, because ChangeMessageVisibility issues a new one.

    with MnsListener(endpoint, "q", bucket="bkt", prefix="in/") as listener:
        batch = listener.receive(timeout=20)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar

from mns.account import Account
from mns.mns_exception import MNSServerException

from connectors._objects import RETRY
from connectors._queue import QueueListener
from connectors.alicloud.client import AliCloudOptions, translate_mns_errors
from connectors.alicloud.events import ParsedMessage, _tie_break, parse_message, to_file_event
from connectors.alicloud.store import OssScope
from connectors.alicloud.sts import AliRole
from connectors.errors import ConnectorError, is_transient
from connectors.events import FileEvent

__all__ = ["MnsHandle", "MnsListener"]

logger = logging.getLogger("connectors.mns")

_MAX_MESSAGES = 16  # MNS limit per BatchReceive / BatchDelete
_STALE_CODES = frozenset({"MessageNotExist", "ReceiptHandleError"})


class MnsHandle:
    """The acknowledgement handle of one received message.

    Mutable on purpose: MNS invalidates a receipt handle when ChangeMessageVisibility issues a
    new one, so `MnsListener.extend` stores the new handle here and the caller's `Received`
    stays valid. `stale` is set when MNS said the handle no longer holds the message (its
    visibility ran out and it may be redelivered). Compared by identity.
    """

    __slots__ = ("dequeue_count", "enqueue_time", "message_id", "receipt_handle", "stale")

    def __init__(self, message_id: str, receipt_handle: str, dequeue_count: int = 1,
                 enqueue_time: int = 0) -> None:
        self.message_id, self.receipt_handle = message_id, receipt_handle
        self.dequeue_count, self.enqueue_time = dequeue_count, enqueue_time
        self.stale = False

    def __repr__(self) -> str:
        return f"MnsHandle({self.message_id!r}, dequeue_count={self.dequeue_count})"


def _receipt(handle: Any) -> str:
    return handle.receipt_handle if isinstance(handle, MnsHandle) else str(handle)


class MnsListener(QueueListener):
    """Receive the OSS events of one volume from an MNS queue (`Listener` protocol).

    Args:
        endpoint: The MNS account endpoint, "https://<account>.mns.<region>.aliyuncs.com".
        queue_name: The queue OSS notifies.
        bucket: The volume's bucket; events of other buckets are ignored (and acked).
        prefix: The volume's key prefix; events outside it are ignored (and acked).
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only keys ending with this (or one of these).
        access_key_id, access_key_secret, security_token: Explicit credentials; by default
            ALIBABA_CLOUD_ACCESS_KEY_ID / _SECRET / _SECURITY_TOKEN.
        role_arn, role_session_name, role_duration_seconds, role_refresh_seconds, sts_endpoint:
            A RAM role to assume with those credentials (`connectors.alicloud.sts.AliRole`).
        wait_seconds: Long-poll wait of the first call (0..30, bounded by `timeout`).
        batch_size: Messages per BatchReceiveMessage call (1..16).
        max_workers: Parallel short polls while draining a backlog.
        max_batch_messages: Stop draining once this many messages are received.

    Raises:
        CredentialsError: no credentials were given or found in the environment.
    """

    max_messages = _MAX_MESSAGES
    thread_prefix = "volume-stream-mns"
    extra_counters = ("events_skipped",)
    log: ClassVar[logging.Logger] = logger
    parse_message = staticmethod(parse_message)
    to_file_event = staticmethod(to_file_event)
    _delete_action = "BatchDeleteMessage"
    _extend_action = "ChangeMessageVisibility"

    def __init__(self, endpoint: str, queue_name: str, *, bucket: str, prefix: str = "",
                 recursive: bool = True, suffix: str | tuple[str, ...] | None = None,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, wait_seconds: int = 20,
                 batch_size: int = _MAX_MESSAGES, max_workers: int = 4,
                 max_batch_messages: int = 1000, **role: Any) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https://: {endpoint!r}")
        if not 0 <= wait_seconds <= 30:
            raise ValueError(f"wait_seconds must be in 0..30: {wait_seconds}")
        if not 1 <= batch_size <= _MAX_MESSAGES:
            raise ValueError(f"batch_size must be in 1..16: {batch_size}")
        self._setup(OssScope(bucket, prefix, recursive, suffix), batch_size=batch_size,
                    wait_seconds=wait_seconds, max_workers=max_workers,
                    max_batch_messages=max_batch_messages)
        self.endpoint, self.queue_name = endpoint.rstrip("/"), queue_name
        self.name = f"MNS queue {queue_name}"
        self._options = AliCloudOptions(access_key_id, access_key_secret, security_token)
        #: a RAM role to assume through STS; its credentials (refreshed before expiry) sign
        #: the MNS requests (`security-token` header)
        self._role = AliRole.of(self._options, **role)
        self._credentials = self._options.credentials()  # fail fast
        if self._role is not None:
            self._role.credentials()  # fail fast: the role must be assumable
        self._local = threading.local()
        self._accounts: list[Account] = []

    def __repr__(self) -> str:
        return (f"MnsListener({self.endpoint!r}, {self.queue_name!r}, {self.scope!r}, "
                f"{self._options!r})")

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep the messages invisible for `seconds` more (ChangeMessageVisibility each).

        Each `MnsHandle` gets the new receipt handle MNS returns. `seconds=0` gives a message
        back as soon as MNS allows (1 s, its minimum). A stale handle is logged and marked.
        """
        if not all(isinstance(h, MnsHandle) for h in handles):
            raise TypeError("extend needs the MnsHandle objects from receive()")
        super().extend(handles, seconds)

    def backlog(self) -> int:
        """Messages waiting on the queue (its ActiveMessages attribute), for metrics.

        Raises:
            ConnectorError: the attributes cannot be read (e.g. no mns:GetQueueAttributes).
        """
        attributes = self._attributes()
        with warnings.catch_warnings():
            # aliyun-mns-sdk 1.3 marks ActiveMessages deprecated but offers no replacement yet
            warnings.simplefilter("ignore", DeprecationWarning)
            return int(attributes.active_messages)

    def _read_visibility(self) -> int:
        return int(self._attributes().visibility_timeout)

    def _attributes(self) -> Any:
        with translate_mns_errors(f"GetQueueAttributes {self.queue_name}"), \
                warnings.catch_warnings():
            # aliyun-mns-sdk 1.3 marks ActiveMessages deprecated but offers no replacement yet
            warnings.simplefilter("ignore", DeprecationWarning)
            return RETRY(lambda: self._queue().get_attributes())()

    def _queue(self, *, receiving: bool = True) -> Any:
        """This thread's SDK queue client (one HTTP connection each; raw, undecoded bodies).

        Receiving refuses once closed (which also stops retries of calls cut off by `close`);
        acks and visibility changes still work after `close`, as the base promises.
        """
        if receiving:
            self._check_open()
        creds = self._role.credentials() if self._role is not None else self._credentials
        queue = getattr(self._local, "queue", None)
        if queue is None or getattr(self._local, "key", None) != creds.access_key_id:
            account = Account(self.endpoint, creds.access_key_id, creds.access_key_secret,
                              creds.security_token or "")
            with self._lock:
                if receiving:
                    self._check_open()
                self._accounts.append(account)
            old = getattr(self._local, "account", None)
            if old is not None:  # the role's credentials were refreshed: drop the old client
                with self._lock:
                    if old in self._accounts:
                        self._accounts.remove(old)
                old.mns_client.close_connection()
            queue = account.get_queue(self.queue_name)
            queue.set_encoding(False)  # we decode base64 ourselves, tolerating plain JSON
            self._local.queue, self._local.key = queue, creds.access_key_id
            self._local.account = account
        return queue

    # -- QueueListener hooks ------------------------------------------------------------------
    def _receive_call(self, count: int, wait: int) -> list[Any]:
        def call() -> list[Any]:
            try:
                return self._queue().batch_receive_message(count, wait_seconds=wait)
            except MNSServerException as exc:
                if exc.type == "MessageNotExist":  # the queue is empty
                    return []
                raise

        with translate_mns_errors(f"BatchReceiveMessage {self.queue_name}"):
            return RETRY(call)()

    def _message_id(self, raw: Any) -> str:
        return raw.message_id

    def _handle(self, raw: Any) -> MnsHandle:
        return MnsHandle(raw.message_id, raw.receipt_handle, raw.dequeue_count, raw.enqueue_time)

    def _body(self, raw: Any) -> Any:
        return raw.message_body

    def _receive_count(self, raw: Any) -> int:
        return raw.dequeue_count

    def _count(self, parsed: ParsedMessage, info: dict[str, int]) -> None:
        info["events_skipped"] += parsed.skipped

    def _order(self, found: list[tuple[Any, FileEvent]]) -> list[FileEvent]:
        refined = [(_tie_break(event, raw.enqueue_time), raw.enqueue_time, index)
                   for index, (raw, event) in enumerate(found)]
        refined.sort(key=lambda item: (item[0].event_time, item[1], item[2]))
        return [event for event, _, _ in refined]

    def _wait_out(self, started: float, timeout: float) -> None:
        # MNS waits whole seconds: wait out a fraction rather than spin
        bound = min(self.wait_seconds, max(0.0, timeout))
        self._closed.wait(max(0.0, bound - (time.monotonic() - started)))

    def _close_connections(self) -> None:
        with self._lock:
            accounts, self._accounts = self._accounts, []
        for account in accounts:
            account.mns_client.close_connection()

    def _delete(self, chunk: list[Any]) -> list[Any]:
        """One BatchDeleteMessage; returns the handles still failing for a retryable reason."""
        by_receipt = {_receipt(h): h for h in chunk}
        with translate_mns_errors(f"BatchDeleteMessage {self.queue_name}"):
            try:
                self._queue(receiving=False).batch_delete_message(sorted(by_receipt))
                return []
            except MNSServerException as exc:
                if not exc.sub_errors:
                    if exc.type not in _STALE_CODES:
                        raise
                    # a whole-request answer for one handle
                    self.log.warning("BatchDeleteMessage on %s: %s", self.queue_name, exc.type)
                    return []
                failed = {e.get("ReceiptHandle"): e for e in exc.sub_errors}
        pending = []  # the others were deleted
        for receipt, error in failed.items():
            if error.get("ErrorCode") in _STALE_CODES:
                self.log.warning("BatchDeleteMessage on %s: handle no longer valid (%s); the "
                                 "message will be redelivered", self.queue_name,
                                 error.get("ErrorCode"))
            elif receipt in by_receipt:
                pending.append(by_receipt[receipt])
        return pending

    def _change_visibility(self, chunk: list[MnsHandle], seconds: int) -> list[MnsHandle]:
        """ChangeMessageVisibility for each handle; returns those failing transiently."""
        pending = []
        queue = self._queue(receiving=False)
        for handle in chunk:
            try:
                with translate_mns_errors(f"ChangeMessageVisibility {self.queue_name}"):
                    try:
                        handle.receipt_handle = queue.change_message_visibility(
                            handle.receipt_handle, max(1, seconds)).receipt_handle
                    except MNSServerException as exc:
                        if exc.type not in _STALE_CODES:
                            raise
                        handle.stale = True
                        self.log.warning("ChangeMessageVisibility on %s: message %s no longer "
                                         "held (%s)", self.queue_name, handle.message_id,
                                         exc.type)
            except ConnectorError as exc:
                if not is_transient(exc):
                    raise
                pending.append(handle)
        return pending
