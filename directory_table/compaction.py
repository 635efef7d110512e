"""Sorted compaction of a bucketed directory table: small files are merged with the files whose
path range they overlap, sorted by path and split into files of the table's size, in one
`dataChange=false` commit (no change records: stream offsets stay valid).

delta-rs's own compaction (`optimize.compact`) bin-packs files by size without sorting, so
after it a bucket's files overlap in path range and every lookup reads them all. Here, per
bucket holding more than `max_small_files` small files (fewer rows than half a full file):

1. the small files (few live rows: a merge-on-read table's per-batch image files, DESIGN
   §4.8, or files whose deletion vector marks `PURGE_FRACTION` of their rows), and the full
   files whose [min, max] path range overlaps one of them, are read without their marked rows
   (only those: a bucket's other files stay as they are);
2. their rows are sorted by `relative_path` and written as files of `rows_per_file` rows;
3. one commit removes the files read and adds the new ones, all with `dataChange=false`,
   created at exactly the next version (`rewrite.write_commit`); losing the race to a writer
   raises `CommitFailedError` and the caller plans again.

Buckets are compacted in groups of at most `_GROUP_ROWS` rows per commit, so memory stays
bounded on a huge table.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable

from directory_table import dv
from directory_table._reads import live_files
from directory_table.deltalog import replay
from directory_table.layout import BUCKET_COLUMN
from directory_table.protocol import has_deletion_vectors
from directory_table.rewrite import rows_per_file, write_commit
from directory_table.schema import BUCKETED_SCHEMA

#: a file whose deletion vector marks at least this share of its rows is rewritten with its
#: live rows only (purged), however big it is
PURGE_FRACTION = 0.2
_NAMES = BUCKETED_SCHEMA.names
_SCHEMA = BUCKETED_SCHEMA

__all__ = ["sorted_compact"]

#: rows rewritten per compaction commit (whole buckets; a bigger bucket is a group alone)
_GROUP_ROWS = 1_000_000


def _chosen(files: list[tuple], is_small: Callable[[tuple], bool]) -> list[tuple]:
    """The small files of a bucket and the files overlapping their path ranges."""
    small = [f for f in files if is_small(f)]
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
    """Compact the buckets holding more than `max_small_files` small files, or a file whose
    deletion vector marks at least `PURGE_FRACTION` of its rows (see the module docstring).
    Returns (buckets compacted, files removed, files added)."""
    per_file = rows_per_file(dt) if target_size is None else max(1, target_size // 64)
    by_bucket: dict[int, list[tuple]] = defaultdict(list)
    descriptors: dict[str, dv.Descriptor] = {}
    if has_deletion_vectors(dt):  # delta-rs's add actions show no deletion vectors
        files = replay(dt.table_uri, storage_options, dt.version()).files
        for path, size, bucket, rows, lo, hi, vector in zip(
                *(files[c].to_pylist() for c in ("log_path", "size", "bucket", "num_records",
                                                 "min_path", "max_path", "deletionVector")),
                strict=True):
            descriptor = dv.Descriptor.of(vector)
            if descriptor is not None:
                descriptors[path] = descriptor
            by_bucket[int(bucket)].append((path, int(size), int(bucket), rows, lo, hi))
    else:
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        n = len(actions.get("path", []))
        for path, size, bucket, rows, lo, hi in zip(
                actions.get("path", []), actions.get("size_bytes", []),
                actions.get(f"partition.{BUCKET_COLUMN}", []), actions.get("num_records", []),
                actions.get("min.relative_path", [None] * n),
                actions.get("max.relative_path", [None] * n), strict=True):
            by_bucket[int(bucket)].append((path, int(size), int(bucket), rows, lo, hi))

    def marked(f: tuple) -> int:
        return descriptors[f[0]].cardinality if f[0] in descriptors else 0

    def small(f: tuple) -> bool:  # few live rows, or many marked ones to purge
        return f[3] is None or f[3] - marked(f) < small_rows or (
            marked(f) >= PURGE_FRACTION * f[3])

    small_rows = max(1, per_file // 2)
    work = {}
    for bucket, files in sorted(by_bucket.items()):
        if (sum(1 for f in files if small(f)) > max_small_files
                or any(marked(f) >= PURGE_FRACTION * (f[3] or 1) for f in files)):
            work[bucket] = _chosen(files, small)
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
            chosen = work[bucket]
            table = live_files(dt, [f[0] for f in chosen], [f[3] for f in chosen],
                               [descriptors.get(f[0]) for f in chosen],
                               [bucket] * len(chosen), _NAMES, storage_options)
            adds.append((bucket, table.cast(_SCHEMA).sort_by("relative_path")))
        # a file is its path and its DV: the remove of a file with one names it
        marked_removes = [{"remove": {"path": f[0], "dataChange": False,
                                      "extendedFileMetadata": True,
                                      "partitionValues": {BUCKET_COLUMN: str(f[2])},
                                      "size": f[1],
                                      "deletionVector": descriptors[f[0]].to_json()}}
                          for f in files if f[0] in descriptors]
        write_commit(dt, dt.version() + 1,
                     removes=[f[:3] for f in files if f[0] not in descriptors],
                     marked=marked_removes, adds=adds, cdc=[],
                     data_change=False, now=datetime.now(UTC), storage_options=storage_options,
                     operation=("OPTIMIZE", {"sorted": "relative_path",
                                             "buckets": ",".join(map(str, group))}),
                     custom_metadata={"volume_stream.maintenance": "compact"})
        dt.update_incremental()
        removed += len(files)
        added += sum(-(-t.num_rows // per_file) for _, t in adds if t.num_rows)
    return len(work), removed, added
