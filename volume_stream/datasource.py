"""`volume_stream`: a Spark Python data source over a volume's directory table, for Structured
Streaming with Spark's own checkpoints (DESIGN §8), and for batch reads of a version range.

    from volume_stream.datasource import register
    register(spark)
    (spark.readStream.format("volume_stream")
        .option("warehouse", "/wh").option("volume", "landing")
        .option("mode", "APPEND_ONLY").option("maxFilesPerTrigger", 100)
        .load()
        .writeStream.format("parquet").option("path", "/out")
        .option("checkpointLocation", "/chk").trigger(availableNow=True).start())

Offsets are directory-table versions: `{"volume_id": ..., "version": v}`. A micro-batch covering
(a, b] returns what a stream would: STANDARD, the minimal change set per file between a and b;
APPEND_ONLY, every insert. Versions are immutable, so a batch replayed after a failure returns
exactly the same records: with Spark's file sink (or any idempotent sink) the output is
exactly-once. The source keeps no state of its own; Spark's checkpoint is the offset.

Options: `warehouse` (a folder or a URI: `s3://bucket/prefix`, `hdfs://...`) and `volume` (or
`table`: a warehouse table's Table Stream records, with change tracking on; it starts at the
latest version unless told otherwise); `storage_options` (a JSON object of delta-rs's keys,
e.g. `AWS_ENDPOINT_URL`; credentials come from the environment, and secret keys given here stay
on the driver); `mode` (STANDARD | APPEND_ONLY, default
STANDARD); `startingVersion` ("latest", or n to include version n and later; default 0: every
change since the volume was created); `startingTimestamp` (changes after the last version
committed at or before it); `maxFilesPerTrigger` (files per micro-batch, at version
granularity: a version larger than the limit makes a batch of its own). `endingVersion` for
batch reads. Triggers `availableNow`, `processingTime` and `once` work.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from connectors.secrets import is_secret
from directory_table import DirectoryTable
from volume_stream._datasource_table import TableRange, TableSource, table_records
from volume_stream.errors import InvalidInputError, WarehouseError
from volume_stream.streams.changes import MODES, RECORD_DDL
from volume_stream.streams.reader import VersionReader, records

__all__ = ["SCHEMA", "SourceOptions", "VolumeStreamDataSource", "register"]

#: the change-record schema, as Spark DDL
SCHEMA = RECORD_DDL
_KNOWN = ("warehouse", "volume", "table", "mode", "startingversion", "startingtimestamp",
          "maxfilespertrigger", "endingversion", "path", "storage_options")


def register(spark) -> None:
    """Make `format("volume_stream")` available in this SparkSession (safe to call again).

    Example:
        >>> register(spark)
        >>> spark.read.format("volume_stream").option("warehouse", "/wh")\\
        ...     .option("volume", "landing").load().count()
    """
    spark.dataSource.register(VolumeStreamDataSource)


def _int_option(options: Mapping[str, str], key: str, name: str, minimum: int) -> int | None:
    raw = options.get(key)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise InvalidInputError(f"volume_stream option {name} must be an integer, not {raw!r}"
                                ) from None
    if value < minimum:
        raise InvalidInputError(f"volume_stream option {name} must be >= {minimum}, not {value}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The data source's options, checked."""

    warehouse: str
    volume: str
    mode: str = "STANDARD"
    starting_version: int | str | None = None  # "latest", n, or None
    starting_timestamp: datetime | None = None
    max_files_per_trigger: int | None = None
    ending_version: int | None = None
    table: str | None = None
    storage_options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check the options given to `.option(...)` (keys are case-insensitive).

        Example:
            >>> SourceOptions.parse({"warehouse": "/wh", "volume": "v", "mode": "append_only"}).mode
            'APPEND_ONLY'
        """
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        unknown = sorted(set(opts) - set(_KNOWN))
        if unknown:
            raise InvalidInputError(f"unknown volume_stream options {unknown}; known: warehouse, "
                                    f"volume, mode, startingVersion, startingTimestamp, "
                                    f"maxFilesPerTrigger, endingVersion, table, storage_options")
        for key in ("warehouse", "table" if opts.get("table") else "volume"):
            if not opts.get(key):
                raise InvalidInputError(f"volume_stream needs .option({key!r}, ...)")
        if opts.get("table") and opts.get("volume"):
            raise InvalidInputError("volume_stream takes .option('volume', ...) or "
                                    ".option('table', ...), not both")
        mode = str(opts.get("mode", "STANDARD")).upper()
        if mode not in MODES:
            raise InvalidInputError(f"volume_stream option mode must be STANDARD or "
                                    f"APPEND_ONLY, not {opts['mode']!r}")
        starting: int | str | None = None
        if opts.get("startingversion") is not None:
            if str(opts["startingversion"]).strip().lower() == "latest":
                starting = "latest"
            else:
                starting = _int_option(opts, "startingversion", "startingVersion", 0)
        when = None
        if opts.get("startingtimestamp") is not None:
            if starting is not None:
                raise InvalidInputError("volume_stream: give startingVersion or "
                                        "startingTimestamp, not both")
            try:
                when = datetime.fromisoformat(str(opts["startingtimestamp"]).strip())
            except ValueError:
                raise InvalidInputError(f"volume_stream option startingTimestamp "
                                        f"{opts['startingtimestamp']!r} is not an ISO timestamp"
                                        ) from None
            when = when if when.tzinfo else when.replace(tzinfo=UTC)
        return cls(str(opts["warehouse"]), str(opts.get("volume") or ""), mode, starting, when,
                   _int_option(opts, "maxfilespertrigger", "maxFilesPerTrigger", 1),
                   _int_option(opts, "endingversion", "endingVersion", 0),
                   str(opts["table"]) if opts.get("table") else None,
                   _storage_options(opts.get("storage_options")))


def _storage_options(text: Any) -> tuple[tuple[str, str], ...]:
    if text is None or text == "":
        return ()
    try:
        data = json.loads(text) if isinstance(text, str) else dict(text)
    except (ValueError, TypeError):
        raise InvalidInputError("volume_stream option storage_options must be a JSON object "
                                "of strings, e.g. '{\"AWS_REGION\": \"eu-west-1\"}'") from None
    if not isinstance(data, dict):
        raise InvalidInputError("volume_stream option storage_options must be a JSON object")
    return tuple(sorted((str(k), str(v)) for k, v in data.items()))


class VersionRange(InputPartition):
    """The versions (start, end] of one volume's directory table, read on an executor.
    `options` are the warehouse's storage options without secrets: executors take
    credentials from their own environment or role."""

    def __init__(self, table_root: str, base_url: str, start: int, end: int, mode: str,
                 options: dict[str, str] | None = None):
        super().__init__((start, end))
        self.table_root, self.base_url = table_root, base_url
        self.start, self.end, self.mode = start, end, mode
        self.options = {k: v for k, v in (options or {}).items() if not is_secret(k)}


def _records(part: VersionRange) -> pa.Table:
    table = DirectoryTable(part.table_root, part.base_url, getattr(part, "options", None))
    return records(table, part.mode, part.start, part.end)


def _read(part: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(part, TableRange):
        yield from table_records(part).to_batches(max_chunksize=10_000)
        return
    if not isinstance(part, VersionRange):
        return  # Spark reads one placeholder partition when a batch read plans none
    yield from _records(part).to_batches(max_chunksize=10_000)


def _source(opts: SourceOptions) -> Any:
    """The volume (or table) behind the options."""
    if opts.table:
        return TableSource(opts)
    return _Volume(opts)


class _Volume:
    """The volume behind the options: its id, location and directory table (read-only: a
    warehouse that does not exist is an error, never created)."""

    def __init__(self, opts: SourceOptions):
        try:
            self.reader = VersionReader.open(opts.warehouse, opts.volume,
                                             dict(opts.storage_options))
        except WarehouseError as exc:
            raise WarehouseError(f"volume_stream option warehouse: {exc}") from exc
        self.spec, self.table = self.reader.spec, self.reader.table

    def check(self, offset: dict[str, Any]) -> int:
        """The offset's version, after checking it belongs to this volume and is still kept."""
        if offset.get("volume_id") != self.spec.id:
            raise InvalidInputError(
                f"volume {self.spec.name!r} was dropped or replaced after this query's checkpoint "
                f"was written (checkpoint volume id {offset.get('volume_id')!r}, now "
                f"{self.spec.id!r}); start the query again with a new checkpointLocation")
        version = int(offset["version"])
        if not self.reader.is_kept(version):
            oldest = self.reader.oldest()
            raise InvalidInputError(
                f"volume {self.spec.name!r}: the query is at version {version} but the oldest "
                f"kept version is {oldest} (older ones were removed by retention); start again "
                f"with a new checkpointLocation and startingVersion >= {oldest + 1}")
        return version

    def offset(self, version: int) -> dict[str, Any]:
        return {"volume_id": self.spec.id, "version": int(version)}

    def start_version(self, opts: SourceOptions) -> int:
        latest = self.table.version()
        if opts.starting_version == "latest":
            return latest
        if opts.starting_timestamp is not None:
            found = self.table.version_at(opts.starting_timestamp)
            return 0 if found is None else found
        version = opts.starting_version or 0
        if version > latest + 1:
            raise InvalidInputError(f"volume_stream startingVersion {version} is after volume "
                                    f"{self.spec.name!r}'s latest version {latest}")
        start = max(version - 1, 0)
        oldest = self.table.oldest_version()
        if start < oldest:
            raise InvalidInputError(
                f"volume {self.spec.name!r} keeps versions from {oldest} on; set "
                f"startingVersion to {oldest + 1} or later, or to 'latest'")
        return start

    def partition(self, start: int, end: int, mode: str) -> VersionRange:
        return VersionRange(str(self.table.root), self.spec.location, start, end, mode,
                            self.table.storage_options)

    def admit(self, start: int, latest: int, limit: ReadLimit) -> int:
        """The last version to read so a batch stays within `limit` (at least one version)."""
        if isinstance(limit, ReadMaxFiles):
            cap, distinct = limit.max_files, True
        elif isinstance(limit, ReadMaxRows):
            cap, distinct = limit.max_rows, False
        else:
            return latest
        return self.reader.admit(start, latest, cap, distinct_files=distinct)


class VolumeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of a volume's change records; offsets are directory-table versions."""

    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self.volume = _source(opts)
        self._target: int | None = None  # the last version for Trigger.AvailableNow

    def initialOffset(self) -> dict:
        return self.volume.offset(self.volume.start_version(self.opts))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_files_per_trigger:
            return ReadMaxFiles(self.opts.max_files_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.volume.table.version()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        a = self.volume.check(start)
        latest = self.volume.table.version()
        if self._target is not None:
            latest = min(latest, self._target)
        if latest <= a:
            return start
        return self.volume.offset(self.volume.admit(a, latest, limit))

    def reportLatestOffset(self) -> dict | None:
        return self.volume.offset(self.volume.table.version())

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        a, b = self.volume.check(start), int(end["version"])
        if b <= a:
            return []
        return [self.volume.partition(a, b, self.opts.mode)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offset, versions stay until retention."""


class VolumeBatchReader(DataSourceReader):
    """`spark.read.format("volume_stream")`: the change records of versions (start, end]."""

    def __init__(self, opts: SourceOptions):
        volume = _source(opts)
        start = volume.start_version(opts)
        end = volume.table.version() if opts.ending_version is None else opts.ending_version
        if end > volume.table.version():
            raise InvalidInputError(f"volume_stream endingVersion {end} is after volume "
                                    f"{opts.volume!r}'s latest version {volume.table.version()}")
        self.part = volume.partition(start, max(start, end), opts.mode)

    def partitions(self) -> list[InputPartition]:
        return [self.part] if self.part.end > self.part.start else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition)


class VolumeStreamDataSource(DataSource):
    """The `volume_stream` format (see the module docstring for its options)."""

    @classmethod
    def name(cls) -> str:
        return "volume_stream"

    def schema(self) -> str:
        # called when the query is defined: bad options fail at load(), not later
        source = _source(SourceOptions.parse(self.options))
        return SCHEMA if isinstance(source, _Volume) else source.schema()

    def streamReader(self, schema) -> DataSourceStreamReader:
        return VolumeStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema) -> DataSourceReader:
        return VolumeBatchReader(SourceOptions.parse(self.options))

