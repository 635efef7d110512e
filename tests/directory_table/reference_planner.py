"""The per-event planner the directory table used before planning moved onto Arrow columns
(`directory_table.batch`, `directory_table.planner`), kept verbatim as the reference the
property tests compare the columnar planner with (`test_planner.py`).

One Python object per event and per stored row: what the columnar planner must agree with,
event for event, on every batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from connectors.events import EventKind, FileEvent, is_newer

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class StoredRow:
    """What the table (or its tombstones) holds for one path, as far as ordering needs."""

    size: int | None
    etag: str | None
    last_modified_time: datetime | None
    sequencer: str | None
    event_time: datetime | None
    #: version that wrote the row (or, for a tombstone, that deleted it)
    version: int | None = None


@dataclass
class Plan:
    inserts: list[FileEvent] = field(default_factory=list)
    updates: list[FileEvent] = field(default_factory=list)
    deletes: list[FileEvent] = field(default_factory=list)
    #: events dropped: superseded in the batch, older than or equal to the stored state,
    #: folder markers, removals of unknown paths
    ignored: int = 0
    #: CREATED events whose image equals the stored row
    unchanged: int = 0
    #: REMOVED events of paths the table does not hold (yet), newer than their tombstone:
    #: remembered as tombstones (no directory change), so that the CREATED they follow,
    #: delivered late (a queue redelivers out of order), is recognised as older
    remembered: list[FileEvent] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.inserts or self.updates or self.deletes)


def stored_rows(table: pa.Table) -> dict[str, StoredRow]:
    """path -> StoredRow of the rows of a directory table (or of its tombstones) read back."""
    cols = table.to_pydict()
    n = table.num_rows
    version = cols.get("_image_version") or cols.get("deleted_version") or [None] * n
    return {
        path: StoredRow(size, etag, lmt, seq, evt, v)
        for path, size, etag, lmt, seq, evt, v in zip(
            cols["relative_path"], cols.get("size", [None] * n), cols.get("etag", [None] * n),
            cols.get("last_modified_time", [None] * n), cols["_sequencer"],
            cols["_event_time"], version, strict=True)
    }


def newest_per_path(events: Iterable[FileEvent]) -> tuple[dict[str, FileEvent], int]:
    """Keep the newest event of each path; later arrival wins a tie. Returns (latest, dropped)."""
    latest: dict[str, FileEvent] = {}
    dropped = 0
    for event in events:
        if event.is_folder_marker:
            dropped += 1
            continue
        current = latest.get(event.relative_path)
        if current is not None:
            dropped += 1
            order = is_newer(event.sequencer, event.event_time,
                             current.sequencer, current.event_time)
            if order < 0:
                continue
        latest[event.relative_path] = event
    return latest, dropped


def _same_image(event: FileEvent, row: StoredRow) -> bool:
    if event.size != row.size or event.etag != row.etag:
        return False
    # With etags on both sides the etag decides: stores report LastModified at different
    # precisions in events and listings. Without, the time is all there is.
    return event.etag is not None or event.last_modified_time == row.last_modified_time


def plan_changes(
    latest: Mapping[str, FileEvent],
    stored: Mapping[str, StoredRow],
    tombstones: Mapping[str, StoredRow],
    base_version: int | None = None,
) -> Plan:
    """Decide, per path, whether the newest event inserts, updates, deletes or does nothing.

    With `base_version` (refresh events), see the module docstring.
    """
    plan = Plan()
    for path, event in latest.items():
        row = stored.get(path)
        if base_version is not None:
            _plan_listed(plan, event, row, tombstones.get(path), base_version)
        elif event.kind is EventKind.CREATED:
            if row is None:
                tomb = tombstones.get(path)
                if tomb is not None and is_newer(event.sequencer, event.event_time,
                                                 tomb.sequencer, tomb.event_time) <= 0:
                    plan.ignored += 1
                else:
                    plan.inserts.append(event)
            elif is_newer(event.sequencer, event.event_time, row.sequencer, row.event_time) <= 0:
                plan.ignored += 1
            elif _same_image(event, row):
                plan.unchanged += 1
            else:
                plan.updates.append(event)
        elif row is not None:
            if is_newer(event.sequencer, event.event_time, row.sequencer, row.event_time) > 0:
                plan.deletes.append(event)
            else:
                plan.ignored += 1
        else:
            plan.ignored += 1
            tomb = tombstones.get(path)
            if tomb is None or is_newer(event.sequencer, event.event_time, tomb.sequencer,
                                        tomb.event_time) > 0:
                plan.remembered.append(event)
    return plan


def _plan_listed(plan: Plan, event: FileEvent, row: StoredRow | None,
                 tomb: StoredRow | None, base_version: int) -> None:
    changed_since = row.version if row is not None else (tomb.version if tomb else None)
    if changed_since is not None and changed_since > base_version:
        plan.ignored += 1
    elif event.kind is EventKind.CREATED:
        if row is None:
            plan.inserts.append(event)
        elif _same_image(event, row):
            plan.unchanged += 1
        else:
            plan.updates.append(event)
    elif row is not None:
        plan.deletes.append(event)
    else:
        plan.ignored += 1
