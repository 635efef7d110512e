"""The `volume_stream` data source over a warehouse table's Table Stream records
(`.option("table", "orders")` instead of `.option("volume", ...)`): the same offsets (Delta
versions, here `{"table_id": ..., "version": v}`), the same micro-batch contract, the records of
`volume_stream.tables` (STANDARD / APPEND_ONLY keyed by row id). Used by `datasource`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxFiles, ReadMaxRows

from connectors.secrets import is_secret
from volume_stream.errors import InvalidInputError, WarehouseError
from volume_stream.tables import TableStore, records_between
from volume_stream.tables.types import sql_type
from volume_stream.warehouse import MARKER
from volume_stream.warehouse.location import Location, storage_error

__all__ = ["TableRange", "TableSource", "table_records"]


class TableRange(InputPartition):
    """Versions (start, end] of one warehouse table, read on an executor. `options` are the
    warehouse's storage options without secrets (executors take credentials from their own
    environment or role)."""

    def __init__(self, root: str, name: str, start: int, end: int, mode: str,
                 options: dict[str, str] | None = None):
        super().__init__((start, end))
        self.root, self.name, self.start, self.end, self.mode = root, name, start, end, mode
        self.options = {k: v for k, v in (options or {}).items() if not is_secret(k)}


def table_records(part: TableRange) -> pa.Table:
    spec = {"name": f"table {part.name}", "table": part.name, "mode": part.mode,
            "initial_pending": False}
    store = TableStore(part.root, getattr(part, "options", None))
    return records_between(store, spec, part.start, part.end)


def _spark_type(t: pa.DataType) -> str:
    return "timestamp" if pa.types.is_timestamp(t) else sql_type(t).lower()


class _Versions:
    """The DirectoryTable-like view `datasource` reads versions through."""

    def __init__(self, store, name: str):
        self.store, self.name = store, name

    def version(self) -> int:
        return self.store.version(self.name)

    def oldest_version(self) -> int:
        return self.store.oldest_version(self.name)

    def version_at(self, when) -> int | None:
        return self.store.version_at(self.name, when)


class TableSource:
    """The table behind the options (read-only: a missing warehouse is an error)."""

    def __init__(self, opts):
        where = Location.parse(opts.warehouse, dict(opts.storage_options))
        try:
            marked = where.exists(MARKER)
        except OSError as exc:
            raise storage_error(where.uri, exc, "open it") from exc
        if not marked:
            raise WarehouseError(f"volume_stream option warehouse: {opts.warehouse!r} is not a "
                                 f"volume-stream warehouse (no {MARKER})")
        self.store = TableStore(where.join("tables"), where.delta_options())
        self.name = opts.table
        self.id = self.store.table_id(self.name)  # NotFoundError names the tables
        if not self.store.change_tracking(self.name):
            raise InvalidInputError(f"table {self.name!r} does not have change tracking on; "
                                    f"ALTER TABLE {self.name} SET PROPERTIES "
                                    f"('change_tracking' = 'true') first")
        self.table = _Versions(self.store, self.name)

    def schema(self) -> str:
        cols = ", ".join(f"`{f.name}` {_spark_type(f.type)}" for f in self.store.schema(self.name))
        return ("__change_type string, __commit_version bigint, __commit_timestamp timestamp, "
                + cols)

    def check(self, offset: dict[str, Any]) -> int:
        if offset.get("table_id") != self.id:
            raise InvalidInputError(
                f"table {self.name!r} was dropped or replaced after this query's checkpoint was "
                f"written; start the query again with a new checkpointLocation")
        version = int(offset["version"])
        oldest = self.table.oldest_version()
        if version < oldest:
            raise InvalidInputError(
                f"table {self.name!r}: the query is at version {version} but the oldest kept "
                f"version is {oldest}; start again with a new checkpointLocation")
        return version

    def offset(self, version: int) -> dict[str, Any]:
        return {"table_id": self.id, "version": int(version)}

    def start_version(self, opts) -> int:
        latest = self.table.version()
        if opts.starting_version == "latest" or (opts.starting_version is None
                                                 and opts.starting_timestamp is None):
            return latest  # a table's history before change tracking has no change data
        if opts.starting_timestamp is not None:
            found = self.table.version_at(opts.starting_timestamp)
            return latest if found is None else found
        start = max(int(opts.starting_version) - 1, 0)
        if start > latest:
            raise InvalidInputError(f"volume_stream startingVersion {opts.starting_version} is "
                                    f"after table {self.name!r}'s latest version {latest}")
        return start

    def partition(self, start: int, end: int, mode: str) -> TableRange:
        return TableRange(self.store.root, self.name, start, end, mode,
                          self.store.storage_options)

    def admit(self, start: int, latest: int, limit: ReadLimit) -> int:
        """The last version so a batch stays within `limit` change rows (at least one)."""
        if not isinstance(limit, ReadMaxFiles | ReadMaxRows):
            return latest
        cap = limit.max_files if isinstance(limit, ReadMaxFiles) else limit.max_rows
        upper = min(latest, start + max(cap, 1))
        versions = self.store.changes(self.name, start, upper)["_commit_version"].to_pylist()
        end, total = start, 0
        for version in range(start + 1, upper + 1):
            total += versions.count(version)
            if total > cap and end > start:
                break
            end = version
        return end
