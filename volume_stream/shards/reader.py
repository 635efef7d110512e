"""Records of one shard between two versions, from its source's change data feed.

The source (`shards.sources`: a volume's directory table or a change-tracked SQL table) gives
the CDF rows of the shard's buckets only. Per version and key the old image (delete /
update_preimage) and the new one (insert / update_postimage) are paired into one record:
INSERT (new only), REMOVE (old only), MODIFY (both; a rewrite that changes no public column —
Delta shows it as delete + insert — is no change and gives no record, as DynamoDB writes none
for a no-op put). Records are ordered by (version, key); the row of a sequence number is the
record's index in its version. All of it is column-wise (Arrow sort, numpy pairing and
numbering); a page's `Record`s are views over one `_Page` of columns, which turns Arrow
columns into Python values only when a record first asks for a key or an image (each look
makes a new dict of them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from directory_table.storage import filesystem_for
from volume_stream.shards.model import Keys, PageColumns, Record, Shard, sequence_number
from volume_stream.shards.sources import VolumeSource, row_sizes

__all__ = ["CommitTimes", "Window", "shard_records", "shard_window", "shard_windows"]

_OLD = frozenset(("delete", "update_preimage"))
_COMMIT_TS_KEY = "volume_stream.commit_timestamp"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EVENTS = ("INSERT", "MODIFY", "REMOVE")
#: versions below this pack with the row into one int64 (version * 10**10 + row)
_ROW_SCALE = 10_000_000_000
_MAX_PACKED_VERSION = (2**63 - 1) // _ROW_SCALE - 1
#: a sequence number is the decimal of 10**29 + version * 10**10 + row (`model.sequence_number`)
_SEQ_BASE = 10**29


class CommitTimes:
    """The commit time of each version, read from its Delta log entry once and cached."""

    def __init__(self, source: Any, limit: int = 100_000):
        self.limit = limit
        self._cache: dict[int, datetime] = {}
        path = source.log_path if hasattr(source, "log_path") else f"{source.path}/_delta_log"
        options = getattr(source, "storage_options", None)
        if "://" in path:
            self._fs, self._base = filesystem_for(path, options)
        else:
            self._fs, self._base = pafs.LocalFileSystem(), path

    def __call__(self, version: int) -> datetime:
        when = self._cache.get(version)
        if when is None:
            when = self._read(version)
            if len(self._cache) >= self.limit:
                self._cache.clear()
            self._cache[version] = when
        return when

    def _read(self, version: int) -> datetime:
        with self._fs.open_input_stream(f"{self._base}/{version:020d}.json") as f:
            text = f.read().decode()
        for line in text.splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info is not None:
                if info.get(_COMMIT_TS_KEY):
                    return datetime.fromisoformat(info[_COMMIT_TS_KEY])
                return datetime.fromtimestamp(info["timestamp"] / 1000, UTC)
        return datetime.fromtimestamp(0, UTC)


#: the microseconds from the epoch whose float seconds convert exactly (< 0.45 us of error)
_FAST_US = 4_000_000_000_000_000


def _pylist(col: pa.ChunkedArray | pa.Array) -> list[Any]:
    """Python values of a column; timestamps through int64 (pyarrow's own conversion of a
    zoned timestamp costs ~7 us a value, `fromtimestamp` of the float seconds ~0.3 us, exact
    while the float has sub-microsecond precision, else through a timedelta), each distinct
    value converted once."""
    if pa.types.is_timestamp(col.type) and col.type.unit == "us":
        ints = pc.cast(col, pa.int64())
        if col.type.tz is not None and ints.null_count == 0:
            us = ints.to_numpy()
            if len(us) == 0 or (-_FAST_US < us.min() and us.max() < _FAST_US):
                # each distinct value once (files listed together often share a time)
                distinct, where = np.unique(us, return_inverse=True)
                made = np.empty(len(distinct), object)
                made[:] = list(map(datetime.fromtimestamp, (distinct / 1e6).tolist(),
                                   repeat(UTC)))
                return made[where].tolist()
        base = _EPOCH if col.type.tz else _EPOCH.replace(tzinfo=None)
        return [None if x is None else base + timedelta(microseconds=x)
                for x in ints.to_pylist()]
    return col.to_pylist()


class _Images:
    """Images of a page: `images[k]` is a new dict of record k's image (None when it has none)
    made from the page's column values, so no dict per record is kept for the page's life
    (fewer objects for the collector); `_image_class` makes a subclass per column set whose
    `__getitem__` is one dict display."""

    __slots__ = ("cols", "pos")

    def __init__(self, pos: list[int], lists: list[list[Any]]):
        self.pos, self.cols = pos, lists

    def __len__(self) -> int:
        return len(self.pos)


_IMAGE_CLASSES: dict[tuple[str, ...], type[_Images]] = {}


def _image_class(columns: tuple[str, ...]) -> type[_Images]:
    """The `_Images` subclass of `columns` (their names enter the code only as `repr`s)."""
    cls = _IMAGE_CLASSES.get(columns)
    if cls is None:
        if len(columns) > 200:
            def getitem(self: _Images, k: int) -> dict[str, Any] | None:
                p = self.pos[k]
                return None if p < 0 else {c: v[p] for c, v in zip(columns, self.cols,
                                                                   strict=True)}
        else:
            names = [f"_{i}" for i in range(len(columns))]
            body = ", ".join(f"{c!r}: {n}[p]" for c, n in zip(columns, names, strict=True))
            code = (f"def getitem(self, k):\n"
                    f"    p = self.pos[k]\n"
                    f"    if p < 0:\n"
                    f"        return None\n"
                    f"    {', '.join(names)}, = self.cols\n"
                    f"    return {{{body}}}\n")
            scope: dict[str, Any] = {}
            exec(code, scope)  # noqa: S102 (column names are repr literals)
            getitem = scope["getitem"]
        cls = type("_Images", (_Images,), {"__slots__": (), "__getitem__": getitem})
        _IMAGE_CLASSES[columns] = cls
    return cls


#: event name by code (0 INSERT, 1 MODIFY, 2 REMOVE), as an object array for one `take`
_EVENT_NAMES = np.array(_EVENTS, dtype=object)


class _Page(PageColumns):
    """The columns of one page (records i to j of a window): sequence numbers, events,
    versions and sizes made at once (numpy), keys and images from the window's Arrow columns
    when a record first asks."""

    __slots__ = ("_keep_new", "_keep_old", "_new", "_old", "_window")

    def __init__(self, window: Window, i: int, j: int, shard: Shard, view_type: str,
                 commit_time: Callable[[int], datetime]):
        old, new = window.old[i:j], window.new[i:j]
        self._window, self._old, self._new = window, old, new
        self._keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
        self._keep_new = view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
        v, r = window.version[i:j], window.row[i:j]
        versions = v.tolist()
        if len(v) and int(v.max()) < _MAX_PACKED_VERSION:  # "1" + 19 + 10 digits at once
            seqs = list(map(str, map(_SEQ_BASE.__add__, (v * _ROW_SCALE + r).tolist())))
        else:
            seqs = [sequence_number(a, b) for a, b in zip(versions, r.tolist(), strict=True)]
        times = {x: commit_time(x) for x in set(versions)}
        events = _EVENT_NAMES[np.where(new >= 0, np.where(old >= 0, 1, 0), 2)].tolist()
        sizes = window.sizes(old, new, self._keep_old, self._keep_new)
        super().__init__(seqs, events, versions, r.tolist(), [times[x] for x in versions],
                         shard.shard_id, sizes.tolist())

    def records(self) -> list[Record]:
        n = len(self.sequence_numbers)
        return list(map(Record, repeat(self, n), range(n)))

    def _images(self, idx: np.ndarray, keep: bool) -> _Images | list[None]:
        """The images of rows `idx` (None where -1), converting only the rows that exist."""
        if not keep:
            return [None] * len(idx)
        cols = self._window.columns
        valid = idx >= 0
        where = np.nonzero(valid)[0]
        taken = self._window.rows.select(list(cols)).take(pa.array(idx[where]))
        pos = np.where(valid, np.cumsum(valid) - 1, -1)
        return _image_class(cols)(pos.tolist(), [_pylist(taken[c]) for c in cols])

    def make_old_images(self) -> _Images | list[None]:
        if self.old_images is None:
            self.old_images = self._images(self._old, self._keep_old)
        return self.old_images

    def make_new_images(self) -> _Images | list[None]:
        if self.new_images is None:
            self.new_images = self._images(self._new, self._keep_new)
        return self.new_images

    def make_keys(self) -> Keys:
        if self.keys is None:
            name = self._window.key
            idx = np.where(self._new >= 0, self._new, self._old)
            self.keys = Keys(name, _pylist(self._window.rows[name].take(pa.array(idx))))
        return self.keys


class Window:
    """The records of one shard over a version range, paired and numbered column-wise (Arrow
    and numpy); `records(i, j)` makes Record objects for a slice only, so a page of 1000 out
    of a window of a million costs a page, not the window."""

    def __init__(self, rows: pa.Table, version: np.ndarray, row: np.ndarray,
                 old: np.ndarray, new: np.ndarray, key: str = "relative_path",
                 columns: tuple[str, ...] = ()):
        self.rows, self.version, self.row, self.old, self.new = rows, version, row, old, new
        self.key, self.columns = key, columns or tuple(c for c in rows.column_names
                                                       if not c.startswith("_"))
        #: (version, row) packed into one sortable int64 (for searchsorted)
        self.keys = (version.astype(np.int64) << 32) | row.astype(np.int64)
        self._sizes: np.ndarray | None = None
        self._key_sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.version)

    @staticmethod
    def key_of(version: int, row: int) -> int:
        return (version << 32) | min(row, 0xFFFFFFFF)

    def after(self, version: int, row: int) -> int:
        """The index of the first record after position (version, row)."""
        return int(np.searchsorted(self.keys, self.key_of(version, row), side="right"))

    def sizes(self, old: np.ndarray, new: np.ndarray, keep_old: bool, keep_new: bool
              ) -> np.ndarray:
        """Approximate bytes of records (DynamoDB's count: key, kept images)."""
        if self._sizes is None:
            self._sizes = row_sizes(self.rows, self.columns)
            self._key_sizes = row_sizes(self.rows, (self.key,))
        either = np.where(new >= 0, new, old)
        total = self._key_sizes[either].copy()
        if keep_old:
            total += np.where(old >= 0, self._sizes[np.maximum(old, 0)], 0)
        if keep_new:
            total += np.where(new >= 0, self._sizes[np.maximum(new, 0)], 0)
        return total

    def records(self, i: int, j: int, shard: Shard, view_type: str,
                commit_time: Callable[[int], datetime]) -> list[Record]:
        """Records i to j (views over one `_Page` of their columns)."""
        page = self.page(i, j, shard, view_type, commit_time)
        return [] if page is None else page.records()

    def page(self, i: int, j: int, shard: Shard, view_type: str,
             commit_time: Callable[[int], datetime]) -> _Page | None:
        """The columns of records i to j (None when there are none)."""
        j = min(j, len(self))
        return _Page(self, i, j, shard, view_type, commit_time) if j > i else None


def _same(t: pa.Table, a: np.ndarray, b: np.ndarray, columns: tuple[str, ...]) -> np.ndarray:
    """Per pair (a[k], b[k]) of rows: whether every public column is equal (nulls equal)."""
    same = np.ones(len(a), bool)
    ia, ib = pa.array(a), pa.array(b)
    for col in columns:
        x, y = t[col].take(ia), t[col].take(ib)
        eq = pc.fill_null(pc.equal(x, y), False)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= pc.or_(eq, both_null).to_numpy(zero_copy_only=False)
    return same


def shard_window(source: Any, shard: Shard, after: int, up_to: int) -> Window:
    """The shard's records of versions (after, up_to], in sequence-number order; `source` is
    a `shards.sources` source (a bare `DirectoryTable` is read as a volume's)."""
    return shard_windows(source, [shard], after, up_to)[0]


def shard_windows(source: Any, shards: list[Shard], after: int, up_to: int) -> list[Window]:
    """`shard_window` of each of `shards` (one read of the change data feed when more than
    one: every bucket's changes, split by shard)."""
    if not hasattr(source, "columns"):
        source = VolumeSource(source)
    if up_to <= after:
        cdfs: list[pa.Table | None] = [None] * len(shards)
    elif len(shards) == 1:
        cdfs = [source.changes(after, up_to, shards[0])]
    else:
        cdfs = list(source.changes_of(after, up_to, shards))
    return [_window_of(cdf, source.key, tuple(source.columns)) for cdf in cdfs]


def _window_of(cdf: pa.Table | None, key: str, columns: tuple[str, ...]) -> Window:
    keep = list(dict.fromkeys([*columns, key]))
    empty = np.zeros(0, np.int64)
    if cdf is None or cdf.num_rows == 0:
        return Window(pa.table({c: [] for c in keep}), empty, empty, empty, empty, key, columns)
    t = cdf.select([*keep, "_commit_version"]).append_column(
        "_phase", pc.cast(pc.invert(pc.is_in(cdf["_change_type"], pa.array(list(_OLD)))),
                          pa.int8()))
    t = t.sort_by([("_commit_version", "ascending"), (key, "ascending"),
                   ("_phase", "ascending")])
    n = t.num_rows
    v = t["_commit_version"].to_numpy()
    phase = t["_phase"].to_numpy()
    keys = t[key].combine_chunks()
    pair = np.zeros(n, bool)
    if n > 1:
        same_key = (v[:-1] == v[1:]) & pc.fill_null(pc.equal(
            keys.slice(0, n - 1), keys.slice(1)), False).to_numpy(zero_copy_only=False)
        pair[:-1] = same_key & (phase[:-1] == 0) & (phase[1:] == 1)
    second = np.zeros(n, bool)
    second[1:] = pair[:-1]
    first = np.nonzero(~second)[0]                    # one record per first row
    is_pair = pair[first]
    old = np.where(is_pair | (phase[first] == 0), first, -1)
    new = np.where(is_pair, first + 1, np.where(phase[first] == 1, first, -1))
    if is_pair.any():                                  # a no-op rewrite is no record
        idx = np.nonzero(is_pair)[0]
        noop = np.zeros(len(first), bool)
        noop[idx] = _same(t, first[idx], first[idx] + 1, columns)
        first, old, new = first[~noop], old[~noop], new[~noop]
    rv = v[first]
    ar = np.arange(len(rv))
    starts = np.r_[True, rv[1:] != rv[:-1]] if len(rv) else np.zeros(0, bool)
    row = ar - np.maximum.accumulate(np.where(starts, ar, 0)) if len(rv) else empty
    return Window(t, rv.astype(np.int64), row.astype(np.int64), old, new, key, columns)


def shard_records(source: Any, shard: Shard, after: int, up_to: int, view_type: str,
                  commit_time: Callable[[int], datetime]) -> list[Record]:
    """The shard's records of versions (after, up_to], in sequence-number order."""
    window = shard_window(source, shard, after, up_to)
    return window.records(0, len(window), shard, view_type, commit_time)
