"""The status page's SQL tables: each warehouse table with its version, key, change tracking,
the streams reading it and its change log (DESIGN §8.3), from the tables' Delta logs and the
catalog state the page read already."""

from __future__ import annotations

from typing import Any

from volume_stream.warehouse import STREAM

__all__ = ["table_rows"]

_CHANGE_LOG = "change_log"  # volume_stream.shards.meta.CHANGE_LOG (a feature: not imported)


def table_rows(store: Any, state: dict, error: Any) -> list[dict[str, Any]]:
    """One row per table of `store` (`tables.TableStore`): name, version, columns, key,
    change tracking, registered or not, its streams and its change log; a table that cannot
    be read is listed with `error` (`error(exc)`: the text shown)."""
    streams: dict[str, list[str]] = {}
    for (kind, name), spec in sorted(state.items()):
        if kind == STREAM and spec.get("table") is not None:
            streams.setdefault(spec["table"], []).append(name)
    rows = []
    for name in store.names():
        row: dict[str, Any] = {"name": name, "streams": streams.get(name, []),
                               "change_log": _change_log(state, name)}
        try:
            info = store.describe(name)
            row.update(version=info["version"], columns=len(info["columns"]),
                       change_tracking=info["change_tracking"], key=list(store.key(name)),
                       registered=store.registration(name) is not None, path=info["path"])
        except Exception as exc:  # one unreadable table does not hide the others
            row["error"] = error(exc)
        rows.append(row)
    return rows


def _change_log(state: dict, name: str) -> dict[str, Any] | None:
    """The table's current change log: label, open shards, key (None: none enabled)."""
    meta = state.get((_CHANGE_LOG, f"table:{name}"))
    if not meta or not meta.get("streams"):
        return None
    current = meta["streams"][-1]
    shards = current.get("shards", [])
    return {"label": current.get("label"), "enabled": current.get("disabled_version") is None,
            "open_shards": sum(1 for s in shards if s.get("end_version") is None),
            "key": current.get("key")}
