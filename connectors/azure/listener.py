"""Azure Storage Queue listener for Event Grid blob events (DESIGN §6).

`AzureQueueListener` is a `connectors._queue.QueueListener` on azure-storage-queue: the base
drains (a first receive, then parallel receives on `volume-stream-azq-*` threads while a
backlog lasts), dedupes, filters by scope, maps events to handles and retries acks; this module
supplies the SDK calls, the pure parser (`connectors.azure.events`) and what a Storage Queue
lacks:

* **no long poll**: a receive returns at once, so an empty queue is polled again every
  `poll_interval_s` (first sooner: 50 ms, doubling) until the wait is over;
* **no redrive policy**: a message received more than `max_dequeue_count` times (its
  `dequeue_count`, default 5 as Azure Functions') is copied to the poison queue
  (`<queue>-poison` unless named) and deleted, whether it was malformed or its events kept
  failing; 0 turns this off;
* **no batch calls**: acks delete message by message, visibility changes update each message;
  `update_message` issues a new pop receipt, kept in the mutable `AzureHandle`.

ADLS Gen2 renames and directory deletes in the volume's scope set `needs_refresh` (their
events do not say which files moved with what size).

    with AzureQueueListener("events", container="c", prefix="in/", account="acct") as listener:
        batch = listener.receive(timeout=20)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

from connectors._queue import QueueListener, _Item
from connectors.azure.client import AzureOptions, error_code, translate_errors
from connectors.azure.events import ParsedMessage, parse_message, to_file_event
from connectors.azure.store import AzureScope
from connectors.errors import ConnectorError, is_transient
from connectors.protocols import Received

__all__ = ["AzureHandle", "AzureQueueListener"]

logger = logging.getLogger("connectors.azure_queue")

_MAX_MESSAGES = 32  # Storage Queue limit per Get Messages
#: a pop receipt that no longer holds its message (it became visible and was received again)
_STALE_CODES = frozenset({"MessageNotFound", "PopReceiptMismatch"})


class AzureHandle:
    """The acknowledgement handle of one received message; `pop_receipt` is updated in place
    by `extend` (Update Message issues a new one). Compared by identity."""

    __slots__ = ("dequeue_count", "message_id", "pop_receipt", "stale")

    def __init__(self, message_id: str, pop_receipt: str, dequeue_count: int = 1) -> None:
        self.message_id, self.pop_receipt = message_id, pop_receipt
        self.dequeue_count = dequeue_count
        self.stale = False

    def __repr__(self) -> str:
        return f"AzureHandle({self.message_id!r}, dequeue_count={self.dequeue_count})"


class AzureQueueListener(QueueListener):
    """Receive the blob events of one volume from a Storage Queue (`Listener` protocol).

    Args:
        queue_name: The queue Event Grid delivers to.
        container: The volume's container; events of other containers are ignored (acked).
        prefix: The volume's prefix; events outside it are ignored (and acked).
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only names ending with this (or one of these).
        account: The volume's storage account: events of other accounts are ignored. The
            queue's account is `queue_account` (else this one).
        queue_account: The storage account holding the queue, when not the volume's.
        wait_seconds: How long a receive polls an empty queue (bounded by its timeout).
        poll_interval_s: The longest pause between two polls of an empty queue.
        visibility_timeout: Seconds received messages stay invisible (the service's 30 s
            when None).
        max_dequeue_count: Receives after which a message goes to the poison queue (0: never).
        poison_queue: Its name (default `<queue_name>-poison`; created when first needed).
        max_workers: Parallel receives while draining a backlog.
        max_batch_messages: Stop draining once this many messages are received.
        **client_options: `AzureOptions` fields (queue_endpoint, credentials...).
    """

    max_messages = _MAX_MESSAGES
    thread_prefix = "volume-stream-azq"
    extra_counters = ("events_skipped", "refresh_events", "poisoned")
    log: ClassVar[logging.Logger] = logger
    parse_message = staticmethod(parse_message)
    to_file_event = staticmethod(to_file_event)
    _delete_action = "DeleteMessage"
    _extend_action = "UpdateMessage"

    def __init__(self, queue_name: str, *, container: str, prefix: str = "",
                 recursive: bool = True, suffix: str | tuple[str, ...] | None = None,
                 account: str | None = None, queue_account: str | None = None,
                 wait_seconds: int = 20, poll_interval_s: float = 1.0,
                 visibility_timeout: int | None = None, max_dequeue_count: int = 5,
                 poison_queue: str | None = None, max_workers: int = 4,
                 max_batch_messages: int = 1000, **client_options: Any) -> None:
        if not 0 <= wait_seconds <= 60:
            raise ValueError(f"wait_seconds must be in 0..60: {wait_seconds}")
        if poll_interval_s <= 0 or max_dequeue_count < 0:
            raise ValueError("poll_interval_s must be > 0 and max_dequeue_count >= 0")
        self._setup(AzureScope(container, prefix, recursive, suffix, account=account),
                    batch_size=_MAX_MESSAGES, wait_seconds=wait_seconds, max_workers=max_workers,
                    max_batch_messages=max_batch_messages, visibility_timeout=visibility_timeout)
        self.queue_name = queue_name
        self.name = f"Azure queue {queue_name}"
        self.poll_interval_s, self.max_dequeue_count = poll_interval_s, max_dequeue_count
        self.poison_queue = poison_queue or f"{queue_name}-poison"
        options = dict(client_options)
        if (queue_account or account) and not options.get("account_name"):
            options["account_name"] = queue_account or account
        self._options = AzureOptions.of(**options).with_environment()
        from azure.storage.queue import QueueClient

        with translate_errors("queue", f"create client for {queue_name}", self._options):
            endpoint, credential = self._options.endpoint("queue"), self._options.credential()
            kwargs = self._options.client_kwargs()
            self._client = QueueClient(endpoint, queue_name, credential=credential, **kwargs)
            self._poison = QueueClient(endpoint, self.poison_queue, credential=credential,
                                       **kwargs)
        self._poison_ready = False

    def __repr__(self) -> str:
        return f"AzureQueueListener({self.queue_name!r}, {self.scope!r}, {self._options!r})"

    def receive(self, timeout: float) -> Received:
        """As `QueueListener.receive`; `needs_refresh` is set when an ADLS Gen2 rename or
        directory delete touched the volume."""
        received = super().receive(timeout)
        if received.info.get("refresh_events"):
            return dataclasses.replace(received, needs_refresh=True)
        return received

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep the messages invisible for `seconds` more; each handle gets its new receipt."""
        if not all(isinstance(h, AzureHandle) for h in handles):
            raise TypeError("extend needs the AzureHandle objects from receive()")
        super().extend(handles, seconds)

    def backlog(self) -> int:
        """Messages waiting on the queue (its approximate message count), for metrics."""
        with translate_errors("queue", f"Get Queue Metadata {self.queue_name}", self._options):
            return int(self._client.get_queue_properties().approximate_message_count or 0)

    def _read_visibility(self) -> int:
        return self.default_visibility  # a Storage Queue has no default of its own: 30 s

    # -- QueueListener hooks ------------------------------------------------------------------
    def _receive_call(self, count: int, wait: int) -> list[Any]:
        """Get Messages; on an empty queue poll again (50 ms, doubling up to
        `poll_interval_s`) until `wait` seconds are over or the listener closes."""
        deadline = time.monotonic() + wait
        pause = 0.05
        while True:
            self._check_open()
            with translate_errors("queue", f"Get Messages {self.queue_name}", self._options):
                got = list(self._client.receive_messages(
                    messages_per_page=count, max_messages=count,
                    visibility_timeout=self.visibility_timeout))
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            if self._closed.wait(min(pause, self.poll_interval_s, left)):
                return []
            pause *= 2

    def _message_id(self, raw: Any) -> str:
        return raw.id

    def _handle(self, raw: Any) -> AzureHandle:
        return AzureHandle(raw.id, raw.pop_receipt, raw.dequeue_count or 1)

    def _body(self, raw: Any) -> Any:
        return raw.content

    def _receive_count(self, raw: Any) -> int:
        return raw.dequeue_count

    def _count(self, parsed: ParsedMessage, info: dict[str, int]) -> None:
        info["events_skipped"] += parsed.skipped
        scope: AzureScope = self.scope
        for account, container, path in parsed.refresh:
            if container != scope.bucket or (account and scope.account
                                             and account.lower() != scope.account.lower()):
                continue
            # a directory's path is a prefix of the volume's, or a path inside it
            if path.startswith(scope.prefix) or scope.prefix.startswith(path.rstrip("/") + "/"):
                info["refresh_events"] += 1

    def _digest(self, items: Sequence[_Item], calls: int) -> Received:
        """The base's digest, after moving messages received too often to the poison queue."""
        kept, poisoned = [], 0
        for item in items:
            if self.max_dequeue_count and (item.raw.dequeue_count or 0) > self.max_dequeue_count:
                poisoned += self._to_poison(item)
            else:
                kept.append(item)
        received = super()._digest(kept, calls)
        received.info["poisoned"] = poisoned
        received.info["messages"] = len(items)
        return received

    def _to_poison(self, item: _Item) -> int:
        """Copy a message to the poison queue, then delete it; 0 when that failed (it stays
        and is tried again when next received)."""
        raw = item.raw
        try:
            with translate_errors("queue", f"move message {raw.id} to {self.poison_queue}",
                                  self._options):
                if not self._poison_ready:
                    try:
                        self._poison.create_queue()
                    except ResourceExistsError:
                        pass
                    self._poison_ready = True
                self._poison.send_message(raw.content)
                self._client.delete_message(raw.id, raw.pop_receipt)
        except ConnectorError as exc:
            self.log.warning("could not move message %s of %s to %s: %s", raw.id,
                             self.queue_name, self.poison_queue, exc)
            return 0
        self.log.warning("moved message %s of %s to %s after %d receives%s", raw.id,
                         self.queue_name, self.poison_queue, raw.dequeue_count,
                         f" (malformed: {item.error})" if item.error else "")
        return 1

    def _delete(self, chunk: list[AzureHandle]) -> list[AzureHandle]:
        """Delete Message for each handle; returns those failing transiently."""
        return self._each(chunk, "Delete Message",
                          lambda h: self._client.delete_message(h.message_id, h.pop_receipt))

    def _change_visibility(self, chunk: list[AzureHandle], seconds: int) -> list[AzureHandle]:
        def update(handle: AzureHandle) -> None:
            handle.pop_receipt = self._client.update_message(
                handle.message_id, handle.pop_receipt, visibility_timeout=seconds).pop_receipt

        return self._each(chunk, "Update Message", update)

    def _each(self, chunk: list[AzureHandle], action: str, call: Any) -> list[AzureHandle]:
        pending = []
        for handle in chunk:
            try:
                with translate_errors("queue", f"{action} {self.queue_name}", self._options):
                    try:
                        call(handle)
                    except (ResourceNotFoundError, HttpResponseError) as exc:
                        if error_code(exc) not in _STALE_CODES:
                            raise
                        handle.stale = True
                        self.log.warning("%s on %s: message %s no longer held (%s); it will be "
                                         "received again", action, self.queue_name,
                                         handle.message_id, error_code(exc))
            except ConnectorError as exc:
                if not is_transient(exc):
                    raise
                pending.append(handle)
        return pending

    # `_close_connections` stays the base's no-op: acks and visibility changes must keep
    # working after `close` (the daemon acks its last commit then), and the SDK's pooled
    # connections close with the client.
