"""The catalog's side of Table Streams: a stream on a warehouse table is stored in the catalog
beside volume streams (kind "stream", with `table`/`table_id` where a volume stream has
`volume`/`volume_id`) and its offset moves by the same compare-and-swap; the records come from
`volume_stream.tables`. Kept out of `catalog.py` so that module stays a thin front door.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa

from volume_stream.errors import AlreadyExistsError, InvalidInputError, NotFoundError
from volume_stream.tables import TableStore, check_table, new_spec, records_between

__all__ = ["check_target", "create", "describe", "not_found", "owner_id", "pending"]

STREAM = "stream"


def owner_id(spec: dict[str, Any]) -> str:
    """The id of what a stream reads (its volume's or its table's)."""
    return spec.get("volume_id") or spec["table_id"]


def create(catalog, name: str, table: str, *, mode: str, show_initial_rows: bool,
           at_timestamp: datetime | str | None, replace: bool) -> dict[str, Any]:
    store: TableStore = catalog.tables
    spec = new_spec(store, name, table, mode=mode, show_initial_rows=show_initial_rows,
                    at_timestamp=at_timestamp)

    def register(state: dict) -> None:
        if (STREAM, name) in state and not replace:
            raise AlreadyExistsError(STREAM, name)
        state[(STREAM, name)] = spec

    catalog.warehouse.mutate(register)
    return dict(spec)


def pending(store: TableStore, spec: dict[str, Any]) -> tuple[pa.Table, dict[str, Any], int, int]:
    """(records, spec, a, b): the stream's records for (offset, latest version]."""
    check_table(store, spec)
    a, b = spec["offset"], store.version(spec["table"])
    return records_between(store, spec, a, b), spec, a, b


def describe(store: TableStore, spec: dict[str, Any]) -> dict[str, Any]:
    check_table(store, spec)
    table = spec["table"]
    info = {k: v for k, v in spec.items() if k != "table_id"}
    info["latest_version"] = store.version(table)
    info["oldest_version"] = store.oldest_version(table)
    info["stale"] = spec["offset"] < info["oldest_version"]
    info["pending_changes"] = None if info["stale"] else pending(store, spec)[0].num_rows
    return info


def check_target(on_volume: str | None, on_table: str | None) -> None:
    if (on_volume is None) == (on_table is None):
        raise InvalidInputError("create_stream needs exactly one of on_volume= or on_table=")


def not_found(state: dict, name: str) -> NotFoundError:
    return NotFoundError(STREAM, name, [n for k, n in state if k == STREAM])
