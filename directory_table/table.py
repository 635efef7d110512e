"""The versioned directory table of one volume: a Delta table with Change Data Feed, committed
with delta-rs (DESIGN §2–§4).

Every `apply` is one commit at exactly the next version (optimistic concurrency with no silent
retry at a later version, so each row can record the version that wrote it); a batch that
changes nothing commits nothing. Reads of a version range go through the change data feed, so
they cost O(changes), never O(files).

    table = DirectoryTable.create("/wh/volumes/v1", base_url="file:///data/")
    result = table.apply([FileEvent.created("a.txt", size=3, last_modified_time=now)])
    result.version          # 1
    table.changes(0, 1)     # pyarrow.Table of CDF rows
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from connectors.events import FileEvent
from directory_table import _reads, mor, protocol, rewrite
from directory_table.batch import Batch
from directory_table.cdf import _CDF_SCHEMA, changes, read_cdf  # noqa: F401
from directory_table.compaction import FOLD_MIN_FILES, fold_after
from directory_table.deltalog import replay
from directory_table.errors import CommitConflict, TableMissing
from directory_table.files import CommitLog, FileIndex, Stale
from directory_table.filestore import Store
from directory_table.images import images, rows_for_delete, write_tombstones
from directory_table.keyed import KeyCache, key_root
from directory_table.layout import (
    BUCKETS_KEY,
    DEFAULT_BUCKETS,
    DEFAULT_TARGET_FILE_SIZE,
    TARGET_FILE_SIZE_KEY,
    Layout,
    bucket_groups,
    for_layout,
    read_matching,
    touched_files,
)
from directory_table.planner import Plan, plan_changes
from directory_table.roles import fresh, generation, live_options
from directory_table.schema import (
    BUCKET_FIELD,
    BUCKETED_SCHEMA,
    BUCKETED_TOMBSTONE_SCHEMA,
    TABLE_SCHEMA,
)
from directory_table.storage import list_names

if TYPE_CHECKING:
    from directory_table.maintenance import OptimizeResult

__all__ = ["ApplyResult", "CommitConflict", "DirectoryTable", "TableMissing"]

log = logging.getLogger(__name__)

_COMMIT_TS_KEY = "volume_stream.commit_timestamp"
_MAX_ATTEMPTS = 20
#: most commits a read may be behind its open handle before the handle is brought up to date
_STALE_READS = 50
#: paths planned per group of buckets: bounds the stored rows a huge batch's merge holds
_LOOKUP_GROUP = 200_000
_ROW_COLUMNS = ["relative_path", "size", "etag", "last_modified_time", "_sequencer",
                "_event_time", "_image_version"]
_TOMB_COLUMNS = ["relative_path", "_sequencer", "_event_time", "deleted_version"]


@dataclass(frozen=True)
class ApplyResult:
    """What one `apply` did. `version` is None when nothing changed (no version was made)."""

    version: int | None
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    ignored: int = 0
    unchanged: int = 0
    events: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> int:
        return self.inserted + self.updated + self.deleted


def _retention_config(days: float) -> dict[str, str]:
    interval = f"interval {max(0, int(days * 24 * 3600))} seconds"
    return {"delta.enableChangeDataFeed": "true", "delta.logRetentionDuration": interval,
            "delta.deletedFileRetentionDuration": interval}


class DirectoryTable:
    """One volume's directory table, stored under `root` (`root/directory`, `root/tombstones`)."""

    def __init__(self, root: str, base_url: str, storage_options: dict[str, str] | None = None):
        self.root = root.rstrip("/")
        self.base_url = base_url
        self._options = live_options(storage_options)
        self._generation = self._tomb_generation = -1
        self.path = f"{self.root}/directory"
        self.tombstones_path = f"{self.root}/tombstones"
        self._dt: DeltaTable | None = None
        self._tomb: DeltaTable | None = None
        #: active files of the latest version, advanced from the log (`directory_table.files`)
        self._index: FileIndex | None = None
        self._log = CommitLog(self.path, self._options)
        self._tomb_log = CommitLog(self.tombstones_path, self._options)
        self._oldest: int | None = None  # (oldest_version)

    #: batches of at least this many paths that update or delete rows are written by
    #: rewriting the touched files in Arrow (`directory_table.rewrite`: one scan, no merge);
    #: None: always a delta-rs merge
    rewrite_min_events: int | None = 1
    #: the folder of merge-on-read tables' key indexes (None: `keyed.key_root`'s choice)
    key_index_root: str | None = None
    #: a merge-on-read bucket's small files are folded after a batch once this many (None: no)
    fold_min_files: int | None = FOLD_MIN_FILES

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options, with current credentials (an assumed role's are refreshed)."""
        return fresh(self._options)

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    def create(cls, root: str, base_url: str, *, retention_days: float = 7,
               storage_options: dict[str, str] | None = None,
               buckets: int = DEFAULT_BUCKETS,
               target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
               deletion_vectors: bool = True) -> DirectoryTable:
        """Create an empty table (version 0) and its tombstone table, both split into
        `buckets` hash buckets of `relative_path` (fixed for the table's lifetime), with data
        files of about `target_file_size` bytes (see `directory_table.layout`). With
        `deletion_vectors` (the default) the directory table is merge-on-read (DESIGN §4.8);
        its store must be a local disk or S3 (`rewrite.supported`)."""
        if buckets < 1:
            raise ValueError(f"buckets must be >= 1, not {buckets}")
        table = cls(root, base_url, storage_options)
        config = {**_retention_config(retention_days), BUCKETS_KEY: str(buckets),
                  TARGET_FILE_SIZE_KEY: str(target_file_size)}
        dvs = {protocol.DV_KEY: "true"} if deletion_vectors else {}
        DeltaTable.create(table.path, schema=BUCKETED_SCHEMA, mode="error", name="directory",
                          partition_by=[BUCKET_FIELD.name], configuration={**config, **dvs},
                          storage_options=table.storage_options, raise_if_key_not_exists=False)
        DeltaTable.create(table.tombstones_path, schema=BUCKETED_TOMBSTONE_SCHEMA, mode="error",
                          partition_by=[BUCKET_FIELD.name],
                          configuration={k: v for k, v in config.items()
                                         if k != "delta.enableChangeDataFeed"},
                          storage_options=table.storage_options, raise_if_key_not_exists=False)
        return table

    def delta(self, version: int | None = None) -> DeltaTable:
        """The Delta table at its latest (or a given) version."""
        try:
            if version is not None:
                dt = DeltaTable(self.path, version=version, storage_options=self.storage_options)
                protocol.check(dt, self.path)
                return dt
            options = self.storage_options
            if self._dt is None or generation(options) != self._generation:
                self._dt = DeltaTable(self.path, storage_options=options)
                self._generation = generation(options)
            elif self._log.newer_than(self._dt.version()):
                self._dt.update_incremental()
            else:
                return self._dt  # the latest, checked when it was loaded
            try:  # features another writer (a user's Spark) may have turned on
                protocol.check(self._dt, self.path)
            except protocol.UnsupportedFeature:
                self._dt = self._index = None
                raise
            return self._dt
        except TableNotFoundError as exc:
            raise TableMissing(f"no directory table at {self.path}") from exc

    def tombstones(self) -> DeltaTable:
        """The tombstone table at its latest version (one handle, brought up to date)."""
        options = self.storage_options
        if self._tomb is None or generation(options) != self._tomb_generation:
            self._tomb = DeltaTable(self.tombstones_path, storage_options=options)
            self._tomb_generation = generation(options)
        elif self._tomb_log.newer_than(self._tomb.version()):
            self._tomb.update_incremental()
        return self._tomb

    def layout(self) -> Layout:
        """Bucket count and layout of the latest version (`bucketed=False`: the pre-bucket
        layout, read as it is until `migrate()`)."""
        return Layout.of(self.delta())

    def version(self) -> int:
        """The latest version: the open handle's plus the commits found after it (bringing the
        handle up to date costs a snapshot update that grows with the files: ~18 ms at 10M
        rows, against a look per commit)."""
        if self._dt is not None and generation(self.storage_options) == self._generation:
            latest = self._log.latest_from(self._dt.version())
            if latest is not None and latest - self._dt.version() <= _STALE_READS:
                return latest
        return self.delta().version()

    def reader(self, up_to: int) -> DeltaTable:
        """A handle to read the change feed up to `up_to` with: the open one as it is when the
        commits after it change no metadata (delta-rs reads those commits from the log
        itself), else the latest (`delta()`)."""
        dt = self._dt
        if dt is None or generation(self.storage_options) != self._generation \
                or up_to - dt.version() > _STALE_READS \
                or self._log.changes_metadata(dt.version(), up_to):
            return self.delta()
        return dt

    def file_count(self) -> int:
        """Rows at the latest version from the log's file statistics (no data read), less the
        rows deletion vectors mark."""
        dt = self.delta()
        if protocol.has_deletion_vectors(dt):
            files = replay(dt.table_uri, self.storage_options, dt.version()).files
            marked = pc.struct_field(files["deletionVector"], "cardinality")
            return int((pc.sum(files["num_records"]).as_py() or 0)
                       - (pc.sum(marked).as_py() or 0))
        actions = pa.table(dt.get_add_actions(flatten=True))
        return int(pc.sum(actions["num_records"]).as_py() or 0)

    def url_of(self, relative_path: str) -> str:
        return self.base_url + relative_path

    # ---------------------------------------------------------------- writes
    def apply(self, events: Iterable[FileEvent] | pa.Table, *,
              listed_at_version: int | None = None) -> ApplyResult:
        """Apply a batch of events in one commit (DESIGN §4.1–4.3).

        `events`: `FileEvent`s, or their columns (`batch.EVENT_SCHEMA`). `listed_at_version`
        marks them as a listing's differences from that version (refresh): they are ordered
        by versions rather than clocks (see `planner`). Only the buckets (and files) the batch
        touches are read; a huge batch is planned a group of buckets at a time, so the stored
        rows in memory stay bounded by the group, not the table.

        Example:
            >>> table.apply([FileEvent.removed("old.csv")]).deleted
            1
        """
        started = time.perf_counter()
        batch = Batch.of(events if isinstance(events, pa.Table) else list(events))
        paths = batch.paths()
        for _attempt in range(_MAX_ATTEMPTS):
            dt, index = self._write_state()
            base_version = index.version if index else dt.version()
            layout = Layout.of(dt)
            loaded = None
            merge_on_read = protocol.has_deletion_vectors(dt)
            if merge_on_read and (index is None or not rewrite.supported(dt, layout)):
                raise protocol.UnsupportedFeature(self.path, ["deletionVectors (an unbucketed "
                                                              "table, or this store)"],
                                                  write=True)
            if merge_on_read:
                keys = KeyCache.of(dt.table_uri, self.storage_options,
                                   key_root(self.root, self.key_index_root))
                loaded = keys.load(dt, layout, index, batch.by_bucket(layout.buckets), paths,
                                   self.base_url, self.changes)
            elif (index is not None and self.rewrite_min_events is not None
                    and len(paths) >= self.rewrite_min_events
                    and rewrite.supported(dt, layout)):
                keyed = batch.by_bucket(layout.buckets)
                loaded = rewrite.load(dt, layout, paths, storage_options=self.storage_options,
                                      candidates=index.candidates(layout, paths, keyed),
                                      by_bucket=keyed, follows=index.follows)
            if loaded is None and dt.version() != base_version:
                dt = self.delta()  # lookups and merges read delta-rs's snapshot
                if dt.version() != base_version:
                    continue  # another writer committed meanwhile: plan again
            plan = self._plan(dt, layout, batch, paths, listed_at_version, loaded)
            result_kw = dict(inserted=len(plan.inserts), updated=len(plan.updates),
                             deleted=len(plan.deletes), ignored=plan.ignored + batch.dropped,
                             unchanged=plan.unchanged, events=batch.table.num_rows)
            if plan.empty:
                if len(plan.remembered):  # no new version; a refresh listed at
                    # base_version or later may still name the path (its listing wins)
                    write_tombstones(self.tombstones(), batch.take(plan.remembered),
                                     datetime.now(UTC), base_version)
                return ApplyResult(None, seconds=time.perf_counter() - started, **result_kw)
            try:
                self._commit(dt, layout, base_version, batch, plan, loaded)
            except CommitFailedError:  # lost the race for the version: plan again
                log.info("directory table %s: another writer committed version %d first; "
                         "planning again on it (nothing lost)", self.path, base_version + 1)
                self._dt = self._index = None
                continue
            return ApplyResult(base_version + 1, seconds=time.perf_counter() - started,
                               **result_kw)
        raise CommitConflict(f"could not commit to {self.path} after {_MAX_ATTEMPTS} attempts")

    def _write_state(self) -> tuple[DeltaTable, FileIndex | None]:
        """A handle with the latest metadata (its files may lag) and, when bucketed, the
        index of the latest version's files, advanced from the log (`directory_table.files`)."""
        if (self._dt is None or self._index is None
                or generation(self.storage_options) != self._generation):
            dt = self.delta()
            protocol.check(dt, self.path, write=True)
            if not Layout.of(dt).bucketed:
                self._index = None
            elif protocol.has_deletion_vectors(dt):  # delta-rs's add actions show no DVs
                state = replay(dt.table_uri, self.storage_options, dt.version())
                self._index = FileIndex.of_adds(state.version, state.adds())
            else:
                self._index = FileIndex.of(dt)
            return dt, self._index
        try:
            self._index.advance(self._log)
        except Stale as exc:
            log.info("directory table %s: rebuilding its file index (%s)", self.path, exc)
            self._index = None
            return self._write_state()
        return self._dt, self._index

    def _plan(self, dt: DeltaTable, layout: Layout, batch: Batch, paths: list[str],
              listed_at_version: int | None, loaded: rewrite.Loaded | None) -> Plan:
        tomb = self.tombstones()
        tomb_layout = Layout.of(tomb)

        def tombstones(missing: list[str]) -> pa.Table | None:
            return self._find(tomb, tomb_layout, missing, _TOMB_COLUMNS)

        plan = Plan()
        # (the rewrite path holds the stored rows of all the batch's paths already)
        groups = [paths] if loaded else bucket_groups(paths, layout, _LOOKUP_GROUP)
        row_of = dict(zip(paths, batch.latest.tolist(), strict=True)) if len(groups) > 1 else {}
        for group in groups:
            rows = (np.array([row_of[p] for p in group], dtype=np.int64) if row_of
                    else batch.latest)
            stored = (loaded.stored(group).select(_ROW_COLUMNS) if loaded
                      else self._find(dt, layout, group, _ROW_COLUMNS))
            plan += plan_changes(batch, rows, stored, tombstones, listed_at_version)
        return plan

    def _commit(self, dt: DeltaTable, layout: Layout, base_version: int, batch: Batch,
                plan: Plan, loaded: rewrite.Loaded | None) -> None:
        version = base_version + 1
        now = datetime.now(UTC)
        props = CommitProperties(max_commit_retries=0,
                                 custom_metadata={_COMMIT_TS_KEY: now.isoformat()})
        if len(plan.deletes) or len(plan.remembered):
            write_tombstones(self.tombstones(),
                             batch.take(np.concatenate([plan.deletes, plan.remembered])), now,
                             version)
        changed = np.concatenate([plan.inserts, plan.updates])
        rows = images(batch.take(changed), self.base_url, version, now)  # a merge lays its source out
        laid_out = rows if not layout.bucketed else for_layout(
            rows, layout, batch.buckets(layout.buckets)[changed],
            batch.laid_out(layout.buckets, changed))
        if not len(plan.updates) and not len(plan.deletes) and loaded is None:
            if dt.version() != base_version:  # delta-rs commits after its handle's version
                dt = self.delta()
                if dt.version() != base_version:
                    raise CommitFailedError(f"version {version} already exists")
            write_deltalake(dt, laid_out, mode="append", commit_properties=props)
            return
        if loaded is not None and loaded.entries is not None:
            updated, deleted = batch.paths(plan.updates), batch.paths(plan.deletes)
            written = mor.commit(dt, layout, loaded, loaded.entries, version=version,
                                 new_rows=laid_out, updated=updated, deleted=deleted, now=now,
                                 custom_metadata={_COMMIT_TS_KEY: now.isoformat()},
                                 storage_options=self.storage_options,
                                 store=Store(dt.table_uri, self.storage_options))
            keys = KeyCache.of(dt.table_uri, self.storage_options,
                               key_root(self.root, self.key_index_root))
            keys.record(version, [*updated, *deleted], written)
            fold_after(dt, version, lambda: self._write_state()[1], written, keys,
                       self.fold_min_files, self.storage_options)
            return
        if loaded is not None:
            rewrite.commit(dt, layout, loaded, version=version, new_rows=laid_out,
                           updated=batch.paths(plan.updates),
                           deleted=batch.paths(plan.deletes),
                           inserted=batch.paths(plan.inserts), now=now,
                           custom_metadata={_COMMIT_TS_KEY: now.isoformat()},
                           storage_options=self.storage_options)
            return
        deletes = batch.take(plan.deletes).select(["relative_path"])
        ops = pa.array(["I"] * len(plan.inserts) + ["U"] * len(plan.updates)
                       + ["D"] * len(plan.deletes), pa.string())
        source = pa.concat_tables([rows, rows_for_delete(deletes)]).append_column("_op", ops)
        source = for_layout(source, layout)
        # only updated and deleted paths can match a stored row: they alone name the target's
        # buckets and files to scan (inserts are known to be absent)
        touched = batch.paths(np.concatenate([plan.updates, plan.deletes]))
        predicate = layout.merge_predicate(touched)
        columns = [f.name for f in TABLE_SCHEMA] + ([BUCKET_FIELD.name] if layout.bucketed else [])
        assign = {c: f"s.`{c}`" for c in columns}
        (
            dt.merge(source, predicate, source_alias="s", target_alias="t",
                     commit_properties=props)
            .when_matched_update(updates=assign, predicate="s._op = 'U'")
            .when_matched_delete(predicate="s._op = 'D'")
            .when_not_matched_insert(updates=assign, predicate="s._op = 'I'")
            .execute()
        )

    # ---------------------------------------------------------------- lookups
    @classmethod
    def _find(cls, dt: DeltaTable, layout: Layout, paths: list[str], columns: list[str],
              ) -> pa.Table | None:
        """Stored rows of `paths` (None: none), reading only the files of their buckets whose
        statistics bracket one of them (`layout.touched_files`)."""
        if not paths:
            return None
        return read_matching(dt, touched_files(dt, layout, paths), paths, columns)

    # ---------------------------------------------------------------- reads
    def snapshot(self, version: int | None = None, columns: list[str] | None = None, *,
                 buckets: Iterable[int] | None = None) -> pa.Table:
        """Every row at `version` (default: latest); the public and internal columns unless
        `columns` names others (`_bucket` included). `buckets` reads only those buckets'
        files (a refresh can diff a listing bucket by bucket, `layout.bucket_of`)."""
        cached = self._dt if self._dt is not None and self._dt.version() == version else None
        dt = cached or self.delta(version)
        return _reads.snapshot(dt, list(columns or TABLE_SCHEMA.names), buckets, path=self.path,
                               latest=self.version(), storage_options=self.storage_options)

    def changes(self, after_version: int, up_to_version: int, *, buckets: Iterable[int] |
                None = None, columns: Iterable[str] | None = None) -> pa.Table:
        """The change data feed of versions (after_version, up_to_version]: O(changes)
        (`directory_table.cdf.changes`; `columns`: only those and the change columns)."""
        return changes(self, after_version, up_to_version, buckets, columns)

    def history(self, limit: int | None = None) -> list[dict]:
        """Commits newest first: version, timestamp (UTC datetime), operation, metrics."""
        return [{"version": e["version"], "timestamp": self._commit_time(e),
                 "operation": e.get("operation"), "metrics": e.get("operationMetrics", {})}
                for e in self.delta().history(limit)]

    @staticmethod
    def _commit_time(entry: dict) -> datetime:
        # delta-rs puts custom commit metadata at the top level of commitInfo
        ours = entry.get(_COMMIT_TS_KEY)
        return (datetime.fromisoformat(ours) if ours
                else datetime.fromtimestamp(entry["timestamp"] / 1000, UTC))

    def version_at(self, when: datetime) -> int | None:
        """The last version committed at or before `when`; None if none was."""
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
        return next((e["version"] for e in self.history() if e["timestamp"] <= when), None)

    def oldest_version(self) -> int:
        """The oldest kept commit's version; locally the last answer while it stands (no list)."""
        if (last := self._oldest) is not None and self._log.local and self._log.exists(last) \
                and not (last and self._log.exists(last - 1)):
            return last
        names = list_names(f"{self.path}/_delta_log", self.storage_options)
        self._oldest = min([int(n.split(".")[0]) for n in names if n.endswith(".json")
                            and n.split(".")[0].isdigit()], default=0)
        return self._oldest

    # ---------------------------------------------------------------- maintenance
    def optimize(self, *, max_files_per_bucket: int = 4, target_size: int | None = None,
                 migrate: bool = False, buckets: int = DEFAULT_BUCKETS,
                 checkpoint: bool = True) -> OptimizeResult:
        """Compact the buckets holding more than `max_files_per_bucket` data files (one
        `dataChange=false` commit: no change records, stream offsets stay valid), in the
        directory table and its tombstones; then write a checkpoint and drop log entries older
        than the table's log retention. With `migrate`, a table in the pre-bucket layout is
        first rewritten into `buckets` buckets (`migrate()`). See `directory_table.maintenance`."""
        from directory_table.maintenance import optimize

        return optimize(self, max_files_per_bucket=max_files_per_bucket,
                        target_size=target_size, migrate_layout=migrate, buckets=buckets,
                        checkpoint=checkpoint)

    def enable_deletion_vectors(self) -> int | None:
        """Make the table merge-on-read (DESIGN §4.8); the upgrade's version, or None."""
        from directory_table.maintenance import enable_deletion_vectors

        return enable_deletion_vectors(self)

    def migrate(self, *, buckets: int = DEFAULT_BUCKETS) -> int | None:
        """Rewrite a table of the pre-bucket layout into `buckets` buckets (one commit, left
        out of `changes()`); returns its version, or None when already bucketed."""
        from directory_table.maintenance import migrate

        return migrate(self, buckets=buckets)

    # ---------------------------------------------------------------- retention
    def apply_retention(self, retention_days: float) -> dict:
        """Drop versions and files older than `retention_days` (DESIGN §4.5), checkpointing
        first so the table stays readable from the oldest kept version on."""
        from directory_table.maintenance import apply_retention

        return apply_retention(self, retention_days)
