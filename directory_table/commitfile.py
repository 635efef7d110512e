"""The log entry and the data/change files of one commit written by volume-stream itself (the
rewrite path, `directory_table.rewrite` and `directory_table.streamed`, and compaction): files
split to the table's size with path statistics, `cdc` files, and the commit created at exactly
the next version by put-if-absent (`filestore.Store`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table import protocol
from directory_table.filestore import Store, run
from directory_table.layout import BUCKET_COLUMN, TARGET_FILE_SIZE_KEY, Layout
from directory_table.schema import TABLE_SCHEMA

__all__ = ["rows_per_file", "write_commit"]

#: most rows per data file written here (a bigger bucket is split, sorted by path)
MAX_ROWS_PER_FILE = 65_536
#: in-memory bytes of a directory-table row, as far as file sizing goes
ROW_BYTES = 64
_FILE = "__file"
_CHANGE_TYPE = pa.field("_change_type", pa.string())
_CDC_SCHEMA = TABLE_SCHEMA.append(_CHANGE_TYPE)
#: columns given min/max statistics in the files this module writes (pruning uses the path)
_STATS_COLUMNS = ("relative_path", "size", "_image_version")

def write_commit(dt: DeltaTable, version: int, *, removes: list[tuple[str, int, int]],
                 adds: list, cdc: list[tuple[int, pa.Table]],
                 data_change: bool, now: datetime, storage_options: dict[str, str],
                 operation: tuple[str, dict], custom_metadata: dict[str, Any] | None = None,
                 metrics: dict[str, int] | None = None, store: Store | None = None,
                 marked: list[dict] | None = None,
                 extra_files: list[tuple[str, bytes]] | None = None,
                 ) -> list[tuple[str, pa.Table]]:
    """Write the data files (`adds`: rows of one bucket each, as `(bucket, table)` or a
    function making it on a writer thread; split into files of the table's size) and change
    files of one commit, then create its log entry at exactly `version` (`CommitFailedError`
    if another writer made it first). `removes`: (path, size, bucket) of the files the commit
    replaces. `data_change=False` marks a commit that changes no row (compaction): readers of
    the change feed skip it. `store`: the table's files, when the caller has it open.
    `marked`: `remove`/`add` actions giving files new deletion vectors (`directory_table.mor`),
    `extra_files`: (name, bytes) of files they need (a DV file), written before the log entry.
    Returns the data files written: (path, rows), rows in file order."""
    max_rows = rows_per_file(dt)
    store = store or Store(dt.table_uri, storage_options)
    stamp = int(now.timestamp() * 1000)
    actions: list[dict] = [
        {"remove": {"path": path, "dataChange": data_change, "deletionTimestamp": stamp,
                    "extendedFileMetadata": True,
                    "partitionValues": {BUCKET_COLUMN: str(bucket)}, "size": size}}
        for path, size, bucket in removes]
    for action in marked or ():
        if "remove" in action:
            action["remove"]["deletionTimestamp"] = stamp
        actions.append(action)

    written: list[tuple[str, pa.Table]] = []

    def write(kind: str, bucket: int, table: pa.Table) -> dict:
        path = (f"{BUCKET_COLUMN}={bucket}/part-00000-{uuid.uuid4()}-c000.snappy.parquet"
                if kind == "add" else
                f"_change_data/{BUCKET_COLUMN}={bucket}/cdc-00000-{uuid.uuid4()}"
                ".c000.snappy.parquet")
        size = store.put(path, table)
        action = {"path": path, "partitionValues": {BUCKET_COLUMN: str(bucket)}, "size": size}
        if kind == "add":
            action.update(modificationTime=stamp, dataChange=data_change, stats=_stats(table))
            written.append((path, table))
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
    jobs += [lambda name=name, body=body: store.put_bytes(name, body) or []
             for name, body in extra_files or ()]
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
        checkpoint(dt, version, storage_options)
    return written


def checkpoint(dt: DeltaTable, version: int, storage_options: dict[str, str]) -> None:
    """A checkpoint of `dt` at `version`: delta-rs's, or ours for a table with deletion
    vectors (delta-rs refuses to checkpoint those: DESIGN §4.8)."""
    if protocol.has_deletion_vectors(dt):
        from directory_table.checkpoint import write_checkpoint

        write_checkpoint(dt.table_uri, storage_options, version)
        return
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


