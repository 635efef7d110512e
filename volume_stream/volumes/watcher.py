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

from connectors.base import Listener, Received
from directory_table import ApplyResult, DirectoryTable

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
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"received": self.received, "applied": self.applied, "ignored": self.ignored,
                "malformed": self.malformed, "filtered": self.filtered,
                "versions": list(self.versions), "refreshes": self.refreshes,
                "seconds": round(self.seconds, 3)}


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
    is extended every `extend_every_s` seconds by `visibility_s` seconds.
    """

    def __init__(self, table: DirectoryTable, listener: Listener,
                 accept: Callable[[str], bool], refresh: Callable[[], object], *,
                 extend_every_s: float = 20.0, visibility_s: int = 120):
        self.table = table
        self.listener = listener
        self.accept = accept
        self.refresh = refresh
        self.extend_every_s = extend_every_s
        self.visibility_s = visibility_s
        self.metrics = WatchMetrics()

    def step(self, timeout: float) -> StepResult:
        received = self.listener.receive(timeout)
        m = self.metrics
        m.received += len(received.events)
        m.malformed += received.malformed
        m.ignored += received.ignored
        with keep_invisible(self.listener, received.handles, every_s=self.extend_every_s,
                            visibility_s=self.visibility_s):
            result = self._commit(received)
        # Acknowledge only now that the commit (if any) is durable.
        if received.handles:
            self.listener.ack(received.handles)
        return StepResult(result, idle=received.empty and self.listener.idle)

    def _commit(self, received: Received) -> ApplyResult | None:
        m = self.metrics
        if received.needs_refresh:
            log.warning("listener lost events; running a full refresh")
            self.refresh()
            m.refreshes += 1
        events = [e for e in received.events if self.accept(e.relative_path)]
        m.filtered += len(received.events) - len(events)
        result = None
        if events:
            result = self.table.apply(events)
            m.applied += result.changed
            m.ignored += result.ignored + result.unchanged
            if result.version is not None:
                m.versions.append(result.version)
                log.info("committed version %d: +%d ~%d -%d (%d events, %.3fs)", result.version,
                         result.inserted, result.updated, result.deleted, len(events),
                         result.seconds)
        return result

    def run(self, *, until_idle: bool = False, timeout: float | None = None,
            poll: float = 0.5, on_step: Callable[[StepResult], None] | None = None,
            ) -> WatchMetrics:
        """Loop until idle (if asked), the timeout, or Ctrl-C; return the totals."""
        started = time.monotonic()
        try:
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
