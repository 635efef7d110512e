"""Users' Delta tables adopted by name (`cat.register_table`, `CREATE TABLE t LOCATION '...'`):
Table Streams on a table that Spark writes, stored outside the warehouse (issue 23 item 4).

A registered table is a pointer: `<warehouse>/tables/<name>/_vs_registered.json` holding the
table's location, its Delta id and, optionally, its key. Everything that finds a table by name
(`TableStore.path`, `exists`, `names`) follows the pointer, so SELECT, DESCRIBE and streams see
the user's table. The warehouse never writes to it and never deletes it: INSERT, UPDATE,
DELETE, MERGE, ALTER and retention are refused, and DROP TABLE removes the pointer folder only
(`Location.delete_tree` of a checked name under `tables/`), so the user's files stay as they are.

Reading. delta-rs reads a plain or partitioned table's change feed itself. It reads tables
with deletion vectors wrong (a deleted row's image is taken from the wrong row of the file)
and refuses column mapping, so a table whose protocol names reader features delta-rs does not
handle (`deletionVectors`, `columnMapping`, ...) is read through Delta Lake's own Spark
connector (`readChangeFeed`, `format("delta")`) in the session the store was given. A reader
feature neither reads is refused when the table is registered, naming the feature.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from volume_stream.errors import AlreadyExistsError, InvalidInputError
from volume_stream.tables.keys import key_columns
from volume_stream.warehouse import check_name
from volume_stream.warehouse.location import Location

__all__ = ["POINTER", "SPARK_FEATURES", "needs_spark", "pointer", "refuse_write", "register",
           "spark_changes", "spark_path", "spark_snapshot"]

POINTER = "_vs_registered.json"
CDF = "delta.enableChangeDataFeed"
#: reader features delta-rs reads correctly (its change feed included)
DELTA_RS_FEATURES = frozenset({"timestampNtz"})
#: reader features Delta Lake's Spark connector (4.x) reads
SPARK_FEATURES = frozenset({"deletionVectors", "columnMapping", "timestampNtz", "typeWidening",
                            "typeWidening-preview", "v2Checkpoint", "vacuumProtocolCheck",
                            "variantType", "variantType-preview"})


def pointer(location: Location, name: str) -> dict[str, Any] | None:
    """The registration of table `name` (None when `tables/<name>` holds no pointer)."""
    relative = f"{check_name('table', name)}/{POINTER}"
    if not location.exists(relative):
        return None
    return json.loads(location.read_text(relative))


def _features(dt: DeltaTable) -> set[str]:
    protocol = dt.protocol()
    features = set(protocol.reader_features or ())
    mode = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    if protocol.min_reader_version == 2 or str(mode).lower() != "none":
        features.add("columnMapping")  # reader version 2 is column mapping, without a list
    return features


def needs_spark(dt: DeltaTable) -> set[str]:
    """The table's reader features delta-rs cannot read right (empty: delta-rs reads it)."""
    return _features(dt) - DELTA_RS_FEATURES


def spark_path(uri: str) -> str:
    """The location as Spark names it (`s3://` as `s3a://`)."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def _inside(where: Location, warehouse: str) -> bool:
    if where.is_local:
        a, b = os.path.realpath(where.uri), os.path.realpath(warehouse)
        return a == b or a.startswith(b.rstrip(os.sep) + os.sep)
    return where.uri == warehouse or where.uri.startswith(warehouse.rstrip("/") + "/")


def register(tables: Location, name: str, location: str | os.PathLike, *,
             key: str | list[str] | None = None, replace: bool = False,
             if_not_exists: bool = False) -> bool:
    """Point table `name` of the warehouse whose tables are under `tables` at the Delta table
    at `location`; returns False if `name` existed and `if_not_exists`.

    Raises:
        InvalidInputError: the location is missing, not a Delta table, inside the warehouse,
            has no change data feed, lacks a key column, or needs a reader feature nothing
            here reads (each named).
        AlreadyExistsError: a table `name` exists (and neither `replace` nor `if_not_exists`).
    """
    check_name("table", name)
    text = os.fspath(location)
    if not text.strip():
        raise InvalidInputError(f"table {name!r}: LOCATION is empty")
    where = Location.parse(text, tables.storage_options, what=f"table {name!r}: location")
    warehouse = tables.uri.rsplit("/", 1)[0] if not tables.is_local \
        else os.path.dirname(tables.uri)
    if _inside(where, warehouse):
        raise InvalidInputError(f"table {name!r}: location {where.uri} is inside the warehouse "
                                f"{warehouse}; register only tables stored outside it")
    if where.is_local and not os.path.isdir(where.uri):
        raise InvalidInputError(f"table {name!r}: location {where.uri} does not exist (or is "
                                f"not a folder); nothing was registered")
    try:
        dt = DeltaTable(where.uri, storage_options=where.delta_options())
    except (TableNotFoundError, DeltaError, OSError) as exc:
        feature = re.search(r"[Ff]eatures?:? '?([A-Za-z][\w-]*)'? (is|are) not supported",
                            str(exc))
        if feature:  # delta-rs cannot even open the log (its versions, schema, history)
            who = "delta-rs cannot open its log" if feature[1] in SPARK_FEATURES \
                else "neither delta-rs nor Delta Lake's Spark connector here can read it"
            raise InvalidInputError(f"table {name!r}: the Delta table at {where.uri} needs "
                                    f"reader feature {feature[1]}, and {who}; nothing was "
                                    f"registered") from exc
        raise InvalidInputError(f"table {name!r}: location {where.uri} is not a Delta table "
                                f"(no readable _delta_log): {str(exc).splitlines()[0][:200]}; "
                                f"nothing was registered") from exc
    meta = dt.metadata()
    unknown = sorted(_features(dt) - SPARK_FEATURES - DELTA_RS_FEATURES)
    if unknown:
        raise InvalidInputError(f"table {name!r}: the Delta table at {where.uri} needs reader "
                                f"feature(s) {', '.join(unknown)}, which neither delta-rs nor "
                                f"Delta Lake's Spark connector here can read; nothing was "
                                f"registered")
    if str(meta.configuration.get(CDF, "false")).lower() != "true":
        raise InvalidInputError(
            f"table {name!r}: the Delta table at {where.uri} has no change data feed, which "
            f"Table Streams read; turn it on first (in Spark: ALTER TABLE "
            f"delta.`{spark_path(where.uri)}` SET TBLPROPERTIES "
            f"({CDF} = true)); nothing was registered")
    keys = key_columns(key)
    columns = {f.name.lower(): f.name for f in pa.schema(dt.schema().to_arrow())}
    missing = [k for k in keys if k.lower() not in columns]
    if missing:
        raise InvalidInputError(f"table {name!r}: key column(s) {', '.join(missing)} are not "
                                f"columns of {where.uri} ({', '.join(columns.values())})")
    body = {"name": name, "location": where.uri, "table_id": meta.id,
            "key": [columns[k.lower()] for k in keys],
            "registered_at": datetime.now(UTC).isoformat()}
    if tables.children(name):
        if if_not_exists:
            return False
        if not replace:
            raise AlreadyExistsError("table", name)
        tables.delete_tree(name)  # the old pointer (or our own table): never the user's files
    if tables.is_local:
        os.makedirs(tables.uri, exist_ok=True)
    tables.create_text(f"{name}/{POINTER}", json.dumps(body, sort_keys=True))
    if pointer(tables, name) != body:  # another process registered the name first
        raise AlreadyExistsError("table", name)
    return True


def refuse_write(name: str, where: str) -> InvalidInputError:
    return InvalidInputError(
        f"table {name!r} is registered from {where}: volume-stream only reads it (its owner "
        f"writes it, e.g. with Spark); nothing was written. DROP TABLE {name} unregisters it "
        f"and leaves its files as they are")


def spark_changes(spark: Any, name: str, uri: str, after: int, up_to: int) -> pa.Table:
    """Delta Spark's change feed of versions (after, up_to], without `_commit_timestamp`."""
    _check_delta(spark, name, uri)
    df = (spark.read.format("delta").option("readChangeFeed", "true")
          .option("startingVersion", after + 1).option("endingVersion", up_to)
          .load(spark_path(uri)))
    return df.drop("_commit_timestamp").toArrow()


def spark_snapshot(spark: Any, name: str, uri: str, version: int | None) -> pa.Table:
    _check_delta(spark, name, uri)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(spark_path(uri)).toArrow()


def _check_delta(spark: Any, name: str, uri: str) -> None:
    if spark is None or "DeltaSparkSessionExtension" not in str(
            spark.conf.get("spark.sql.extensions", "")):
        raise InvalidInputError(f"table {name!r}: the Delta table at {uri} has reader features "
                                f"delta-rs cannot read, and this Spark session has no Delta "
                                f"Lake connector to read them (`make install` fetches its "
                                f"jars; sessions started by volume-stream then have it)")
