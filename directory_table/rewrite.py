"""The write path of large batches: rewrite the touched files in Arrow and commit the Delta
actions directly, instead of a delta-rs `merge`.

A delta-rs merge of a batch that touches most buckets pays per-file overhead inside the merge
(planning, a scan and two writers per partition: ~0.3 s for 1k events touching 128 buckets of a
10k-row table) and re-reads the files the lookup has just read. Here one scan reads the touched
files whole (all columns); the lookup, the planner and the new files all work from that one
table:

1. `load` reads the files of the batch's buckets whose min/max statistics bracket one of its
   paths (`layout.touched_files`), with the file each row came from.
2. The planner runs on the stored rows of the batch's paths, as for a merge.
3. `commit` rewrites only the files holding a path the plan updates or deletes: their other
   rows are carried over unchanged, the batch's new images added, sorted by path and split into
   files of at most `max_rows_per_file` rows (one bucket per file). New paths of buckets with
   no rewritten file go into new files of their own.
4. Change data is written as Delta `cdc` files (`_change_data/`, one per bucket): exactly the
   `insert`, `update_preimage`, `update_postimage` and `delete` rows of the changed paths. A
   reader of the change feed (delta-rs, Spark) reads a version's `cdc` files instead of its
   added and removed files, so the rows carried over report nothing. A batch that only adds
   new paths and rewrites no file (a backfill into new buckets) writes no `cdc` files: a
   reader takes the rows of a version's added files as inserts then.
5. One commit (`remove` + `add` + `cdc` actions, commitInfo with `readVersion`) is created at
   exactly `base_version + 1` with put-if-absent: an exclusive hard link on a local disk, a PUT
   with `If-None-Match: *` on S3 (what delta-rs >= 1.6 itself does there). A writer that loses
   the race gets `CommitFailedError` and re-plans, as with a merge; its files stay unreferenced
   (vacuum removes them).

Only tables in the bucketed layout on a local disk or S3 take this path (`supported`); others
keep the merge. A batch whose touched files hold more than `MAX_LOADED_ROWS` rows (overwrites
spread over a huge table) is read file by file and rewritten in runs of a bucket's files, with
bounded memory
(`directory_table.streamed`). Files are written on a small pool of daemon threads when the
machine has a core to spare (`filestore.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table.commitfile import (  # noqa: F401  (re-exported: compaction, tests)
    _CDC_SCHEMA,
    _CHANGE_TYPE,
    _FILE,
    _STATS_COLUMNS,
    MAX_ROWS_PER_FILE,
    ROW_BYTES,
    _by_bucket,
    _split,
    _stats,
    _tagged,
    rows_per_file,
    write_commit,
)
from directory_table.layout import (
    BUCKET_COLUMN,
    Layout,
    plain_types,
)
from directory_table.schema import TABLE_SCHEMA

if TYPE_CHECKING:
    from directory_table.streamed import Streamed

__all__ = ["Loaded", "commit", "load", "rows_per_file", "supported", "write_commit"]

#: most rows of touched files a rewrite keeps in memory from `load` to `commit`; a batch
#: touching files holding more is streamed (each file read again as it is rewritten)
MAX_LOADED_ROWS = 2_000_000



def supported(dt: DeltaTable, layout: Layout) -> bool:
    """Whether `dt` can take this path: bucketed, on a local disk or S3."""
    scheme = urlparse(dt.table_uri).scheme.lower()
    return layout.bucketed and scheme in ("", "file", "s3", "s3a")


@dataclass
class Loaded:
    """The touched files of a batch, read whole."""

    #: every row of the files read, with `_bucket` and the index in `files` of its file
    rows: pa.Table
    #: the files read: (path relative to the table, size in bytes, bucket)
    files: list[tuple[str, int, int]]
    #: the rows holding one of the batch's paths, and their positions in `rows`
    found: pa.Table
    positions: np.ndarray
    #: the files of a merge-on-read load (`directory_table.mor`), by the rows' file index
    entries: list | None = None

    @classmethod
    def of(cls, rows: pa.Table, files: list[tuple[str, int, int]], paths: list[str]) -> Loaded:
        if not rows.num_rows:  # nothing stored there (new buckets): no lookup to make
            return cls(rows, files, rows, np.zeros(0, dtype=np.int64))
        where = pc.is_in(rows["relative_path"], value_set=pa.array(paths, pa.string()))
        positions = np.flatnonzero(where.to_numpy(zero_copy_only=False))
        return cls(rows, files, rows.take(pa.array(positions, pa.int64())), positions)

    def stored(self, paths: list[str]) -> pa.Table:
        """The rows of `paths` (those stored)."""
        if not self.found.num_rows:
            return self.found
        keys = self.found["relative_path"]
        return self.found.filter(pc.is_in(keys, value_set=pa.array(paths, pa.string())))


def load(dt: DeltaTable, layout: Layout, paths: list[str], max_rows: int | None = None,
         *, storage_options: dict[str, str] | None = None,
         candidates: list[tuple] | None = None,
         by_bucket: dict[int, list[str]] | None = None,
         follows: Callable[[list[tuple]], set[str]] | None = None) -> Loaded | Streamed:
    """Read whole every data file that may hold one of `paths` (see the module docstring);
    when they hold more than `max_rows` (default `MAX_LOADED_ROWS`) rows, a `Streamed` load
    instead (`directory_table.streamed`: read file by file, bounded memory). `candidates`: those
    files as (bucket, min path or "", path, size, rows, min path, max path), when the caller
    knows them
    (`directory_table.files.FileIndex.candidates`); else from `dt`'s add actions. `by_bucket`:
    `paths` by bucket, sorted (`batch.Batch.by_bucket`), when the caller has them; `follows`:
    which of those files come right after another of them (`FileIndex.follows`), for a
    streamed load (without it, each file is rewritten on its own)."""
    from directory_table.layout import _files_dataset  # one reader for local and remote files
    from directory_table.streamed import candidates_of
    from directory_table.streamed import load as load_streamed

    max_rows = MAX_LOADED_ROWS if max_rows is None else max_rows

    found = sorted(candidates) if candidates is not None else candidates_of(dt, layout, paths)
    # read in (bucket, path range) order: rows come out grouped by bucket, sorted by path
    # inside it when the files' ranges do not overlap
    files = [(p, size, bucket) for bucket, _, p, size, *_ in found]
    counts = [f[4] for f in found]
    if sum(n or 0 for n in counts) > max_rows:  # too much to hold in memory at once
        return load_streamed(dt, layout, paths, max_rows, storage_options=storage_options,
                             found=found, by_bucket=by_bucket,
                             follows=follows(found) if follows is not None else set())
    schema = TABLE_SCHEMA.append(pa.field(BUCKET_COLUMN, pa.int32())).append(
        pa.field(_FILE, pa.int32()))
    if not files:
        return Loaded.of(schema.empty_table(), files, paths)
    dataset = _files_dataset(dt, [f[0] for f in files], TABLE_SCHEMA.names)
    table = None
    if all(n is not None for n in counts):
        # one single-threaded scan, which keeps the files' order (measured: a threaded scan,
        # or one naming each row's file, costs 2-4x as much on this 2-core machine)
        table = dataset.to_table(columns=TABLE_SCHEMA.names, use_threads=False)
    if table is None or table.num_rows != sum(counts):
        # no (or wrong) row counts in the log: read file by file to know whose rows are whose
        parts = [frag.to_table(columns=TABLE_SCHEMA.names, use_threads=False)
                 for frag in dataset.get_fragments()]
        counts = [t.num_rows for t in parts]
        table = pa.concat_tables([plain_types(t) for t in parts], promote_options="permissive")
    table = plain_types(table).cast(TABLE_SCHEMA)
    index = np.repeat(np.arange(len(files), dtype=np.int32), counts)
    buckets = np.array([f[2] for f in files], dtype=np.int32)[index]
    table = table.append_column(BUCKET_COLUMN, pa.array(buckets, pa.int32()))
    return Loaded.of(table.append_column(_FILE, pa.array(index, pa.int32())), files, paths)


def commit(dt: DeltaTable, layout: Layout, loaded: Loaded | Streamed, *, version: int,
           new_rows: pa.Table,
           updated: list[str], deleted: list[str], inserted: list[str], now: datetime,
           custom_metadata: dict[str, Any], storage_options: dict[str, str]) -> None:
    """Write the files and the commit of one batch at `version` (see the module docstring).

    `new_rows` are the images of `inserted` and `updated` paths (with `_bucket`);
    `loaded` holds the stored rows of `updated` and `deleted` paths. Raises
    `CommitFailedError` when another writer made `version` first.
    """
    if not isinstance(loaded, Loaded):
        from directory_table.streamed import commit as commit_streamed

        return commit_streamed(dt, layout, loaded, version=version, new_rows=new_rows,
                               updated=updated, deleted=deleted, inserted=inserted, now=now,
                               custom_metadata=custom_metadata,
                               storage_options=storage_options)
    rows = loaded.rows
    names = [*TABLE_SCHEMA.names, BUCKET_COLUMN]
    # per stored row: the index of its new image (-1: not updated), whether it is deleted;
    # worked out on the rows of the batch's paths only, then spread over all rows
    found = loaded.found["relative_path"]
    image_of = np.full(rows.num_rows, -1, dtype=np.int64)
    if updated:  # `new_rows` holds the images of `inserted` and `updated` paths, nothing else
        is_update = pc.is_in(new_rows["relative_path"], value_set=pa.array(updated, pa.string()))
        images, new_paths = new_rows.filter(is_update), new_rows.filter(pc.invert(is_update))
        image_of[loaded.positions] = pc.fill_null(
            pc.index_in(found, value_set=images["relative_path"]), -1).to_numpy()
    else:
        images, new_paths = new_rows.slice(0, 0), new_rows
    gone = np.zeros(rows.num_rows, dtype=bool)
    if deleted:
        gone[loaded.positions] = pc.is_in(found, value_set=pa.array(
            deleted, pa.string())).to_numpy(zero_copy_only=False)
    hit = (image_of >= 0) | gone
    file_of = rows[_FILE].to_numpy()
    rewritten = np.unique(file_of[hit]).tolist()
    if rewritten:
        # the rows of the rewritten files, in their order (files ordered by bucket and path
        # range): an updated row takes its new image in place, a deleted one is dropped, so
        # the files' sort order holds without sorting anything; one `take` builds them
        keep = np.flatnonzero(np.isin(file_of, rewritten) & ~gone)
        source = keep.copy()
        moved = image_of[keep] >= 0
        source[moved] = rows.num_rows + image_of[keep][moved]
        # one chunk: `take` over the scan's many small chunks costs several times more
        both = pa.concat_tables([rows.select(names),
                                 images.select(names).cast(rows.select(names).schema)])
        kept = both.combine_chunks().take(pa.array(source, pa.int64()))
        hit_rows = np.flatnonzero(hit)
        stored = rows.take(pa.array(hit_rows, pa.int64())).drop_columns([_FILE])
        stored_gone = pa.array(gone[hit_rows])
        cdc = list(_by_bucket(pa.concat_tables([
            _tagged(new_paths, "insert"),
            _tagged(stored.filter(pc.invert(stored_gone)), "update_preimage"),
            _tagged(images, "update_postimage"),
            _tagged(stored.filter(stored_gone), "delete"),
        ]).sort_by([(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])))
    else:
        # only new paths, in new files: a reader of the change feed takes the rows of the
        # added files as inserts (the Delta protocol), so no change data is written
        kept, cdc = rows.select(names).slice(0, 0), []
    data = _with_new_paths(kept, new_paths.select(names).cast(kept.schema))

    removes = [loaded.files[i] for i in rewritten]
    write_commit(dt, version, removes=removes, adds=list(data), cdc=cdc,
                 data_change=True, now=now, storage_options=storage_options,
                 operation=("WRITE", {"mode": "Append", "rewrite": "volume-stream"}),
                 custom_metadata=custom_metadata,
                 metrics={"numCopiedRows": kept.num_rows - images.num_rows})


def _with_new_paths(kept: pa.Table, new: pa.Table) -> list[tuple[int, pa.Table]]:
    """(bucket, rows) to write: each bucket's rewritten rows with the bucket's new paths.
    New paths that all sort after the rewritten rows are appended; otherwise the bucket's rows
    are sorted by path (a bucket without rewritten rows gets its sorted new paths alone)."""
    out: dict[int, list[pa.Table]] = {}
    for bucket, rows in _by_bucket(kept):
        out.setdefault(bucket, []).append(rows)
    for bucket, rows in _by_bucket(new):
        out.setdefault(bucket, []).append(rows)
    result = []
    for bucket, parts in out.items():
        if len(parts) == 1:
            result.append((bucket, parts[0]))
            continue
        rows = pa.concat_tables(parts)
        first_new = pc.min(parts[-1]["relative_path"]).as_py()
        if not all(pc.max(p["relative_path"]).as_py() < first_new for p in parts[:-1]):
            rows = rows.sort_by("relative_path")
        result.append((bucket, rows))
    return sorted(result, key=lambda r: r[0])
