"""One volume's loop inside the daemon: receive events, batch them, commit, acknowledge.

A `VolumeRunner` owns one thread. It opens the volume's `VolumeWatcher` (whatever the backend:
the watcher carries the listener, the path filter and the refresh), runs a full-listing refresh
at start (the listener is already running, so nothing falls between the two), then loops:

1. receive a batch adaptively: wait up to `poll_s` for a first event, then keep taking what
   is already there (receives that do not wait) while events keep coming, and commit as soon
   as one of them comes back empty, or the batch holds `max_batch_events`, or `max_wait_s`
   passed since its first event. A quiet queue commits each event at once; under load a batch
   grows to what arrived during the previous commit, up to those caps;
2. commit them as one `DirectoryTable.apply` (one version, or none if nothing changed);
3. acknowledge the messages only after that commit;
4. refresh when the listener says it lost events, and every `refresh_interval_s`;
   compact the directory table every `optimize_interval_s` (`DirectoryTable.optimize`).

Failures back off exponentially (with jitter) and keep the batch: it is retried, never
acknowledged before it commits, so a crash or a stop at any point loses nothing (unacknowledged
messages come back; local events lost with the process are healed by the start refresh) and
applies nothing twice (the table ignores events it already holds). A batch that keeps failing
is bisected: if some of its events commit, the ones that fail on their own are poison and go to
a dead-letter file, and their messages are left to the queue's redrive policy; if none commits,
a queue batch is released unacknowledged and a local one is retried, so neither a poison
message nor a failing disk throws events away or stops the loop for good.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connectors.events import FileEvent
from volume_stream.config.daemon import DaemonTuning, VolumeConfig
from volume_stream.daemon.loop import LoopThread
from volume_stream.daemon.metrics import DaemonMetrics
from volume_stream.errors import InventoryError
from volume_stream.volumes.watcher import VolumeWatcher
from volume_stream.warehouse.dead_letters import DeadLetters

__all__ = ["VolumeRunner"]

log = logging.getLogger("volume_stream.daemon")

#: A bisection that finds this many failing single events and no success stops early: the
#: fault is not in particular events (and bisecting a large batch would cost ~2n commits).
_NOTHING_COMMITS_AFTER = 3


class _NothingCommits(Exception):
    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass
class _Bisection:
    ok: int = 0
    bad: list[tuple[FileEvent, Exception]] = field(default_factory=list)


@dataclass
class _Batch:
    events: list[FileEvent] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)
    needs_refresh: bool = False
    attempts: int = 0
    released: bool = False  # nothing commits: give the messages back unacknowledged
    poisoned: list[FileEvent] = field(default_factory=list)  # dead-lettered events
    #: event source_id -> message handle, when the listener says (`Received.source_handles`)
    handle_of: dict[str, Any] = field(default_factory=dict)


class VolumeRunner(LoopThread):
    """The receive → commit → acknowledge loop of one volume, on its own thread.

    Args:
        name: The volume.
        config: Its `[volumes.NAME]` table.
        open_watcher: Builds a running `VolumeWatcher` for a volume name (`Catalog.watcher`).
        metrics: Where counts and timings go.
        tuning: Backoff, poison and liveness settings.
        dead_letter_dir: Where poison events are written (`<volume>.jsonl`).
        stop: Set to make the loop finish its batch and return.

    Example:
        >>> runner = VolumeRunner("landing", VolumeConfig(), cat.watcher, DaemonMetrics(),
        ...                       DaemonTuning(), Path("/tmp/dlq"), threading.Event())
        >>> runner.start()
    """

    def __init__(self, name: str, config: VolumeConfig,
                 open_watcher: Callable[[str], VolumeWatcher], metrics: DaemonMetrics,
                 tuning: DaemonTuning, dead_letter_dir: Path | str, stop: threading.Event, *,
                 clock: Callable[[], float] = time.monotonic,
                 storage_options: dict[str, str] | None = None) -> None:
        self.name = name
        self.config = config
        self.tuning = tuning
        self.metrics = metrics
        self.dead_letters = DeadLetters(dead_letter_dir, name, storage_options)
        self.dead_letter_file = self.dead_letters.location
        self._open_watcher = open_watcher
        self._stop = stop
        self._clock = clock
        self._watcher: VolumeWatcher | None = None
        self._pending: _Batch | None = None
        self._refresh_reason: str | None = None
        self._next_refresh: float | None = None
        self._next_optimize: float | None = self._after(config.optimize_interval_s)
        self._next_backlog = 0.0
        self._started_once = False
        self._stage = "open"
        self.failures = 0
        self.last_error: str | None = None
        self.last_version: int | None = None
        self.last_refresh: str | None = None  # ISO time of the last refresh's end, and why
        self.commits = 0
        self.beat = clock()
        self._thread = threading.Thread(target=self._run, name=f"volume-stream-daemon-{name}",
                                        daemon=True)

    # ------------------------------------------------------------------ lifecycle
    @property
    def ready(self) -> bool:
        """Listening, the start refresh done, and the last cycle succeeded."""
        return (self._watcher is not None and self._refresh_reason != "start"
                and self.failures == 0)

    def healthy(self) -> bool:
        """Alive and beating (a loop stuck longer than `liveness_timeout_s` is not)."""
        if self._stop.is_set():
            return True
        return self.alive and self._clock() - self.beat < self.tuning.liveness_timeout_s

    def status(self) -> dict[str, Any]:
        return {"alive": self.alive, "ready": self.ready, "listening": self._watcher is not None,
                "failures": self.failures, "last_error": self.last_error,
                "last_version": self.last_version, "commits": self.commits,
                "last_refresh": self.last_refresh,
                "seconds_since_beat": round(self._clock() - self.beat, 3)}

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._cycle()
                except Exception as exc:
                    self._failed(exc)
                else:
                    if self.failures:
                        log.info("volume %s recovered after %d failures", self.name,
                                 self.failures, extra={"volume": self.name})
                    self.failures = 0
                    self.last_error = None
                self.metrics.volume_ready.labels(self.name).set(1 if self.ready else 0)
            self._drain()
        finally:
            self._close_watcher()
            self.metrics.volume_ready.labels(self.name).set(0)
            log.info("volume %s stopped", self.name, extra={"volume": self.name})

    def _cycle(self) -> None:
        self.beat = self._clock()
        if self._watcher is None:
            self._open()
        if self._pending is None:
            if self._refresh_due():
                self._refresh()
            if self._next_optimize is not None and self._clock() >= self._next_optimize:
                self._optimize()
            self._update_backlog()
            self._pending = self._collect()
            if self._pending is None:
                return
        self._commit_and_ack(self._pending)

    def _commit_and_ack(self, batch: _Batch) -> None:
        watcher = self._watcher
        assert watcher is not None
        # A long commit must not let the queue hand the messages to another receiver.
        with watcher.holding(batch.handles):
            self._apply(batch)
        self._pending = None
        self._ack(batch)

    def _drain(self) -> None:
        """On stop: one last try to commit a held batch (else its messages come back)."""
        if self._pending is None or self._watcher is None:
            return
        try:
            self._commit_and_ack(self._pending)
        except Exception as exc:
            log.warning("volume %s: stopping with an uncommitted batch of %d events (%s); "
                        "its messages stay on the queue, local events are healed by the next "
                        "start's refresh", self.name, len(self._pending.events), exc,
                        extra={"volume": self.name})

    def _open(self) -> None:
        self._stage = "open"
        self._watcher = self._open_watcher(self.name)
        if not self._started_once:
            self._started_once = True
            if self.config.refresh_on_start:
                self._refresh_reason = "start"
        else:  # the listener was down for a while: events may have been missed
            self._refresh_reason = "reopen"
        self._schedule_refresh()
        log.info("volume %s: listening (%s)", self.name, self._watcher.listener_kind,
                 extra={"volume": self.name})

    def _close_watcher(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            try:
                watcher.close()
            except Exception:
                log.exception("volume %s: closing the listener failed", self.name)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        self.last_error = f"{self._stage}: {type(exc).__name__}: {exc}"
        self.metrics.errors.labels(self.name, self._stage).inc()
        delay = min(self.tuning.backoff_max_s,
                    self.tuning.backoff_initial_s * 2 ** min(self.failures - 1, 30))
        delay *= random.uniform(0.5, 1.0)
        log.error("volume %s: %s failed (%d in a row), retrying in %.1fs: %s", self.name,
                  self._stage, self.failures, delay, exc, exc_info=self.failures == 1,
                  extra={"volume": self.name, "stage": self._stage})
        if self._stage in ("receive", "open") and self.failures >= self.tuning.reopen_after:
            self._close_watcher()  # reopened (and refreshed) on the next cycle
        self._stop.wait(delay)

    # ------------------------------------------------------------------ refresh
    def _schedule_refresh(self) -> None:
        self._next_refresh = self._after(self.config.refresh_interval_s)

    def _refresh_due(self) -> bool:
        if self._refresh_reason is None and self._next_refresh is not None \
                and self._clock() >= self._next_refresh:
            self._refresh_reason = "schedule"
        return self._refresh_reason is not None

    def _refresh(self) -> None:
        assert self._watcher is not None
        self._stage = "refresh"
        reason = self._refresh_reason or "schedule"
        started = time.perf_counter()
        report = self.config.inventory if reason == "start" else None  # DESIGN §4.4
        try:
            result = self._watcher.refresh(inventory=report) if report else self._watcher.refresh()
        except InventoryError as exc:  # a bad report: logged, counted, skipped; events flow on
            self.metrics.errors.labels(self.name, "refresh").inc()
            result = log.error("volume %s: start backfill refused: %s", self.name, exc)
        seconds = time.perf_counter() - started
        self.metrics.refreshes.labels(self.name, reason).inc()
        self.metrics.refresh_seconds.labels(self.name).observe(seconds)
        version = getattr(result, "version", None)
        if version is not None:
            self._committed(version)
        self._refresh_reason = None
        self.last_refresh = f"{datetime.now(UTC).isoformat(timespec='seconds')} ({reason})"
        self._schedule_refresh()
        log.info("volume %s: %s refresh in %.2fs%s", self.name, reason, seconds,
                 f", committed version {version}" if version is not None else ", no change",
                 extra={"volume": self.name, "reason": reason, "version": version,
                        **{k: getattr(result, k, None) for k in ("inserted", "updated",
                                                                 "deleted")}})

    # ------------------------------------------------------------------ optimize
    def _after(self, interval: float | None) -> float | None:
        return self._clock() + interval if interval else None

    def _optimize(self) -> None:
        """Compact the directory table (in this thread: no race with our own commits). A
        failure is logged and retried at the next interval; it does not stop the listener."""
        assert self._watcher is not None
        started = time.perf_counter()
        try:
            result = self._watcher.table.optimize()
        except Exception as exc:
            log.warning("volume %s: optimize failed: %s", self.name, exc, extra={"volume": self.name})
        else:
            log.info("volume %s: optimize in %.2fs, %d bucket(s) compacted", self.name,
                     time.perf_counter() - started, result.buckets_compacted,
                     extra={"volume": self.name, "files_removed": result.files_removed,
                            "files_added": result.files_added})
        self._next_optimize = self._after(self.config.optimize_interval_s)

    # ------------------------------------------------------------------ receive
    def _update_backlog(self) -> None:
        if self._watcher is None or self._clock() < self._next_backlog:
            return
        self._next_backlog = self._clock() + self.tuning.stats_interval_s
        try:
            value = self._watcher.backlog()
        except Exception as exc:
            log.warning("volume %s: reading the queue backlog failed: %s", self.name, exc)
            return
        if value is not None:
            self.metrics.queue_backlog.labels(self.name).set(value)

    def _collect(self) -> _Batch | None:
        """Receive adaptively (module docstring, step 1): after the first event, receives do
        not wait, and the first one that comes back empty closes the batch."""
        assert self._watcher is not None
        watcher, cfg = self._watcher, self.config
        batch = _Batch()
        deadline: float | None = None
        while True:
            timeout = cfg.poll_s if deadline is None else 0.0
            self._stage = "receive"
            try:
                received = watcher.receive(timeout)
            except Exception as exc:
                if not (batch.events or batch.handles or batch.needs_refresh):
                    raise
                # keep what we hold: commit it now, the error comes back on the next receive
                self.metrics.errors.labels(self.name, "receive").inc()
                log.warning("volume %s: receive failed mid-batch (%s); committing the %d "
                            "events held", self.name, exc, len(batch.events),
                            extra={"volume": self.name})
                break
            self.beat = self._clock()
            self._account(received.events, received, batch)
            if deadline is None:
                if not (batch.events or batch.handles or batch.needs_refresh):
                    return None
                deadline = self._clock() + cfg.max_wait_s
            elif not (received.events or received.handles or received.needs_refresh
                      or received.malformed or received.ignored):
                break  # the queue is quiet: commit what we hold now
            if len(batch.events) >= cfg.max_batch_events or self._clock() >= deadline \
                    or self._stop.is_set():
                break
        if batch.needs_refresh:
            self._refresh_reason = self._refresh_reason or "listener"
        return batch

    def _account(self, events: tuple[FileEvent, ...], received: Any, batch: _Batch) -> None:
        m, v = self.metrics, self.name
        accepted = self._watcher.accepted(events)
        m.events_received.labels(v).inc(len(events))
        m.events_filtered.labels(v).inc(len(events) - len(accepted))
        m.messages_malformed.labels(v).inc(received.malformed)
        m.events_ignored.labels(v).inc(received.ignored)
        info = received.info or {}
        backlog = info.get("backlog", info.get("pending"))
        if isinstance(backlog, int | float):
            m.queue_backlog.labels(v).set(backlog)
        # which message carried each event, so only a poison event's message is held
        handle_of = received.source_handles or info.get("handle_of_source")
        if handle_of:
            batch.handle_of.update(handle_of)
        batch.events.extend(accepted)
        batch.handles.extend(received.handles)
        batch.needs_refresh |= bool(received.needs_refresh)

    # ------------------------------------------------------------------ commit
    def _apply(self, batch: _Batch) -> None:
        if not batch.events:
            return
        self._stage = "apply"
        try:
            self._apply_events(batch.events)
        except Exception:
            batch.attempts += 1
            if batch.attempts % self.tuning.poison_after:
                raise
            self._isolate(batch)

    def _apply_events(self, events: list[FileEvent]) -> None:
        assert self._watcher is not None
        started = time.perf_counter()
        result = self._watcher.commit(events)
        seconds = time.perf_counter() - started
        m, v = self.metrics, self.name
        m.commit_seconds.labels(v).observe(seconds)
        m.batch_events.labels(v).observe(len(events))
        m.events_applied.labels(v).inc(result.changed)
        m.events_ignored.labels(v).inc(result.ignored + result.unchanged)
        if result.version is not None:
            m.commits.labels(v).inc()
            self._committed(result.version)
            log.info("volume %s: committed version %d: +%d ~%d -%d (%d events, %.3fs)",
                     v, result.version, result.inserted, result.updated, result.deleted,
                     len(events), seconds,
                     extra={"volume": v, "version": result.version, "events": len(events),
                            "inserted": result.inserted, "updated": result.updated,
                            "deleted": result.deleted, "seconds": round(seconds, 4)})

    def _committed(self, version: int) -> None:
        self.commits += 1
        self.last_version = version
        self.metrics.directory_version.labels(self.name).set(version)
        self.metrics.last_commit.labels(self.name).set(time.time())

    def _isolate(self, batch: _Batch) -> None:
        """Find the events that fail on their own; dead-letter them, commit the rest.

        Only a batch in which some events commit proves the table healthy, so only then are
        the failing ones poison. If nothing commits (the table's storage is failing, or the
        batch is all poison), nothing is dead-lettered: a queue batch is released unacknowledged
        (its messages come back after their visibility timeout, and the queue's redrive policy
        takes the poison ones), a local batch is retried with backoff.
        """
        assert self._watcher is not None
        self._watcher.table_version()  # the table is reachable, so suspect the events
        progress = _Bisection()
        try:
            self._bisect(batch.events, progress)
            if progress.bad and not progress.ok:
                raise _NothingCommits(progress.bad[-1][1])
        except _NothingCommits as nothing:
            if not batch.handles:
                raise nothing.cause from None
            batch.released = True
            self.metrics.errors.labels(self.name, "apply").inc()
            log.warning("volume %s: no event of a batch of %d commits (%s); releasing its %d "
                        "messages to the queue unacknowledged", self.name, len(batch.events),
                        nothing.cause, len(batch.handles), extra={"volume": self.name})
            return
        records = []
        for event, exc in progress.bad:
            batch.poisoned.append(event)
            records.append(self._dead_letter(event, exc))
        self._write_dead_letters(records)

    def _bisect(self, events: list[FileEvent], progress: _Bisection) -> None:
        try:
            self._apply_events(events)
            progress.ok += 1
        except Exception as exc:
            if len(events) > 1:
                mid = len(events) // 2
                self._bisect(events[:mid], progress)
                self._bisect(events[mid:], progress)
                return
            progress.bad.append((events[0], exc))
            if not progress.ok and len(progress.bad) >= _NOTHING_COMMITS_AFTER:
                raise _NothingCommits(exc) from exc

    def _dead_letter(self, event: FileEvent, exc: Exception) -> dict[str, Any]:
        self.metrics.events_poison.labels(self.name).inc()
        record = {"ts": datetime.now(UTC).isoformat(), "volume": self.name,
                  "error": f"{type(exc).__name__}: {exc}",
                  "event": {"kind": str(event.kind), "relative_path": event.relative_path,
                            "size": event.size, "etag": event.etag,
                            "last_modified_time": event.last_modified_time,
                            "sequencer": event.sequencer, "event_time": event.event_time,
                            "source_id": event.source_id}}
        log.error("volume %s: poison event for %r (%s) written to %s", self.name,
                  event.relative_path, record["error"], self.dead_letter_file,
                  extra={"volume": self.name, "source_id": event.source_id})
        return record

    def _write_dead_letters(self, records: list[dict[str, Any]]) -> None:
        """One write per batch (one object per batch on an object store)."""
        if not records:
            return
        try:
            self.dead_letters.write(records)
        except OSError as write_error:
            log.error("volume %s: cannot write the dead letters to %s: %s", self.name,
                      self.dead_letters.location, write_error)

    def _ack(self, batch: _Batch) -> None:
        handles = batch.handles
        if batch.released:
            return
        if batch.poisoned:
            sources = [e.source_id for e in batch.poisoned]
            if all(s in batch.handle_of for s in sources):
                held = {batch.handle_of[s] for s in sources}
                handles = [h for h in handles if h not in held]
            else:  # which message carried the poison is unknown: hold them all
                held = set(handles)
                handles = []
            if held:
                log.warning("volume %s: leaving %d messages with poison events to the queue's "
                            "redrive policy", self.name, len(held), extra={"volume": self.name})
        if not handles:
            return
        assert self._watcher is not None
        self._stage = "ack"
        try:
            self._watcher.ack(handles)
        except Exception as exc:
            # Already committed: the messages come back and are ignored as duplicates.
            self.metrics.errors.labels(self.name, "ack").inc()
            log.warning("volume %s: acknowledging %d messages failed (they will be redelivered "
                        "and ignored): %s", self.name, len(handles), exc,
                        extra={"volume": self.name})
