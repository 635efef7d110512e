"""The streams of one warehouse: create, drop, list, describe, read, and move offsets (DESIGN §5).

A stream is an offset (a version of its volume's directory table) plus a mode; its pending
records are the changes in (offset, latest]. Offsets move only by compare-and-swap on the
warehouse catalog (`commit_offset`), so two racing consumers cannot both move one.
"""

from __future__ import annotations

import functools
import threading
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from directory_table import DirectoryTable
from directory_table.kept import VersionsGone
from volume_stream.errors import (
    AlreadyExistsError,
    ConsumeConflictError,
    InvalidInputError,
    NotFoundError,
    StaleStreamError,
    converted,
)
from volume_stream.streams import changes as ch
from volume_stream.streams import tables as tstreams
from volume_stream.streams.reader import VersionReader
from volume_stream.tables import TableStore
from volume_stream.volumes.registry import VolumeRegistry
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.warehouse import STREAM, VOLUME, CatalogState, check_name, entry, now

__all__ = ["CONSUMED_KEPT", "StreamRegistry", "pinned_end"]

#: consumed batches a stream keeps in its catalog entry (`consumed`: the status page shows them)
CONSUMED_KEPT = 20


class StreamRegistry:
    """The streams over the volumes of `volumes`."""

    def __init__(self, volumes: VolumeRegistry):
        self.volumes = volumes
        self.warehouse = volumes.warehouse
        self.tables = TableStore.of_warehouse(self.warehouse)
        self.tables.spark = volumes._spark  # reads registered tables delta-rs cannot
        # one open directory table per volume for reads: it brings its Delta handle up to
        # date only when a newer commit exists (opening one costs a log replay per read)
        self._readers: dict[tuple[str, str, str], DirectoryTable] = {}
        self._readers_lock = threading.Lock()

    def _table(self, volume: VolumeSpec) -> DirectoryTable:
        """The volume's directory table, kept open between reads."""
        key = (volume.name, volume.id, volume.location)
        with self._readers_lock:
            table = self._readers.get(key)
            if table is None:
                table = self._readers[key] = self.volumes.table(volume)
            return table

    def create(self, name: str, on_volume: str | None = None, *, on_table: str | None = None,
               mode: str = "STANDARD", show_initial_rows: bool = False,
               at_timestamp: datetime | str | None = None,
               replace: bool = False, if_not_exists: bool = False) -> dict[str, Any]:
        """A new stream; `if_not_exists`: one of that name is left as it is (its offset too)
        and its stored spec returned."""
        if replace and if_not_exists:
            raise InvalidInputError("give replace or if_not_exists, not both")
        try:
            if if_not_exists and (STREAM, name) in self.warehouse.read():
                raise AlreadyExistsError(STREAM, name)
            return self._create(name, on_volume, on_table, mode, show_initial_rows,
                                at_timestamp, replace)
        except AlreadyExistsError:
            existing = self.warehouse.read().get((STREAM, name))
            if not if_not_exists or existing is None:
                raise
            return dict(existing)

    def _create(self, name: str, on_volume: str | None, on_table: str | None, mode: str,
                show_initial_rows: bool, at_timestamp: datetime | str | None,
                replace: bool) -> dict[str, Any]:
        check_name(STREAM, name)
        tstreams.check_target(on_volume, on_table)
        if on_table is not None:
            return tstreams.create(self.warehouse, self.tables, name, on_table, mode=mode,
                                   show_initial_rows=show_initial_rows,
                                   at_timestamp=at_timestamp, replace=replace)
        mode = str(mode).upper()
        if mode not in ch.MODES:
            raise InvalidInputError(f"invalid mode {mode!r}; valid modes: {', '.join(ch.MODES)}")
        volume = self.volumes.spec(on_volume)
        with converted(f"volume {on_volume!r}"):
            offset = self._start(self.volumes.table(volume), on_volume, at_timestamp)
        spec = {"name": name, "volume": on_volume, "volume_id": volume.id, "mode": mode,
                "show_initial_rows": bool(show_initial_rows),
                "initial_pending": bool(show_initial_rows), "offset": offset, "batch_id": 0,
                "created_at": now(),
                "at_timestamp": str(at_timestamp) if at_timestamp is not None else None}

        def register(state: CatalogState) -> None:
            entry(state, VOLUME, on_volume)
            if (STREAM, name) in state and not replace:
                raise AlreadyExistsError(STREAM, name)
            state[(STREAM, name)] = spec

        self.warehouse.mutate(register)
        return dict(spec)

    @staticmethod
    def _start(table: Any, on_volume: str, at_timestamp: datetime | str | None) -> int:
        if at_timestamp is None:
            return table.version()
        when = _timestamp(at_timestamp)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        offset = table.version_at(when)
        if offset is None:
            raise InvalidInputError(
                f"at_timestamp {when.isoformat()} is before volume {on_volume!r} existed")
        if offset < table.oldest_version():
            raise InvalidInputError(f"at_timestamp {when.isoformat()} is older than the "
                                    f"oldest kept version {table.oldest_version()}")
        return offset

    def drop(self, name: str, *, if_exists: bool = False) -> bool:
        check_name(STREAM, name)
        def drop(state: CatalogState) -> bool:
            if (STREAM, name) not in state:
                if if_exists:
                    return False
                entry(state, STREAM, name)
            del state[(STREAM, name)]
            return True

        return self.warehouse.mutate(drop)

    def list(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in spec.items() if k not in ("volume_id", "table_id", "pinned")}
                for (kind, _), spec in sorted(self.warehouse.read().items()) if kind == STREAM]

    def spec(self, name: str) -> tuple[dict[str, Any], VolumeSpec]:
        """The stream's stored spec and its volume's (NotFoundError if either is gone)."""
        state = self.warehouse.read()
        spec = entry(state, STREAM, name)
        if tstreams.is_table_stream(spec):
            raise InvalidInputError(f"stream {name!r} is on table {spec['table']!r}, not on a "
                                    f"volume (file pipelines read volume streams)")
        volume = state.get((VOLUME, spec["volume"]))
        if volume is None or volume["id"] != spec["volume_id"]:
            raise NotFoundError.orphaned(VOLUME, spec["volume"], name,
                                         [n for k, n in state if k == VOLUME])
        return spec, VolumeSpec.from_dict(volume)

    def latest_version(self, volume: VolumeSpec) -> int:
        """The latest version of the volume's directory table."""
        with converted(f"volume {volume.name!r}"):
            return self._table(volume).version()

    def pending(self, name: str) -> tuple[pa.Table, dict[str, Any], int, int]:
        """(records, spec, a, b): the stream's records in (offset a, latest version b]."""
        stored = entry(self.warehouse.read(), STREAM, name)
        if tstreams.is_table_stream(stored):
            return tstreams.pending(self.tables, stored)
        spec, volume = self.spec(name)
        a, b = spec["offset"], self.latest_version(volume)
        return self.records_between(name, spec, volume, a, b), spec, a, b

    def pin(self, name: str, *, end: int | None = None
            ) -> tuple[pa.Table, dict[str, Any], int, int]:
        """(records, spec, a, b) of the stream's next batch, its range recorded with its batch id.

        Like Spark's offset log: before a consumer runs, (a, b] is written to the catalog beside
        the batch id, so a retry of that batch id after a failure sees exactly (a, b] even if
        files (or rows, for a stream on a table) arrived meanwhile: they go to the next batch.
        An unchanged offset with nothing pending is not recorded. `end` proposes the end to
        record when none is yet (a pipeline whose target already holds part of this batch,
        written before its range was recorded); a range already recorded wins.
        """
        stored = entry(self.warehouse.read(), STREAM, name)
        if tstreams.is_table_stream(stored):
            spec, ident = stored, "table_id"
            latest = functools.partial(tstreams.latest_version, self.tables, spec)
            between = functools.partial(tstreams.records, self.tables, spec)
        else:
            spec, volume = self.spec(name)
            ident = "volume_id"
            latest = functools.partial(self.latest_version, volume)
            between = functools.partial(self.records_between, name, spec, volume)
        a, batch_id = spec["offset"], spec["batch_id"]
        pinned = pinned_end(spec)
        if pinned is None:
            b = latest() if end is None else end
            if a == b and not spec["initial_pending"]:
                return between(a, b), spec, a, b

            def record(state: CatalogState) -> int:
                current = entry(state, STREAM, name)
                if current.get(ident) != spec[ident] or current["offset"] != a \
                        or current["batch_id"] != batch_id:
                    raise ConsumeConflictError(name, a, current["offset"])
                already = pinned_end(current)
                if already is not None:  # another consumer pinned this batch first
                    return already
                current["pinned"] = {"batch_id": batch_id, "start": a, "end": b}
                return b

            pinned = self.warehouse.mutate(record)
        return between(a, pinned), spec, a, pinned

    def records_between(self, name: str, spec: dict[str, Any], volume: VolumeSpec, a: int,
                        b: int) -> pa.Table:
        """The change records stream `name` (with `spec`, on `volume`) shows for exactly (a, b].

        Raises:
            StaleStreamError: `a` is older than the oldest kept version, or a VACUUM removed
                files of the range (its log entries kept: `directory_table.kept`).
        """
        with converted(f"stream {name!r}"):
            reader = VersionReader(volume, self._table(volume))
            if not reader.is_kept(a):
                raise StaleStreamError(name, a, reader.oldest())
            try:
                return reader.records(spec["mode"], a, b,
                                      initial_pending=spec["initial_pending"])
            except VersionsGone as exc:
                raise StaleStreamError(name, a, exc.oldest) from exc

    def commit_offset(self, name: str, volume_id: str, start: int, end: int,
                      batch_id: int, rows: int | None = None) -> None:
        """Move the stream's offset from `start` to `end` if nobody else has (compare-and-swap),
        and keep the batch among its last `CONSUMED_KEPT` consumed ones (`rows`: its records,
        when the consumer counted them)."""

        def advance(state: CatalogState) -> None:
            spec = entry(state, STREAM, name)
            if spec.get("volume_id", spec.get("table_id")) != volume_id \
                    or spec["offset"] != start \
                    or spec["batch_id"] != batch_id:
                raise ConsumeConflictError(name, start, spec["offset"])
            at = now()
            spec.update(offset=end, batch_id=batch_id + 1, initial_pending=False,
                        consumed_at=at)
            spec["consumed"] = [*spec.get("consumed", []), {
                "batch_id": batch_id, "start": start, "end": end, "rows": rows,
                "at": at}][-CONSUMED_KEPT:]
            spec.pop("pinned", None)

        self.warehouse.mutate(advance)

    def describe(self, name: str) -> dict[str, Any]:
        """The stream's spec, latest and oldest versions, pending changes and whether it is
        stale: its offset older than the oldest kept version, or its volume or table dropped
        or replaced (`stale_reason` says which; nothing can be read from it again)."""
        stored = entry(self.warehouse.read(), STREAM, name)
        try:
            if tstreams.is_table_stream(stored):
                return {**tstreams.describe(self.tables, stored),
                        "pinned_end": pinned_end(stored)}
            spec, volume = self.spec(name)
        except NotFoundError as exc:  # the stream's source is gone: it is stale for good
            hidden = ("volume_id", "table_id", "pinned")
            return {**{k: v for k, v in stored.items() if k not in hidden},
                    "pinned_end": pinned_end(stored), "latest_version": None,
                    "oldest_version": None, "stale": True, "stale_reason": str(exc),
                    "pending_changes": None}
        with converted(f"stream {name!r}"):
            table = self._table(volume)
            info = {k: v for k, v in spec.items()
                    if k not in ("volume_id", "pinned", "consumed")}
            info["pinned_end"] = pinned_end(spec)
            info["latest_version"] = table.version()
            info["oldest_version"] = table.oldest_version()
        info["stale"] = spec["offset"] < info["oldest_version"]
        info["stale_reason"], info["pending_changes"] = None, None
        if not info["stale"]:
            try:
                info["pending_changes"] = self.pending(name)[0].num_rows
            except StaleStreamError as exc:  # a VACUUM removed files the log still lists
                info["stale"], info["oldest_version"] = True, exc.oldest
        if info["stale"]:
            info["stale_reason"] = str(StaleStreamError(name, spec["offset"],
                                                        info["oldest_version"]))
        return info


def pinned_end(spec: dict[str, Any]) -> int | None:
    """The end version recorded for the stream's current batch (its stored `spec`), if a
    consumer pinned it."""
    pinned = spec.get("pinned")
    if pinned and pinned.get("batch_id") == spec["batch_id"] \
            and pinned.get("start") == spec["offset"]:
        return int(pinned["end"])
    return None


def _timestamp(value: Any) -> datetime:
    """`at_timestamp` as a datetime: a datetime or an ISO 8601 string."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.strip())
        except ValueError:
            pass
    raise InvalidInputError(f"at_timestamp {value!r} is not a datetime or an ISO 8601 time "
                            f"such as '2026-01-31T12:00:00+00:00'")
