"""Table Streams in the stream registry: a stream on a warehouse table is stored in the catalog
beside volume streams (kind "stream", with `table`/`table_id` where a volume stream has
`volume`/`volume_id`) and its offset moves by the same compare-and-swap; its records come from
`volume_stream.tables` (STANDARD / APPEND_ONLY keyed by the hidden row id).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from volume_stream.errors import AlreadyExistsError, InvalidInputError, StaleStreamError
from volume_stream.tables import TableStore, check_table, new_spec, records_between
from volume_stream.warehouse import STREAM, CatalogState, Warehouse

__all__ = ["check_target", "create", "describe", "is_table_stream", "latest_version", "pending",
           "records"]


def is_table_stream(spec: dict[str, Any]) -> bool:
    return "table" in spec


def check_target(on_volume: str | None, on_table: str | None) -> None:
    if (on_volume is None) == (on_table is None):
        raise InvalidInputError("create_stream needs exactly one of on_volume= or on_table=")


def create(warehouse: Warehouse, store: TableStore, name: str, table: str, *, mode: str,
           show_initial_rows: bool, at_timestamp: datetime | str | None,
           replace: bool) -> dict[str, Any]:
    spec = new_spec(store, name, table, mode=mode, show_initial_rows=show_initial_rows,
                    at_timestamp=at_timestamp)

    def register(state: CatalogState) -> None:
        if (STREAM, name) in state and not replace:
            raise AlreadyExistsError(STREAM, name)
        state[(STREAM, name)] = spec

    warehouse.mutate(register)
    return dict(spec)


def pending(store: TableStore, spec: dict[str, Any]) -> tuple[pa.Table, dict[str, Any], int, int]:
    """(records, spec, a, b): the stream's records for (offset, latest version]."""
    check_table(store, spec)
    a, b = spec["offset"], store.version(spec["table"])
    return records_between(store, spec, a, b), spec, a, b


def latest_version(store: TableStore, spec: dict[str, Any]) -> int:
    """The latest version of the stream's table (NotFoundError if it was dropped or replaced)."""
    check_table(store, spec)
    return store.version(spec["table"])


def records(store: TableStore, spec: dict[str, Any], a: int, b: int) -> pa.Table:
    """The stream's records for exactly (a, b] (a retry of a pinned batch sees the same)."""
    check_table(store, spec)
    return records_between(store, spec, a, b)


def describe(store: TableStore, spec: dict[str, Any]) -> dict[str, Any]:
    check_table(store, spec)
    table = spec["table"]
    info = {k: v for k, v in spec.items() if k not in ("table_id", "pinned", "consumed")}
    info["latest_version"] = store.version(table)
    info["oldest_version"] = store.oldest_version(table)
    info["stale"] = spec["offset"] < info["oldest_version"]
    info["stale_reason"], info["pending_changes"] = None, None
    if not info["stale"]:
        try:
            info["pending_changes"] = pending(store, spec)[0].num_rows
        except StaleStreamError as exc:  # a VACUUM removed files the log still lists
            info["stale"], info["oldest_version"] = True, exc.oldest
    if info["stale"]:
        info["stale_reason"] = str(StaleStreamError(spec["name"], spec["offset"],
                                                    info["oldest_version"]))
    return info
