"""Group commit: how a listener loop turns received events into batches (DESIGN §6.2).

While one batch commits, events keep arriving (a queue keeps them, a local listener buffers
them); the next batch takes everything pending. `gather` waits for a first event, then keeps
taking what is already there with receives that do not wait, and closes the batch when

- a receive comes back empty (the queue is quiet: a lone event commits at once), or
- the batch reaches its size cap, `BatchLimits.cap`: the memory cap (`max_batch_bytes`, an
  estimate of what the held events weigh), the optional fixed cap (`max_events`), and the cap
  the `CommitModel` derives from `target_commit_s`, or
- `max_wait_s` passed since its first event.

The model fits `seconds = fixed + per_event * events` over the last commits. A batch's variable
part may take `target_commit_s - fixed`, and never less than `fixed`: when the fixed part alone
exceeds the target (a spread batch rewrites every data file of a large table whatever its size)
batches grow until the variable part matches it, so throughput stays at least half of what
unbounded batches would reach, and a backlog cannot grow without end because of the cap. With
too few distinct batch sizes to fit a line the model sets no cap. Both callers, the daemon's
`VolumeRunner` and `VolumeWatcher.step` (behind `Catalog.watch`), gather with this module.

    limits = BatchLimits(max_batch_bytes=256 << 20, target_commit_s=5.0)
    model = CommitModel()
    batch = gather(watcher.receive, poll_s=1.0, limits=limits, model=model)
    ... commit batch.events, then: model.observe(len(batch.events), seconds)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectors.events import FileEvent
from connectors.protocols import Received

__all__ = ["Batch", "BatchLimits", "CommitModel", "event_bytes", "gather"]

#: what one held `FileEvent` weighs beyond its strings (object, fields, datetimes), measured
#: with tracemalloc on CPython 3.11-3.13 (about 550-650 bytes); rounded up
_EVENT_OVERHEAD = 700


def event_bytes(event: FileEvent) -> int:
    """An estimate of the memory one held event takes (for `max_batch_bytes`)."""
    return _EVENT_OVERHEAD + len(event.relative_path) + len(event.etag or "") \
        + len(event.source_id or "") + len(event.sequencer or "")


@dataclass(frozen=True)
class BatchLimits:
    """Caps on one batch. `max_events=None`: no fixed cap (group commit decides)."""

    max_batch_bytes: int = 256 << 20
    target_commit_s: float = 5.0
    max_wait_s: float = 0.5
    max_events: int | None = None


class CommitModel:
    """`seconds = fixed + per_event * events`, fitted over the last `window` commits.

    Example:
        >>> m = CommitModel()
        >>> for n, s in ((100, 1.1), (1000, 2.0), (10_000, 11.0)): m.observe(n, s)
        >>> round(m.fixed, 2), round(m.per_event * 1e3, 3)
        (1.0, 1.0)
        >>> m.cap(5.0)  # a variable part of max(5 - 1, 1) s: 4,000 events
        4000
    """

    def __init__(self, window: int = 16) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.fixed = 0.0
        self.per_event: float | None = None

    def observe(self, events: int, seconds: float) -> None:
        """Record one commit of `events` events that took `seconds`."""
        if events <= 0:
            return
        self._samples.append((events, seconds))
        self._fit()

    def _fit(self) -> None:
        ns = [n for n, _ in self._samples]
        if len(ns) < 2 or max(ns) < 1.5 * min(ns):
            self.per_event = None  # sizes too alike to separate the fixed part from the rest
            return
        mean_n = sum(ns) / len(ns)
        mean_s = sum(s for _, s in self._samples) / len(ns)
        var = sum((n - mean_n) ** 2 for n in ns)
        cov = sum((n - mean_n) * (s - mean_s) for n, s in self._samples)
        slope = cov / var
        if slope <= 0:  # bigger batches were not slower: nothing to cap
            self.fixed, self.per_event = max(0.0, mean_s), None
            return
        self.fixed = max(0.0, mean_s - slope * mean_n)
        self.per_event = slope

    def cap(self, target_commit_s: float) -> int | None:
        """Events a batch may hold to commit within about `target_commit_s` (module
        docstring); None when the model has no evidence for a cap."""
        if self.per_event is None:
            return None
        budget = max(target_commit_s - self.fixed, self.fixed)
        return max(1, int(budget / self.per_event))

    def as_dict(self) -> dict[str, Any]:
        return {"fixed_s": round(self.fixed, 4), "samples": len(self._samples),
                "per_event_us": None if self.per_event is None
                else round(self.per_event * 1e6, 3)}


@dataclass
class Batch:
    """Events gathered for one commit, and the messages that carried them."""

    events: list[FileEvent] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)
    needs_refresh: bool = False
    #: estimated memory of `events` (`event_bytes`)
    bytes: int = 0
    #: `time.monotonic()` when its first event was received
    first_at: float | None = None
    #: why it closed: quiet, cap, wait, stop, error, idle
    closed_by: str = ""
    attempts: int = 0
    released: bool = False  # nothing commits: give the messages back unacknowledged
    poisoned: list[FileEvent] = field(default_factory=list)  # dead-lettered events
    #: event source_id -> message handle, when the listener says (`Received.source_handles`)
    handle_of: dict[str, Any] = field(default_factory=dict)
    #: events held that came without a message id the listener names
    _held: set[FileEvent] = field(default_factory=set, repr=False)
    #: ids of the messages held (`Received.source_handles`)
    _messages: set[Any] = field(default_factory=set, repr=False)

    @property
    def empty(self) -> bool:
        return not (self.events or self.handles or self.needs_refresh)

    def add(self, received: Received, accepted: list[FileEvent]) -> int:
        """Take one receive's accepted events and its handles; how many of the events the
        batch did not hold yet (a message received again carries the same events). Events
        whose message the listener names (`source_handles`) count by message id: those of a
        message held already are not new. Others are compared whole (an event's hash, of its
        eight fields, costs ~0.5-1 us: a second or two of a batch of 1M events)."""
        info = received.info or {}
        handle_of = received.source_handles or info.get("handle_of_source")
        if handle_of:
            self.handle_of.update(handle_of)
            unnamed = [e for e in accepted if e.source_id is None or e.source_id not in handle_of]
            new_messages = [m for m in handle_of if m not in self._messages]
            self._messages.update(new_messages)
            fresh_named = len(accepted) - len(unnamed) if new_messages else 0
        else:
            unnamed, fresh_named = accepted, 0
        fresh = [e for e in unnamed if e not in self._held]
        self._held.update(fresh)
        if accepted and self.first_at is None:
            self.first_at = time.monotonic()
        self.events.extend(accepted)
        self.bytes += sum(event_bytes(e) for e in accepted)
        self.handles.extend(received.handles)
        self.needs_refresh |= bool(received.needs_refresh)
        return len(fresh) + fresh_named


def gather(receive: Callable[[float], Received], *, poll_s: float, limits: BatchLimits,
           model: CommitModel | None = None,
           accept: Callable[[Received], list[FileEvent]] = lambda r: list(r.events),
           stop: threading.Event | None = None,
           on_error: Callable[[Exception, Batch], None] | None = None,
           clock: Callable[[], float] = time.monotonic) -> Batch:
    """Gather one batch (module docstring). An empty batch (`.empty`) means nothing arrived
    within `poll_s`.

    Args:
        receive: The listener's receive (timeout in seconds).
        poll_s: How long to wait for a first event.
        limits: The caps.
        model: Commit times so far (None: no cap from the target interval).
        accept: The events of a receive the volume counts (and where a caller counts them).
        stop: When set, the batch closes after the current receive.
        on_error: A receive that fails after the batch holds something closes it (the error
            comes back on the next receive) and is reported here; with nothing held, or
            without `on_error`, it is raised.
    """
    batch = Batch()
    cap = limits.max_events
    modelled = model.cap(limits.target_commit_s) if model is not None else None
    if modelled is not None:
        cap = modelled if cap is None else min(cap, modelled)
    deadline: float | None = None
    while True:
        try:
            received = receive(poll_s if deadline is None else 0.0)
        except Exception as exc:
            if batch.empty or on_error is None:
                raise
            on_error(exc, batch)
            batch.closed_by = "error"
            return batch
        accepted = accept(received)
        fresh = batch.add(received, accepted)
        if deadline is None:
            if batch.empty:
                batch.closed_by = "idle"
                return batch
            deadline = clock() + limits.max_wait_s
        elif (received.empty and not received.ignored) or (accepted and not fresh):
            # nothing new: commit what we hold now (events only received again mean the
            # queue's visibility timeout is shorter than the batch: waiting on would only
            # count more receives of those messages towards their redrive limit)
            batch.closed_by = "quiet"
            return batch
        if (cap is not None and len(batch.events) >= cap) \
                or batch.bytes >= limits.max_batch_bytes:
            batch.closed_by = "cap"
            return batch
        if clock() >= deadline:
            batch.closed_by = "wait"
            return batch
        if stop is not None and stop.is_set():
            batch.closed_by = "stop"
            return batch
