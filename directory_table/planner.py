"""Turn a batch of `FileEvent`s into the row changes one commit must make (DESIGN §4.2).

Pure functions, no I/O: the table hands in the stored rows of the touched paths and gets back
a `Plan`. Per path only the newest event counts (sequencer when both sides have one, else event
time, then arrival order: `directory_table.batch`); an event no newer than what the table holds
is ignored; a CREATED whose image equals the stored one changes nothing. So redelivered and
reordered events are harmless, and a batch of duplicates plans nothing.

Refresh events are different: they state what a listing saw, diffed against version
`base_version`. They are ordered by versions, not clocks (a listing's time and the store's
event times come from different clocks): a path the table changed after `base_version` was
changed by a newer event and is left alone; any other path takes the listing's state.

Everything is decided on Arrow columns, a batch at a time: each newest event is joined with
the stored row (and tombstone) of its path, and the comparisons that decide insert, update,
delete or nothing run over whole columns (`batch.newer` orders them as `is_newer` does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from directory_table.batch import Batch, _null, newer
from directory_table.schema import TS

__all__ = ["Plan", "plan_changes"]

_EMPTY = np.zeros(0, dtype=np.int64)


def _rows() -> np.ndarray:
    return _EMPTY


@dataclass
class Plan:
    """What one commit does, as rows of the batch's `Batch.table` (events in arrival order)."""

    inserts: np.ndarray = field(default_factory=_rows)
    updates: np.ndarray = field(default_factory=_rows)
    deletes: np.ndarray = field(default_factory=_rows)
    #: events dropped: older than or equal to the stored state, removals of unknown paths
    #: (those superseded in the batch and folder markers are `Batch.dropped`)
    ignored: int = 0
    #: CREATED events whose image equals the stored row
    unchanged: int = 0
    #: REMOVED events of paths the table does not hold (yet), newer than their tombstone:
    #: remembered as tombstones (no directory change), so that the CREATED they follow,
    #: delivered late (a queue redelivers out of order), is recognised as older
    remembered: np.ndarray = field(default_factory=_rows)

    @property
    def empty(self) -> bool:
        return not (len(self.inserts) or len(self.updates) or len(self.deletes))

    def __iadd__(self, other: Plan) -> Plan:
        self.inserts = np.concatenate([self.inserts, other.inserts])
        self.updates = np.concatenate([self.updates, other.updates])
        self.deletes = np.concatenate([self.deletes, other.deletes])
        self.remembered = np.concatenate([self.remembered, other.remembered])
        self.ignored += other.ignored
        self.unchanged += other.unchanged
        return self


def _np(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _positions(keys: pa.Array, stored: pa.Table | None) -> np.ndarray:
    """Per key, the row of `stored` holding it (the last such row, as a dict built from the
    rows would keep), or -1."""
    if stored is None or stored.num_rows == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    n = stored.num_rows
    reverse = pa.array(np.arange(n - 1, -1, -1), pa.int64())
    found = pc.index_in(keys, value_set=stored["relative_path"].combine_chunks().cast(pa.string()).take(reverse))
    found = _np(pc.fill_null(found, -1)).astype(np.int64)
    return np.where(found >= 0, n - 1 - found, -1)


def _at(stored: pa.Table | None, rows: np.ndarray, column: str, type_: pa.DataType,
        ) -> pa.Array:
    """`stored[column]` at `rows` (-1: null); all nulls when `stored` lacks the column."""
    if stored is None or column not in stored.column_names:
        return pa.nulls(len(rows), type_)
    index = pa.array(rows, pa.int64(), mask=rows < 0)
    values = stored[column].combine_chunks().take(index)
    return values if values.type == type_ else values.cast(type_)


def _same(a: pa.Array, b: pa.Array) -> np.ndarray:
    """Python's `==` row by row: equal values, or None on both sides."""
    equal = _np(pc.fill_null(pc.equal(a, b), False))
    return equal | (_null(a) & _null(b))


def plan_changes(
    batch: Batch,
    rows: np.ndarray,
    stored: pa.Table | None,
    tombstones: Callable[[list[str]], pa.Table | None],
    base_version: int | None = None,
) -> Plan:
    """Decide, for the newest events at `rows` of `batch`, whether each inserts, updates,
    deletes or does nothing.

    `stored`: the table's rows of (at least) those paths (`relative_path`, `size`, `etag`,
    `last_modified_time`, `_sequencer`, `_event_time`, `_image_version`), or None.
    `tombstones(paths)`: the tombstones (`relative_path`, `_sequencer`, `_event_time`,
    `deleted_version`) of the paths `stored` does not hold; called only when there are some.
    With `base_version` (refresh events), see the module docstring.
    """
    rows = np.asarray(rows, dtype=np.int64)
    event = batch.take(rows)
    paths = event["relative_path"].combine_chunks()
    at = _positions(paths, stored)
    has_row = at >= 0
    missing = np.flatnonzero(~has_row)
    tombs = tombstones(paths.take(pa.array(missing, pa.int64())).to_pylist()) \
        if len(missing) else None
    tomb_at = _positions(paths, tombs)
    has_tomb = (tomb_at >= 0) & ~has_row  # a tombstone counts only for a path not stored
    created = _np(event["created"])
    seq = event["_sequencer"].combine_chunks()
    time = event["_event_time"].combine_chunks()

    def same_image() -> np.ndarray:
        if not (created & has_row).any():
            return np.zeros(len(rows), dtype=bool)
        etag = event["etag"].combine_chunks()
        image = (_same(event["size"].combine_chunks(), _at(stored, at, "size", pa.int64()))
                 & _same(etag, _at(stored, at, "etag", pa.string())))
        # With etags on both sides the etag decides: stores report LastModified at different
        # precisions in events and listings. Without, the time is all there is.
        lmt = _same(event["last_modified_time"].combine_chunks(),
                    _at(stored, at, "last_modified_time", TS))
        return image & (_np(pc.is_valid(etag)) | lmt)

    plan = Plan()
    if base_version is not None:
        version = np.where(
            has_row, _np(pc.fill_null(_at(stored, at, "_image_version", pa.int64()), -1)),
            _np(pc.fill_null(_at(tombs, tomb_at, "deleted_version", pa.int64()), -1)))
        version = np.where(has_row | has_tomb, version, -1)
        later = version > base_version  # changed since the listing: a newer event did it
        same = same_image()
        pick = ~later & created
        plan.inserts = rows[pick & ~has_row]
        plan.unchanged = int(np.count_nonzero(pick & has_row & same))
        plan.updates = rows[pick & has_row & ~same]
        plan.deletes = rows[~later & ~created & has_row]
        plan.ignored = int(np.count_nonzero(later | (~created & ~has_row)))
        return plan

    def than(table: pa.Table | None, where: np.ndarray, needed: np.ndarray) -> np.ndarray:
        if not needed.any():
            return np.zeros(len(rows), dtype=np.int8)
        return newer(seq, time, _at(table, where, "_sequencer", pa.string()),
                     _at(table, where, "_event_time", TS), needed=needed)

    than_row, than_tomb = than(stored, at, has_row), than(tombs, tomb_at, has_tomb)
    fresh = has_row & (than_row > 0)  # newer than the stored row
    blocked = has_tomb & (than_tomb <= 0)  # no newer than the path's tombstone
    same = same_image()
    plan.inserts = rows[created & ~has_row & ~blocked]
    plan.unchanged = int(np.count_nonzero(created & fresh & same))
    plan.updates = rows[created & fresh & ~same]
    plan.deletes = rows[~created & fresh]
    plan.remembered = rows[~created & ~has_row & ~blocked]
    plan.ignored = int(np.count_nonzero(
        (created & ~has_row & blocked) | (has_row & ~fresh) | (~created & ~has_row)))
    return plan
