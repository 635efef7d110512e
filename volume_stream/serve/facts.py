"""What the status page knows of each volume, kept between polls (DESIGN §8.3).

A page polled every 2 seconds over 100 volumes and 1,000 streams cannot open every directory
table and read every stream's change feed each time. `VolumeFacts` keeps one volume's table
open and, per version, its files, bytes, oldest kept version and latest commits; a poll that
finds the version unchanged reads nothing but the log's listing. When a version arrives, only
the new commits are read: their history entries and their change feed (files and bytes move by
what it inserts and deletes), appended to the change rows kept for the streams. The oldest kept
version (a listing of the whole log) is looked at again every `OLDEST_RECHECK_S`.

A stream's pending changes are those of its offset's range (a, latest], computed from the kept
change rows with the stream rules of `streams.changes` (the same as `describe_stream`) once
per (mode, offset, version): ten streams at one offset cost one computation, and the rows kept
go back only as far as the oldest offset asked for.

    facts = VolumeFacts(catalog.directory_table("landing"))
    facts.refresh()                  # the latest version; reads only what is new
    facts.files, facts.bytes, facts.history[:1]
    facts.pending("STANDARD", offset=3)
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from volume_stream.streams import changes as ch
from volume_stream.streams.reader import records

__all__ = ["HISTORY", "VolumeFacts"]

#: commits kept per volume, newest first (to date pending changes, and for the charts)
HISTORY = 200
#: seconds between two looks at the oldest kept version (a listing of the whole log, which
#: only retention moves): a stream turns stale on the page at most this late
OLDEST_RECHECK_S = 30.0

_ADDS = ("insert", "update_postimage")
_REMOVES = ("delete", "update_preimage")


class VolumeFacts:
    """One volume's directory table and its facts at its latest version (see module docstring).

    Thread-safe: a poll and the daemon's statistics pass may ask at once; hold `lock` to use
    `table` directly (its open Delta handle is brought up to date in place).
    """

    def __init__(self, table: Any) -> None:
        self.table = table
        self.version: int | None = None
        self.files = 0
        self.bytes = 0
        self.oldest = 0
        self.history: list[dict[str, Any]] = []
        self.complete = False  # whether `history` holds every commit
        self._cdf: pa.Table | None = None   # change rows of versions (lo, version]
        self._lo: int | None = None
        self._pending: dict[tuple[str, bool, int], int] = {}
        self._first: dict[int, datetime | None] = {}
        self.lock = threading.RLock()
        self.looked_at = 0.0  # time.monotonic() of the last refresh
        self._oldest_at = 0.0

    def refresh(self, max_age_s: float = 0.0) -> int:
        """Bring the facts to the table's latest version (unless they were less than
        `max_age_s` ago); return it."""
        with self.lock:
            if self.version is not None and time.monotonic() - self.looked_at < max_age_s:
                return self.version
            self.looked_at = time.monotonic()
            latest = self.table.version()
            if latest == self.version:
                return latest
            previous = self.version
            fresh = self.table.history(HISTORY if previous is None
                                       else min(latest - previous, HISTORY))
            seen = {h["version"] for h in fresh}
            self.history = (fresh + [h for h in self.history if h["version"] not in seen]
                            )[:HISTORY]
            self.complete = len(self.history) < HISTORY
            now = time.monotonic()
            if previous is None or now - self._oldest_at >= OLDEST_RECHECK_S:
                self.oldest, self._oldest_at = self.table.oldest_version(), now
            if previous is None or previous > latest:
                self.files = self.table.file_count()
                self.bytes = _bytes(self.table.snapshot(latest, columns=["size"]))
                self._cdf, self._lo = None, None
            else:
                new = self.table.changes(previous, latest)
                files, size = _moved(new)
                self.files += files
                self.bytes += size
                if self._cdf is not None:
                    self._cdf = _concat(self._cdf, new)
            self.version = latest
            self._pending, self._first = {}, {}
            if self._lo is not None and self._lo < self.oldest - 1:
                self._cdf, self._lo = None, None  # retention removed what they came from
            return latest

    def pending(self, mode: str, offset: int, *, initial_pending: bool = False) -> int | None:
        """The change records a stream (`mode`, at `offset`) would read now; None when its
        offset is older than the oldest kept version (stale)."""
        with self.lock:
            version = self.version if self.version is not None else self.refresh()
            if offset < self.oldest:
                return None
            key = (mode, bool(initial_pending), offset)
            if key not in self._pending:
                if initial_pending:  # the files present at creation: a snapshot, rare
                    count = records(self.table, mode, offset, version,
                                    initial_pending=True).num_rows
                else:
                    cdf = self._changes_after(offset, version)
                    count = (ch.standard_changes(cdf) if mode == "STANDARD"
                             else ch.append_only_changes(cdf)).num_rows
                self._pending[key] = count
            return self._pending[key]

    def _changes_after(self, offset: int, version: int) -> pa.Table:
        if offset >= version:
            return self.table.changes(version, version)  # empty, with the right columns
        if self._cdf is None or self._lo is None:
            self._cdf, self._lo = self.table.changes(offset, version), offset
        elif offset < self._lo:
            self._cdf = _concat(self.table.changes(offset, self._lo), self._cdf)
            self._lo = offset
        if offset == self._lo:
            return self._cdf
        return self._cdf.filter(pc.greater(self._cdf["_commit_version"], offset))

    def keep_from(self, offset: int) -> None:
        """Drop the kept change rows at or before `offset` (no stream asks for them now)."""
        with self.lock:
            if self._cdf is not None and self._lo is not None and offset > self._lo:
                self._cdf = self._cdf.filter(pc.greater(self._cdf["_commit_version"], offset))
                self._lo = offset

    def first_commit_after(self, offset: int) -> datetime | None:
        """The time of the first commit after `offset` among those kept (the oldest kept when
        the history does not reach back to it: a lower bound)."""
        with self.lock:
            if offset not in self._first:
                later = [h for h in self.history if h["version"] > offset]
                self._first[offset] = later[-1]["timestamp"] if later else None
            return self._first[offset]


def _bytes(sizes: pa.Table) -> int:
    return int(pc.sum(sizes["size"]).as_py() or 0)


def _moved(cdf: pa.Table) -> tuple[int, int]:
    """(files, bytes) a change feed adds: inserts and deletes count, updates move bytes."""
    if not cdf.num_rows:
        return 0, 0
    kinds, sizes = cdf["_change_type"], pc.fill_null(cdf["size"], 0)
    adds, removes = pc.is_in(kinds, pa.array(_ADDS)), pc.is_in(kinds, pa.array(_REMOVES))
    added = pc.sum(pc.if_else(adds, sizes, 0)).as_py() or 0
    removed = pc.sum(pc.if_else(removes, sizes, 0)).as_py() or 0
    files = (pc.sum(pc.equal(kinds, "insert").cast(pa.int64())).as_py() or 0) \
        - (pc.sum(pc.equal(kinds, "delete").cast(pa.int64())).as_py() or 0)
    return int(files), int(added - removed)


def _concat(first: pa.Table, second: pa.Table) -> pa.Table:
    if not first.num_rows:
        return second
    if not second.num_rows:
        return first
    return pa.concat_tables([first, second.select(first.column_names)],
                            promote_options="default")
