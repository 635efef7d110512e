"""One volume's loop inside the daemon: receive events, batch them, commit, acknowledge.

A `VolumeRunner` owns one thread. It opens the volume's `VolumeWatcher` (whatever the backend:
the watcher carries the listener, the path filter and the refresh), runs a full-listing refresh
at start (the listener is already running, so nothing falls between the two), then loops:

1. gather a batch by group commit (`volume_stream.volumes.batching`): wait up to `poll_s` for
   a first event, then take everything already pending, and commit as soon as a receive finds
   the queue quiet, or the batch reaches its cap (memory, `max_batch_bytes`; the events that
   commit within about `target_commit_s` by the commit times measured so far; an optional
   fixed `max_batch_events`), or `max_wait_s` passed since its first event. A quiet queue
   commits each event at once; under load a batch holds what arrived during the previous
   commit, so batches grow with the load;
2. commit them as one `DirectoryTable.apply` (one version, or none if nothing changed);
3. acknowledge the messages only after that commit;
4. refresh when the listener says it lost events, and every `refresh_interval_s`;
   compact the directory table every `optimize_interval_s` (`DirectoryTable.optimize`).

Failures back off exponentially (with jitter) and keep the batch: it is retried, never
acknowledged before it commits, so a crash or a stop at any point loses nothing (unacknowledged
messages come back; local events lost with the process are healed by the start refresh) and
applies nothing twice (the table ignores events it already holds). A batch that keeps failing
is bisected (`volume_stream.daemon.poison`), so neither a poison message nor a failing disk
throws events away or stops the loop for good.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from connectors.events import FileEvent
from connectors.protocols import Received
from volume_stream.config.daemon import DaemonTuning, VolumeConfig
from volume_stream.daemon.loop import LoopThread
from volume_stream.daemon.metrics import DaemonMetrics
from volume_stream.daemon.poison import PoisonIsolator, handles_to_ack
from volume_stream.errors import InventoryError
from volume_stream.volumes.batching import Batch, CommitModel, gather
from volume_stream.volumes.watcher import VolumeWatcher
from volume_stream.warehouse.dead_letters import DeadLetters

__all__ = ["VolumeRunner"]

log = logging.getLogger("volume_stream.daemon")

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
        self._pending: Batch | None = None
        self.limits = config.batch_limits()
        self.model = CommitModel()
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
                "last_refresh": self.last_refresh, "commit_model": self.model.as_dict(),
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

    def _commit_and_ack(self, batch: Batch) -> None:
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

    def _collect(self) -> Batch | None:
        """Gather a batch by group commit (module docstring, step 1)."""
        assert self._watcher is not None
        self._stage = "receive"
        batch = gather(self._watcher.receive, poll_s=self.config.poll_s, limits=self.limits,
                       model=self.model, accept=self._account, stop=self._stop,
                       on_error=self._receive_failed)
        if batch.empty:
            return None
        if batch.needs_refresh:
            self._refresh_reason = self._refresh_reason or "listener"
        return batch

    def _receive_failed(self, exc: Exception, batch: Batch) -> None:
        # keep what we hold: commit it now, the error comes back on the next receive
        self.metrics.errors.labels(self.name, "receive").inc()
        log.warning("volume %s: receive failed mid-batch (%s); committing the %d events held",
                    self.name, exc, len(batch.events), extra={"volume": self.name})

    def _account(self, received: Received) -> list[FileEvent]:
        self.beat = self._clock()
        m, v, events = self.metrics, self.name, received.events
        accepted = self._watcher.accepted(events)
        m.events_received.labels(v).inc(len(events))
        m.events_filtered.labels(v).inc(len(events) - len(accepted))
        m.messages_malformed.labels(v).inc(received.malformed)
        m.events_ignored.labels(v).inc(received.ignored)
        info = received.info or {}
        backlog = info.get("backlog", info.get("pending"))
        if isinstance(backlog, int | float):
            m.queue_backlog.labels(v).set(backlog)
        return accepted

    # ------------------------------------------------------------------ commit
    def _apply(self, batch: Batch) -> None:
        if not batch.events:
            return
        self._stage = "apply"
        try:
            self._apply_events(batch.events)
            m, v = self.metrics, self.name
            m.batch_bytes.labels(v).observe(batch.bytes)
            if batch.first_at is not None:
                m.batch_latency.labels(v).observe(time.monotonic() - batch.first_at)
            cap = self.model.cap(self.limits.target_commit_s)
            m.batch_cap.labels(v).set(-1 if cap is None else cap)
        except Exception:
            batch.attempts += 1
            if batch.attempts % self.tuning.poison_after:
                raise
            assert self._watcher is not None
            PoisonIsolator(self.name, self._apply_events, self._watcher.table_version,
                           self.dead_letters, self.metrics).isolate(batch)

    def _apply_events(self, events: list[FileEvent]) -> None:
        assert self._watcher is not None
        started = time.perf_counter()
        result = self._watcher.commit(events)
        seconds = time.perf_counter() - started
        self.model.observe(len(events), seconds)
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

    def _ack(self, batch: Batch) -> None:
        handles = handles_to_ack(batch, self.name)
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
