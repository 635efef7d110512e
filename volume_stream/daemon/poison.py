"""Poison events: find the events of a failing batch that fail on their own, and what to do
with them and their messages (DESIGN §6.3).

A batch that keeps failing is bisected. Only a batch in which some events commit proves the
table healthy, so only then are the failing ones poison: they are written to the volume's
dead-letter file and their messages are left to the queue's redrive policy (not
acknowledged). If nothing commits (the table's storage is failing, or the batch is all
poison), nothing is dead-lettered: a queue batch is released unacknowledged (its messages come
back after their visibility timeout), a local batch is retried with backoff.

    isolator = PoisonIsolator("landing", commit_events, table_version, dead_letters, metrics)
    isolator.isolate(batch)          # commits what it can, marks batch.poisoned / .released
    handles = handles_to_ack(batch)  # what may be acknowledged after that
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connectors.events import FileEvent
from volume_stream.daemon.metrics import DaemonMetrics
from volume_stream.volumes.batching import Batch
from volume_stream.warehouse.dead_letters import DeadLetters

__all__ = ["PoisonIsolator", "handles_to_ack"]

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


class PoisonIsolator:
    """Bisect a failing batch of one volume (module docstring).

    Args:
        volume: The volume's name (for logs, metrics and dead-letter records).
        commit_events: Commits a list of events in one version (raises on failure).
        table_version: Reads the table's version (raises when the table is unreachable).
        dead_letters: Where poison events are written.
        metrics: Where they are counted.
    """

    def __init__(self, volume: str, commit_events: Callable[[list[FileEvent]], None],
                 table_version: Callable[[], int], dead_letters: DeadLetters,
                 metrics: DaemonMetrics) -> None:
        self.volume = volume
        self._commit = commit_events
        self._table_version = table_version
        self.dead_letters = dead_letters
        self.metrics = metrics

    def isolate(self, batch: Batch) -> None:
        """Commit what commits on its own; dead-letter what fails on its own (when something
        committed); otherwise release a queue batch or re-raise for a local one."""
        self._table_version()  # the table is reachable, so suspect the events
        progress = _Bisection()
        try:
            self._bisect(batch.events, progress)
            if progress.bad and not progress.ok:
                raise _NothingCommits(progress.bad[-1][1])
        except _NothingCommits as nothing:
            if not batch.handles:
                raise nothing.cause from None
            batch.released = True
            self.metrics.errors.labels(self.volume, "apply").inc()
            log.warning("volume %s: no event of a batch of %d commits (%s); releasing its %d "
                        "messages to the queue unacknowledged", self.volume, len(batch.events),
                        nothing.cause, len(batch.handles), extra={"volume": self.volume})
            return
        records = []
        for event, exc in progress.bad:
            batch.poisoned.append(event)
            records.append(self._dead_letter(event, exc))
        self._write(records)

    def _bisect(self, events: list[FileEvent], progress: _Bisection) -> None:
        try:
            self._commit(events)
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
        self.metrics.events_poison.labels(self.volume).inc()
        record = {"ts": datetime.now(UTC).isoformat(), "volume": self.volume,
                  "error": f"{type(exc).__name__}: {exc}",
                  "event": {"kind": str(event.kind), "relative_path": event.relative_path,
                            "size": event.size, "etag": event.etag,
                            "last_modified_time": event.last_modified_time,
                            "sequencer": event.sequencer, "event_time": event.event_time,
                            "source_id": event.source_id}}
        log.error("volume %s: poison event for %r (%s) written to %s", self.volume,
                  event.relative_path, record["error"], self.dead_letters.location,
                  extra={"volume": self.volume, "source_id": event.source_id})
        return record

    def _write(self, records: list[dict[str, Any]]) -> None:
        """One write per batch (one object per batch on an object store)."""
        if not records:
            return
        try:
            self.dead_letters.write(records)
        except OSError as write_error:
            log.error("volume %s: cannot write the dead letters to %s: %s", self.volume,
                      self.dead_letters.location, write_error)


def handles_to_ack(batch: Batch, volume: str) -> list[Any]:
    """The handles of a committed batch that may be acknowledged: none of a released batch,
    and not those of messages that carried a poison event (all of them when which message
    carried it is unknown)."""
    handles = batch.handles
    if batch.released:
        return []
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
                        "redrive policy", volume, len(held), extra={"volume": volume})
    return list(handles)
