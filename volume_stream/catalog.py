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

import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from directory_table import DirectoryTable
from volume_stream import changes as ch
from volume_stream._store import CatalogState, Warehouse
from volume_stream.errors import (
    AlreadyExistsError,
    ConfigError,
    ConsumeConflictError,
    InvalidInputError,
    NotFoundError,
    StaleStreamError,
)
from volume_stream.refresh import diff_listing, diff_listing_spark, read_listing
from volume_stream.volumes import (
    VolumeSpec,
    backend_for,
    normalize_location,
    notification_from_dict,
)
from volume_stream.watcher import VolumeWatcher, WatchMetrics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Batch", "Catalog", "RefreshMetrics", "connect"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
VOLUME, STREAM = "volume", "stream"


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(
            f"invalid {kind} name {name!r}: use letters, digits and '_', starting with a letter "
            f"or '_' (at most 128 characters)")
    return name


@contextmanager
def _connector_errors(volume: str) -> Iterator[None]:
    """Convert connector errors at the edge: missing or rejected credentials are ConfigError."""
    from connectors.errors import CredentialsError

    try:
        yield
    except CredentialsError as exc:
        raise ConfigError(f"volume {volume!r}: {exc}") from exc


def _now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class RefreshMetrics:
    """What one refresh found and committed."""

    listed: int
    inserted: int
    updated: int
    deleted: int
    version: int | None
    invalid_paths: int
    seconds: float


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


def connect(warehouse: str | os.PathLike, *, spark: SparkSession | None = None) -> Catalog:
    """Open (or create) the warehouse at `warehouse` and return its catalog.

    Example:
        >>> cat = connect("./warehouse")
        >>> cat.list_volumes()
        []
    """
    return Catalog(Warehouse(warehouse), spark=spark)


class Catalog:
    """Volumes, their directory tables, and streams over them, in one warehouse."""

    def __init__(self, warehouse: Warehouse, spark: SparkSession | None = None):
        self.warehouse = warehouse
        self._spark = spark
        self._source_registered = False
        # Options given to create_volume (secrets included) stay in this process only, for the
        # volume's listeners and readers; the catalog stores them without secrets.
        self._runtime_options: dict[str, dict[str, Any]] = {}
        self._runtime_notifications: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Catalog({str(self.warehouse.root)!r})"

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from volume_stream._spark import get_spark

            self._spark = get_spark()
        if not self._source_registered:
            from volume_stream.datasource import register

            register(self._spark)  # spark.readStream.format("volume_stream")
            self._source_registered = True
        return self._spark

    # ------------------------------------------------------------------ lookups
    @staticmethod
    def _get(state: CatalogState, kind: str, name: str) -> dict[str, Any]:
        spec = state.get((kind, name))
        if spec is None:
            raise NotFoundError(kind, name, [n for k, n in state if k == kind])
        return spec

    def _volume(self, name: str, state: CatalogState | None = None) -> VolumeSpec:
        return VolumeSpec.from_dict(self._get(state or self.warehouse.read(), VOLUME, name))

    def _table(self, spec: VolumeSpec) -> DirectoryTable:
        return DirectoryTable(self.warehouse.volume_root(spec.name, spec.id), spec.location)

    @property
    def tables(self) -> Any:
        """The warehouse's tables (`volume_stream.tables.TableStore`, `<warehouse>/tables/`)."""
        from volume_stream.tables import TableStore

        return TableStore(self.warehouse.root / "tables")

    def directory_table(self, volume: str) -> DirectoryTable:
        """The volume's directory table (a Delta table; `.path` is its location)."""
        return self._table(self._volume(volume))

    # ------------------------------------------------------------------ volumes
    def create_volume(self, name: str, location: str | os.PathLike, *, recursive: bool = True,
                      notification: Any = None, replace: bool = False,
                      **options: Any) -> VolumeSpec:
        """Register a volume and create its (empty) directory table at version 0.

        Options: `include` / `exclude` (globs on relative paths), `data_retention_days`
        (default 7), and backend options (endpoint, region, credentials: never stored).

        Example:
            >>> cat.create_volume("landing", "/data/landing", recursive=False)
        """
        _check_name(VOLUME, name)
        location = normalize_location(location)
        days = options.get("data_retention_days", 7)
        if not isinstance(days, int | float) or days < 0:
            raise InvalidInputError(f"data_retention_days must be a number >= 0, not {days!r}")
        spec = VolumeSpec(name=name, id=self.warehouse.new_id(), location=location,
                          recursive=bool(recursive),
                          notification=notification.to_dict() if notification else None,
                          options=dict(options), created_at=_now())
        self._check_options(spec)  # fail now, not at the first refresh
        table_root = self.warehouse.volume_root(spec.name, spec.id)
        DirectoryTable.create(table_root, location, retention_days=spec.retention_days)

        def register(state: CatalogState) -> VolumeSpec | None:
            old = state.get((VOLUME, name))
            if old is not None and not replace:
                raise AlreadyExistsError(VOLUME, name)
            state[(VOLUME, name)] = spec.to_dict()
            return VolumeSpec.from_dict(old) if old else None

        try:
            replaced = self.warehouse.mutate(register)
        except Exception:
            shutil.rmtree(table_root, ignore_errors=True)
            raise
        if replaced is not None:
            shutil.rmtree(self.warehouse.volume_root(replaced.name, replaced.id),
                          ignore_errors=True)
        log.info("created volume %s at %s", name, location)
        self._runtime_options[name] = dict(options)
        self._runtime_notifications[name] = notification
        return spec

    @staticmethod
    def _check_options(spec: VolumeSpec) -> None:
        # Building a lister validates the connector options; clients and credentials are lazy,
        # so this makes no call and needs no secret.
        try:
            backend_for(spec).lister(spec)
        except TypeError as exc:
            raise InvalidInputError(f"volume {spec.name!r}: bad option: {exc}") from exc
        except ValueError as exc:
            raise InvalidInputError(f"volume {spec.name!r}: {exc}") from exc

    def drop_volume(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> bool:
        """Remove a volume, its directory table and (with `cascade=True`) its streams."""

        def drop(state: CatalogState) -> VolumeSpec | None:
            if (VOLUME, name) not in state:
                if if_exists:
                    return None
                self._get(state, VOLUME, name)
            streams = sorted(n for (k, n), s in state.items()
                             if k == STREAM and s.get("volume") == name)
            if streams and not cascade:
                raise InvalidInputError(f"volume {name!r} has streams {streams}; drop them "
                                        f"first or pass cascade=True")
            for s in streams:
                del state[(STREAM, s)]
            return VolumeSpec.from_dict(state.pop((VOLUME, name)))

        spec = self.warehouse.mutate(drop)
        if spec is None:
            return False
        shutil.rmtree(self.warehouse.volume_root(spec.name, spec.id), ignore_errors=True)
        return True

    def list_volumes(self) -> list[dict[str, Any]]:
        """One dict per volume: name, location, recursive, notification, version, files."""
        out = []
        for (kind, _), data in sorted(self.warehouse.read().items()):
            if kind != VOLUME:
                continue
            spec = VolumeSpec.from_dict(data)
            table = self._table(spec)
            out.append({"name": spec.name, "location": spec.location,
                        "recursive": spec.recursive,
                        "notification": (spec.notification or {}).get("type", "LOCAL")
                        if spec.scheme == "file" else (spec.notification or {}).get("type"),
                        "version": table.version(), "files": table.file_count()})
        return out

    def describe_volume(self, name: str) -> dict[str, Any]:
        spec = self._volume(name)
        table = self._table(spec)
        info = next(v for v in self.list_volumes() if v["name"] == name)
        info.update(id=spec.id, options=spec.options, created_at=spec.created_at,
                    table_path=table.path, oldest_version=table.oldest_version(),
                    retention_days=spec.retention_days)
        return info

    def refresh(self, volume: str) -> RefreshMetrics:
        """List the volume, diff against the directory table, commit the difference.

        Example:
            >>> cat.refresh("landing").inserted
            42
        """
        spec = self._volume(volume)
        table = self._table(spec)
        started = datetime.now(UTC)
        # The version is pinned before listing: whatever the table learns while we list is
        # newer than the listing, and apply leaves it alone (ordered by version, not clock).
        base = table.version()
        lister = backend_for(spec).lister(self._with_options(spec))
        with _connector_errors(volume):
            listing = read_listing(lister.list(), spec.accepts())
        stored = table.snapshot(base, columns=["relative_path", "size", "etag",
                                               "last_modified_time", "_sequencer",
                                               "_event_time"])
        threshold = int(spec.options.get("spark_diff_threshold", 2_000_000))
        if listing.num_rows + stored.num_rows > threshold:
            events, invalid = diff_listing_spark(self.spark, listing, stored, started)
        else:
            events, invalid = diff_listing(listing, stored, started)
        result = table.apply(events, listed_at_version=base)
        seconds = (datetime.now(UTC) - started).total_seconds()
        log.info("refresh %s: listed %d, +%d ~%d -%d in %.2fs", volume, listing.num_rows,
                 result.inserted, result.updated, result.deleted, seconds)
        return RefreshMetrics(listed=listing.num_rows, inserted=result.inserted,
                              updated=result.updated, deleted=result.deleted,
                              version=result.version, invalid_paths=invalid, seconds=seconds)

    def _with_options(self, spec: VolumeSpec) -> VolumeSpec:
        extra = self._runtime_options.get(spec.name)
        if not extra:
            return spec
        return VolumeSpec(**{**spec.__dict__, "options": {**spec.options, **extra}})

    def watcher(self, volume: str) -> VolumeWatcher:
        """A `VolumeWatcher` for the volume's listener (the caller runs and closes it)."""
        spec = self._with_options(self._volume(volume))
        notification = (self._runtime_notifications.get(volume)
                        or notification_from_dict(spec.notification))
        with _connector_errors(volume):
            listener = backend_for(spec).listener(spec, notification)
        return VolumeWatcher(self._table(spec), listener, spec.accepts(),
                             lambda: self.refresh(volume))

    def watch(self, volume: str, *, until_idle: bool = False,
              timeout: float | None = None) -> WatchMetrics:
        """Run the volume's listener in the foreground; Ctrl-C stops it cleanly.

        With `until_idle=True` it returns once no events are pending (a queue drained, no file
        waiting for its debounce). Returns the totals.
        """
        with _connector_errors(volume):
            watcher = self.watcher(volume)
            with watcher.listener:
                return watcher.run(until_idle=until_idle, timeout=timeout)

    def history(self, volume: str, limit: int | None = None) -> list[dict]:
        """The directory table's commits, newest first."""
        return self.directory_table(volume).history(limit)

    def read_directory(self, volume: str, *, version: int | None = None) -> DataFrame:
        """The directory table at its latest (or a given) version, public columns only."""
        from directory_table.schema import PUBLIC_COLUMNS

        snap = self.directory_table(volume).snapshot(version, columns=list(PUBLIC_COLUMNS))
        return self.spark.createDataFrame(snap)

    def apply_retention(self, volume: str, *, days: float = 7) -> dict:
        """Remove versions older than the volume's `data_retention_days` (DESIGN §4.5), or, for
        a warehouse table of that name, older than `days`; streams behind them become stale."""
        if (VOLUME, volume) not in self.warehouse.read() and self.tables.exists(volume):
            return self.tables.apply_retention(volume, days)
        spec = self._volume(volume)
        return self._table(spec).apply_retention(spec.retention_days)

    # ------------------------------------------------------------------ streams
    def create_stream(self, name: str, on_volume: str | None = None, *,
                      on_table: str | None = None, mode: str = "STANDARD",
                      show_initial_rows: bool = False, at_timestamp: datetime | str | None = None,
                      replace: bool = False) -> dict[str, Any]:
        """Create a stream whose offset starts at the volume's (or table's) latest version (or
        at the last version committed at or before `at_timestamp`). A table needs change
        tracking (`ALTER TABLE t SET PROPERTIES ('change_tracking' = 'true')`).

        Example:
            >>> cat.create_stream("s", on_volume="landing", mode="APPEND_ONLY")
            >>> cat.create_stream("orders_changes", on_table="orders")
        """
        _check_name(STREAM, name)
        from volume_stream import _table_catalog

        _table_catalog.check_target(on_volume, on_table)
        if on_table is not None:
            return _table_catalog.create(self, name, on_table, mode=mode, replace=replace,
                                         show_initial_rows=show_initial_rows,
                                         at_timestamp=at_timestamp)
        mode = str(mode).upper()
        if mode not in ch.MODES:
            raise InvalidInputError(f"invalid mode {mode!r}; valid modes: {', '.join(ch.MODES)}")
        volume = self._volume(on_volume)
        table = self._table(volume)
        if at_timestamp is not None:
            when = (datetime.fromisoformat(at_timestamp) if isinstance(at_timestamp, str)
                    else at_timestamp)
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            offset = table.version_at(when)
            if offset is None:
                raise InvalidInputError(
                    f"at_timestamp {when.isoformat()} is before volume {on_volume!r} existed")
            if offset < table.oldest_version():
                raise InvalidInputError(f"at_timestamp {when.isoformat()} is older than the "
                                        f"oldest kept version {table.oldest_version()}")
        else:
            offset = table.version()
        spec = {"name": name, "volume": on_volume, "volume_id": volume.id, "mode": mode,
                "show_initial_rows": bool(show_initial_rows),
                "initial_pending": bool(show_initial_rows), "offset": offset, "batch_id": 0,
                "created_at": _now(),
                "at_timestamp": str(at_timestamp) if at_timestamp is not None else None}

        def register(state: CatalogState) -> None:
            self._get(state, VOLUME, on_volume)
            if (STREAM, name) in state and not replace:
                raise AlreadyExistsError(STREAM, name)
            state[(STREAM, name)] = spec

        self.warehouse.mutate(register)
        return dict(spec)

    def drop_stream(self, name: str, *, if_exists: bool = False) -> bool:
        def drop(state: CatalogState) -> bool:
            if (STREAM, name) not in state:
                if if_exists:
                    return False
                self._get(state, STREAM, name)
            del state[(STREAM, name)]
            return True

        return self.warehouse.mutate(drop)

    def list_streams(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in spec.items() if k not in ("volume_id", "table_id")}
                for (kind, _), spec in sorted(self.warehouse.read().items()) if kind == STREAM]

    def _stream(self, name: str, state: CatalogState | None = None
                ) -> tuple[dict[str, Any], VolumeSpec]:
        state = state or self.warehouse.read()
        spec = self._get(state, STREAM, name)
        if "table" in spec:
            raise InvalidInputError(f"stream {name!r} is on table {spec['table']!r}, not on a "
                                    f"volume (file pipelines read volume streams)")
        volume = state.get((VOLUME, spec["volume"]))
        if volume is None or volume["id"] != spec["volume_id"]:
            raise NotFoundError(
                VOLUME, f"{spec['volume']} (the volume of stream {name!r} was dropped or "
                        f"replaced; recreate the stream)",
                [n for k, n in state if k == VOLUME])
        return spec, VolumeSpec.from_dict(volume)

    def _pending(self, name: str) -> tuple[pa.Table, dict[str, Any], int, int]:
        state = self.warehouse.read()
        if "table" in self._get(state, STREAM, name):
            from volume_stream import _table_catalog

            return _table_catalog.pending(self.tables, self._get(state, STREAM, name))
        spec, volume = self._stream(name, state)
        a, b = spec["offset"], self._table(volume).version()
        return self.records_between(name, spec, volume, a, b), spec, a, b

    def records_between(self, name: str, spec: dict[str, Any], volume: VolumeSpec, a: int,
                        b: int) -> pa.Table:
        """The change records stream `name` (with `spec`, on `volume`) shows for exactly (a, b]:
        what `read_stream` returns when `b` is the latest version; a retry that pinned `b`
        sees the same records later.

        Raises:
            StaleStreamError: `a` is older than the oldest kept version.
        """
        table = self._table(volume)
        oldest = table.oldest_version()
        if a < oldest:
            raise StaleStreamError(name, a, oldest)
        if spec["initial_pending"]:
            if spec["mode"] == "STANDARD":
                return ch.initial_rows(table.snapshot(b))
            return pa.concat_tables([ch.initial_rows(table.snapshot(a)),
                                     ch.append_only_changes(table.changes(a, b))])
        if spec["mode"] == "STANDARD":
            return ch.standard_changes(table.changes(a, b))
        return ch.append_only_changes(table.changes(a, b))

    def read_stream_arrow(self, name: str) -> pa.Table:
        """`read_stream` as a pyarrow Table (no Spark needed)."""
        return self._pending(name)[0]

    def read_stream(self, name: str) -> DataFrame:
        """The stream's pending change records as a Spark DataFrame; the offset does not move.

        Columns: relative_path, url, size, last_modified_time, etag, __change_type,
        __commit_version, __commit_timestamp.
        """
        return self._to_df(self._pending(name)[0])

    def _to_df(self, records: pa.Table) -> DataFrame:
        return self.spark.createDataFrame(records)

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
        records, spec, a, b = self._pending(name)
        batch = Batch(stream=name, df=self._to_df(records), records=records, start_version=a,
                      end_version=b, batch_id=spec["batch_id"])
        yield batch
        if a == b and not spec["initial_pending"]:
            return  # nothing was pinned, nothing to move
        self.commit_offset(name, spec.get("volume_id") or spec["table_id"], a, b,
                           spec["batch_id"])

    def commit_offset(self, name: str, volume_id: str, start: int, end: int,
                      batch_id: int) -> None:
        """Move the stream's offset from `start` to `end` if nobody else has (compare-and-swap)."""

        def advance(state: CatalogState) -> None:
            spec = self._get(state, STREAM, name)
            if spec.get("volume_id", spec.get("table_id")) != volume_id \
                    or spec["offset"] != start \
                    or spec["batch_id"] != batch_id:
                raise ConsumeConflictError(name, start, spec["offset"])
            spec.update(offset=end, batch_id=batch_id + 1, initial_pending=False,
                        consumed_at=_now())

        self.warehouse.mutate(advance)

    def describe_stream(self, name: str) -> dict[str, Any]:
        """Offset, mode, latest version, pending-change count, and whether it is stale."""
        state = self.warehouse.read()
        if "table" in self._get(state, STREAM, name):
            from volume_stream import _table_catalog

            return _table_catalog.describe(self.tables, self._get(state, STREAM, name))
        spec, volume = self._stream(name, state)
        table = self._table(volume)
        info = {k: v for k, v in spec.items() if k != "volume_id"}
        info["latest_version"] = table.version()
        info["oldest_version"] = table.oldest_version()
        info["stale"] = spec["offset"] < info["oldest_version"]
        info["pending_changes"] = None if info["stale"] else self._pending(name)[0].num_rows
        return info

    # ------------------------------------------------------------------ front doors
    def pipeline(self, stream: str, udf: Any, target: str, **options: Any) -> Any:
        """A per-file UDF pipeline over `stream` writing to `target` (see `volume_stream.pipeline`).

        Example:
            >>> cat.pipeline("new_images", image_metadata, "image_meta").run_once()
        """
        from volume_stream.pipeline import Pipeline

        return Pipeline(self, stream, udf, target, **options)

    def sql(self, text: str) -> Any:
        """Run volume-stream DDL and Spark SQL over streams (see `volume_stream.sql`)."""
        from volume_stream.sql import run_sql

        return run_sql(self, text)

    def register_udf(self, name: str, fn: Any, return_type: Any = "string") -> None:
        """Make a Python function callable from `sql()` under `name`."""
        from volume_stream.sql import register_udf

        register_udf(self, name, fn, return_type)

