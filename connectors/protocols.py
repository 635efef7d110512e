"""The contracts every listener, lister and object reader implements (DESIGN §6).

A listener hands out `Received` batches: the `FileEvent`s it could parse, the opaque
acknowledgement handles of the messages that carried them, which handle each event came from
(`source_handles`, keyed by `FileEvent.source_id`), and counters for what it could not parse.
The caller commits the events to the directory table and only then calls `ack` with the
handles, so a crash between the two leaves the messages on the queue to be redelivered (the
directory table ignores the duplicates). A caller that cannot commit one event (a poison
event) acks the handles of the others and leaves only that event's message on the queue.

The contracts are base classes: `Listener` owns `__enter__`/`__exit__` once, and every
provider raises `ListenerClosedError` when used after `close`.

    with LocalListener(root) as listener:
        batch = listener.receive(timeout=1.0)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa

from connectors.errors import ListenerClosedError
from connectors.events import FileEvent

__all__ = ["LISTING_SCHEMA", "Lister", "Listener", "ObjectReader", "Received"]

#: What a full listing yields, batch by batch: one row per file (never folder markers), keys
#: relative to the volume location. `etag` may be null.
LISTING_SCHEMA = pa.schema(
    [
        ("relative_path", pa.string()),
        ("size", pa.int64()),
        ("last_modified_time", pa.timestamp("us", tz="UTC")),
        ("etag", pa.string()),
    ]
)


@dataclass(frozen=True)
class Received:
    """One receive call's result.

    `needs_refresh` is set when the listener knows it lost events (an inotify queue overflow, a
    directory moved out of the volume): the caller should run a full-listing refresh.
    `malformed` counts messages that could not be parsed; they stay on the queue for its
    dead-letter policy. `ignored` counts well-formed messages that carry nothing for this volume
    (test events, other buckets or prefixes); their handles are in `handles` so they get acked.
    `source_handles` maps each event's `source_id` to the handle of the message carrying it,
    so a caller can ack all but a poison event's message.
    """

    events: tuple[FileEvent, ...] = ()
    handles: tuple[Any, ...] = ()
    malformed: int = 0
    ignored: int = 0
    needs_refresh: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    source_handles: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.events or self.handles or self.malformed or self.needs_refresh)


class Listener:
    """Receive events, acknowledge them after the commit, close (a context manager)."""

    _closed_flag: bool = False

    def receive(self, timeout: float) -> Received:
        """Wait up to `timeout` seconds for events; return what arrived (maybe nothing)."""
        raise NotImplementedError

    def ack(self, handles: Sequence[Any]) -> None:
        """Acknowledge (delete) the messages behind `handles`; call only after the commit."""
        raise NotImplementedError

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep `handles` invisible to other receivers for `seconds` more (long batches)."""
        raise NotImplementedError

    def backlog(self) -> int | None:
        """How many messages or changes wait to be received (for metrics); None if unknown."""
        return None

    @property
    def idle(self) -> bool:
        """True when nothing is pending inside the listener (used by `watch(until_idle=True)`)."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._closed_flag

    def close(self) -> None:
        self._closed_flag = True

    def _check_open(self) -> None:
        if self.closed:
            raise ListenerClosedError(f"{self!r} is closed")

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ObjectReader:
    """Read objects of one volume by relative path; picklable so it can run on Spark executors."""

    def open(self, relative_path: str) -> IO[bytes]:
        """A binary, streamed file-like object."""
        raise NotImplementedError

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        raise NotImplementedError


class Lister:
    """List every file of a volume for `refresh` (DESIGN §4.4)."""

    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield batches in `LISTING_SCHEMA`, already filtered by prefix and recursion."""
        raise NotImplementedError
