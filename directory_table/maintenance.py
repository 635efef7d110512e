"""Keeping a directory table small and fast over time: compaction, checkpoints, log clean-up,
and the one-off migration of a pre-bucket table into buckets.

Compaction (`optimize`) of a bucketed directory table on a disk or S3 is the sorted compaction
of `directory_table.compaction`: in the buckets holding more than `max_files_per_bucket` small
files, those files and the ones whose path range they overlap are rewritten sorted by path and
split into files of the table's size. Elsewhere (tombstones, pre-bucket tables, other stores)
it is delta-rs's `optimize.compact` on the buckets holding more than `max_files_per_bucket`
files. Either commit rewrites files without changing any row (`dataChange=false`), so the
change data feed has nothing for it: streams read across it see the same records and their
offsets (versions) stay valid.

Migration cannot be a `dataChange=false` commit: changing the partition column needs an
overwrite, whose change feed would delete and re-insert every row. So it is made visible to
`DirectoryTable.changes()` instead: the table's configuration records the version of the
migration commit (`volume_stream.migrated_version`), and `changes()` reads the versions before
it at the old layout and leaves the migration version itself out. Rows keep their
`_image_version`/`_image_timestamp`, so change records are the same before and after.

    result = table.optimize()                # compact busy buckets, checkpoint, clean the log
    result = table.optimize(migrate=True)    # the same, after migrating an old table
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from directory_table import protocol, rewrite
from directory_table.commitfile import checkpoint as write_checkpoint
from directory_table.compaction import sorted_compact
from directory_table.errors import CommitConflict
from directory_table.layout import (
    BUCKET_COLUMN,
    BUCKETS_KEY,
    DEFAULT_BUCKETS,
    MIGRATED_KEY,
    Layout,
    bucket_array,
    plain_types,
)

#: a `DirectoryTable` (not imported: the table imports this module)
DirectoryTable = Any

__all__ = ["MAINTENANCE_KEY", "OptimizeResult", "apply_retention", "enable_deletion_vectors",
           "migrate", "optimize"]

log = logging.getLogger(__name__)

#: commit metadata key naming a maintenance commit (value: "migrate")
MAINTENANCE_KEY = "volume_stream.maintenance"
_ATTEMPTS = 5


@dataclass
class OptimizeResult:
    """What one `optimize` did (per table: `directory` and `tombstones`)."""

    #: version of the migration commit, when this call migrated the table
    migrated_version: int | None = None
    #: buckets compacted (all of an unbucketed table count as one, bucket 0)
    buckets_compacted: int = 0
    files_removed: int = 0
    files_added: int = 0
    #: version of the checkpoint written (the latest version)
    checkpoint_version: int | None = None
    removed_logs: int = 0
    tombstones: dict = field(default_factory=dict)


def files_per_bucket(dt: DeltaTable) -> dict[int, int]:
    """Number of data files in each bucket (bucket 0 for an unbucketed table)."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    column = f"partition.{BUCKET_COLUMN}"
    if actions.num_rows == 0:
        return {}
    if column not in actions.column_names:
        return {0: actions.num_rows}
    counts = pc.value_counts(actions[column]).to_pylist()
    return {int(c["values"]): int(c["counts"]) for c in counts}


def compact(dt: DeltaTable, max_files_per_bucket: int, target_size: int | None = None,
            ) -> tuple[int, int, int]:
    """Compact the buckets holding more than `max_files_per_bucket` files in one commit.
    Returns (buckets compacted, files removed, files added)."""
    busy = sorted(b for b, n in files_per_bucket(dt).items() if n > max_files_per_bucket)
    if not busy:
        return 0, 0, 0
    filters = None
    if Layout.of(dt).bucketed:
        filters = [(BUCKET_COLUMN, "in", [str(b) for b in busy])]
    metrics = dt.optimize.compact(partition_filters=filters, target_size=target_size,
                                  max_concurrent_tasks=2)
    return len(busy), int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


def _compact_retrying(dt: DeltaTable, max_files: int, target_size: int | None,
                      storage_options: dict[str, str] | None = None) -> tuple[int, int, int]:
    """`storage_options` given: a bucketed directory table on a store the rewrite path
    supports gets the sorted compaction (`directory_table.compaction`)."""
    layout = Layout.of(dt)
    use_sorted = storage_options is not None and rewrite.supported(dt, layout)
    for attempt in range(_ATTEMPTS):
        try:
            if use_sorted:
                return sorted_compact(dt, max_files, storage_options or {}, target_size)
            return compact(dt, max_files, target_size)
        except CommitFailedError:
            # a writer committed meanwhile and touched the same files: plan again
            log.info("compaction of %s lost a race (attempt %d); retrying", dt.table_uri,
                     attempt + 1)
            dt.update_incremental()
    return 0, 0, 0


def optimize(table: DirectoryTable, *, max_files_per_bucket: int = 4,
             target_size: int | None = None, migrate_layout: bool = False,
             buckets: int = DEFAULT_BUCKETS, checkpoint: bool = True) -> OptimizeResult:
    """See `DirectoryTable.optimize`."""
    result = OptimizeResult()
    protocol.check(table.delta(), table.path, write=True)
    if migrate_layout:
        result.migrated_version = migrate(table, buckets=buckets)
    dt = table.delta()
    result.buckets_compacted, result.files_removed, result.files_added = _compact_retrying(
        dt, max_files_per_bucket, target_size, table.storage_options)
    tomb = table.tombstones()
    b, removed, added = _compact_retrying(tomb, max_files_per_bucket, target_size)
    result.tombstones = {"buckets_compacted": b, "files_removed": removed, "files_added": added}
    if checkpoint:
        dt = table.delta()
        write_checkpoint(dt, dt.version(), table.storage_options)
        result.checkpoint_version = dt.version()
        # removes log entries older than the table's delta.logRetentionDuration only
        result.removed_logs = dt.cleanup_metadata()
        tomb = table.tombstones()
        tomb.create_checkpoint()
        tomb.cleanup_metadata()
    table._dt = None
    return result


def enable_deletion_vectors(table: DirectoryTable) -> int | None:
    """See `DirectoryTable.enable_deletion_vectors`: one metadata commit setting
    `delta.enableDeletionVectors`, which makes delta-rs upgrade the protocol to reader 3 /
    writer 7 with the feature (no data change: streams read across it see nothing)."""
    dt = table.delta()
    if protocol.writes_deletion_vectors(dt):
        return None
    if not Layout.of(dt).bucketed or not rewrite.supported(dt, Layout.of(dt)):
        raise protocol.UnsupportedFeature(table.path, ["deletionVectors (migrate the table "
                                                       "into buckets first, on a local disk "
                                                       "or S3)"], write=True)
    dt.alter.set_table_properties({protocol.DV_KEY: "true"}, raise_if_not_exists=False,
                                  commit_properties=CommitProperties(max_commit_retries=0))
    table._dt = table._index = None
    return table.delta().version()


def migrate(table: DirectoryTable, *, buckets: int = DEFAULT_BUCKETS) -> int | None:
    """Rewrite a pre-bucket table (and its tombstones) into `buckets` buckets, each in one
    commit. Returns the version of the directory table's migration commit, or None when the
    table is bucketed already.

    The migration version is recorded in the table's configuration first (a metadata-only
    commit, no change records), then the rows are rewritten, unchanged, at exactly that
    version; a writer that commits in between makes the rewrite fail, and it starts over.
    """
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, not {buckets}")
    _migrate_tombstones(table, buckets)
    for _attempt in range(_ATTEMPTS):
        dt = table.delta()
        if Layout.of(dt).bucketed:
            return None
        version = dt.version() + 2
        dt.alter.set_table_properties(
            {BUCKETS_KEY: str(buckets), MIGRATED_KEY: str(version)}, raise_if_not_exists=False,
            commit_properties=CommitProperties(max_commit_retries=0))
        dt = table.delta()
        if dt.version() != version - 1:
            continue
        rows = _bucketed(dt, buckets)
        try:
            write_deltalake(dt, rows, mode="overwrite", schema_mode="overwrite",
                            partition_by=[BUCKET_COLUMN],
                            commit_properties=CommitProperties(
                                max_commit_retries=0,
                                custom_metadata={MAINTENANCE_KEY: "migrate"}))
        except CommitFailedError:
            log.info("migration of %s lost a race for version %d; retrying", table.path,
                     version)
            table._dt = None
            continue
        table._dt = None
        log.info("directory table %s migrated into %d buckets at version %d", table.path,
                 buckets, version)
        return version
    raise CommitConflict(f"could not migrate {table.path}: other writers kept committing")


def _bucketed(dt: DeltaTable, buckets: int) -> pa.Table:
    """Every row of `dt` with its `_bucket`, sorted by (bucket, path). Held in memory once:
    a migration is a one-off rewrite of the whole table."""
    rows = plain_types(dt.to_pyarrow_dataset().to_table(use_threads=False))
    rows = rows.append_column(pa.field(BUCKET_COLUMN, pa.int32()),
                              bucket_array(rows["relative_path"].to_pylist(), buckets))
    return rows.sort_by([(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])


def _migrate_tombstones(table: DirectoryTable, buckets: int) -> None:
    for _attempt in range(_ATTEMPTS):
        tomb = table.tombstones()
        if Layout.of(tomb).bucketed:
            return
        tomb.alter.set_table_properties({BUCKETS_KEY: str(buckets)}, raise_if_not_exists=False)
        tomb = table.tombstones()
        try:
            write_deltalake(tomb, _bucketed(tomb, buckets), mode="overwrite",
                            schema_mode="overwrite", partition_by=[BUCKET_COLUMN],
                            commit_properties=CommitProperties(
                                max_commit_retries=0,
                                custom_metadata={MAINTENANCE_KEY: "migrate"}))
            return
        except CommitFailedError:
            continue
    raise CommitConflict(f"could not migrate {table.tombstones_path}: other writers kept "
                       "committing")


def apply_retention(table: DirectoryTable, retention_days: float) -> dict:
    """See `DirectoryTable.apply_retention`."""
    dt = table.delta()
    protocol.check(dt, table.path, write=True)
    write_checkpoint(dt, dt.version(), table.storage_options)
    removed_logs = dt.cleanup_metadata()
    vacuumed = dt.vacuum(retention_hours=int(retention_days * 24),
                         enforce_retention_duration=False, dry_run=False)
    horizon = datetime.now(UTC) - timedelta(days=retention_days)
    table.tombstones().delete(f"deleted_at < '{horizon.strftime('%Y-%m-%d %H:%M:%S.%f')}'")
    table._dt = None
    return {"oldest_version": table.oldest_version(), "vacuumed_files": len(vacuumed),
            "removed_logs": removed_logs}
