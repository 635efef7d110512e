"""Records of one shard between two versions, from the directory table's change data feed.

`DirectoryTable.changes(a, b, buckets=shard.buckets)` gives the CDF rows of the shard's buckets
only (O(changes)); if the table was re-bucketed after the change log was made (a migration of a
pre-bucket table), the rows are read whole and kept by the change log's own bucket count. Per version and key the old image (delete / update_preimage) and the new one
(insert / update_postimage) are paired into one record: INSERT (new only), REMOVE (old only),
MODIFY (both; a rewrite that changes no public column — Delta shows it as delete + insert — is
no change and gives no record, as DynamoDB writes none for a no-op put). Records are ordered by
(version, key); the row of a sequence number is the record's index in its version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from directory_table import DirectoryTable
from directory_table.layout import bucket_of
from directory_table.schema import PUBLIC_COLUMNS
from volume_stream.shards.model import Record, Shard

__all__ = ["CommitTimes", "Window", "shard_records", "shard_window"]

_OLD = frozenset(("delete", "update_preimage"))
_COMMIT_TS_KEY = "volume_stream.commit_timestamp"


class CommitTimes:
    """The commit time of each version, read from its Delta log entry once and cached."""

    def __init__(self, table: DirectoryTable, limit: int = 100_000):
        self.table, self.limit = table, limit
        self._cache: dict[int, datetime] = {}
        path = f"{table.path}/_delta_log"
        if "://" in path:
            self._fs, self._base = pafs.FileSystem.from_uri(path)
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


#: attribute names of an image plus its fixed-size values (size 8, time 32 as text)
_IMAGE_FIXED = sum(len(c) for c in PUBLIC_COLUMNS) + 8 + 32
_KEY_FIXED = len("relative_path")


def _size(path: str, *images: dict[str, Any] | None) -> int:
    """Approximate bytes of a record as DynamoDB counts them (names plus values)."""
    total = _KEY_FIXED + len(path)
    for image in images:
        if image:
            total += (_IMAGE_FIXED + len(image["relative_path"]) + len(image["url"] or "")
                      + len(image["etag"] or ""))
    return total


class Window:
    """The records of one shard over a version range, paired and numbered column-wise (Arrow
    and numpy); `records(i, j)` makes Record objects for a slice only, so a page of 1000 out
    of a window of a million costs a page, not the window."""

    def __init__(self, rows: pa.Table, version: np.ndarray, row: np.ndarray,
                 old: np.ndarray, new: np.ndarray):
        self.rows, self.version, self.row, self.old, self.new = rows, version, row, old, new
        #: (version, row) packed into one sortable int64 (for searchsorted)
        self.keys = (version.astype(np.int64) << 32) | row.astype(np.int64)

    def __len__(self) -> int:
        return len(self.version)

    @staticmethod
    def key(version: int, row: int) -> int:
        return (version << 32) | min(row, 0xFFFFFFFF)

    def after(self, version: int, row: int) -> int:
        """The index of the first record after position (version, row)."""
        return int(np.searchsorted(self.keys, self.key(version, row), side="right"))

    def records(self, i: int, j: int, shard: Shard, view_type: str,
                commit_time: Callable[[int], datetime]) -> list[Record]:
        old, new = self.old[i:j], self.new[i:j]
        if len(old) == 0:
            return []
        pub = self.rows.select(list(PUBLIC_COLUMNS))
        olds = pub.take(pa.array(np.maximum(old, 0))).to_pylist()
        news = pub.take(pa.array(np.maximum(new, 0))).to_pylist()
        keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
        keep_new = view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
        out = []
        times: dict[int, datetime] = {}
        shard_id = shard.shard_id
        for k, (version, row, io, jn) in enumerate(zip(
                self.version[i:j].tolist(), self.row[i:j].tolist(), old.tolist(), new.tolist(),
                strict=True)):
            has_old, has_new = io >= 0, jn >= 0
            event = "MODIFY" if has_old and has_new else ("INSERT" if has_new else "REMOVE")
            image = news[k] if has_new else olds[k]
            path = image["relative_path"]
            o = olds[k] if has_old and keep_old else None
            n = news[k] if has_new and keep_new else None
            when = times.get(version)
            if when is None:
                when = times[version] = commit_time(version)
            # the sequence number, inlined (model.sequence_number): this loop is the hot path
            out.append(Record(f"1{version:019d}{row:010d}", event, {"relative_path": path}, o,
                              n, version, when, shard_id, _size(path, o, n)))
        return out


def _shard_cdf(table: DirectoryTable, shard: Shard, after: int, up_to: int) -> pa.Table:
    if not shard.hash_buckets or shard.hash_buckets == table.layout().buckets:
        return table.changes(after, up_to, buckets=shard.buckets)
    # the table was re-bucketed (migrated) after the change log was made
    cdf = table.changes(after, up_to)
    keep = [shard.bucket_lo <= bucket_of(p, shard.hash_buckets) < shard.bucket_hi
            for p in cdf["relative_path"].to_pylist()]
    return cdf.filter(pa.array(keep, pa.bool_()))


def _same(t: pa.Table, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per pair (a[k], b[k]) of rows: whether every public column is equal (nulls equal)."""
    same = np.ones(len(a), bool)
    ia, ib = pa.array(a), pa.array(b)
    for col in PUBLIC_COLUMNS:
        x, y = t[col].take(ia), t[col].take(ib)
        eq = pc.fill_null(pc.equal(x, y), False)
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same &= pc.or_(eq, both_null).to_numpy(zero_copy_only=False)
    return same


def shard_window(table: DirectoryTable, shard: Shard, after: int, up_to: int) -> Window:
    """The shard's records of versions (after, up_to], in sequence-number order."""
    empty = np.zeros(0, np.int64)
    cdf = _shard_cdf(table, shard, after, up_to) if up_to > after else None
    if cdf is None or cdf.num_rows == 0:
        return Window(pa.table({c: [] for c in PUBLIC_COLUMNS}), empty, empty, empty, empty)
    t = cdf.select([*PUBLIC_COLUMNS, "_commit_version"]).append_column(
        "_phase", pc.cast(pc.invert(pc.is_in(cdf["_change_type"], pa.array(list(_OLD)))),
                          pa.int8()))
    t = t.sort_by([("_commit_version", "ascending"), ("relative_path", "ascending"),
                   ("_phase", "ascending")])
    n = t.num_rows
    v = t["_commit_version"].to_numpy()
    phase = t["_phase"].to_numpy()
    paths = t["relative_path"].combine_chunks()
    pair = np.zeros(n, bool)
    if n > 1:
        same_key = (v[:-1] == v[1:]) & pc.equal(paths.slice(0, n - 1), paths.slice(1)
                                                ).to_numpy(zero_copy_only=False)
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
        noop[idx] = _same(t, first[idx], first[idx] + 1)
        first, old, new = first[~noop], old[~noop], new[~noop]
    rv = v[first]
    ar = np.arange(len(rv))
    starts = np.r_[True, rv[1:] != rv[:-1]] if len(rv) else np.zeros(0, bool)
    row = ar - np.maximum.accumulate(np.where(starts, ar, 0)) if len(rv) else empty
    return Window(t, rv.astype(np.int64), row.astype(np.int64), old, new)


def shard_records(table: DirectoryTable, shard: Shard, after: int, up_to: int, view_type: str,
                  commit_time: Callable[[int], datetime]) -> list[Record]:
    """The shard's records of versions (after, up_to], in sequence-number order."""
    window = shard_window(table, shard, after, up_to)
    return window.records(0, len(window), shard, view_type, commit_time)
