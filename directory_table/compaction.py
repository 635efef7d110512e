"""Sorted compaction of a bucketed directory table: small files are merged with the files whose
path range they overlap, sorted by path and split into files of the table's size, in one
`dataChange=false` commit (no change records: stream offsets stay valid).

delta-rs's own compaction (`optimize.compact`) bin-packs files by size without sorting, so
after it a bucket's files overlap in path range and every lookup reads them all. Here, per
bucket holding more than `max_small_files` small files (fewer rows than half a full file):

1. the small files, and the full files whose [min, max] path range overlaps one of them, are
   read (only those: a bucket's other files stay as they are);
2. their rows are sorted by `relative_path` and written as files of `rows_per_file` rows;
3. one commit removes the files read and adds the new ones, all with `dataChange=false`,
   created at exactly the next version (`rewrite.write_commit`); losing the race to a writer
   raises `CommitFailedError` and the caller plans again.

Buckets are compacted in groups of at most `_GROUP_ROWS` rows per commit, so memory stays
bounded on a huge table.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable

from directory_table.layout import BUCKET_COLUMN, _files_dataset, plain_types
from directory_table.rewrite import rows_per_file, write_commit
from directory_table.schema import TABLE_SCHEMA

__all__ = ["sorted_compact"]

#: rows rewritten per compaction commit (whole buckets; a bigger bucket is a group alone)
_GROUP_ROWS = 1_000_000


def _chosen(files: list[tuple], small_rows: int) -> list[tuple]:
    """The small files of a bucket and the files overlapping their path ranges."""
    small = [f for f in files if f[3] is None or f[3] < small_rows]
    ranges = [(f[4], f[5]) for f in small if f[4] is not None and f[5] is not None]
    if any(f[4] is None or f[5] is None for f in small):
        return files  # a file without statistics: its range is unknown, take the bucket
    out = []
    for f in files:
        lo, hi = f[4], f[5]
        if f in small or (lo is not None and hi is not None
                          and any(lo <= b and a <= hi for a, b in ranges)):
            out.append(f)
    return out


def sorted_compact(dt: DeltaTable, max_small_files: int, storage_options: dict[str, str],
                   target_size: int | None = None) -> tuple[int, int, int]:
    """Compact the buckets holding more than `max_small_files` small files (see the module
    docstring). Returns (buckets compacted, files removed, files added)."""
    per_file = rows_per_file(dt) if target_size is None else max(1, target_size // 64)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    n = len(actions.get("path", []))
    lows = actions.get("min.relative_path", [None] * n)
    highs = actions.get("max.relative_path", [None] * n)
    by_bucket: dict[int, list[tuple]] = defaultdict(list)
    for path, size, bucket, rows, lo, hi in zip(
            actions.get("path", []), actions.get("size_bytes", []),
            actions.get(f"partition.{BUCKET_COLUMN}", []), actions.get("num_records", []),
            lows, highs, strict=True):
        by_bucket[int(bucket)].append((path, int(size), int(bucket), rows, lo, hi))
    small_rows = max(1, per_file // 2)
    work = {}
    for bucket, files in sorted(by_bucket.items()):
        if sum(1 for f in files if f[3] is None or f[3] < small_rows) > max_small_files:
            work[bucket] = _chosen(files, small_rows)
    if not work:
        return 0, 0, 0
    groups: list[list[int]] = [[]]
    rows_in_group = 0
    for bucket, files in work.items():
        rows = sum(f[3] or 0 for f in files)
        if groups[-1] and rows_in_group + rows > _GROUP_ROWS:
            groups.append([])
            rows_in_group = 0
        groups[-1].append(bucket)
        rows_in_group += rows
    removed = added = 0
    for group in groups:
        files = [f for b in group for f in work[b]]
        adds = []
        for bucket in group:
            chosen = [f[0] for f in work[bucket]]
            table = _files_dataset(dt, chosen, TABLE_SCHEMA.names).to_table(
                columns=TABLE_SCHEMA.names, use_threads=False)
            table = plain_types(table).cast(TABLE_SCHEMA).sort_by("relative_path")
            adds.append((bucket, table.append_column(
                BUCKET_COLUMN, pa.array([bucket] * table.num_rows, pa.int32()))))
        write_commit(dt, dt.version() + 1, removes=[f[:3] for f in files], adds=adds, cdc=[],
                     data_change=False, now=datetime.now(UTC), storage_options=storage_options,
                     operation=("OPTIMIZE", {"sorted": "relative_path",
                                             "buckets": ",".join(map(str, group))}),
                     custom_metadata={"volume_stream.maintenance": "compact"})
        dt.update_incremental()
        removed += len(files)
        added += sum(-(-t.num_rows // per_file) for _, t in adds if t.num_rows)
    return len(work), removed, added
