"""A volume's change log metadata in the warehouse catalog (kind "change_log", named after the
volume), changed only by compare-and-swap (`Warehouse.mutate`), like stream offsets.

    {"volume": "landing", "volume_id": "…", "buckets": 128,
     "streams": [{"label": "2026-11-23T16:20:01.123", "created_at": "…", "view_type": "…",
                  "start_version": 0, "disabled_version": null, "disabled_at": null,
                  "order": "bucket",
                  "shards": [{"id": "shardId-…", "lo": 0, "hi": 128, "parent": null,
                              "sibling": null, "start_version": 0, "end_version": null,
                              "order": "bucket"}]}]}

A shard holds the keys whose directory-table bucket is in [lo, hi) for the versions
(start_version, end_version]. Its records of one version are ordered by key, or, with "order":
"bucket" (a volume's streams made since it existed, and their shards' children), by bucket and
then key: the order the change data feed's rows come in (`shards.order`). A stream keeps the
order it was made with, so the sequence numbers it gave out stay what they were. A reshard
closes every open shard at the latest version and opens children over equal bucket ranges;
each child names the shard holding its first bucket as parent and, when it also covers part
of a second one (a merge), that one as parent sibling, as Tablestore does. A child may not
cover more than two parents (reshard in steps).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from volume_stream.errors import InvalidInputError, NotFoundError
from volume_stream.shards.model import BY_BUCKET, check_view_type, shard_id
from volume_stream.warehouse import VOLUME, CatalogState, Warehouse, entry, now

__all__ = ["CHANGE_LOG", "TABLE_PREFIX", "disable", "enable", "ensure", "reshard"]

CHANGE_LOG = "change_log"
#: the change log of SQL table T is kept as "table:T" (a volume's under its bare name); its
#: `volume_id` is then the table's Delta id, given by the caller (tables are not catalog entries)
TABLE_PREFIX = "table:"


def _label(taken: set[str], when: datetime | None = None) -> str:
    """The stream's creation time, `2015-05-11T21:21:33.291` style, unique in this log."""
    when = when or datetime.now(UTC)
    while True:
        label = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}"
        if label not in taken:
            return label
        when += timedelta(milliseconds=1)


def _ranges(buckets: int, n: int) -> list[tuple[int, int]]:
    return [(i * buckets // n, (i + 1) * buckets // n) for i in range(n)]


def _check_count(n: Any, buckets: int) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= buckets:
        raise InvalidInputError(
            f"shard count must be an integer from 1 to the directory table's bucket count "
            f"({buckets}), not {n!r}")
    return n


def _new_stream(volume: str, volume_id: str, buckets: int, n: int, view_type: str,
                start_version: int, taken: set[str], when: datetime | None = None
                ) -> dict[str, Any]:
    label = _label(taken, when)
    # a volume's new stream orders a version's records by (bucket, path): `shards.order`
    order = {} if volume.startswith(TABLE_PREFIX) else {"order": BY_BUCKET}
    shards = [{"id": shard_id(volume_id, label, lo, hi, start_version, i), "lo": lo, "hi": hi,
               "parent": None, "sibling": None, "start_version": start_version,
               "end_version": None, **order} for i, (lo, hi) in enumerate(_ranges(buckets, n))]
    return {"label": label, "created_at": now(), "view_type": view_type,
            "start_version": start_version, "disabled_version": None, "disabled_at": None,
            "shards": shards, **order}


def _order(stream: dict[str, Any]) -> dict[str, Any]:
    """The order of a stream's records that its new shards keep (none: by key)."""
    return {"order": stream["order"]} if "order" in stream else {}


def _current(state: CatalogState, volume: str, volume_id: str | None) -> dict[str, Any] | None:
    meta = state.get((CHANGE_LOG, volume))
    if meta is None or meta.get("volume_id") != volume_id:
        return None  # none yet, or left over from a dropped volume of the same name
    return meta


def _volume_id(state: CatalogState, volume: str, given: str | None = None) -> str | None:
    """The id of the change log's owner: `given` (a table's), the stored one of a table's
    log, or the volume's catalog id."""
    if given is not None:
        return given
    if volume.startswith(TABLE_PREFIX):
        meta = state.get((CHANGE_LOG, volume))
        return meta["volume_id"] if meta else None
    return entry(state, VOLUME, volume)["id"]


def ensure(warehouse: Warehouse, volume: str, buckets: int, *, shards: int = 1,
           view_type: str = "NEW_AND_OLD_IMAGES", start_version: int = 0,
           created: datetime | None = None, owner_id: str | None = None,
           key: str | list[str] | None = None) -> dict[str, Any]:
    """The volume's change log metadata, created (enabled, `shards` shards from
    `start_version`) if the volume has none."""
    view_type = check_view_type(view_type)
    _check_count(shards, buckets)
    state = warehouse.read()
    meta = _current(state, volume, _volume_id(state, volume, owner_id))
    if meta is not None:
        return meta

    def create(state: CatalogState) -> dict[str, Any]:
        vid = _volume_id(state, volume, owner_id)
        meta = _current(state, volume, vid)
        if meta is None:
            meta = {"volume": volume, "volume_id": vid, "buckets": buckets,
                    "streams": [_new_stream(volume, vid, buckets, shards, view_type,
                                            start_version, set(), created)]}
            if key is not None:
                meta["key"] = key
            state[(CHANGE_LOG, volume)] = meta
        return meta

    return warehouse.mutate(create)


def _enabled(meta: dict[str, Any], volume: str) -> dict[str, Any]:
    stream = meta["streams"][-1]
    if stream["disabled_version"] is not None:
        raise InvalidInputError(f"the change log of volume {volume!r} is disabled; enable it "
                                f"with enable_change_log({volume!r})")
    return stream


def _locked(state: CatalogState, volume: str) -> dict[str, Any]:
    meta = _current(state, volume, _volume_id(state, volume))
    if meta is None:
        raise NotFoundError(CHANGE_LOG, volume, [n for k, n in state if k == CHANGE_LOG])
    return meta


def _close(stream: dict[str, Any], meta: dict[str, Any], version: int, volume: str,
           plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Apply a closing intent at `version`: close the open shards there and open the planned
    children (a reshard) or mark the stream disabled."""
    open_shards = sorted((s for s in stream["shards"] if s["end_version"] is None),
                         key=lambda s: s["lo"])
    if "split" in plan:  # only these shards, each into two halves
        open_shards = [s for s in open_shards
                       if s["id"] in plan["split"] and s["hi"] - s["lo"] >= 2]
    start = max([version, stream["start_version"]] + [s["start_version"] for s in open_shards])
    children = []
    if "split" in plan:
        for s in open_shards:
            mid = (s["lo"] + s["hi"]) // 2
            for lo, hi in ((s["lo"], mid), (mid, s["hi"])):
                children.append({
                    "id": shard_id(meta["volume_id"], stream["label"], lo, hi, start,
                                   len(stream["shards"]) + len(children)),
                    "lo": lo, "hi": hi, "parent": s["id"], "sibling": None,
                    "start_version": start, "end_version": None, **_order(stream)})
    if "shards" in plan:
        buckets = meta["buckets"]
        for i, (lo, hi) in enumerate(_ranges(buckets, plan["shards"])):
            parents = [s for s in open_shards if s["lo"] < hi and lo < s["hi"]]
            children.append({
                "id": shard_id(meta["volume_id"], stream["label"], lo, hi, start,
                               len(stream["shards"]) + i),
                "lo": lo, "hi": hi, "parent": parents[0]["id"],
                "sibling": parents[1]["id"] if len(parents) == 2 else None,
                "start_version": start, "end_version": None, **_order(stream)})
    for s in open_shards:
        s["end_version"] = start
    stream["shards"].extend(children)
    if plan.get("disable"):
        stream["disabled_version"], stream["disabled_at"] = start, now()
    stream.pop("closing", None)
    return children


def finish(warehouse: Warehouse, volume: str, version: Callable[[], int]
           ) -> list[dict[str, Any]]:
    """Complete a pending closing intent, if any, at `version()` read now (after the intent
    was committed). Anyone may call it: a reader that finds a shard closing does."""

    def change(state: CatalogState) -> list[dict[str, Any]]:
        meta = _locked(state, volume)
        stream = meta["streams"][-1]
        plan = stream.get("closing")
        if plan is None:
            return []
        return _close(stream, meta, version(), volume, plan)

    return warehouse.mutate(change)


def _intend(warehouse: Warehouse, volume: str, plan: dict[str, Any],
            version: Callable[[], int]) -> list[dict[str, Any]]:
    """Two steps, so a reader never returns from a shard a record its children also hold:
    (1) commit the intent (`closing`); (2) read the latest version V and close the shards at V.
    A reader reads the version first and the catalog second: if it still saw the shard open,
    the intent came later, so V is at least the version it read up to."""
    finish(warehouse, volume, version)  # one left by a process that died between the steps

    def change(state: CatalogState) -> None:
        meta = _locked(state, volume)
        stream = _enabled(meta, volume)
        if "shards" in plan:
            n = _check_count(plan["shards"], meta["buckets"])
            open_shards = [s for s in stream["shards"] if s["end_version"] is None]
            for lo, hi in _ranges(meta["buckets"], n):
                parents = [s for s in open_shards if s["lo"] < hi and lo < s["hi"]]
                if len(parents) > 2:
                    raise InvalidInputError(
                        f"volume {volume!r}: resharding {len(open_shards)} shards into {n} "
                        f"would give a shard {len(parents)} parents (at most 2: a split or a "
                        f"merge of two); reshard in steps")
        stream["closing"] = plan

    warehouse.mutate(change)
    return finish(warehouse, volume, version)


def reshard(warehouse: Warehouse, volume: str, n: int, version: Callable[[], int]
            ) -> list[dict[str, Any]]:
    """Close every open shard at the latest version and open `n` children (returns them)."""
    return _intend(warehouse, volume, {"shards": n}, version)


def split(warehouse: Warehouse, volume: str, shard_ids: list[str],
          version: Callable[[], int]) -> list[dict[str, Any]]:
    """Split each of these open shards into two children (halves of its buckets)."""
    return _intend(warehouse, volume, {"split": sorted(shard_ids)}, version)


def set_split_threshold(warehouse: Warehouse, volume: str, records_per_s: float | None,
                        window_s: float) -> None:
    """Store the auto-split settings of the volume's change log (None: never split)."""
    if records_per_s is not None and not records_per_s > 0:
        raise InvalidInputError(f"split threshold must be > 0 records/s, not {records_per_s!r}")
    if not window_s > 0:
        raise InvalidInputError(f"split window must be > 0 s, not {window_s!r}")

    def change(state: CatalogState) -> None:
        meta = _locked(state, volume)
        meta["auto_split"] = (None if records_per_s is None
                              else {"records_per_s": records_per_s, "window_s": window_s})

    warehouse.mutate(change)


def disable(warehouse: Warehouse, volume: str, version: Callable[[], int]) -> None:
    """Close every open shard at the latest version; the stream stays readable for the
    retention."""
    _intend(warehouse, volume, {"disable": True}, version)


def enable(warehouse: Warehouse, volume: str, buckets: int, version: int, *,
           view_type: str = "NEW_AND_OLD_IMAGES", shards: int = 1,
           owner_id: str | None = None, key: str | list[str] | None = None) -> dict[str, Any]:
    """A new stream (new label) from `version` on; InvalidInputError if one is enabled."""
    view_type = check_view_type(view_type)

    def change(state: CatalogState) -> dict[str, Any]:
        vid = _volume_id(state, volume, owner_id)
        meta = _current(state, volume, vid)
        if meta is None:
            meta = {"volume": volume, "volume_id": vid, "buckets": buckets, "streams": []}
            if key is not None:
                meta["key"] = key
            state[(CHANGE_LOG, volume)] = meta
        elif meta["streams"] and meta["streams"][-1]["disabled_version"] is None:
            raise InvalidInputError(f"the change log of volume {volume!r} is already enabled "
                                    f"(stream {meta['streams'][-1]['label']})")
        _check_count(shards, meta["buckets"])
        stream = _new_stream(volume, vid, meta["buckets"], shards, view_type, version,
                             {s["label"] for s in meta["streams"]})
        if key is not None:
            stream["key"] = key  # a table's stream may have its own key column
        meta["streams"].append(stream)
        return stream

    return warehouse.mutate(change)
