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

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from directory_table import dv
from directory_table._reads import live_files
from directory_table.deltalog import replay
from directory_table.files import FileIndex
from directory_table.layout import BUCKET_COLUMN
from directory_table.protocol import has_deletion_vectors
from directory_table.rewrite import rows_per_file, write_commit
from directory_table.schema import BUCKETED_SCHEMA

#: a file whose deletion vector marks at least this share of its rows is rewritten with its
#: live rows only (purged), however big it is
PURGE_FRACTION = 0.2
_NAMES = BUCKETED_SCHEMA.names
_SCHEMA = BUCKETED_SCHEMA

__all__ = ["FOLD_MIN_FILES", "fold_after", "fold_small_files", "sorted_compact"]

log = logging.getLogger(__name__)

#: a bucket is folded once it holds this many small files (Delta's auto compaction waits for
#: 50 too, `spark.databricks.delta.autoCompact.minNumFiles`)
FOLD_MIN_FILES = 50

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
        _, gone, new = _rewrite(dt, dt.version() + 1, {b: work[b] for b in group}, descriptors,
                                storage_options, per_file)
        dt.update_incremental()
        removed += gone
        added += new
    return len(work), removed, added


def fold_after(dt: DeltaTable, version: int, files_at: Callable[[], FileIndex | None],
               written: list[tuple[str, pa.Table]], keys, min_files: int | None,
               storage_options: dict[str, str]) -> int | None:
    """After the merge-on-read commit of `version`, which wrote the data files `written`:
    fold the small files of one of their buckets when due (`fold_small_files`) and record the
    fold in the key index `keys` (`keyed.KeyCache`). Best effort: the batch is committed
    already, a fold that fails (another writer took the version, a store error) is left to a
    later batch. `files_at()`: the table's files, as of `version` when no other writer came
    between. Returns the fold's version, or None."""
    if not min_files or not written:
        return None
    buckets = {int(path.split("/", 1)[0].split("=", 1)[1]) for path, _ in written}
    try:
        files = files_at()
        if files is None or files.version != version:
            return None
        folded = fold_small_files(dt, version + 1, files, buckets, min_files, storage_options)
    except CommitFailedError:
        log.info("directory table %s: another writer committed version %d first; the fold "
                 "of small files waits for a later batch", dt.table_uri, version + 1)
        return None
    except Exception as exc:  # noqa: BLE001 (a fold is an optimisation: never fail the batch)
        log.warning("directory table %s: folding small files failed (%s); a later batch "
                    "tries again", dt.table_uri, exc)
        return None
    if folded is None:
        return None
    log.info("directory table %s: version %d folds small files into %d", dt.table_uri,
             version + 1, len(folded))
    keys.record(version + 1, [], folded)
    return version + 1


def fold_small_files(dt: DeltaTable, version: int, files: FileIndex, buckets: Iterable[int],
                     min_files: int, storage_options: dict[str, str],
                     ) -> list[tuple[str, pa.Table]] | None:
    """Auto-compaction after a merge-on-read commit (DESIGN §4.8): of `buckets` (those the
    commit wrote to), the one holding the most small files (fewer live rows than half a full
    file), when it holds at least `min_files`, has them folded together (sorted, without
    their marked rows) in a `dataChange=false` commit at exactly `version`; the other files
    of the bucket stay as they are. One bucket a commit keeps the work per batch small (tens
    of small files) and still outpaces the files batches add. `files`: the table's files at
    `version - 1`. Returns the files written, or None when no bucket was due.
    Raises `CommitFailedError` when another writer took `version`."""
    per_file = rows_per_file(dt)
    small_rows = max(1, per_file // 2)
    due = []
    for bucket in set(buckets):
        small = [e for e in files.by_bucket.get(bucket, {}).values()
                 if e.live_rows is not None and e.live_rows < small_rows]
        if len(small) >= min_files:
            due.append((len(small), bucket, small))
    if not due:
        return None
    _, bucket, small = max(due)
    descriptors = {e.path: e.dv for e in small if e.dv is not None}
    work = {bucket: [(e.path, e.size, e.bucket, e.rows, e.low, e.high) for e in small]}
    return _rewrite(dt, version, work, descriptors, storage_options, per_file, fold=True)[0]


def _rewrite(dt: DeltaTable, version: int, work: dict[int, list[tuple]],
             descriptors: dict[str, dv.Descriptor], storage_options: dict[str, str],
             per_file: int, fold: bool = False,
             ) -> tuple[list[tuple[str, pa.Table]], int, int]:
    """One `dataChange=false` commit at `version` replacing the files `work` names (per
    bucket: (path, size, bucket, rows, min path, max path)) by their live rows, sorted by path
    and split into files of `per_file` rows. Returns (files written, files removed, files
    added)."""
    adds = []
    for bucket, chosen in work.items():
        table = live_files(dt, [f[0] for f in chosen], [f[3] for f in chosen],
                           [descriptors.get(f[0]) for f in chosen],
                           [bucket] * len(chosen), _NAMES, storage_options)
        adds.append((bucket, table.cast(_SCHEMA).sort_by("relative_path")))
    files = [f for chosen in work.values() for f in chosen]
    # a file is its path and its DV: the remove of a file with one names it
    marked_removes = [{"remove": {"path": f[0], "dataChange": False,
                                  "extendedFileMetadata": True,
                                  "partitionValues": {BUCKET_COLUMN: str(f[2])},
                                  "size": f[1],
                                  "deletionVector": descriptors[f[0]].to_json()}}
                      for f in files if f[0] in descriptors]
    written = write_commit(
        dt, version, removes=[f[:3] for f in files if f[0] not in descriptors],
        marked=marked_removes, adds=adds, cdc=[], data_change=False, now=datetime.now(UTC),
        storage_options=storage_options,
        operation=("OPTIMIZE", {"sorted": "relative_path", "buckets": ",".join(map(str, work))}),
        custom_metadata={"volume_stream.maintenance": "fold" if fold else "compact"})
    return written, len(files), sum(-(-t.num_rows // per_file) for _, t in adds if t.num_rows)
