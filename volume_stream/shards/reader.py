"""Records of one shard between two versions, from its source's change data feed.

The source (`shards.sources`: a volume's directory table or a change-tracked SQL table) gives
the CDF rows of the shard's buckets only (sibling shards: one read, each shard's rows by
index; their windows share its rows). Per version and key the old image (delete /
update_preimage) and the new one (insert / update_postimage) are paired into one record:
INSERT (new only), REMOVE (old only), MODIFY (both; a rewrite that changes no public column —
Delta shows it as delete + insert — is no change and gives no record, as DynamoDB writes none
for a no-op put). Records are ordered by (version, key); the row of a sequence number is the
record's index in its version. All of it is column-wise (Arrow sort, numpy pairing and
numbering); `shards.pages` makes a page's Arrow table from slices of windows, and the
`Record`s over it. A table's key may be several columns (its declared key).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from directory_table.storage import filesystem_for
from volume_stream.shards import order
from volume_stream.shards.model import BY_BUCKET, Shard
from volume_stream.shards.sources import VolumeSource, row_sizes

__all__ = ["CommitTimes", "Window", "empty_window", "fitting", "pylist", "shard_window",
           "shard_windows"]

_OLD = frozenset(("delete", "update_preimage"))
#: page ends a window remembers (`Window.position`)
_ENDS_KEPT = 1024
#: threads that make the windows of one read (at most one per core)
_THREADS = 2
_COMMIT_TS_KEY = "volume_stream.commit_timestamp"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def pylist(col: pa.ChunkedArray | pa.Array) -> list[Any]:
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


_pylist = pylist  # (its first name)


class Window:
    """The records of one shard over a version range, paired and numbered column-wise (Arrow
    and numpy); a page is built from a slice (i, j) only (`shards.pages.arrow_page`), so a
    page of 1000 out of a window of a million costs a page, not the window."""

    def __init__(self, rows: pa.Table, version: np.ndarray, row: np.ndarray,
                 old: np.ndarray, new: np.ndarray, key: str | tuple[str, ...] = "relative_path",
                 columns: tuple[str, ...] = (), row_bytes: Any = None):
        self.rows, self.version, self.row, self.old, self.new = rows, version, row, old, new
        #: the key columns (one, or a table's declared key of several)
        self.key_columns = (key,) if isinstance(key, str) else tuple(key)
        self.columns = columns or tuple(c for c in rows.column_names if not c.startswith("_"))
        #: (version, row) packed into one sortable int64 (for searchsorted)
        self.keys = (version.astype(np.int64, copy=False) << 32) | row.astype(np.int64,
                                                                               copy=False)
        self._sizes: np.ndarray | None = None
        self._key_sizes: np.ndarray | None = None
        self._both: np.ndarray | None = None
        #: row sizes shared with sibling windows over the same rows (`_RowBytes`)
        self._row_bytes = row_bytes
        self._record_sizes: dict[tuple[Any, ...], np.ndarray] = {}
        #: blocks of this window's page table, made by `shards.pages` (per shard and view
        #: type, and apart those made at once by `pages.prepare`)
        self.tables: dict[tuple[str, ...], dict[int, pa.Table]] = {}
        #: columns of all its records that the blocks slice, made by `shards.pages` at once
        self.made: dict[Any, Any] = {}
        #: `position`s handed out: (version, row) -> the index after it
        self._ends: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.version)

    @staticmethod
    def key_of(version: int, row: int) -> int:
        return (version << 32) | min(row, 0xFFFFFFFF)

    def after(self, version: int, row: int) -> int:
        """The index of the first record after position (version, row)."""
        known = self._ends.get((version, row))
        if known is not None:
            return known
        return int(np.searchsorted(self.keys, self.key_of(version, row), side="right"))

    def position(self, j: int) -> tuple[int, int]:
        """The position (version, row) of record j - 1, where a page ends; remembered, so the
        next page's `after` it is known (j) without a search."""
        pos = (int(self.version[j - 1]), int(self.row[j - 1]))
        if len(self._ends) >= _ENDS_KEPT:
            self._ends.clear()
        self._ends[pos] = j
        return pos

    def sizes(self, old: np.ndarray, new: np.ndarray, keep_old: bool, keep_new: bool
              ) -> np.ndarray:
        """Approximate bytes of records (DynamoDB's count: key, kept images)."""
        if self._sizes is None:
            of = self._row_bytes or _RowBytes(self.rows, self.columns)
            self._sizes, self._key_sizes = of(self.columns), of(self.key_columns)
            self._both = of.both(self.columns, self.key_columns)
        # by the new image's row (its key and, when kept, image at once), then the records
        # without one (by the old image's key) and those with an old image kept (few, mostly)
        by_new = self._both if keep_new else self._key_sizes
        total = by_new[np.maximum(new, 0)]
        gone = np.flatnonzero(new < 0)
        total[gone] = self._key_sizes[old[gone]]
        if keep_old:
            at = np.flatnonzero(old >= 0)
            total[at] += self._sizes[old[at]]
        return total

    def record_sizes(self, keep_old: bool, keep_new: bool) -> np.ndarray:
        """`sizes` of every record of the window (made once per view)."""
        made = self._record_sizes.get((keep_old, keep_new))
        if made is None:
            made = self._record_sizes[keep_old, keep_new] = self.sizes(
                self.old, self.new, keep_old, keep_new)
        return made

    def running_sizes(self, keep_old: bool, keep_new: bool) -> np.ndarray:
        """The running total of `record_sizes` (made once per view): the records i to j
        weigh `running[j - 1] - running[i - 1]` (0 before the first)."""
        made = self._record_sizes.get((keep_old, keep_new, "running"))
        if made is None:
            made = self._record_sizes[keep_old, keep_new, "running"] = np.cumsum(
                self.record_sizes(keep_old, keep_new))
        return made


def fitting(slices: list[tuple[Window, int, int]], max_bytes: int, keep_old: bool,
             keep_new: bool) -> int:
    """How many records of the slices fit in `max_bytes`: those up to the first whose running
    size passes it (at least one), from the windows' running sizes."""
    taken, left = 0, max_bytes
    for w, i, j in slices:
        running = w.running_sizes(keep_old, keep_new)
        before = int(running[i - 1]) if i else 0
        weight = int(running[j - 1]) - before
        if weight > left:  # the records up to the first whose running size passes it
            return max(1, taken + int(np.searchsorted(running[i:j], before + left,
                                                      side="right")))
        taken += j - i
        left -= weight
    return taken


def _same(t: pa.Table, a: np.ndarray, b: np.ndarray, columns: tuple[str, ...]) -> np.ndarray:
    """Per pair (a[k], b[k]) of rows: whether every one of `columns` is equal, NULL-safe (SQL's
    `IS NOT DISTINCT FROM`: a NULL equals a NULL) and NaN equal to NaN (as Spark and DuckDB
    compare, and sort, them) - the rule that pairs a key's images and finds no-op rewrites."""
    same = np.ones(len(a), bool)
    ia, ib = pa.array(a), pa.array(b)
    for col in columns:
        x, y = t[col].take(ia), t[col].take(ib)
        eq = pc.fill_null(pc.equal(x, y), False)
        both = pc.and_(pc.is_null(x), pc.is_null(y))
        if pa.types.is_floating(x.type):
            both = pc.or_(both, pc.fill_null(pc.and_(pc.is_nan(x), pc.is_nan(y)), False))
        same &= pc.or_(eq, both).to_numpy(zero_copy_only=False)
    return same


def shard_window(source: Any, shard: Shard, after: int, up_to: int) -> Window:
    """The shard's records of versions (after, up_to], in sequence-number order; `source` is
    a `shards.sources` source (a bare `DirectoryTable` is read as a volume's)."""
    return shard_windows(source, [shard], after, up_to)[0]


def shard_windows(source: Any, shards: list[Shard], after: int, up_to: int,
                  prepare: Callable[[Window, Shard], Any] | None = None) -> list[Window]:
    """`shard_window` of each of `shards` (one read of the change data feed when more than
    one: every bucket's changes, each shard's rows picked by index; the windows share the
    read's table and its row sizes, and are made on a thread per core, each followed by
    `prepare(window, shard)`, e.g. the columns its pages will slice)."""
    if not hasattr(source, "columns"):
        source = VolumeSource(source)
    columns = tuple(source.columns)
    if up_to <= after:
        return [_window_of(None, None, source.key, columns) for _ in shards]
    if len(shards) == 1:
        window = _window_of(source.changes(after, up_to, shards[0]), None, source.key, columns,
                            by_bucket=_by_bucket(source, shards[0]))
        if prepare is not None:
            prepare(window, shards[0])
        return [window]
    cdf, picked = source.changes_of(after, up_to, shards)
    rows = _rows(cdf, source.key, columns)
    shared = _RowBytes(rows, columns)
    shared.both(columns, (source.key,) if isinstance(source.key, str) else source.key)
    follows = order.follows(rows, source.key) if any(_by_bucket(source, s) for s in shards) \
        else None

    def made(shard: Shard, idx: np.ndarray) -> Window:
        window = _window_of(rows, idx, source.key, columns, shared, _by_bucket(source, shard),
                            follows)
        if prepare is not None:
            prepare(window, shard)
        return window

    # a thread per core: the windows' numpy and Arrow work releases the GIL (the read itself
    # keeps ~1.4 cores busy; after it, one thread alone would leave one idle)
    with ThreadPoolExecutor(max(1, min(len(shards), os.cpu_count() or 1, _THREADS))) as pool:
        return list(pool.map(made, shards, picked))


def _by_bucket(source: Any, shard: Shard) -> bool:
    """Whether the shard's records go by (version, bucket, key): a volume's (one key column,
    the read's `_bucket`) whose shard says so."""
    return shard.order == BY_BUCKET and getattr(source, "kind", None) == "volume"


def empty_window(source: Any) -> Window:
    """A window without records, its columns typed as the source's (an empty page's)."""
    schema = source.schema()
    empty = np.zeros(0, np.int64)
    return Window(schema.empty_table(), empty, empty, empty, empty, source.key,
                  tuple(source.columns))


class _RowBytes:
    """Row sizes (images, keys) of a table, made once for the windows that share it."""

    def __init__(self, rows: pa.Table, columns: tuple[str, ...]):
        self.rows, self.columns = rows, columns
        self.made: dict[tuple[Any, ...], np.ndarray] = {}
        #: the string columns' lengths (an image's and the key's share the key column's)
        self.lengths: dict[str, np.ndarray] = {}

    def __call__(self, columns: tuple[str, ...]) -> np.ndarray:
        made = self.made.get(columns)
        if made is None:
            made = self.made[columns] = row_sizes(self.rows, columns, self.lengths)
        return made

    def both(self, columns: tuple[str, ...], key: tuple[str, ...]) -> np.ndarray:
        """An image's size and its key's, per row (a record with a new image)."""
        made = self.made.get(("+", columns, key))
        if made is None:
            made = self.made[("+", columns, key)] = self(columns) + self(key)
        return made


def _rows(cdf: pa.Table, key: str | tuple[str, ...], columns: tuple[str, ...]) -> pa.Table:
    """The columns of a CDF a window keeps (public ones, keys, version, bucket when there is
    one, and `_phase`: 0 for an old image, 1 for a new one), in one chunk each: pages take
    from them (a take from one array costs a third of one from the read's many chunks) or
    slice them."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    kept = [*dict.fromkeys([*columns, *keys]), "_commit_version"]
    kept += ["_bucket"] if "_bucket" in cdf.column_names and "_bucket" not in kept else []
    rows = cdf.select(kept).combine_chunks()
    return rows.append_column("_phase", pc.cast(pc.invert(pc.is_in(
        cdf["_change_type"], pa.array(list(_OLD)))), pa.int8()).combine_chunks())


def _window_of(cdf: pa.Table | None, idx: np.ndarray | None, key: str | tuple[str, ...],
               columns: tuple[str, ...], shared: _RowBytes | None = None,
               by_bucket: bool = False, follows: np.ndarray | None = None) -> Window:
    """The window of the CDF rows `idx` of `cdf` (None: all): the rows sorted by (version,
    key, old image first), or by (version, bucket, key, old image first) `by_bucket`, as
    indices into `cdf`, only the sort's columns copied."""
    keys = (key,) if isinstance(key, str) else tuple(key)
    keep = list(dict.fromkeys([*columns, *keys]))
    empty = np.zeros(0, np.int64)
    if cdf is None or cdf.num_rows == 0 or (idx is not None and not len(idx)):
        return Window(pa.table({c: [] for c in keep}), empty, empty, empty, empty, key, columns)
    if shared is None:
        cdf = _rows(cdf, key, columns)
    version, phases = _numbers(cdf)
    perm = np.arange(cdf.num_rows, dtype=np.int64) if idx is None else \
        idx.astype(np.int64, copy=False)
    if by_bucket:
        if follows is None:
            follows = order.follows(cdf, keys[0])
        perm, v = order.by_bucket(cdf, perm, version, phases, keys[0], follows)
    else:
        perm, v = order.by_key(cdf, perm, version, phases, keys)  # rows of cdf, in record order
    is_old = phases[perm] == 0
    # an old image followed by a new one of the same version: a pair if the keys match
    at = np.flatnonzero(is_old[:-1] & ~is_old[1:] & (v[:-1] == v[1:]))
    if len(at):
        at = at[_same(cdf, perm[at], perm[at + 1], keys)]  # NULL-safe: NULL pairs with NULL
    old = np.where(is_old, perm, -1)
    new = np.where(is_old, -1, perm)
    if len(at):
        # one record per row but the second of a pair (a pair's first row is its old image)
        new[at] = perm[at + 1]
        keep = np.ones(len(perm), bool)
        keep[at + 1] = False
        noop = _same(cdf, old[at], new[at], columns)   # a no-op rewrite is no record
        keep[at[noop]] = False
        v, old, new = v[keep], old[keep], new[keep]
    # the row of a record: its index among its version's records
    row = np.arange(len(v), dtype=np.int64)
    runs = np.flatnonzero(v[1:] != v[:-1]) + 1
    if len(runs) > order.FEW_RUNS:
        starts = np.r_[0, runs]
        row -= np.repeat(starts, np.diff(np.r_[starts, len(v)]))
    else:  # a slice each (a window of the log has at most 64 versions)
        ends = [*runs[1:].tolist(), len(v)] if len(runs) else []
        for a, b in zip(runs.tolist(), ends, strict=True):
            row[a:b] -= a
    return Window(cdf, v, row, old, new, key, columns, shared)


def _numbers(rows: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The versions and phases of `rows` (`_rows`: one chunk each) as numpy arrays."""
    return (order.one_chunk(rows["_commit_version"]).to_numpy(),
            order.one_chunk(rows["_phase"]).to_numpy())
