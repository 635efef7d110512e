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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from connectors.base import ObjectReader
from directory_table import DirectoryTable
from directory_table.schema import PUBLIC_COLUMNS
from volume_stream import datasource
from volume_stream._spark import get_spark
from volume_stream.errors import converted
from volume_stream.pipelines.pipeline import Pipeline
from volume_stream.sql import register_udf, run_sql
from volume_stream.streams.registry import StreamRegistry
from volume_stream.volumes.registry import RefreshMetrics, VolumeRegistry
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.volumes.watcher import VolumeWatcher, WatchMetrics
from volume_stream.warehouse import Warehouse

__all__ = ["Batch", "Catalog", "RefreshMetrics", "connect"]


@dataclass
class Batch:
    """One consumption: the pinned range (start_version, end_version] of a stream.

    `df` is the Spark DataFrame of its change records, `records` the same as an Arrow table.
    `batch_id` numbers the stream's committed batches from 0; a retried range gets the same id,
    so sinks can use it to stay idempotent.
    """

    stream: str
    df: DataFrame
    records: pa.Table
    start_version: int
    end_version: int
    batch_id: int

    @property
    def empty(self) -> bool:
        return self.records.num_rows == 0


def connect(warehouse: str | os.PathLike, *, storage_options: dict[str, str] | None = None,
            spark: SparkSession | None = None) -> Catalog:
    """Open (or create) the warehouse at `warehouse` and return its catalog.

    `warehouse` is a local folder, `file://...`, `s3://bucket/prefix` or `hdfs://...` (an
    `oss://` warehouse is refused: see the README). `storage_options` are delta-rs's keys
    (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`, ...); without them credentials come
    from the standard environment (`AWS_*`, profiles, roles). They are never written anywhere.

    Example:
        >>> cat = connect("./warehouse")
        >>> cat = connect("s3://my-bucket/wh", storage_options={"AWS_REGION": "eu-west-1"})
        >>> cat.list_volumes()
        []
    """
    return Catalog(Warehouse(warehouse, storage_options), spark=spark)


class Catalog:
    """Volumes, their directory tables, and streams over them, in one warehouse.

    A thin facade: volumes are kept by `volumes.registry.VolumeRegistry`, streams and offsets by
    `streams.registry.StreamRegistry`; pipelines and SQL get this object and call only its
    public methods.
    """

    def __init__(self, warehouse: Warehouse, spark: SparkSession | None = None):
        self.warehouse = warehouse
        self._spark = spark
        self._source_registered = False
        self.volumes = VolumeRegistry(warehouse, lambda: self.spark)
        self.streams = StreamRegistry(self.volumes)

    def __repr__(self) -> str:
        return f"Catalog({self.warehouse.uri!r})"

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = get_spark()
        if not self._source_registered:
            datasource.register(self._spark)  # spark.readStream.format("volume_stream")
            self._source_registered = True
        return self._spark

    # ------------------------------------------------------------------ volumes
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
                      **options: Any) -> VolumeSpec:
        """Register a volume and create its (empty) directory table at version 0.

        Options: `include` / `exclude` (globs on relative paths), `data_retention_days`
        (default 7), and backend options (endpoint, region, credentials: never stored).

        Example:
            >>> cat.create_volume("landing", "/data/landing", recursive=False)
        """
        return self.volumes.create(name, location, recursive=recursive,
                                   notification=notification, replace=replace, **options)

    def drop_volume(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> bool:
        """Remove a volume, its directory table and (with `cascade=True`) its streams."""
        return self.volumes.drop(name, if_exists=if_exists, cascade=cascade)

    def list_volumes(self) -> list[dict[str, Any]]:
        """One dict per volume: name, location, recursive, notification, version, files."""
        return self.volumes.list()

    def describe_volume(self, name: str) -> dict[str, Any]:
        return self.volumes.describe(name)

    def refresh(self, volume: str) -> RefreshMetrics:
        """List the volume, diff against the directory table, commit the difference.

        Example:
            >>> cat.refresh("landing").inserted
            42
        """
        return self.volumes.refresh(volume)

    def watcher(self, volume: str) -> VolumeWatcher:
        """A `VolumeWatcher` for the volume's listener (the caller runs and closes it)."""
        return self.volumes.watcher(volume)

    def watch(self, volume: str, *, until_idle: bool = False,
              timeout: float | None = None) -> WatchMetrics:
        """Run the volume's listener in the foreground; Ctrl-C stops it cleanly.

        With `until_idle=True` it returns once no events are pending (a queue drained, no file
        waiting for its debounce). Returns the totals.
        """
        return self.volumes.watch(volume, until_idle=until_idle, timeout=timeout)

    def history(self, volume: str, limit: int | None = None) -> list[dict]:
        """The directory table's commits, newest first."""
        with converted(f"volume {volume!r}"):
            return self.directory_table(volume).history(limit)

    def read_directory(self, volume: str, *, version: int | None = None) -> DataFrame:
        """The directory table at its latest (or a given) version, public columns only."""
        with converted(f"volume {volume!r}"):
            snap = self.directory_table(volume).snapshot(version, columns=list(PUBLIC_COLUMNS))
        return self.spark.createDataFrame(snap)

    def apply_retention(self, volume: str) -> dict:
        """Remove versions older than the volume's `data_retention_days` (DESIGN §4.5)."""
        spec = self.volumes.spec(volume)
        with converted(f"volume {volume!r}"):
            return self.volumes.table(spec).apply_retention(spec.retention_days)

    # ------------------------------------------------------------------ streams
    def create_stream(self, name: str, on_volume: str, *, mode: str = "STANDARD",
                      show_initial_rows: bool = False, at_timestamp: datetime | str | None = None,
                      replace: bool = False) -> dict[str, Any]:
        """Create a stream whose offset starts at the volume's latest version (or at the last
        version committed at or before `at_timestamp`).

        Example:
            >>> cat.create_stream("s", on_volume="landing", mode="APPEND_ONLY")
        """
        return self.streams.create(name, on_volume, mode=mode,
                                   show_initial_rows=show_initial_rows,
                                   at_timestamp=at_timestamp, replace=replace)

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

        An exception inside the block leaves the offset where it was, so a retry sees the same
        range (and the same `batch_id`). If another consumer moved the offset meanwhile,
        `ConsumeConflictError` is raised and the offset is not moved again.

        Example:
            >>> with cat.consume("s") as batch:
            ...     batch.df.write.mode("append").parquet("/out")
        """
        records, spec, a, b = self.streams.pending(name)
        batch = Batch(stream=name, df=self.spark.createDataFrame(records), records=records,
                      start_version=a, end_version=b, batch_id=spec["batch_id"])
        yield batch
        if a == b and not spec["initial_pending"]:
            return  # nothing was pinned, nothing to move
        self.commit_offset(name, spec["volume_id"], a, b, spec["batch_id"])

    def commit_offset(self, name: str, volume_id: str, start: int, end: int,
                      batch_id: int) -> None:
        """Move the stream's offset from `start` to `end` if nobody else has (compare-and-swap)."""
        self.streams.commit_offset(name, volume_id, start, end, batch_id)

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
