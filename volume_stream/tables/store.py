"""Warehouse tables: Delta tables under `<warehouse>/tables/<name>` (where pipeline targets given
by a bare name live too), created, changed and read with delta-rs, so they persist across
processes and working directories and Spark never needs a metastore.

Row identity. Tables written here carry two hidden columns that SELECT never shows:
`_vs_row_id` (int64, assigned on insert as `version << 32 | position`, so unique without any
coordination, and kept by UPDATE and MERGE's update) and `_vs_row_version` (the version that
wrote the row's current image, set by every insert and update). A table stream pairs the pre-
and post-images of a row by `_vs_row_id` and dates an old image by `_vs_row_version`, which is
what the per-key minimal change set of `volume_stream.streams.changes` needs; duplicate rows stay
distinct rows and a row updated back to its old value nets to nothing. Every write commits at
exactly the version it stamped (delta-rs with no commit retry) and starts again on a lost race.

Where. The tables live under a warehouse `Location` (DESIGN §3.1): a local folder or a prefix on
S3/HDFS, opened by delta-rs with the warehouse's `storage_options`; listing and dropping go
through the same `Location`, so an S3 warehouse never touches local disk. On S3 a commit is a
conditional PUT of `_delta_log/<v>.json`: of two processes racing for version v one loses
(`CommitFailedError`), reloads and stamps v+1; a write that loses `_ATTEMPTS` races in a row is
a `CommitConflictError` naming the table.

    store = TableStore("/wh/tables")          # or TableStore(location) of an S3 warehouse
    store.create("t", [Column("id", "INT"), Column("name", "STRING", "who")])
    store.insert("t", pa.table({"id": [1], "name": ["a"]}))
    store.update("t", {"name": "upper(name)"}, where="id = 1")
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from volume_stream.errors import (
    AlreadyExistsError,
    CommitConflictError,
    InvalidInputError,
    NotFoundError,
    VolumeStreamError,
)
from volume_stream.tables import registered
from volume_stream.tables._util import integers as _integers
from volume_stream.tables._util import plain as _plain
from volume_stream.tables._util import quote as _quote
from volume_stream.tables._util import statement_error as _statement_error
from volume_stream.tables.expressions import deep_stack, to_delta, to_delta_predicate
from volume_stream.tables.keys import KEY_PROPERTY, check_key, key_columns, parse_key
from volume_stream.tables.readable import check_readable, readable, rows
from volume_stream.tables.types import arrow_type, conform, sql_type
from volume_stream.warehouse import check_name
from volume_stream.warehouse.location import Location, storage_error

__all__ = ["HIDDEN", "ROW_ID", "ROW_VERSION", "Column", "MergeClause", "TableStore"]

log = logging.getLogger(__name__)

ROW_ID, ROW_VERSION = "_vs_row_id", "_vs_row_version"
HIDDEN = (ROW_ID, ROW_VERSION)
CDF = "delta.enableChangeDataFeed"
_PROPERTIES = {"change_tracking": CDF, "key": KEY_PROPERTY}
_ATTEMPTS = 20
TABLE = "table"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    comment: str | None = None


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause: `matched` (WHEN MATCHED) or not; `action` "update" | "delete" |
    "insert"; `condition` the AND condition; `assignments` target column -> expression
    (UPDATE SET / INSERT (cols) VALUES (exprs)). Expressions are Spark SQL text or sqlglot
    nodes, qualified with the merge's aliases."""

    matched: bool
    action: str
    condition: Any = None
    assignments: dict[str, Any] | None = None


class TableStore:
    """The tables of one warehouse: the Delta tables under `root` (a local folder, a URI such
    as `s3://bucket/wh/tables` with `storage_options`, or a `Location`)."""

    def __init__(self, root: str | os.PathLike | Location,
                 storage_options: dict[str, Any] | None = None):
        self.location = root if isinstance(root, Location) else Location.parse(
            root, storage_options)
        #: the tables' folder: an absolute local path or `scheme://bucket/prefix`
        self.root = self.location.uri
        #: returns the Spark session that reads registered tables delta-rs cannot (or None)
        self.spark: Callable[[], Any] | None = None

    @classmethod
    def of_warehouse(cls, warehouse: Any) -> TableStore:
        """The tables of `warehouse` (a `Warehouse`: its `tables/` folder, its options)."""
        return cls(warehouse.location.join("tables"), warehouse.storage_options)

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options with current credentials (an assumed role's are refreshed)."""
        return self.location.delta_options()

    # ------------------------------------------------------------------ lookups
    def path(self, name: str) -> str:
        """Where the table's Delta files are: `tables/<name>`, or a registered table's location."""
        found = self.registration(name)
        return found["location"] if found else self.location.join(name)

    def registration(self, name: str) -> dict[str, Any] | None:
        """The pointer of a table registered from outside the warehouse (`tables.registered`)."""
        try:
            return registered.pointer(self.location, name)
        except OSError as exc:
            raise storage_error(self.root, exc, f"read table {name!r}") from exc

    def _children(self, relative: str = "") -> list[str]:
        try:
            return self.location.children(relative)
        except OSError as exc:  # the object store refused: name the warehouse, no secret
            raise storage_error(self.root, exc, "list its tables") from exc

    def names(self) -> list[str]:
        return sorted(n for n in self._children() if self.exists(n))

    def exists(self, name: str) -> bool:
        return bool(self._children(f"{check_name(TABLE, name)}/_delta_log")) \
            or self.registration(name) is not None

    def occupied(self, name: str) -> bool:
        """Whether anything (a table, or a folder that is not one) is stored under `name`."""
        return bool(self._children(check_name(TABLE, name)))

    def open(self, name: str, *, writing: bool = False) -> DeltaTable:
        """The Delta table `name`; NotFoundError lists the tables that exist. `writing`:
        refuse a registered table (the warehouse never writes its users' tables)."""
        if writing and self.registration(name) is not None:
            raise registered.refuse_write(name, self.path(name))
        if not self.exists(name):
            if self.occupied(name):
                raise InvalidInputError(f"table {name!r}: {self.path(name)} is not a Delta "
                                        f"table (no _delta_log); nothing was written")
            raise NotFoundError(TABLE, name, self.names())
        try:
            return DeltaTable(self.path(name), storage_options=self.storage_options)
        except (TableNotFoundError, DeltaError) as exc:
            raise InvalidInputError(f"table {name!r}: {self.path(name)} is not a readable "
                                    f"Delta table: {exc}") from exc

    @staticmethod
    def full_schema(dt: DeltaTable) -> pa.Schema:
        return pa.schema(dt.schema().to_arrow())

    def schema(self, name: str) -> pa.Schema:
        """The table's visible columns (hidden row-identity columns left out)."""
        full = self.full_schema(self.open(name))
        return pa.schema([f for f in full if f.name not in HIDDEN])

    def _layout(self, name: str) -> tuple[DeltaTable, pa.Schema, bool]:
        """One load of the table: (table, visible schema, has row ids)."""
        dt = self.open(name, writing=True)
        full = self.full_schema(dt)
        return dt, pa.schema([f for f in full if f.name not in HIDDEN]), ROW_ID in full.names

    def has_row_ids(self, name: str) -> bool:
        return ROW_ID in self.full_schema(self.open(name)).names

    def version(self, name: str) -> int:
        return self.open(name).version()

    def table_id(self, name: str) -> str:
        return self.open(name).metadata().id

    def key(self, name: str) -> tuple[str, ...]:
        """The table's declared key columns (`tables.keys`, or given when it was registered);
        () when it has none."""
        found = self.registration(name)
        if found and found.get("key"):
            return tuple(found["key"])
        return parse_key(self.open(name).metadata().configuration.get(KEY_PROPERTY))

    def change_tracking(self, name: str) -> bool:
        conf = self.open(name).metadata().configuration
        return str(conf.get(CDF, "false")).lower() == "true"

    def describe(self, name: str) -> dict[str, Any]:
        dt = self.open(name)
        meta = dt.metadata()
        columns = [{"name": f.name, "type": sql_type(f.type),
                    "comment": (f.metadata or {}).get(b"comment", b"").decode() or None}
                   for f in self.full_schema(dt) if f.name not in HIDDEN]
        return {"name": name, "path": self.path(name), "id": meta.id,
                "comment": meta.description, "columns": columns, "version": dt.version(),
                "change_tracking": str(meta.configuration.get(CDF, "false")).lower() == "true",
                "properties": dict(meta.configuration)}

    # ------------------------------------------------------------------ DDL
    def create(self, name: str, columns: list[Column] | pa.Schema, *, comment: str | None = None,
               if_not_exists: bool = False, replace: bool = False,
               key: str | list[str] | None = None) -> bool:
        """Create an empty table (`key`: its declared key columns); returns False if it
        existed and `if_not_exists`."""
        if isinstance(columns, pa.Schema):
            fields = [pa.field(f.name, f.type, metadata=f.metadata) for f in columns
                      if f.name not in HIDDEN]
        else:
            fields = [pa.field(c.name, arrow_type(c.type),
                               metadata={"comment": c.comment} if c.comment else None)
                      for c in columns]
        names = [f.name.lower() for f in fields]
        if not fields or len(set(names)) != len(names) or any(n in HIDDEN for n in names):
            raise InvalidInputError(f"table {name!r}: columns must be given, with distinct "
                                    f"names other than {', '.join(HIDDEN)}")
        keys = check_key(name, key_columns(key), [f.name for f in fields])
        if self.occupied(name):
            if if_not_exists:
                return False
            if not replace:
                raise AlreadyExistsError(TABLE, name)
            self.location.delete_tree(name)
        schema = pa.schema(fields + [pa.field(ROW_ID, pa.int64()),
                                     pa.field(ROW_VERSION, pa.int64())])
        if self.location.is_local:
            os.makedirs(self.root, exist_ok=True)
        try:
            DeltaTable.create(self.path(name), schema=schema, name=name, description=comment,
                              storage_options=self.storage_options,
                              configuration={KEY_PROPERTY: ",".join(keys)} if keys else None,
                              raise_if_key_not_exists=False)
        except DeltaError as exc:
            raise VolumeStreamError(f"table {name!r}: could not be created: {exc}") from exc
        return True

    def drop(self, name: str, *, if_exists: bool = False) -> bool:
        """Delete `tables/<name>`: a warehouse table's files, or a registered table's pointer
        only (the user's table at its location is never touched: unregistered, not deleted)."""
        if not self.occupied(name):
            if if_exists:
                return False
            raise NotFoundError(TABLE, name, self.names())
        self.location.delete_tree(name)
        return True

    def set_properties(self, name: str, properties: dict[str, str]) -> int:
        """ALTER TABLE ... SET PROPERTIES: 'change_tracking' = 'true' turns on the change data
        feed; other keys are Delta table properties. Returns the new version."""
        dt = self.open(name, writing=True)
        conf = {}
        for key, value in properties.items():
            key = _PROPERTIES.get(key.lower(), key)
            value = str(value).lower() if key == CDF else str(value)
            if key == CDF and value not in ("true", "false"):
                raise InvalidInputError(f"table {name!r}: change_tracking takes 'true' or "
                                        f"'false', not {properties!r}")
            if key == KEY_PROPERTY:  # 'a,b': the declared key, checked and spelled as stored
                value = ",".join(check_key(name, parse_key(value), self.schema(name).names))
            conf[key] = value
        try:
            dt.alter.set_table_properties(conf, raise_if_not_exists=KEY_PROPERTY not in conf)
        except DeltaError as exc:
            raise InvalidInputError(f"table {name!r}: cannot set {conf}: {exc}") from exc
        return self.version(name)

    # ------------------------------------------------------------------ reads
    def snapshot(self, name: str, version: int | None = None, *,
                 hidden: bool = False) -> pa.Table:
        dt = self.open(name)
        if self._read_by_spark(name, dt):
            table = registered.spark_snapshot(self.spark and self.spark(), name, self.path(name),
                                              version)
        else:
            if version is not None:
                dt.load_as_version(version)
            with readable(name, self.path(name), dt):
                table = rows(name, self.path(name), dt)  # local: starts no thread
        if not hidden:
            table = table.select([c for c in table.column_names if c not in HIDDEN])
        return _plain(table)

    def _read_by_spark(self, name: str, dt: DeltaTable) -> bool:
        """A registered table with reader features delta-rs cannot read is read by Delta Spark;
        a warehouse table another engine upgraded to them is refused (`readable`)."""
        return bool(registered.needs_spark(dt)) and self.registration(name) is not None

    def file_uris(self, name: str) -> list[str]:
        """The data files of the latest version, which hold its rows as they are (a table
        with deletion vectors or column mapping is refused: `readable.check_readable`)."""
        dt = self.open(name)
        check_readable(name, self.path(name), dt)
        return dt.file_uris()

    def changes(self, name: str, after: int, up_to: int) -> pa.Table:
        """The change data feed of versions (after, up_to] (plain Arrow types)."""
        dt = self.open(name)
        if up_to <= after:
            return _plain(pa.table({**{f.name: pa.array([], f.type)
                                       for f in self.full_schema(dt)},
                                    "_change_type": pa.array([], pa.string()),
                                    "_commit_version": pa.array([], pa.int64())}))
        try:
            if self._read_by_spark(name, dt):  # DVs, column mapping: Delta Spark reads
                table = registered.spark_changes(self.spark and self.spark(), name,
                                                 self.path(name), after, up_to)
            else:
                with readable(name, self.path(name), dt, after=after, up_to=up_to,
                              storage_options=self.storage_options):
                    reader = dt.load_cdf(starting_version=after + 1, ending_version=up_to)
                    table = pa.RecordBatchReader.from_stream(reader).read_all()
        except DeltaError as exc:
            raise InvalidInputError(f"table {name!r}: no change data for versions "
                                    f"{after + 1}..{up_to} (is change_tracking on?): {exc}"
                                    ) from exc
        table = table.drop_columns([c for c in ("_commit_timestamp",) if c in table.column_names])
        return _plain(table).set_column(table.column_names.index("_commit_version"),
                                        "_commit_version",
                                        table["_commit_version"].cast(pa.int64()))

    def timestamps(self, name: str) -> dict[int, datetime]:
        """Commit time of every kept version."""
        return {h["version"]: datetime.fromtimestamp(h["timestamp"] / 1000, UTC)
                for h in self.open(name).history()}

    def oldest_version(self, name: str) -> int:
        found = self.registration(name)
        log = Location.parse(found["location"], self.location.storage_options).children(
            "_delta_log") if found else self._children(f"{name}/_delta_log")
        versions = [int(n.split(".")[0]) for n in log
                    if n.endswith(".json") and n.split(".")[0].isdigit()]
        return min(versions) if versions else 0

    def version_at(self, name: str, when: datetime) -> int | None:
        """The last version committed at or before `when`."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        found = [v for v, ts in self.timestamps(name).items() if ts <= when]
        return max(found) if found else None

    def apply_retention(self, name: str, retention_days: float) -> dict[str, Any]:
        dt = self.open(name, writing=True)
        dt.create_checkpoint()
        removed = dt.cleanup_metadata()
        vacuumed = dt.vacuum(retention_hours=int(retention_days * 24),
                             enforce_retention_duration=False, dry_run=False)
        return {"oldest_version": self.oldest_version(name), "vacuumed_files": len(vacuumed),
                "removed_logs": removed}

    # ------------------------------------------------------------------ writes
    def _commit(self, name: str, write: Callable[[DeltaTable, int, CommitProperties], Any],
                dt: DeltaTable | None = None) -> tuple[int, Any]:
        """Run `write(dt, next_version, props)` so it commits at exactly next_version; returns
        (the table's version after it, write's result). A DELETE, UPDATE or MERGE that changes
        no row commits nothing (delta-rs): the version is then the one the table stays at."""
        for attempt in range(_ATTEMPTS):
            dt = dt or self.open(name)
            version = dt.version() + 1
            try:
                result = deep_stack(write, dt, version, CommitProperties(max_commit_retries=0))
            except CommitFailedError:
                log.info("table %s: another writer committed version %d first; planning the "
                         "statement again on it (nothing lost)", self.path(name), version)
                dt = None  # lost a race: reload and stamp the next version
                time.sleep(random.uniform(0, 0.01 * (attempt + 1)))
                continue
            except VolumeStreamError:
                raise
            except BaseException as exc:
                converted = _statement_error(name, exc)
                if converted is None:
                    raise
                raise converted from exc
            return min(version, dt.version()), result
        raise CommitConflictError(f"table {self.path(name)}: lost the race for the next "
                                  f"version {_ATTEMPTS} times in a row (other writers keep "
                                  f"committing); nothing of this statement was written, retry it")

    def insert(self, name: str, rows: pa.Table, *, columns: list[str] | None = None,
               overwrite: bool = False) -> tuple[int, int]:
        """Append (or overwrite with) `rows`, checked against the table's types. Returns
        (version, rows written)."""
        dt, schema, with_ids = self._layout(name)
        rows = conform(rows, schema, table=name, columns=columns)

        def write(dt: DeltaTable, version: int, props: CommitProperties) -> int:
            data = rows
            if with_ids:
                n = data.num_rows
                data = data.append_column(ROW_ID, pa.array(
                    np.arange(n, dtype=np.int64) + (version << 32)))
                data = data.append_column(ROW_VERSION, pa.array([version] * n, pa.int64()))
            write_deltalake(dt, data, mode="overwrite" if overwrite else "append",
                            commit_properties=props)
            return data.num_rows

        return self._commit(name, write, dt)

    def update(self, name: str, assignments: dict[str, Any], where: Any = None
               ) -> tuple[int, int]:
        """UPDATE name SET col = expr, ... [WHERE cond]; returns (version, rows updated)."""
        dt, schema, with_ids = self._layout(name)
        cols = schema.names
        ints = _integers(schema)
        updates = {self._column(name, cols, c): to_delta(e, columns=cols, table=name,
                                                         integers=ints)
                   for c, e in assignments.items()}
        predicate = to_delta_predicate(where, columns=cols, table=name, integers=ints) \
            if where is not None else None

        def write(dt: DeltaTable, version: int, props: CommitProperties) -> int:
            stamped = {_quote(c): e for c, e in updates.items()}
            if with_ids:
                stamped[_quote(ROW_VERSION)] = str(version)
            metrics = dt.update(updates=stamped, predicate=predicate, commit_properties=props)
            return int(metrics.get("num_updated_rows", 0))

        return self._commit(name, write, dt)

    def delete(self, name: str, where: Any = None) -> tuple[int, int]:
        dt, schema, _ = self._layout(name)
        predicate = to_delta_predicate(where, columns=schema.names, table=name,
                                       integers=_integers(schema)) \
            if where is not None \
            else None

        def write(dt: DeltaTable, version: int, props: CommitProperties) -> int:
            metrics = dt.delete(predicate, commit_properties=props)
            return int(metrics.get("num_deleted_rows", 0))

        return self._commit(name, write, dt)

    def merge(self, name: str, source: pa.Table, on: Any, clauses: list[MergeClause], *,
              target_alias: str, source_alias: str) -> tuple[int, dict[str, Any]]:
        """MERGE INTO name AS target_alias USING source AS source_alias ON on WHEN ...

        Several source rows may match one target row as long as at most one clause applies to
        each pair (the seed's stream-driven MERGE)."""
        dt, schema, with_ids = self._layout(name)
        cols = schema.names
        new_id = "_vs_new_row_id"
        source = _plain(source)
        if with_ids:
            source = source.append_column(new_id, pa.array(range(source.num_rows), pa.int64()))
        predicate = to_delta(on, table=name)
        ints = _integers(schema) | _integers(source.schema)
        plan = []
        for clause in clauses:
            cond = to_delta_predicate(clause.condition, table=name, integers=ints) \
                if clause.condition is not None \
                else None
            sets = {self._column(name, cols, c): to_delta(e, table=name, integers=ints)
                    for c, e in (clause.assignments or {}).items()}
            plan.append((clause, cond, sets))

        def write(dt: DeltaTable, version: int, props: CommitProperties) -> dict[str, Any]:
            builder = dt.merge(source, predicate, source_alias=source_alias,
                               target_alias=target_alias, commit_properties=props)
            for clause, cond, sets in plan:
                stamped = {_quote(c): e for c, e in sets.items()}
                if with_ids and clause.action != "delete":
                    stamped[_quote(ROW_VERSION)] = str(version)
                    if clause.action == "insert":
                        stamped[_quote(ROW_ID)] = (f"{version << 32} + "
                                                   f"{_quote(source_alias)}.{_quote(new_id)}")
                if clause.action == "update":
                    builder = builder.when_matched_update(stamped, predicate=cond)
                elif clause.action == "delete" and clause.matched:
                    builder = builder.when_matched_delete(predicate=cond)
                elif clause.action == "delete":
                    builder = builder.when_not_matched_by_source_delete(predicate=cond)
                else:
                    builder = builder.when_not_matched_insert(stamped, predicate=cond)
            return builder.execute()

        return self._commit(name, write, dt)

    @staticmethod
    def _column(name: str, cols: list[str], col: str) -> str:
        lookup = {c.lower(): c for c in cols}
        stored = lookup.get(str(col).lower())
        if stored is None:
            raise InvalidInputError(f"table {name!r} has no column {col!r} (columns: "
                                    f"{', '.join(cols)})")
        return stored
