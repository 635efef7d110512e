"""The public Python front door: `connect(warehouse)` returns a `Catalog` of volumes and streams.

    import volume_stream as vs

    cat = vs.connect("./warehouse")
    cat.create_volume("landing", "/data/landing")
    cat.refresh("landing")
    cat.create_stream("new_files", on_volume="landing")
    cat.read_stream("new_files").show()          # never moves the offset
    with cat.consume("new_files") as batch:       # moves it when the block succeeds
        batch.df.write.mode("append").parquet("/out")

State (volumes, streams, offsets) lives in the warehouse folder; a second `connect` on the same
folder, in this process or another, sees it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from connectors.protocols import ObjectReader
from directory_table import DirectoryTable, OptimizeResult
from directory_table.schema import PUBLIC_COLUMNS
from volume_stream._spark import get_spark
from volume_stream.errors import InvalidInputError, converted
from volume_stream.pipelines.pipeline import Pipeline
from volume_stream.shards import ChangeLog, Shard
from volume_stream.shards import meta as shard_meta
from volume_stream.shards.autosplit import auto_split
from volume_stream.shards.export import ExportResult, export_changes
from volume_stream.shards.log import disable_change_log, enable_change_log
from volume_stream.sql import register_udf, run_sql
from volume_stream.streams.registry import StreamRegistry
from volume_stream.tables import Column, TableStore
from volume_stream.tables.registered import register
from volume_stream.volumes.registry import RefreshMetrics, VolumeRegistry
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.volumes.watcher import VolumeWatcher, WatchMetrics
from volume_stream.warehouse import VOLUME, Warehouse

if TYPE_CHECKING:  # pyspark loads when a session is first needed, not at import
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Batch", "Catalog", "RefreshMetrics", "connect"]


@dataclass
class Batch:
    """One consumption: the pinned range (start_version, end_version] of a stream.

    `df` is the Spark DataFrame of its change records (made on first use, so a consumer of
    `records` alone needs no Spark), `records` the same as an Arrow table. `batch_id` numbers
    the stream's committed batches from 0; a retried range gets the same id, so sinks can use
    it to stay idempotent.
    """

    stream: str
    records: pa.Table
    start_version: int
    end_version: int
    batch_id: int
    _spark: Any = field(default=None, repr=False, compare=False)
    _df: DataFrame | None = field(default=None, repr=False, compare=False)

    @property
    def df(self) -> DataFrame:
        if self._df is None:
            spark = self._spark() if callable(self._spark) else self._spark
            self._df = spark.createDataFrame(self.records)
        return self._df

    @property
    def empty(self) -> bool:
        return self.records.num_rows == 0


def connect(warehouse: str | os.PathLike, *, storage_options: dict[str, str] | None = None,
            spark: SparkSession | None = None, create: bool = True,
            remote: str | None = None) -> Catalog:
    """Open (or create) the warehouse at `warehouse` and return its catalog.

    `warehouse` is a local folder, `file://...`, `s3://bucket/prefix` or `hdfs://...` (an
    `oss://` warehouse is refused: docs/object-storage.md). `storage_options` are delta-rs's keys
    (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...); without them credentials come
    from the standard environment (`AWS_*`, profiles, roles). They are never written anywhere.
    With `create=False` a missing warehouse is a `WarehouseError` and nothing is created.
    Spark starts only when something needs it (a query, a pipeline batch with files): `spark`
    is a session to use instead (or a function returning one, called on first need), `remote`
    a Spark Connect URL (`sc://host:port`, e.g. a daemon's warm Spark; default
    `$VOLUME_STREAM_SPARK_REMOTE`).

    Example:
        >>> cat = connect("./warehouse")
        >>> cat = connect("s3://my-bucket/wh", storage_options={"AWS_REGION": "eu-west-1"})
        >>> cat.list_volumes()
        []
    """
    return Catalog(Warehouse(warehouse, storage_options, create=create), spark=spark,
                   remote=remote)


class Catalog:
    """Volumes, their directory tables, and streams over them, in one warehouse.

    A thin facade: volumes are kept by `volumes.registry.VolumeRegistry`, streams and offsets by
    `streams.registry.StreamRegistry`; pipelines and SQL get this object and call only its
    public methods.
    """

    def __init__(self, warehouse: Warehouse, spark: SparkSession | None = None,
                 remote: str | None = None):
        self.warehouse = warehouse
        # a session, or a function that makes one when first needed (the daemon's shared one)
        self._spark_factory = spark if callable(spark) else None
        self._spark = None if callable(spark) else spark
        self._remote = remote
        self._source_registered = False
        self.volumes = VolumeRegistry(warehouse, lambda: self.spark)
        self.streams = StreamRegistry(self.volumes)

    def __repr__(self) -> str:
        return f"Catalog({self.warehouse.uri!r})"

    @property
    def spark_started(self) -> bool:
        """Whether this catalog has a Spark session yet (`spark` starts one on first use)."""
        return self._spark is not None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = (self._spark_factory() if self._spark_factory is not None
                           else get_spark(remote=self._remote))
        if not self._source_registered:
            from volume_stream import datasource
            from volume_stream._spark import is_connect

            # over Spark Connect registering would start a Python worker on the server for
            # every client: `datasource.register(spark)` there is left to who needs it
            if not is_connect(self._spark):
                datasource.register(self._spark)  # spark.readStream.format("volume_stream")
            self._source_registered = True
        return self._spark

    # ------------------------------------------------------------------ volumes
    @property
    def tables(self) -> TableStore:
        """The warehouse's SQL tables (`volume_stream.tables`, `<warehouse>/tables/`)."""
        return self.streams.tables

    def volume_spec(self, volume: str) -> VolumeSpec:
        """The stored spec of `volume` (NotFoundError if there is none)."""
        return self.volumes.spec(volume)

    def directory_table(self, volume: str) -> DirectoryTable:
        """The volume's directory table (a Delta table; `.path` is its location)."""
        return self.volumes.table(self.volumes.spec(volume))

    def object_reader(self, volume: VolumeSpec) -> ObjectReader:
        """A picklable reader of the volume's files (with this process's options)."""
        return self.volumes.object_reader(volume)

    def create_volume(self, name: str, location: str | os.PathLike, *, recursive: bool = True,
                      notification: Any = None, replace: bool = False,
                      if_not_exists: bool = False, shards: int | None = None,
                      **options: Any) -> VolumeSpec:
        """Register a volume and create its (empty) directory table at version 0.

        Options: `include` / `exclude` (globs on relative paths), `data_retention_days`
        (default 7), `shards` (of its change log, default 1: `change_log`), and backend
        options (endpoint, region, credentials: never stored). `if_not_exists`: a volume of
        that name is left as it is and returned (SQL's IF NOT EXISTS).

        Example:
            >>> cat.create_volume("landing", "/data/landing", recursive=False)
        """
        spec = self.volumes.create(name, location, recursive=recursive,
                                   notification=notification, replace=replace,
                                   if_not_exists=if_not_exists, **options)
        if shards is not None:
            buckets = self.directory_table(name).layout().buckets
            shard_meta.ensure(self.warehouse, name, buckets, shards=shards)
        return spec

    def upgrade_volume(self, name: str) -> int | None:
        """Make volume `name`'s directory table merge-on-read (Delta deletion vectors, DESIGN
        §4.8): one commit, after which its readers need Delta reader version 3 with deletion
        vectors (delta-spark >= 2.3). Returns that version, or None when it was already.

        Example:
            >>> cat.upgrade_volume("landing")
            12
        """
        return self.volumes.upgrade(name)

    def drop_volume(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> bool:
        """Remove a volume, its directory table and (with `cascade=True`) its streams."""
        return self.volumes.drop(name, if_exists=if_exists, cascade=cascade)

    def list_volumes(self) -> list[dict[str, Any]]:
        """One dict per volume: name, location, recursive, notification, version, files."""
        return self.volumes.list()

    def describe_volume(self, name: str) -> dict[str, Any]:
        return self.volumes.describe(name)

    def refresh(self, volume: str, progress: Callable[[str, int, int], None] | None = None,
                *, inventory: str | None = None) -> RefreshMetrics:
        """List the volume, diff against the directory table, commit the difference.

        `progress(stage, listed, changed)` is called as the refresh goes ("listing" per page,
        "diffing" per group of buckets, then "committing").

        `inventory`: read an S3 Inventory / OSS inventory report instead of listing the
        bucket (DESIGN §4.4): the URL of its manifest.json, or of the inventory's destination
        prefix (the newest report of the volume's bucket there). Paths whose last event is
        newer than the report keep what the events made of them. A report failing its
        checksums is refused (`InventoryError`) and nothing is committed.

        Example:
            >>> cat.refresh("landing").inserted
            42
            >>> cat.refresh("big", inventory="s3://inv-bucket/reports/big/daily/")  # doctest: +SKIP
        """
        return self.volumes.refresh(volume, progress, inventory=inventory)

    def watcher(self, volume: str) -> VolumeWatcher:
        """A `VolumeWatcher` for the volume's listener (the caller runs and closes it)."""
        return self.volumes.watcher(volume)

    def watch(self, volume: str, *, until_idle: bool = False, timeout: float | None = None,
              refresh: bool = True) -> WatchMetrics:
        """Run the volume's listener in the foreground; Ctrl-C stops it cleanly.

        It first catches up, as the daemon does: the listener is started, then a refresh
        commits what changed while nothing listened (`refresh=False` skips it: only events
        from the listener count). With `until_idle=True` it returns once no events are pending
        (a queue drained, no file waiting for its debounce). Returns the totals.
        """
        return self.volumes.watch(volume, until_idle=until_idle, timeout=timeout,
                                  refresh=refresh)

    def history(self, volume: str, limit: int | None = None) -> list[dict]:
        """The directory table's commits, newest first."""
        with converted(f"volume {volume!r}"):
            return self.directory_table(volume).history(limit)

    def table_path(self, name: str | None = None, *, volume: str | None = None) -> str:
        """Where the SQL table `name` (or the directory table of `volume`) is stored, as Spark
        names it (`s3://` as `s3a://`): open it with Delta Lake's own Spark connector,

            spark.read.format("delta").load(cat.table_path("orders"))
            spark.read.format("delta").option("readChangeFeed", "true") \\
                .option("startingVersion", 1).load(cat.table_path(volume="landing"))

        (docs/spark-delta.md). NotFoundError if there is no such table or volume."""
        if (name is None) == (volume is None):
            raise InvalidInputError("table_path: give a table name or volume=, not both")
        if volume is not None:
            with converted(f"volume {volume!r}"):
                path = self.directory_table(volume).path
        else:
            self.tables.open(name)  # NotFoundError (naming the tables there) if none
            path = self.tables.path(name)
        return "s3a://" + path[len("s3://"):] if path.startswith("s3://") else path

    def register_table(self, name: str, location: str | os.PathLike, *,
                       key: str | list[str] | None = None, replace: bool = False,
                       if_not_exists: bool = False) -> bool:
        """Adopt the Delta table at `location` (written by Spark, outside the warehouse, with
        its change data feed on) as table `name`, for SELECT and Table Streams; `key`: the
        column(s) a STANDARD stream pairs old and new rows by. volume-stream never writes it;
        `DROP TABLE name` unregisters it and leaves its files as they are
        (docs/spark-delta.md). Returns False if it existed and `if_not_exists`.

        Example:
            >>> cat.register_table("orders", "s3://lake/orders", key="id")
            >>> cat.create_stream("order_changes", on_table="orders")
        """
        return register(self.tables.location, name, location, key=key, replace=replace,
                        if_not_exists=if_not_exists)

    def read_directory(self, volume: str, *, version: int | None = None) -> DataFrame:
        """The directory table at its latest (or a given) version, public columns only."""
        with converted(f"volume {volume!r}"):
            snap = self.directory_table(volume).snapshot(version, columns=list(PUBLIC_COLUMNS))
        return self.spark.createDataFrame(snap)

    def apply_retention(self, volume: str, *, days: float = 7) -> dict:
        """Remove versions older than the volume's `data_retention_days` (DESIGN §4.5), or, for
        a warehouse table of that name, older than `days`; streams behind them become stale."""
        if (VOLUME, volume) not in self.warehouse.read() and self.tables.exists(volume):
            return self.tables.apply_retention(volume, days)
        spec = self.volumes.spec(volume)
        with converted(f"volume {volume!r}"):
            return self.volumes.table(spec).apply_retention(spec.retention_days)

    def optimize(self, volume: str, *, migrate: bool = True) -> OptimizeResult:
        """Compact the volume's directory table (buckets holding many small files), write a
        checkpoint and clean the log within retention; with `migrate`, first rewrite a table of
        the pre-bucket layout into buckets. Streams read the same records across either.

        Example:
            >>> cat.optimize("landing").buckets_compacted
            12
        """
        spec = self.volumes.spec(volume)
        with converted(f"volume {volume!r}"):
            return self.volumes.table(spec).optimize(migrate=migrate)

    # ------------------------------------------------------------------ streams
    def create_stream(self, name: str, on_volume: str | None = None, *,
                      on_table: str | None = None, mode: str = "STANDARD",
                      show_initial_rows: bool = False, at_timestamp: datetime | str | None = None,
                      replace: bool = False, if_not_exists: bool = False) -> dict[str, Any]:
        """Create a stream whose offset starts at the volume's (or table's) latest version (or
        at the last version committed at or before `at_timestamp`). A table needs change
        tracking (`ALTER TABLE t SET PROPERTIES ('change_tracking' = 'true')`).
        `if_not_exists`: a stream of that name is left as it is (its offset too) and returned.

        Example:
            >>> cat.create_stream("s", on_volume="landing", mode="APPEND_ONLY")
            >>> cat.create_stream("people_changes", on_table="people")
        """
        return self.streams.create(name, on_volume, on_table=on_table, mode=mode,
                                   show_initial_rows=show_initial_rows,
                                   at_timestamp=at_timestamp, replace=replace,
                                   if_not_exists=if_not_exists)

    def create_table(self, name: str, columns: pa.Schema | dict[str, str], *,
                     key: str | list[str] | None = None, comment: str | None = None,
                     replace: bool = False, if_not_exists: bool = False) -> bool:
        """An empty warehouse table (`CREATE TABLE`): `columns` a schema or {name: SQL type},
        `key` its declared key; False if it existed and `if_not_exists`. Example:
        `cat.create_table("people", {"id": "INT", "name": "STRING"}, key="id")`."""
        if replace and if_not_exists:
            raise InvalidInputError(f"table {name!r}: give replace or if_not_exists, not both")
        if isinstance(columns, dict):
            columns = [Column(str(n), str(t)) for n, t in columns.items()]
        return self.tables.create(name, columns, comment=comment, key=key, replace=replace,
                                  if_not_exists=if_not_exists)

    def drop_stream(self, name: str, *, if_exists: bool = False) -> bool:
        return self.streams.drop(name, if_exists=if_exists)

    def list_streams(self) -> list[dict[str, Any]]:
        return self.streams.list()

    def stream_spec(self, name: str) -> tuple[dict[str, Any], VolumeSpec]:
        """(the stream's stored spec, its volume's spec); NotFoundError if either is gone."""
        return self.streams.spec(name)

    def latest_version(self, volume: VolumeSpec) -> int:
        """The latest version of the volume's directory table."""
        return self.streams.latest_version(volume)

    def records_between(self, name: str, spec: dict[str, Any], volume: VolumeSpec, a: int,
                        b: int) -> pa.Table:
        """The change records stream `name` (with `spec`, on `volume`) shows for exactly (a, b]:
        what `read_stream` returns when `b` is the latest version; a retry that pinned `b`
        sees the same records later.

        Raises:
            StaleStreamError: `a` is older than the oldest kept version.
        """
        return self.streams.records_between(name, spec, volume, a, b)

    def pin_batch(self, name: str, *, end: int | None = None
                  ) -> tuple[pa.Table, dict[str, Any], int, int]:
        """(records, spec, a, b): the stream's next batch, its range (a, b] recorded in the
        catalog with `spec["batch_id"]` before anything consumes it (DESIGN §5), so a retry of
        that batch id sees exactly this range. What `consume` and pipelines start with; move
        the offset afterwards with `commit_offset(name, id, a, b, batch_id)`. `end` proposes
        the end version when none is recorded yet.
        """
        return self.streams.pin(name, end=end)

    def read_stream_arrow(self, name: str) -> pa.Table:
        """`read_stream` as a pyarrow Table (no Spark needed)."""
        return self.streams.pending(name)[0]

    def read_stream(self, name: str) -> DataFrame:
        """The stream's pending change records as a Spark DataFrame; the offset does not move.

        Columns: relative_path, url, size, last_modified_time, etag, __change_type,
        __commit_version, __commit_timestamp.
        """
        return self.spark.createDataFrame(self.streams.pending(name)[0])

    @contextmanager
    def consume(self, name: str) -> Iterator[Batch]:
        """Pin the stream's pending range; move the offset past it if the block succeeds.

        The range is recorded with the batch id before the block runs, so after an exception
        (the offset stays where it was) the retry sees exactly the same range and `batch_id`;
        files committed meanwhile go to the next batch. If another consumer moved the offset meanwhile,
        `ConsumeConflictError` is raised and the offset is not moved again.

        Example:
            >>> with cat.consume("s") as batch:
            ...     batch.df.write.mode("append").parquet("/out")
        """
        records, spec, a, b = self.pin_batch(name)  # a retry of this batch id gets (a, b]
        batch = Batch(stream=name, records=records, start_version=a, end_version=b,
                      batch_id=spec["batch_id"], _spark=lambda: self.spark)
        yield batch
        if a == b and not spec["initial_pending"]:
            return  # nothing was pinned, nothing to move
        self.commit_offset(name, spec.get("volume_id") or spec["table_id"], a, b,
                           spec["batch_id"], rows=records.num_rows)

    def commit_offset(self, name: str, volume_id: str, start: int, end: int,
                      batch_id: int, rows: int | None = None) -> None:
        """Move the stream's offset from `start` to `end` if nobody else has (compare-and-swap);
        `rows`: the batch's record count, kept with the stream's last consumed batches."""
        self.streams.commit_offset(name, volume_id, start, end, batch_id, rows)

    def describe_stream(self, name: str) -> dict[str, Any]:
        """Offset, mode, latest version, pending-change count, and whether it is stale."""
        return self.streams.describe(name)

    # ------------------------------------------------------------------ front doors
    def pipeline(self, stream: str, udf: Any, target: str, **options: Any) -> Pipeline:
        """A per-file UDF pipeline over `stream` writing to `target` (see `volume_stream.pipelines`).

        Example:
            >>> cat.pipeline("new_images", image_metadata, "image_meta").run_once()
        """
        return Pipeline(self, stream, udf, target, **options)

    def sql(self, text: str) -> Any:
        """Run volume-stream DDL and Spark SQL over streams (see `volume_stream.sql`)."""
        return run_sql(self, text)

    def register_udf(self, name: str, fn: Any, return_type: Any = "string") -> None:
        """Make a Python function callable from `sql()` under `name`."""
        register_udf(self, name, fn, return_type)

    # ------------------------------------------------------------------ change logs (shards)
    def change_log(self, volume: str, *, label: str | None = None, **options: Any) -> ChangeLog:
        """The change log of a volume (or, when no volume has the name, of a change-tracked
        SQL table: key its hidden row id, or `key=`) — its newest stream, or the one `label`
        names — split into shards read through iterators, DynamoDB Streams style
        (`volume_stream.shards`). Options: `region`, `account_id` (12 digits) for its ARN.

        Example:
            >>> log = cat.change_log("landing")
            >>> it = log.iterator(log.shards()[0].shard_id, "TRIM_HORIZON")
            >>> log.get_records(it).records
        """
        return ChangeLog(self, volume, label=label, **options)

    def reshard(self, volume: str, shards: int) -> list[Shard]:
        """Close every open shard of the volume's (or table's) change log at the latest
        version and open `shards` children naming their parents; returns the children."""
        return self.change_log(volume).reshard(shards)

    def enable_change_log(self, volume: str, *, view_type: str = "NEW_AND_OLD_IMAGES",
                          shards: int = 1, key: str | list[str] | None = None) -> ChangeLog:
        """Start a new change log stream (new label) of a volume or table from its latest
        version on (`key`: a table's key column or list of columns; default its declared key,
        else the previous stream's, at first its hidden row id)."""
        enable_change_log(self, volume, view_type=view_type, shards=shards, key=key)
        return self.change_log(volume)

    def disable_change_log(self, volume: str) -> None:
        """Close every open shard at the latest version; records stay readable until the
        retention period after now."""
        disable_change_log(self, volume)

    def set_auto_split(self, volume: str, *, records_per_s: float | None,
                       window_s: float = 60) -> None:
        """Let the volume's shards split on their own when one's write rate over the last
        `window_s` seconds is above `records_per_s` (None: never); see `auto_split`."""
        log = self.change_log(volume)
        shard_meta.set_split_threshold(self.warehouse, log.meta_name, records_per_s, window_s)

    def auto_split(self, volume: str) -> list[Shard]:
        """Split every open shard of the volume whose write rate is above its threshold (the
        shard API server runs this periodically); returns the new children."""
        return auto_split(self, volume)

    def export_changes(self, volume: str, *, out: str | os.PathLike, **options: Any
                       ) -> ExportResult:
        """DataX-style export of the changes of a volume (or a change-tracked SQL table)
        committed in [start_ms, end_ms) (or `date`,
        yyyyMMdd UTC) to `out`; options: `format` (parquet, csv, delta), `status_table`,
        `export_sequence_info`, `max_retries`, `parallelism`, `mbps`
        (`volume_stream.shards.export`)."""
        return export_changes(self, volume, out=out, **options)
