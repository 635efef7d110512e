"""The small protocol every listener and object reader implements (DESIGN §6).

A listener hands out `Received` batches: the `FileEvent`s it could parse, the opaque
acknowledgement handles of the messages that carried them, and counters for what it could not
parse. The caller commits the events to the directory table and only then calls `ack` with the
handles, so a crash between the two leaves the messages on the queue to be redelivered (the
directory table ignores the duplicates). Listeners are context managers.

    with LocalListener(root) as listener:
        batch = listener.receive(timeout=1.0)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol, runtime_checkable

import pyarrow as pa

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
    """

    events: tuple[FileEvent, ...] = ()
    handles: tuple[Any, ...] = ()
    malformed: int = 0
    ignored: int = 0
    needs_refresh: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.events or self.handles or self.malformed or self.needs_refresh)


@runtime_checkable
class Listener(Protocol):
    """Receive events, acknowledge them after the commit, close."""

    def receive(self, timeout: float) -> Received:
        """Wait up to `timeout` seconds for events; return what arrived (maybe nothing)."""
        ...

    def ack(self, handles: Sequence[Any]) -> None:
        """Acknowledge (delete) the messages behind `handles`; call only after the commit."""
        ...

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep `handles` invisible to other receivers for `seconds` more (long batches)."""
        ...

    @property
    def idle(self) -> bool:
        """True when nothing is pending inside the listener (used by `watch(until_idle=True)`)."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Listener: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class ObjectReader(Protocol):
    """Read objects of one volume by relative path; picklable so it can run on Spark executors."""

    def open(self, relative_path: str) -> IO[bytes]:
        """A binary, streamed file-like object."""
        ...

    def read_range(self, relative_path: str, start: int, length: int) -> bytes: ...


@runtime_checkable
class Lister(Protocol):
    """List every file of a volume for `refresh` (DESIGN §4.4)."""

    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield batches in `LISTING_SCHEMA`, already filtered by prefix and recursion."""
        ...
