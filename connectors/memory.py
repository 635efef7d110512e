"""An in-memory listener and store, as httpx ships `MockTransport`: real `Listener`, `Lister`
and `ObjectReader` implementations with no service behind them, for tests and examples.

`MemoryStore` holds files as bytes; with a `MemoryListener` attached, every `put`/`delete`
sends one message carrying its `FileEvent`, as a bucket notification would. The listener keeps
queue semantics: received messages are in flight until acked, `extend(handles, 0)` gives them
back, malformed messages stay (counted on every receive), and each event maps to its message's
handle (`Received.source_handles`).

    >>> listener = MemoryListener()
    >>> store = MemoryStore(listener)
    >>> _ = store.put("a.txt", b"hi")
    >>> batch = listener.receive(timeout=0)
    >>> [e.relative_path for e in batch.events], store.read_range("a.txt", 1, 5)
    (['a.txt'], b'i')
    >>> listener.ack(batch.handles); listener.backlog()
    0
"""

from __future__ import annotations

import hashlib
import io
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pyarrow as pa

from connectors.errors import ObjectNotFoundError
from connectors.events import EventKind, FileEvent, utc_now, validate_relative_path
from connectors.protocols import LISTING_SCHEMA, Listener, Lister, ObjectReader, Received

__all__ = ["MemoryListener", "MemoryStore"]

_ids = itertools.count(1)


@dataclass
class _Message:
    message_id: str
    events: tuple[FileEvent, ...]
    malformed: bool = False
    in_flight: bool = False


class MemoryListener(Listener):
    """A queue in memory (`Listener`); handles are message ids.

    Example:
        >>> with MemoryListener() as listener:
        ...     mid = listener.send(FileEvent.removed("gone.txt"))
        ...     listener.receive(timeout=0).source_handles == {mid: mid}
        True
    """

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._messages: dict[str, _Message] = {}
        self._refresh = False
        self._closed = False
        self.acked: list[str] = []

    def __repr__(self) -> str:
        return f"MemoryListener({self.name!r})"

    # -- feeding --------------------------------------------------------------------------------
    def send(self, *events: FileEvent, message_id: str | None = None) -> str:
        """Enqueue one message carrying `events` (their `source_id` becomes its id)."""
        message_id = message_id or f"{self.name}-{next(_ids)}"
        # events built with this source_id already are taken as they are (no copy: a feeder
        # offering tens of thousands of events a second shares the GIL with the consumer)
        stamped = tuple(e if e.source_id == message_id else replace(e, source_id=message_id)
                        for e in events)
        with self._cond:
            self._messages[message_id] = _Message(message_id, stamped)
            self._cond.notify_all()
        return message_id

    def send_malformed(self) -> str:
        """Enqueue a message no parser understands; it stays until acked by id."""
        message_id = f"{self.name}-bad-{next(_ids)}"
        with self._cond:
            self._messages[message_id] = _Message(message_id, (), malformed=True)
            self._cond.notify_all()
        return message_id

    def request_refresh(self) -> None:
        """Make the next `Received` ask for a full refresh (as an inotify overflow would)."""
        with self._cond:
            self._refresh = True
            self._cond.notify_all()

    # -- Listener ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _visible(self) -> list[_Message]:
        return [m for m in self._messages.values() if not m.in_flight]

    def receive(self, timeout: float) -> Received:
        """Wait up to `timeout` seconds for visible messages; take them all (in flight)."""
        self._check_open()
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not (self._visible() or self._refresh or self._closed):
                left = end - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            taken = [m for m in self._visible() if not m.malformed]
            malformed = len(self._visible()) - len(taken)
            for message in taken:
                message.in_flight = True
            refresh, self._refresh = self._refresh, False
        events = tuple(e for m in taken for e in m.events)
        source_handles = {m.message_id: m.message_id for m in taken if m.events}
        return Received(events, tuple(m.message_id for m in taken), malformed,
                        sum(not m.events for m in taken), refresh,
                        info={"messages": len(taken), "handle_of_source": dict(source_handles)},
                        source_handles=source_handles)

    def ack(self, handles: Sequence[Any]) -> None:
        """Delete the messages; unknown (already acked) ids are ignored, like a stale handle."""
        with self._cond:
            for handle in handles:
                if self._messages.pop(handle, None) is not None:
                    self.acked.append(handle)

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """`seconds=0` makes the messages visible again; otherwise they stay in flight."""
        if not 0 <= seconds <= 43200:
            raise ValueError(f"visibility seconds must be in 0..43200: {seconds}")
        with self._cond:
            for handle in handles:
                if seconds == 0 and handle in self._messages:
                    self._messages[handle].in_flight = False
            self._cond.notify_all()

    def backlog(self) -> int:
        with self._cond:
            return len(self._visible())

    @property
    def idle(self) -> bool:
        with self._cond:
            return not (self._visible() or self._refresh)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass(frozen=True)
class _File:
    data: bytes
    modified: datetime
    etag: str


class MemoryStore(ObjectReader, Lister):
    """Files in memory (`ObjectReader` and `Lister`); picklable (the files go along).

    Args:
        listener: When given, `put` and `delete` send their `FileEvent` to it.
    """

    def __init__(self, listener: MemoryListener | None = None) -> None:
        self.listener = listener
        self._files: dict[str, _File] = {}

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._files)} files)"

    def __getstate__(self) -> dict[str, Any]:
        return {"listener": None, "_files": dict(self._files)}

    def put(self, relative_path: str, data: bytes) -> FileEvent:
        """Store `data` at `relative_path` and return (and send) its CREATED event."""
        validate_relative_path(relative_path)
        now = utc_now()
        file = _File(bytes(data), now, hashlib.md5(data, usedforsecurity=False).hexdigest())
        self._files[relative_path] = file
        event = FileEvent(EventKind.CREATED, relative_path, size=len(data), etag=file.etag,
                          last_modified_time=now, event_time=now)
        if self.listener is not None:
            self.listener.send(event)
        return event

    def delete(self, relative_path: str) -> FileEvent:
        """Remove a file (if present) and return (and send) its REMOVED event."""
        self._files.pop(relative_path, None)
        event = FileEvent(EventKind.REMOVED, relative_path)
        if self.listener is not None:
            self.listener.send(event)
        return event

    def _file(self, relative_path: str) -> _File:
        validate_relative_path(relative_path)
        try:
            return self._files[relative_path]
        except KeyError:
            raise ObjectNotFoundError(f"memory://{relative_path} does not exist") from None

    def open(self, relative_path: str) -> io.BytesIO:
        return io.BytesIO(self._file(relative_path).data)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"start and length must be >= 0: {start}, {length}")
        return self._file(relative_path).data[start:start + length]

    def list(self) -> Iterator[pa.RecordBatch]:
        if not self._files:
            return
        paths = sorted(self._files)
        files = [self._files[p] for p in paths]
        yield pa.RecordBatch.from_pydict(
            {"relative_path": paths, "size": [len(f.data) for f in files],
             "last_modified_time": [f.modified for f in files], "etag": [f.etag for f in files]},
            schema=LISTING_SCHEMA)
