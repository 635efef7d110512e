"""The write path of large batches: rewrite the touched files in Arrow and commit the Delta
actions directly, instead of a delta-rs `merge`.

A delta-rs merge of a batch that touches most buckets pays per-file overhead inside the merge
(planning, a scan and two writers per partition) and re-reads the files the lookup has just
read. Here each touched file is read once, file by file on a few threads; the lookup, the
planner and the new files all work from what was read:

1. `load` reads the files of the batch's buckets whose min/max statistics bracket one of its
   paths (`layout.touched_files`), each file on its own (in parallel: plain Parquet reads of
   our own, never a scan of a delta-rs dataset), and keeps the rows holding one of the
   batch's paths with the file and row they came from. The files' rows stay in memory up to
   `MAX_LOADED_ROWS` rows in all; past that (overwrites spread over a huge table) the commit
   reads the other files again as it rewrites them, so memory stays bounded.
2. The planner runs on the stored rows of the batch's paths, as for a merge.
3. `commit` rewrites only the files holding a path the plan updates or deletes, each file on
   its own: its other rows are carried over as zero-copy slices, an updated row takes its new
   image in place, a deleted one is dropped, so the file stays sorted by path without sorting.
   A new path inside a rewritten file's path range joins that file (sorted in); other new
   paths go into new files of their bucket. A file grown past `rows_per_file` is split.
4. Change data is written as Delta `cdc` files (`_change_data/`, one per bucket): exactly the
   `insert`, `update_preimage`, `update_postimage` and `delete` rows of the changed paths. A
   reader of the change feed (delta-rs, Spark) reads a version's `cdc` files instead of its
   added and removed files, so the rows carried over report nothing.
5. One commit (`remove` + `add` + `cdc` actions, commitInfo with `readVersion`) is created at
   exactly `base_version + 1` with put-if-absent: an exclusive hard link on a local disk, a PUT
   with `If-None-Match: *` on S3 (what delta-rs >= 1.6 itself does there). A writer that loses
   the race gets `CommitFailedError` and re-plans, as with a merge; its files stay unreferenced
   (vacuum removes them).

Reading, rewriting and writing run on a small pool of daemon threads (`filestore.run`) when
the machine has a core to spare: Parquet decoding, encoding and file I/O release the GIL, so a
batch spread over the whole table keeps both cores of a small machine busy; on a busier machine
they run on the calling thread (less CPU in all). Only tables in the bucketed layout on a local
disk or S3 take this path (`supported`); others keep the merge.

Cost: a batch spread over the table rewrites every file it touches, about 1.5-2 ms of CPU per
file of ~2k rows (read, edit, encode, statistics); 10k events (5k overwrites) into 1M rows
(~560 files) take ~1.7 s of CPU, into 10M rows (~3,100 touched files, 2M rows held, the rest
read twice) ~9 s, peak RSS ~0.65 GiB.
"""

from __future__ import annotations

import bisect
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table.filestore import Store, run
from directory_table.layout import (
    _STATS_PREFIX_LEN,
    BUCKET_COLUMN,
    TARGET_FILE_SIZE_KEY,
    Layout,
    touched_files,
)
from directory_table.schema import TABLE_SCHEMA

__all__ = ["Loaded", "commit", "load", "rows_per_file", "supported", "write_commit"]

#: most rows per data file written here (a bigger bucket is split, sorted by path)
MAX_ROWS_PER_FILE = 65_536
#: most rows of touched files a rewrite keeps in memory from `load` to `commit`; a batch
#: touching files holding more is streamed (each file read again as it is rewritten)
MAX_LOADED_ROWS = 2_000_000
#: in-memory bytes of a directory-table row, as far as file sizing goes
ROW_BYTES = 64
_FILE = "__file"
_ROW = "__row"
_CHANGE_TYPE = pa.field("_change_type", pa.string())
_CDC_SCHEMA = TABLE_SCHEMA.append(_CHANGE_TYPE)
#: columns given min/max statistics in the files this module writes (pruning uses the path)
_STATS_COLUMNS = ("relative_path", "size", "_image_version")
_FOUND_SCHEMA = TABLE_SCHEMA.append(pa.field(BUCKET_COLUMN, pa.int32())).append(
    pa.field(_FILE, pa.int32())).append(pa.field(_ROW, pa.int32()))


def supported(dt: DeltaTable, layout: Layout) -> bool:
    """Whether `dt` can take this path: bucketed, on a local disk or S3."""
    scheme = urlparse(dt.table_uri).scheme.lower()
    return layout.bucketed and scheme in ("", "file", "s3", "s3a")


@dataclass
class Loaded:
    """The touched files of a batch, and the stored rows of its paths."""

    #: the files read, by bucket then path range: (path relative to the table, size, bucket)
    files: list[tuple[str, int, int]]
    #: per file: its rows (`TABLE_SCHEMA`), or None when the commit must read it again
    tables: list[pa.Table | None]
    #: per file: its row count, and its smallest and largest path as its statistics say (None:
    #: no statistics; a long max may be truncated)
    counts: list[int]
    ranges: list[tuple[str | None, str | None]]
    #: the rows holding one of the batch's paths, with `_bucket`, their file (index in
    #: `files`) and their row in that file
    found: pa.Table
    store: Store

    def stored(self, paths: list[str]) -> pa.Table:
        """The rows of `paths` (those stored)."""
        keys = self.found["relative_path"]
        return self.found.filter(pc.is_in(keys, value_set=pa.array(paths, pa.string())))

    def rows_of(self, i: int) -> pa.Table:
        """The rows of file `i` (read again if they were not kept)."""
        table = self.tables[i]
        return table if table is not None else self.store.read(self.files[i][0])


def load(dt: DeltaTable, layout: Layout, paths: list[str], max_rows: int = MAX_LOADED_ROWS,
         *, storage_options: dict[str, str] | None = None) -> Loaded:
    """Read every data file that may hold one of `paths` (see the module docstring); keep
    the rows of the first files, up to `max_rows` rows in all."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    wanted = set(touched_files(dt, layout, paths, actions))
    cols = actions.column_names
    lows = (actions["min.relative_path"].to_pylist() if "min.relative_path" in cols
            else [None] * actions.num_rows)
    highs = (actions["max.relative_path"].to_pylist() if "max.relative_path" in cols
             else [None] * actions.num_rows)
    found = sorted(
        (int(bucket), low or "", p, int(size), n, low, high)
        for p, size, bucket, n, low, high in zip(
            actions["path"].to_pylist(), actions["size_bytes"].to_pylist(),
            actions[f"partition.{BUCKET_COLUMN}"].to_pylist(), actions["num_records"].to_pylist(),
            lows, highs, strict=True)
        if p in wanted)
    files = [(p, size, bucket) for bucket, _, p, size, *_ in found]
    store = Store(dt.table_uri, storage_options or {})
    if not files:  # new paths only, or nothing stored near them
        return Loaded(files=[], tables=[], counts=[], ranges=[], store=store,
                      found=_FOUND_SCHEMA.empty_table())
    # keep the files' rows up to `max_rows` in all (in file order); the others are read again
    keep = (np.cumsum([f[4] or 0 for f in found]) <= max_rows).tolist()
    by_bucket: dict[int, list[str]] = {}
    for p in sorted(set(paths)):
        by_bucket.setdefault(layout.bucket_of(p), []).append(p)
    # per file, the batch's paths its statistics bracket (a small set to look up)
    candidates = [_bracketed(by_bucket.get(bucket, []), low, high)
                  for bucket, _, _, _, _, low, high in found]

    def read(i: int) -> tuple[pa.Table | None, pa.Table, int]:
        path, _, bucket = files[i]
        table = store.read(path)
        rows = np.flatnonzero(pc.is_in(table["relative_path"], value_set=pa.array(
            candidates[i], pa.string())).to_numpy(zero_copy_only=False)).astype(np.int32)
        hits = table.take(pa.array(rows, pa.int32()))
        n = len(rows)
        hits = (hits.append_column(BUCKET_COLUMN, pa.array(np.full(n, bucket, np.int32)))
                .append_column(_FILE, pa.array(np.full(n, i, np.int32)))
                .append_column(_ROW, pa.array(rows, pa.int32())))
        return (table if keep[i] else None), hits, table.num_rows

    results = run(read, list(range(len(files))))
    return Loaded(files=files, tables=[r[0] for r in results], counts=[r[2] for r in results],
                  ranges=[(low, high) for *_, low, high in found], store=store,
                  found=pa.concat_tables([_FOUND_SCHEMA.empty_table(), *(r[1] for r in results)]))


def _bracketed(sorted_paths: list[str], low: str | None, high: str | None) -> list[str]:
    """The paths p with low <= p <= high (None: unbounded); a high as long as the statistics'
    truncation length may be a prefix of the real max: the paths it prefixes count too."""
    start = bisect.bisect_left(sorted_paths, low) if low is not None else 0
    if high is None:
        return sorted_paths[start:]
    if len(high) >= _STATS_PREFIX_LEN:
        high += chr(0x10FFFF)
    return sorted_paths[start:bisect.bisect_right(sorted_paths, high)]


#: a rewritten file with more edits than this is rebuilt with one `take` rather than slices
_MAX_SLICED_EDITS = 32


def commit(dt: DeltaTable, layout: Layout, loaded: Loaded, *, version: int, new_rows: pa.Table,
           updated: list[str], deleted: list[str], inserted: list[str], now: datetime,
           custom_metadata: dict[str, Any], storage_options: dict[str, str]) -> None:
    """Write the files and the commit of one batch at `version` (see the module docstring).

    `new_rows` are the images of `inserted` and `updated` paths (with `_bucket`, sorted by
    bucket and path); `loaded` holds the stored rows of `updated` and `deleted` paths. Raises
    `CommitFailedError` when another writer made `version` first.
    """
    names = TABLE_SCHEMA.names
    found = loaded.found
    images = new_rows.filter(pc.is_in(new_rows["relative_path"],
                                      value_set=pa.array(updated, pa.string())))
    image_rows = images.select(names).cast(TABLE_SCHEMA).combine_chunks()
    keys = found["relative_path"]
    # per stored row of the batch's paths: its new image (-1: none), whether it is deleted
    image_of = pc.fill_null(pc.index_in(keys, value_set=images["relative_path"]), -1).to_numpy()
    gone = (pc.is_in(keys, value_set=pa.array(deleted, pa.string())).to_numpy(
        zero_copy_only=False) if deleted else np.zeros(found.num_rows, dtype=bool))
    hit = np.flatnonzero((image_of >= 0) | gone)
    file_of, row_of = found[_FILE].to_numpy()[hit], found[_ROW].to_numpy()[hit]
    order = np.lexsort((row_of, file_of))
    file_of, row_of, image_at = file_of[order], row_of[order], image_of[hit][order]
    cuts = [0, *(np.flatnonzero(file_of[1:] != file_of[:-1]) + 1).tolist(), len(file_of)]
    edits = {int(file_of[a]): (row_of[a:b], image_at[a:b]) for a, b in
             zip(cuts, cuts[1:], strict=False) if b > a}
    new = new_rows.filter(pc.is_in(new_rows["relative_path"],
                                   value_set=pa.array(inserted, pa.string())))
    joins, rest = _place_new_paths(loaded, sorted(edits), new)
    new_plain = new.select(names).cast(TABLE_SCHEMA)

    def rewrite_file(i: int) -> tuple[int, pa.Table]:
        rows, at = edits[i]
        table = _edited(loaded.rows_of(i), rows, at, image_rows)
        if i in joins:  # new paths inside the file's range: sorted in
            table = pa.concat_tables([table, new_plain.take(pa.array(joins[i], pa.int64()))]
                                     ).sort_by("relative_path")
        return loaded.files[i][2], table

    adds: list = [lambda i=i: rewrite_file(i) for i in sorted(edits)]
    adds += list(_by_bucket(new.take(pa.array(rest, pa.int64())).select(
        [*names, BUCKET_COLUMN]))) if rest else []

    stored = found.take(pa.array(hit, pa.int64())).drop_columns([_FILE, _ROW])
    cdc = pa.concat_tables([
        _tagged(new, "insert"),
        _tagged(stored.filter(pc.is_in(stored["relative_path"],
                                       value_set=pa.array(updated, pa.string()))),
                "update_preimage"),
        _tagged(images, "update_postimage"),
        _tagged(stored.filter(pc.is_in(stored["relative_path"],
                                       value_set=pa.array(deleted, pa.string()))), "delete"),
    ]).sort_by([(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])

    removes = [loaded.files[i] for i in sorted(edits)]
    copied = sum(loaded.counts[i] for i in edits) - len(hit)
    write_commit(dt, version, removes=removes, adds=adds, cdc=list(_by_bucket(cdc)),
                 data_change=True, now=now, storage_options=storage_options,
                 operation=("WRITE", {"mode": "Append", "rewrite": "volume-stream"}),
                 custom_metadata=custom_metadata, metrics={"numCopiedRows": copied},
                 store=loaded.store)


def _edited(table: pa.Table, rows: np.ndarray, at: np.ndarray, images: pa.Table) -> pa.Table:
    """`table` with row `rows[j]` replaced by image `at[j]` of `images` (dropped when
    `at[j]` is -1). Few edits: zero-copy slices of the carried rows around the images."""
    if len(rows) <= _MAX_SLICED_EDITS:
        parts, start = [], 0
        for r, k in zip(rows.tolist(), at.tolist(), strict=True):
            if r > start:
                parts.append(table.slice(start, r - start))
            if k >= 0:
                parts.append(images.slice(k, 1))
            start = r + 1
        if start < table.num_rows:
            parts.append(table.slice(start))
        return pa.concat_tables(parts) if parts else table.slice(0, 0)
    n = table.num_rows
    source = np.arange(n, dtype=np.int64)
    source[rows] = np.where(at >= 0, n + at, -1)
    source = source[source >= 0]
    return pa.concat_tables([table, images]).combine_chunks().take(pa.array(source))


def _place_new_paths(loaded: Loaded, rewritten: list[int], new: pa.Table,
                     ) -> tuple[dict[int, list[int]], list[int]]:
    """New paths (rows of `new`) inside the path range of a rewritten file of their bucket
    join that file: {file: rows}; the others (their rows) go into new files."""
    ranges: dict[int, tuple[list[str], list[str], list[int]]] = {}
    for i in sorted(rewritten, key=lambda i: (loaded.files[i][2], loaded.ranges[i][0] or "")):
        lo, hi = loaded.ranges[i]
        if lo is not None:
            los, his, ids = ranges.setdefault(loaded.files[i][2], ([], [], []))
            los.append(lo)
            his.append(hi)
            ids.append(i)
    joins: dict[int, list[int]] = {}
    rest: list[int] = []
    buckets = new[BUCKET_COLUMN].to_pylist()
    for k, (path, bucket) in enumerate(zip(new["relative_path"].to_pylist(), buckets,
                                           strict=True)):
        los, his, ids = ranges.get(bucket, ((), (), ()))
        j = bisect.bisect_right(los, path) - 1
        if j >= 0 and path <= his[j]:
            joins.setdefault(ids[j], []).append(k)
        else:
            rest.append(k)
    return joins, rest


def write_commit(dt: DeltaTable, version: int, *, removes: list[tuple[str, int, int]],
                 adds: list, cdc: list[tuple[int, pa.Table]],
                 data_change: bool, now: datetime, storage_options: dict[str, str],
                 operation: tuple[str, dict], custom_metadata: dict[str, Any] | None = None,
                 metrics: dict[str, int] | None = None, store: Store | None = None) -> None:
    """Write the data files (`adds`: rows of one bucket each, as `(bucket, table)` or a
    function making it on a writer thread; split into files of the table's size) and change
    files of one commit, then create its log entry at exactly `version` (`CommitFailedError`
    if another writer made it first). `removes`: (path, size, bucket) of the files the commit
    replaces. `data_change=False` marks a commit that changes no row (compaction): readers of
    the change feed skip it. `store`: the table's files, when the caller has it open."""
    max_rows = rows_per_file(dt)
    store = store or Store(dt.table_uri, storage_options)
    stamp = int(now.timestamp() * 1000)
    actions: list[dict] = [
        {"remove": {"path": path, "dataChange": data_change, "deletionTimestamp": stamp,
                    "extendedFileMetadata": True,
                    "partitionValues": {BUCKET_COLUMN: str(bucket)}, "size": size}}
        for path, size, bucket in removes]

    def write(kind: str, bucket: int, table: pa.Table) -> dict:
        path = (f"{BUCKET_COLUMN}={bucket}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
                if kind == "add" else
                f"_change_data/{BUCKET_COLUMN}={bucket}/cdc-00000-{uuid.uuid4()}"
                ".c000.snappy.parquet")
        size = store.put(path, table)
        action = {"path": path, "partitionValues": {BUCKET_COLUMN: str(bucket)}, "size": size}
        if kind == "add":
            action.update(modificationTime=stamp, dataChange=data_change, stats=_stats(table))
        else:
            action.update(dataChange=False)
        return {kind: action}

    def write_rows(made: Callable[[], tuple[int, pa.Table]]) -> list[dict]:
        bucket, rows = made()
        return [write("add", bucket, part) for part in _split(rows, max_rows)]

    jobs: list[Callable[[], list[dict]]] = []
    for add in adds:
        if callable(add):
            jobs.append(lambda add=add: write_rows(add))
        else:  # rows at hand: one job per file
            bucket, rows = add
            jobs += [lambda b=bucket, p=part: [write("add", b, p)]
                     for part in _split(rows, max_rows)]
    jobs += [lambda b=bucket, p=part: [write("cdc", b, p.select(_CDC_SCHEMA.names))]
             for bucket, part in cdc]
    store.make_dirs({f"{BUCKET_COLUMN}={b}" for b in range(_buckets(dt))} if adds else set())
    store.make_dirs({f"_change_data/{BUCKET_COLUMN}={b}" for b, _ in cdc})
    actions += [a for made in run(lambda job: job(), jobs) for a in made]
    adds_made = [a["add"] for a in actions if "add" in a]
    name, parameters = operation
    info = {"timestamp": stamp, "operation": name, "operationParameters": parameters,
            "readVersion": version - 1, "isolationLevel": "Serializable",
            "isBlindAppend": False, **(custom_metadata or {}),
            "operationMetrics": {"numRemovedFiles": len(removes),
                                 "numAddedFiles": len(adds_made),
                                 "numOutputRows": sum(json.loads(a["stats"])["numRecords"]
                                                      for a in adds_made),
                                 "numAddedChangeFiles": sum(1 for a in actions if "cdc" in a),
                                 **(metrics or {})}}
    body = "\n".join(json.dumps(a, separators=(",", ":")) for a in [{"commitInfo": info},
                                                                    *actions]) + "\n"
    store.create_log_entry(version, body.encode())
    # delta-rs checkpoints its own commits every `delta.checkpointInterval` versions (a
    # post-commit hook); do the same for ours, so the log replay stays short
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval", "100") or 100)
    if interval > 0 and version % interval == 0:
        dt.update_incremental()
        dt.create_checkpoint()


def _buckets(dt: DeltaTable) -> int:
    return Layout.of(dt).buckets


def _split(rows: pa.Table, max_rows: int) -> list[pa.Table]:
    """`rows` in equal parts of at most `max_rows` rows (no small remainder file); none when
    empty."""
    parts = -(-rows.num_rows // max_rows)
    step = -(-rows.num_rows // max(1, parts)) if parts else 1
    return [rows.slice(start, step).select(TABLE_SCHEMA.names)
            for start in range(0, rows.num_rows, step)]


def rows_per_file(dt: DeltaTable) -> int:
    """Rows per data file written here: the table's `delta.targetFileSize` over an in-memory
    estimate of a row (`ROW_BYTES`; delta-rs sizes its files by the same kind of estimate:
    128 KiB gives ~2k rows per file there and here)."""
    target = dt.metadata().configuration.get(TARGET_FILE_SIZE_KEY)
    if not target:
        return MAX_ROWS_PER_FILE
    return max(1, min(MAX_ROWS_PER_FILE, int(target) // ROW_BYTES))


def _tagged(rows: pa.Table, change_type: str) -> pa.Table:
    return rows.append_column(_CHANGE_TYPE, pa.array([change_type] * rows.num_rows, pa.string()))


def _by_bucket(table: pa.Table):
    """(bucket, rows) for each run of rows of one bucket (a table grouped by bucket: one run
    per bucket)."""
    if table.num_rows == 0:
        return
    buckets = table[BUCKET_COLUMN].to_numpy()
    starts = [0, *(np.flatnonzero(buckets[1:] != buckets[:-1]) + 1).tolist(), len(buckets)]
    for a, b in zip(starts, starts[1:], strict=False):
        yield int(buckets[a]), table.slice(a, b - a)


def _stats(chunk: pa.Table) -> str:
    mins, maxs, nulls = {}, {}, {}
    for name in _STATS_COLUMNS:
        col = chunk[name]
        nulls[name] = col.null_count
        mm = pc.min_max(col).as_py()
        if mm["min"] is not None:
            mins[name], maxs[name] = mm["min"], mm["max"]
    return json.dumps({"numRecords": chunk.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls}, separators=(",", ":"))


