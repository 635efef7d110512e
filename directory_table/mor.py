"""Merge-on-read commits of a directory table with deletion vectors (DESIGN §4.8).

A batch's overwrites and deletes mark the old rows in the deletion vectors (DVs) of the files
they sit in instead of rewriting those files; the new images, with the rows of new paths, go to
new files (per bucket, sorted by path), and the commit carries the batch's change data:

1. `load` finds the stored rows of the batch's paths and their positions in their files: from
   the key index when the table has one (`directory_table.keyindex`: no data file read), else by
   scanning the candidate files (`files.FileIndex.candidates`) and keeping only the batch's
   rows that no DV marks. Memory is O(batch) either way, however many rows the files hold.
2. The planner decides on those rows, as for copy-on-write (`planner.plan_changes`).
3. `commit` marks each updated or deleted row's position in its file's DV (the union with the
   DV the file has), writes the batch's DVs as one DV file (or inline, when small), the new
   rows' files and the `_change_data` files, and creates the log entry at exactly the next
   version with put-if-absent (`commitfile.write_commit`).

    loaded = load(dt, index, paths, store)
    commit(dt, layout, loaded, version=8, new_rows=..., updated=[...], deleted=[...], ...)
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyroaring import BitMap

from directory_table import dv
from directory_table.commitfile import _FILE, _by_bucket, _tagged, write_commit
from directory_table.files import FileEntry
from directory_table.filestore import Store
from directory_table.layout import BUCKET_COLUMN, Layout, _files_dataset, plain_types
from directory_table.rewrite import Loaded
from directory_table.schema import TABLE_SCHEMA

__all__ = ["commit", "load", "marked_rows"]

#: a loaded row's position in its data file
POS = "__pos"
_NAMES = [*TABLE_SCHEMA.names, BUCKET_COLUMN]


def marked_rows(entry: FileEntry, store: Store) -> np.ndarray:
    """The positions `entry`'s DV marks deleted (none: an empty array)."""
    if entry.dv is None or not entry.dv.cardinality:
        return np.zeros(0, dtype=np.int64)
    return entry.dv.rows(store.read_range)


def load(dt: DeltaTable, entries: list[FileEntry], paths: list[str], store: Store) -> Loaded:
    """The live stored rows of `paths` in the files `entries` (the candidates: files of the
    paths' buckets whose path range brackets one of them), with their file (`_FILE`, an index
    into `Loaded.files`) and position in it (`POS`). One scan of the files in order; only the
    batch's rows are kept."""
    files = [(e.path, e.size, e.bucket) for e in entries]
    schema = pa.schema([*(f for f in TABLE_SCHEMA), pa.field(BUCKET_COLUMN, pa.int32()),
                        pa.field(_FILE, pa.int32()), pa.field(POS, pa.int64())])
    if not entries:
        return Loaded.of(schema.empty_table(), files, paths)
    wanted = pa.array(sorted(set(paths)), pa.string())
    dataset = _files_dataset(dt, [e.path for e in entries], TABLE_SCHEMA.names)
    if all(e.rows is not None for e in entries):
        counts = np.array([e.rows for e in entries], dtype=np.int64)
        parts, offset = [], 0
        for batch in dataset.to_batches(columns=TABLE_SCHEMA.names, use_threads=False):
            hit = np.flatnonzero(pc.is_in(batch.column("relative_path"), value_set=wanted)
                                 .to_numpy(zero_copy_only=False))
            if len(hit):
                parts.append((pa.Table.from_batches([batch.take(pa.array(hit))]), hit + offset))
            offset += batch.num_rows
        if offset != counts.sum():
            raise ValueError(f"the files of {dt.table_uri} hold {offset} rows, their add "
                             f"actions say {counts.sum()}")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        found = (pa.concat_tables([plain_types(t) for t, _ in parts]) if parts
                 else TABLE_SCHEMA.empty_table())
        where = (np.concatenate([g for _, g in parts]) if parts
                 else np.zeros(0, dtype=np.int64))
        file_of = np.searchsorted(starts, where, side="right") - 1
        position = where - starts[file_of]
    else:  # no row counts in the log: file by file
        tables, file_parts, pos_parts = [], [], []
        for i, fragment in enumerate(dataset.get_fragments()):
            rows = fragment.to_table(columns=TABLE_SCHEMA.names, use_threads=False)
            hit = np.flatnonzero(pc.is_in(rows["relative_path"], value_set=wanted)
                                 .to_numpy(zero_copy_only=False))
            tables.append(plain_types(rows.take(pa.array(hit))))
            file_parts.append(np.full(len(hit), i))
            pos_parts.append(hit)
        found = pa.concat_tables(tables)
        file_of, position = np.concatenate(file_parts), np.concatenate(pos_parts)
    live = np.ones(len(position), dtype=bool)
    for i in np.unique(file_of):
        marked = marked_rows(entries[i], store)
        if len(marked):
            mine = file_of == i
            live[mine] = ~np.isin(position[mine], marked)
    keep = pa.array(np.flatnonzero(live))
    found = found.cast(TABLE_SCHEMA).take(keep)
    buckets = np.array([e.bucket for e in entries], dtype=np.int32)[file_of[live]]
    found = (found.append_column(BUCKET_COLUMN, pa.array(buckets, pa.int32()))
             .append_column(_FILE, pa.array(file_of[live], pa.int32()))
             .append_column(POS, pa.array(position[live], pa.int64())))
    return Loaded.of(found, files, paths)


def from_index(found: pa.Table, entries: list[FileEntry], base_url: str,
               paths: list[str]) -> Loaded:
    """A `load` from the key index's rows of the batch's paths (`keyed.KeyCache.lookup`: the
    stored columns but `url`, `_bucket`, `pos` and `__file_of`): no data file read."""
    found = found.sort_by([("__file_of", "ascending"), ("pos", "ascending")])
    keys = found["relative_path"]
    columns = {f.name: (pc.binary_join_element_wise(pa.scalar(base_url, pa.string()), keys, "")
                        if f.name == "url" else found[f.name]) for f in TABLE_SCHEMA}
    rows = pa.table(columns, schema=TABLE_SCHEMA).append_column(
        pa.field(BUCKET_COLUMN, pa.int32()), found["_bucket"]).append_column(
        pa.field(_FILE, pa.int32()), found["__file_of"]).append_column(
        pa.field(POS, pa.int64()), found["pos"])
    return Loaded.of(rows, [(e.path, e.size, e.bucket) for e in entries], paths)


def commit(dt: DeltaTable, layout: Layout, loaded: Loaded, entries: list[FileEntry], *,
           version: int, new_rows: pa.Table, updated: list[str], deleted: list[str],
           now: datetime, custom_metadata: dict[str, Any], storage_options: dict[str, str],
           store: Store) -> list[tuple[str, pa.Table]]:
    """Write the DVs, files and commit of one batch at `version` (see the module docstring);
    the data files written, (path, rows in file order), for the key index.

    `loaded`: the stored rows of the batch's paths (`load`), `entries` their files;
    `new_rows`: the images of the inserted and updated paths (with `_bucket`). Raises
    `CommitFailedError` when another writer made `version` first.
    """
    found = loaded.found
    keys = found["relative_path"]
    is_update = pc.is_in(keys, value_set=pa.array(updated, pa.string()))
    is_delete = pc.is_in(keys, value_set=pa.array(deleted, pa.string()))
    hit = pc.or_(is_update, is_delete)
    stored = found.filter(hit)
    gone = pc.is_in(stored["relative_path"], value_set=pa.array(deleted, pa.string()))
    if updated:
        new_is_update = pc.is_in(new_rows["relative_path"],
                                 value_set=pa.array(updated, pa.string()))
        images, new_paths = new_rows.filter(new_is_update), new_rows.filter(
            pc.invert(new_is_update))
    else:
        images, new_paths = new_rows.slice(0, 0), new_rows
    marked, dv_file = _marks(stored, entries, store)
    cdc = []
    if stored.num_rows:
        before = stored.select(_NAMES)
        cdc = list(_by_bucket(pa.concat_tables([
            _tagged(new_paths.select(_NAMES).cast(before.schema), "insert"),
            _tagged(before.filter(pc.invert(gone)), "update_preimage"),
            _tagged(images.select(_NAMES).cast(before.schema), "update_postimage"),
            _tagged(before.filter(gone), "delete"),
        ]).sort_by([(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])))
    data = list(_by_bucket(new_rows.select(_NAMES).sort_by(
        [(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])))
    return write_commit(dt, version, removes=[], adds=data, cdc=cdc, data_change=True, now=now,
                        storage_options=storage_options, store=store, marked=marked,
                        extra_files=[dv_file] if dv_file else [],
                        operation=("WRITE", {"mode": "Append", "rewrite": "deletion-vectors"}),
                        custom_metadata=custom_metadata,
                        metrics={"numDeletionVectorsAdded": sum(1 for a in marked if "add" in a),
                                 "numDeletedRows": stored.num_rows, "numCopiedRows": 0})


def _marks(stored: pa.Table, entries: list[FileEntry], store: Store,
           ) -> tuple[list[dict], tuple[str, bytes] | None]:
    """The `remove`/`add` actions giving each file of `stored`'s rows its new DV (the union of
    its DV and the rows' positions), and the DV file holding the DVs too big to go inline."""
    if not stored.num_rows:
        return [], None
    file_of = stored[_FILE].to_numpy()
    positions = stored[POS].to_numpy()
    order = np.argsort(file_of, kind="stable")
    file_of, positions = file_of[order], positions[order]
    bounds = np.flatnonzero(np.diff(file_of)) + 1
    changed: list[tuple[FileEntry, BitMap]] = []
    for part_files, part_pos in zip(np.split(file_of, bounds), np.split(positions, bounds),
                                    strict=True):
        entry = entries[int(part_files[0])]
        rows = BitMap(marked_rows(entry, store).tolist())
        rows.update(part_pos.tolist())
        changed.append((entry, rows))
    # a file whose every row is now marked is removed, not given a DV; a small DV goes inline
    kept = [(entry, rows) for entry, rows in changed if len(rows) < (entry.rows or 0)]
    inline = {id(rows): dv.inline(rows) for _, rows in kept
              if len(dv.encode(rows)) <= dv.INLINE_MAX_BYTES}
    big = [rows for _, rows in kept if id(rows) not in inline]
    name, body, in_file = dv.pack_file(big) if big else (None, b"", [])
    descriptors = {**inline, **{id(rows): d for rows, d in zip(big, in_file, strict=True)}}
    actions: list[dict] = []
    for entry, rows in changed:
        stamp_remove = {"path": entry.path, "dataChange": True, "extendedFileMetadata": True,
                        "partitionValues": {BUCKET_COLUMN: str(entry.bucket)},
                        "size": entry.size, "stats": entry.stats}
        if entry.dv is not None:
            stamp_remove["deletionVector"] = entry.dv.to_json()
        actions.append({"remove": stamp_remove})
        descriptor = descriptors.get(id(rows))
        if descriptor is None:
            continue  # every row of the file is gone: the file goes
        stats = json.loads(entry.stats) if entry.stats else {"numRecords": entry.rows}
        stats["tightBounds"] = False
        actions.append({"add": {"path": entry.path,
                                "partitionValues": {BUCKET_COLUMN: str(entry.bucket)},
                                "size": entry.size, "modificationTime": entry.modified or 0,
                                "dataChange": True,
                                "stats": json.dumps(stats, separators=(",", ":")),
                                "deletionVector": descriptor.to_json()}})
    return actions, ((name, body) if name else None)
