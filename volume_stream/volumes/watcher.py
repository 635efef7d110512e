"""Run a volume's listener: receive events, commit them to the directory table, acknowledge
them after the commit (DESIGN §6). `Catalog.watch` drives one of these in the foreground; the
daemon drives several.

    watcher = VolumeWatcher(table, listener, accept, refresh)
    while True:
        step = watcher.step(timeout=1.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from connectors.events import FileEvent
from connectors.protocols import Listener, Received
from directory_table import ApplyResult, DirectoryTable
from volume_stream.volumes.batching import Batch, BatchLimits, CommitModel, gather

__all__ = ["StepResult", "VolumeWatcher", "WatchMetrics"]

log = logging.getLogger("volume_stream.watcher")


@dataclass
class WatchMetrics:
    """Running totals of one watch."""

    received: int = 0
    applied: int = 0
    ignored: int = 0
    malformed: int = 0
    filtered: int = 0
    versions: list[int] = field(default_factory=list)
    refreshes: int = 0
    #: files the refreshes (the catch-up, or one after lost events) inserted, updated, deleted
    refreshed: int = 0
    seconds: float = 0.0

    def count_refresh(self, result: object) -> None:
        """Add what one refresh committed (its version too) to the totals."""
        self.refreshes += 1
        self.refreshed += sum(int(getattr(result, k, 0) or 0)
                              for k in ("inserted", "updated", "deleted"))
        version = getattr(result, "version", None)
        if version is not None:
            self.versions.append(version)

    def as_dict(self) -> dict:
        return {"received": self.received, "applied": self.applied, "ignored": self.ignored,
                "malformed": self.malformed, "filtered": self.filtered,
                "versions": list(self.versions), "refreshes": self.refreshes,
                "refreshed": self.refreshed, "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class StepResult:
    result: ApplyResult | None
    idle: bool


@contextmanager
def keep_invisible(listener: Listener, handles: Sequence[Any], *, every_s: float,
                   visibility_s: int) -> Iterator[None]:
    """While the block runs, extend the messages' visibility every `every_s` seconds, so a
    long commit does not let the queue hand them to another receiver (DESIGN §6)."""
    if not handles:
        yield
        return
    stop = threading.Event()

    def extend() -> None:
        while not stop.wait(every_s):
            try:
                listener.extend(handles, visibility_s)
            except Exception:  # the commit matters more; redelivery is harmless
                log.warning("could not extend the visibility of %d messages", len(handles),
                            exc_info=True)

    thread = threading.Thread(target=extend, name="volume-stream-keep-invisible", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class VolumeWatcher:
    """One receive → apply → ack cycle at a time, for one volume.

    `extend_every_s` / `visibility_s`: while a batch is being committed, its messages' visibility
    is extended every `extend_every_s` seconds by `visibility_s` seconds. `limits`: the group
    commit caps `step` gathers its batches with (`volume_stream.volumes.batching`).
    """

    def __init__(self, table: DirectoryTable, listener: Listener,
                 accept: Callable[[str], bool], refresh: Callable[..., object], *,
                 extend_every_s: float = 20.0, visibility_s: int = 120,
                 limits: BatchLimits | None = None):
        self.table = table
        self.listener = listener
        self.accept = accept
        self.refresh = refresh
        self.extend_every_s = extend_every_s
        self.visibility_s = visibility_s
        self.metrics = WatchMetrics()
        self.limits = limits or BatchLimits()
        self.model = CommitModel()

    # ------------------------------------------------------------------ the steps
    # `step` runs them in order; the daemon's VolumeRunner runs the same steps with its own
    # batching, backoff and poison handling around them.
    def receive(self, timeout: float) -> Received:
        """Wait up to `timeout` seconds for events from the listener."""
        return self.listener.receive(timeout)

    def accepted(self, events: Sequence[FileEvent]) -> list[FileEvent]:
        """The events whose paths the volume counts (recursion, include/exclude)."""
        return [e for e in events if self.accept(e.relative_path)]

    def holding(self, handles: Sequence[Any]):
        """Keep the messages of `handles` invisible while the block commits them."""
        return keep_invisible(self.listener, handles, every_s=self.extend_every_s,
                              visibility_s=self.visibility_s)

    def commit(self, events: Sequence[FileEvent]) -> ApplyResult:
        """Apply the events to the directory table in one commit (no version if no change)."""
        return self.table.apply(list(events))

    def ack(self, handles: Sequence[Any]) -> None:
        """Acknowledge messages; call only once the commit holding their events is durable."""
        if handles:
            self.listener.ack(handles)

    def table_version(self) -> int:
        """The directory table's latest version (also: is the table reachable)."""
        return self.table.version()

    def backlog(self) -> int | None:
        """The listener's queue backlog, if it can tell."""
        backlog = getattr(self.listener, "backlog", None)
        return backlog() if callable(backlog) else None

    @property
    def listener_kind(self) -> str:
        return type(self.listener).__name__

    def close(self) -> None:
        self.listener.close()

    def step(self, timeout: float) -> StepResult:
        """One gather → commit → acknowledge cycle: wait up to `timeout` for a first event,
        then take everything pending, within the group commit caps."""
        batch = gather(self.receive, poll_s=timeout, limits=self.limits, model=self.model,
                       accept=self._count)
        with self.holding(batch.handles):
            result = self._commit(batch)
        self.ack(batch.handles)  # only now that the commit (if any) is durable
        return StepResult(result, idle=batch.empty and self.listener.idle)

    def _count(self, received: Received) -> list[FileEvent]:
        m = self.metrics
        m.received += len(received.events)
        m.malformed += received.malformed
        m.ignored += received.ignored
        events = self.accepted(received.events)
        m.filtered += len(received.events) - len(events)
        return events

    def _commit(self, batch: Batch) -> ApplyResult | None:
        m = self.metrics
        if batch.needs_refresh:
            log.warning("listener lost events; running a full refresh")
            m.count_refresh(self.refresh())
        events = batch.events
        result = None
        if events:
            started = time.perf_counter()
            result = self.commit(events)
            self.model.observe(len(events), time.perf_counter() - started)
            m.applied += result.changed
            m.ignored += result.ignored + result.unchanged
            if result.version is not None:
                m.versions.append(result.version)
                log.info("committed version %d: +%d ~%d -%d (%d events, %.3fs)", result.version,
                         result.inserted, result.updated, result.deleted, len(events),
                         result.seconds)
        return result

    def catch_up(self) -> None:
        """Commit what changed while nothing listened: a full refresh, as the daemon runs at
        start. The listener is already on, so a change made during the listing is also
        received afterwards (and changes nothing if the listing had it)."""
        self.metrics.count_refresh(self.refresh())
        log.info("caught up (%d files changed); listening for events", self.metrics.refreshed)

    def run(self, *, until_idle: bool = False, timeout: float | None = None,
            poll: float = 0.5, on_step: Callable[[StepResult], None] | None = None,
            catch_up: bool = False) -> WatchMetrics:
        """Loop until idle (if asked), the timeout, or Ctrl-C; return the totals.

        With `catch_up=True` a refresh runs first (see `catch_up`)."""
        started = time.monotonic()
        try:
            if catch_up:
                self.catch_up()
            while True:
                remaining = None if timeout is None else timeout - (time.monotonic() - started)
                if remaining is not None and remaining <= 0:
                    break
                step = self.step(poll if remaining is None else min(poll, remaining))
                if on_step:
                    on_step(step)
                if until_idle and step.idle:
                    break
        except KeyboardInterrupt:
            log.info("watch interrupted; stopping cleanly")
        self.metrics.seconds = time.monotonic() - started
        return self.metrics
