"""The queue-listener base: one drain loop, dedupe, scope filter, ordering, ack and extend.

SQS and MNS differ only in their calls and message formats, so a provider supplies:

- `_receive_call(count, wait)`: one receive call, raw messages (an empty queue is `[]`);
- `_message_id(raw)`, `_handle(raw)`, `_receive_count(raw)`, `_body(raw)`;
- `parse_message` (pure) and `to_file_event` (scope mapping), as static hooks;
- `_delete(chunk)` / `_change_visibility(chunk, seconds)`: one batch call, returning the
  handles still failing for a reason worth retrying (stale handles are logged and dropped);
- `_read_visibility()`: the queue's visibility timeout, read once;
- optionally `_order(found)` (MNS refines same-second ties) and `_wait_out(...)`.

The base does the rest the same way for both: one long poll, then, while a backlog lasts,
short polls on up to `max_workers` named threads that each poll again as soon as their call
returns (no lockstep rounds) and parse what they got; the drain stops at half the visibility
timeout (past it, it would receive its own messages again); messages seen twice in one batch
are kept once with the newest handle; malformed messages are counted and left for the
dead-letter policy; every event maps to its message's handle (`Received.source_handles`);
acks and visibility changes go in chunks with one jittered retry policy (`is_transient`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tenacity import RetryError, retry, retry_if_result, stop_after_attempt

from connectors._objects import BACKOFF
from connectors.errors import ConnectorError, MalformedMessageError, is_transient
from connectors.events import FileEvent, InvalidPathError
from connectors.protocols import Listener, Received

__all__ = ["QueueListener"]

_ATTEMPTS = 4


@dataclass(frozen=True, slots=True)
class _Item:
    """One received message, parsed on the thread that received it."""

    raw: Any
    message_id: str | None
    parsed: Any
    error: MalformedMessageError | None
    events: list[FileEvent] = field(default_factory=list)
    info: dict[str, int] = field(default_factory=dict)


class _Budget:
    """How many more messages the drain may take; hands out numbered calls to the workers."""

    def __init__(self, room: int, per_call: int, deadline: float = math.inf) -> None:
        self._lock = threading.Lock()
        self.room, self.per_call, self.deadline = room, per_call, deadline
        self.calls = 0
        self.failure: ConnectorError | None = None

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            if self.failure is not None or self.room <= 0 or time.monotonic() > self.deadline:
                return None
            count = min(self.per_call, self.room)
            self.room -= count
            self.calls += 1
            return self.calls, count

    def give_back(self, count: int) -> None:
        with self._lock:
            self.room += count

    def fail(self, exc: ConnectorError) -> None:
        with self._lock:
            self.failure = exc


class QueueListener(Listener):
    """A `Listener` over a message queue; see the module docstring for the provider hooks."""

    #: the most messages one receive / batch call may carry
    max_messages: ClassVar[int] = 10
    #: thread names of the drain and ack workers
    thread_prefix: ClassVar[str] = "volume-stream-queue"
    #: counters a provider adds to `Received.info`
    extra_counters: ClassVar[tuple[str, ...]] = ()
    log: ClassVar[logging.Logger] = logging.getLogger("connectors.queue")
    #: the visibility timeout assumed when the queue's cannot be read
    default_visibility: ClassVar[int] = 30

    parse_message: ClassVar[Callable[..., Any]]
    to_file_event: ClassVar[Callable[..., FileEvent | None]]

    def _setup(self, scope: Any, *, batch_size: int, wait_seconds: int, max_workers: int,
               max_batch_messages: int, visibility_timeout: int | None = None) -> None:
        if max_workers < 1 or max_batch_messages < 1:
            raise ValueError("max_workers and max_batch_messages must be >= 1")
        self.scope = scope
        self.batch_size, self.wait_seconds = batch_size, wait_seconds
        self.max_workers, self.max_batch_messages = max_workers, max_batch_messages
        self.visibility_timeout = visibility_timeout
        self._queue_visibility: int | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._idle = False

    # -- provider hooks -----------------------------------------------------------------------
    name: str  # how logs and errors name the queue

    def _receive_call(self, count: int, wait: int) -> list[Any]:
        raise NotImplementedError

    def _message_id(self, raw: Any) -> str | None:
        raise NotImplementedError

    def _handle(self, raw: Any) -> Any:
        raise NotImplementedError

    def _body(self, raw: Any) -> Any:
        raise NotImplementedError

    def _receive_count(self, raw: Any) -> Any:
        raise NotImplementedError

    def _delete(self, chunk: list[Any]) -> list[Any]:
        raise NotImplementedError

    def _change_visibility(self, chunk: list[Any], seconds: int) -> list[Any]:
        raise NotImplementedError

    def _read_visibility(self) -> int:
        raise NotImplementedError

    def _count(self, parsed: Any, info: dict[str, int]) -> None:
        """Add a parsed message's provider counters to `info`."""

    def _order(self, found: list[tuple[Any, FileEvent]]) -> list[FileEvent]:
        """The batch's events in the order the caller should apply them (default: arrival)."""
        return [event for _, event in found]

    def _wait_out(self, started: float, timeout: float) -> None:
        """Called when a receive found nothing (MNS waits out its whole-second polls)."""

    def _close_connections(self) -> None:
        """Release provider connections on `close`."""

    # -- Listener ---------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """True once a receive found the queue empty (nothing is buffered inside)."""
        return self._idle and not self._closed.is_set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def receive(self, timeout: float) -> Received:
        """Long-poll up to `timeout` seconds (at most `wait_seconds`), then drain a backlog.

        Returns:
            The events; the handles of every well-formed message (ignored ones too, so they
            get acked); `source_handles` (event `source_id` -> handle, also in
            `info["handle_of_source"]`); malformed and ignored counts. `info` has `messages`,
            `receive_calls`, `records_ignored`, `invalid_paths`, `duplicates` and the
            provider's counters.

        Raises:
            ListenerClosedError: the listener is closed.
            CredentialsError: the service rejected the credentials.
            ConnectorError: the queue cannot be read (after retries).
        """
        self._check_open()
        started = time.monotonic()
        wait = int(max(0, min(self.wait_seconds, timeout)))
        first = self._receive_call(self.batch_size, wait)
        items, calls = [self._item(m) for m in first], 1
        if len(first) == self.batch_size and len(items) < self.max_batch_messages \
                and not self.closed:
            more, extra = self._drain(self.max_batch_messages - len(items))
            items.extend(more)
            calls += extra
        self._idle = not items
        if not items:
            self._wait_out(started, timeout)
        return self._digest(items, calls)

    def ack(self, handles: Sequence[Any]) -> None:
        """Delete the messages behind `handles`, `max_messages` at a time.

        Entries failing on the service side are retried with backoff. Handles that no longer
        hold their message (it became visible again and was redelivered) are logged and
        skipped: the redelivered copy is a harmless duplicate.

        Raises:
            ConnectorError: a call failed, or entries still failed after the retries.
        """
        self._batches(self._delete_action, handles, self._delete)

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep the messages invisible for `seconds` more; `seconds=0` gives them back."""
        if not 0 <= seconds <= 43200:
            raise ValueError(f"visibility seconds must be in 0..43200: {seconds}")
        self._batches(self._extend_action, handles,
                      lambda chunk: self._change_visibility(chunk, seconds))

    _delete_action = "DeleteMessageBatch"
    _extend_action = "ChangeMessageVisibilityBatch"

    def close(self) -> None:
        """Stop the worker threads and close the connections. Unacknowledged messages reappear
        after their timeout; `ack` and `extend` keep working (one call at a time), so a daemon
        can close its listener, finish its last commit and still acknowledge it."""
        with self._lock:
            self._closed.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self._close_connections()

    # -- the drain --------------------------------------------------------------------------
    def _drain(self, room: int) -> tuple[list[_Item], int]:
        """Short-poll on the worker threads until the backlog or `room` runs out; returns
        (the parsed messages in call order, the number of calls)."""
        # Stop well before the first messages' visibility runs out: past it, the drain would
        # receive its own messages again (and they would be redelivered to others).
        budget = _Budget(room, self.batch_size, time.monotonic() + 0.5 * self._visibility_s())
        workers = min(self.max_workers, math.ceil(room / self.batch_size))
        try:
            pool = self._pool()
            futures = [pool.submit(self._drain_worker, budget) for _ in range(workers)]
        except (ConnectorError, RuntimeError):  # closed meanwhile: return what we have
            return [], 0
        calls: list[tuple[int, list[_Item]]] = []
        for future in futures:
            try:
                calls.extend(future.result())
            except CancelledError:  # a concurrent close() cancels workers not yet started
                continue
        if budget.failure is not None:  # keep what the other calls received
            self.log.warning("stopped draining %s early: %s", self.name, budget.failure)
        calls.sort(key=lambda call: call[0])
        return [item for _, got in calls for item in got], budget.calls

    def _drain_worker(self, budget: _Budget) -> list[tuple[int, list[_Item]]]:
        done: list[tuple[int, list[_Item]]] = []
        while not self.closed:
            ticket = budget.take()
            if ticket is None:
                break
            index, count = ticket
            try:
                got = self._receive_call(count, 0)
            except ConnectorError as exc:
                budget.fail(exc)
                break
            budget.give_back(count - len(got))
            done.append((index, [self._item(m) for m in got]))
            if len(got) < count:  # the backlog is thinning out: leave it to the next receive
                break
        return done

    def _visibility_s(self) -> float:
        """The visibility timeout received messages get: ours, else the queue's (read once)."""
        if self.visibility_timeout is not None:
            return self.visibility_timeout
        if self._queue_visibility is None:
            try:
                self._queue_visibility = int(self._read_visibility())
            except ConnectorError as exc:
                self.log.warning("cannot read the visibility timeout of %s (%s); assuming %d s",
                                 self.name, exc, self.default_visibility)
                self._queue_visibility = self.default_visibility
        return self._queue_visibility

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            self._check_open()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers,
                                                    thread_name_prefix=self.thread_prefix)
            return self._executor

    # -- parsing ----------------------------------------------------------------------------
    def _item(self, raw: Any) -> _Item:
        """Parse one message and map its records to this volume's events (thread-safe)."""
        message_id = self._message_id(raw)
        try:
            parsed = type(self).parse_message(self._body(raw), message_id=message_id)
        except MalformedMessageError as exc:
            return _Item(raw, message_id, None, exc)
        info = dict.fromkeys(("records_ignored", "invalid_paths"), 0)
        events = []
        for record in parsed.records:
            try:
                event = type(self).to_file_event(record, self.scope, source_id=message_id)
            except InvalidPathError as exc:
                info["invalid_paths"] += 1
                self.log.warning("ignoring %s from message %s: %s", record.url, message_id, exc)
                continue
            if event is None:
                info["records_ignored"] += 1
            else:
                events.append(event)
        return _Item(raw, message_id, parsed, None, events, info)

    def _digest(self, items: Sequence[_Item], calls: int) -> Received:
        found: list[tuple[Any, FileEvent]] = []
        handles: list[Any] = []
        seen: dict[Any, int] = {}
        source_handles: dict[str, Any] = {}
        malformed = ignored = 0
        info = dict.fromkeys((*self.extra_counters, "records_ignored", "invalid_paths",
                              "duplicates"), 0)
        for item in items:
            handle = self._handle(item.raw)
            if item.message_id in seen:  # the same message twice in one batch: newest handle
                handles[seen[item.message_id]] = handle
                if item.message_id in source_handles:
                    source_handles[item.message_id] = handle
                info["duplicates"] += 1
                continue
            if item.parsed is None:
                malformed += 1
                self.log.warning("leaving malformed message %s on %s for its redrive policy "
                                 "(receive count %s): %s", item.message_id, self.name,
                                 self._receive_count(item.raw), item.error)
                continue
            seen[item.message_id] = len(handles)
            handles.append(handle)
            self._count(item.parsed, info)
            for key, count in item.info.items():
                info[key] += count
            for event in item.events:
                found.append((item.raw, event))
                if event.source_id is not None:
                    source_handles[event.source_id] = handle
            ignored += not item.events
        info.update(messages=len(items), receive_calls=calls,
                    handle_of_source=dict(source_handles))
        return Received(tuple(self._order(found)), tuple(handles), malformed, ignored,
                        info=info, source_handles=source_handles)

    # -- ack / extend -----------------------------------------------------------------------
    def _batches(self, action: str, handles: Sequence[Any],
                 call: Callable[[list[Any]], list[Any]]) -> None:
        unique = list(dict.fromkeys(handles))
        chunks = [unique[i:i + self.max_messages]
                  for i in range(0, len(unique), self.max_messages)]
        if len(chunks) <= 1 or self.closed:  # after close(): still works, one call at a time
            for chunk in chunks:
                self._with_retry(action, chunk, call)
        else:
            list(self._pool().map(lambda chunk: self._with_retry(action, chunk, call), chunks))

    def _with_retry(self, action: str, chunk: list[Any],
                    call: Callable[[list[Any]], list[Any]]) -> None:
        """Run `call` on `chunk` until nothing is left failing, with jittered backoff."""
        pending = list(chunk)

        @retry(retry=retry_if_result(bool), stop=stop_after_attempt(_ATTEMPTS), wait=BACKOFF)
        def attempt() -> list[Any]:
            try:
                pending[:] = call(pending)
            except ConnectorError as exc:
                if not is_transient(exc):
                    raise
                self.log.info("%s on %s failed (%s); retrying", action, self.name, exc)
            return pending

        try:
            attempt()
        except RetryError:
            raise ConnectorError(f"{action} on {self.name}: {len(pending)} entries still "
                                 "failing after retries") from None
