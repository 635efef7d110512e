"""Table Streams (the seed's `CREATE TABLE STREAM s ON TABLE t`): a stream spec over a warehouse
table and the change records it shows for a pinned range. The catalog stores the spec and moves
its offset (compare-and-swap, as for volume streams); this module only computes.

A table stream needs change tracking (`ALTER TABLE t SET PROPERTIES ('change_tracking' =
'true')`, the Delta change data feed) and remembers the table's Delta id, so a dropped and
recreated table is reported instead of read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from directory_table.kept import VersionsGone
from volume_stream.errors import InvalidInputError, NotFoundError, StaleStreamError
from volume_stream.tables import changes as tch
from volume_stream.tables.store import ROW_ID, ROW_VERSION, TableStore

__all__ = ["MODES", "new_spec", "records_between", "check_table"]

MODES = ("STANDARD", "APPEND_ONLY")


def new_spec(store: TableStore, name: str, table: str, *, mode: str = "STANDARD",
             show_initial_rows: bool = False, at_timestamp: datetime | str | None = None
             ) -> dict[str, Any]:
    """The catalog entry of a new stream on `table` (offset = latest version, or the last
    version committed at or before `at_timestamp`)."""
    mode = str(mode).upper()
    if mode not in MODES:
        raise InvalidInputError(f"invalid mode {mode!r}; valid modes: {', '.join(MODES)}")
    if not store.change_tracking(table):
        raise InvalidInputError(
            f"table {table!r} does not have change tracking on; run ALTER TABLE {table} SET "
            f"PROPERTIES ('change_tracking' = 'true') before creating stream {name!r}")
    if mode == "STANDARD" and not store.has_row_ids(table) and not store.key(table):
        raise InvalidInputError(
            f"table {table!r} was not created by volume-stream (no row ids) and has no key, so "
            f"a STANDARD stream cannot pair its old and new rows; register it with a key "
            f"(register_table(..., key='id'), or TBLPROPERTIES ('key' = 'id')) or use "
            f"TABLE_STREAM_MODE = 'APPEND_ONLY'")
    if at_timestamp is not None:
        when = datetime.fromisoformat(at_timestamp) if isinstance(at_timestamp, str) \
            else at_timestamp
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
        offset = store.version_at(table, when)
        if offset is None:
            raise InvalidInputError(f"at_timestamp {when.isoformat()} is before table "
                                    f"{table!r} existed")
        if offset < store.oldest_version(table):
            raise InvalidInputError(f"at_timestamp {when.isoformat()} is older than the oldest "
                                    f"kept version {store.oldest_version(table)}")
    else:
        offset = store.version(table)
    key = list(store.key(table)) if not store.has_row_ids(table) else []
    return {"name": name, "table": table, "table_id": store.table_id(table), "mode": mode,
            **({"key": key} if key else {}),
            "show_initial_rows": bool(show_initial_rows),
            "initial_pending": bool(show_initial_rows), "offset": offset, "batch_id": 0,
            "created_at": datetime.now(UTC).isoformat(),
            "at_timestamp": str(at_timestamp) if at_timestamp is not None else None}


def check_table(store: TableStore, spec: dict[str, Any]) -> None:
    """Fail if the stream's table is gone or was replaced since the stream was created."""
    table = spec["table"]
    if not store.exists(table) or store.table_id(table) != spec["table_id"]:
        raise NotFoundError.orphaned("table", table, spec["name"], store.names())


def records_between(store: TableStore, spec: dict[str, Any], a: int, b: int) -> pa.Table:
    """The change records stream `spec` shows for exactly (a, b].

    Raises:
        StaleStreamError: `a` is older than the oldest kept version, or a VACUUM removed files
            of the range (`directory_table.kept`).
    """
    try:
        return _records_between(store, spec, a, b)
    except VersionsGone as exc:
        raise StaleStreamError(spec["name"], a, exc.oldest) from exc


def _records_between(store: TableStore, spec: dict[str, Any], a: int, b: int) -> pa.Table:
    table = spec["table"]
    oldest = store.oldest_version(table)
    if a < oldest:
        raise StaleStreamError(spec["name"], a, oldest)
    columns = store.schema(table)
    times = store.timestamps(table)
    if spec["initial_pending"]:
        at = b if spec["mode"] == "STANDARD" else a
        snapshot = store.snapshot(table, at, hidden=True)
        if ROW_VERSION not in snapshot.column_names:  # a registered table: dated by the snapshot
            snapshot = snapshot.append_column(ROW_VERSION, pa.array([at] * snapshot.num_rows,
                                                                    pa.int64()))
        if spec["mode"] == "STANDARD":
            return tch.initial(snapshot, columns, times)
        return pa.concat_tables([tch.initial(snapshot, columns, times),
                                 tch.append_only(store.changes(table, a, b), columns, times)])
    cdf = store.changes(table, a, b)
    if spec["mode"] == "STANDARD" and ROW_ID not in cdf.column_names and spec.get("key"):
        cdf = tch.keyed(cdf, tuple(spec["key"]))
    if spec["mode"] == "STANDARD" and ROW_ID in cdf.column_names:
        return tch.standard(cdf, columns, times)
    return tch.append_only(cdf, columns, times)
