"""The volumes of one warehouse: create, drop, list, describe, refresh, watch (DESIGN §2, §3).

`VolumeRegistry` keeps the volumes' specs in the warehouse catalog and the options given to
`create_volume` (secrets included) in this process only, for the volume's listeners and readers.
Every error from the connectors or the directory table is converted here (`errors.converted`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, ClassVar
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from connectors.protocols import ObjectReader
from directory_table import DirectoryTable
from directory_table.layout import Layout
from volume_stream.errors import (
    AlreadyExistsError,
    InvalidInputError,
    converted,
)
from volume_stream.volumes import refresh as listing_diff
from volume_stream.volumes.backends import backend_for, check_options, normalize_location
from volume_stream.volumes.inventory import inventory_lister, newer_tombstones, snapshot_diff
from volume_stream.volumes.notifications import notification_from_dict
from volume_stream.volumes.refresh import (
    Listing,
    Progress,
    accepted_rows,
    counted,
    diff_listing_spark,
    diff_refresh,
    in_commits,
)
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.volumes.watcher import VolumeWatcher, WatchMetrics
from volume_stream.warehouse import STREAM, VOLUME, CatalogState, Warehouse, check_name, entry, now

__all__ = ["RefreshMetrics", "VolumeRegistry"]

log = logging.getLogger("volume_stream.catalog")


@dataclass(frozen=True)
class RefreshMetrics:
    """What one refresh found and committed."""

    listed: int
    inserted: int
    updated: int
    deleted: int
    version: int | None
    invalid_paths: int
    seconds: float
    #: a refresh from an inventory report: the report's creationTimestamp
    inventory_created: datetime | None = None


@dataclass
class _Kept:
    """A volume's directory table between refreshes, and the stored rows the last refresh
    read (a snapshot of one version never changes: the next refresh at the same version, a
    poller's over a quiet volume, needs no read)."""

    table: DirectoryTable
    lock: threading.Lock = field(default_factory=threading.Lock)
    stored: pa.Table | None = None
    stored_at: int | None = None

    #: stored rows kept between refreshes, over all the volumes of a registry
    MAX_ROWS: ClassVar[int] = 500_000

    def keep(self, stored: pa.Table, version: int) -> None:
        small = stored.num_rows <= self.MAX_ROWS
        self.stored, self.stored_at = (stored, version) if small else (None, None)

    def forget(self) -> None:
        self.stored, self.stored_at = None, None


class VolumeRegistry:
    """The volumes of `warehouse`. `spark` returns the session for large listing diffs."""

    def __init__(self, warehouse: Warehouse, spark: Callable[[], Any]):
        self.warehouse = warehouse
        self._spark = spark
        self._runtime_options: dict[str, dict[str, Any]] = {}
        self._runtime_notifications: dict[str, Any] = {}
        self._refresh_tables: dict[tuple[str, str], _Kept] = {}
        self._tables_lock = threading.Lock()

    # ------------------------------------------------------------------ lookups
    def spec(self, name: str, state: CatalogState | None = None) -> VolumeSpec:
        """The stored spec of volume `name` (NotFoundError if there is none)."""
        return VolumeSpec.from_dict(entry(state or self.warehouse.read(), VOLUME, name))

    def table(self, spec: VolumeSpec) -> DirectoryTable:
        """The directory table of the volume `spec` describes."""
        return DirectoryTable(self.warehouse.volume_root(spec.name, spec.id), spec.location,
                              self.warehouse.storage_options)

    def with_options(self, spec: VolumeSpec) -> VolumeSpec:
        """`spec` plus the options (secrets included) this process was given for it."""
        extra = self._runtime_options.get(spec.name)
        if not extra:
            return spec
        return VolumeSpec(**{**spec.__dict__, "options": {**spec.options, **extra}})

    def object_reader(self, spec: VolumeSpec) -> ObjectReader:
        """A (picklable) reader of the volume's files, with this process's options."""
        with converted(f"volume {spec.name!r}"):
            return backend_for(spec).reader(self.with_options(spec))

    # ------------------------------------------------------------------ lifecycle
    def create(self, name: str, location: str | os.PathLike, *, recursive: bool = True,
               notification: Any = None, replace: bool = False, if_not_exists: bool = False,
               **options: Any) -> VolumeSpec:
        """A new volume; `if_not_exists`: one of that name is left as it is and returned."""
        check_name(VOLUME, name)
        if replace and if_not_exists:
            raise InvalidInputError("give replace or if_not_exists, not both")
        if if_not_exists and (VOLUME, name) in self.warehouse.read():
            return self.spec(name)
        try:
            return self._create(name, location, recursive, notification, replace, options)
        except AlreadyExistsError:
            if not if_not_exists:
                raise
            return self.spec(name)  # created by another process meanwhile

    def _create(self, name: str, location: str | os.PathLike, recursive: bool,
                notification: Any, replace: bool, options: dict[str, Any]) -> VolumeSpec:
        location = normalize_location(location)
        days = options.get("data_retention_days", 7)
        if not isinstance(days, int | float) or days < 0:
            raise InvalidInputError(f"data_retention_days must be a number >= 0, not {days!r}")
        merge_on_read = self._deletion_vectors(options.get("deletion_vectors"))
        spec = VolumeSpec(name=name, id=self.warehouse.new_id(), location=location,
                          recursive=bool(recursive),
                          notification=notification.to_dict() if notification else None,
                          options=dict(options), created_at=now())
        self._check_options(spec)  # fail now, not at the first refresh
        table_root = self.warehouse.volume_root(spec.name, spec.id)
        DirectoryTable.create(table_root, location, retention_days=spec.retention_days,
                              storage_options=self.warehouse.storage_options,
                              deletion_vectors=merge_on_read)

        def register(state: CatalogState) -> VolumeSpec | None:
            old = state.get((VOLUME, name))
            if old is not None and not replace:
                raise AlreadyExistsError(VOLUME, name)
            state[(VOLUME, name)] = spec.to_dict()
            return VolumeSpec.from_dict(old) if old else None

        try:
            replaced = self.warehouse.mutate(register)
        except Exception:
            self.warehouse.delete_volume_root(spec.name, spec.id)
            raise
        if replaced is not None:
            self.warehouse.delete_volume_root(replaced.name, replaced.id)
        log.info("created volume %s at %s", name, location)
        self._runtime_options[name] = dict(options)
        self._runtime_notifications[name] = notification
        return spec

    def _deletion_vectors(self, wanted: Any) -> bool:
        """Whether a new volume's directory table is merge-on-read (DESIGN §4.8): by default
        where our commit writer serves the warehouse's store (a local disk or S3)."""
        if wanted is not None and not isinstance(wanted, bool):
            raise InvalidInputError(f"deletion_vectors must be true or false, not {wanted!r}")
        serves = urlparse(self.warehouse.uri).scheme.lower() in ("", "file", "s3", "s3a")
        if wanted and not serves:
            raise InvalidInputError(
                f"deletion_vectors: volume-stream writes deletion vectors to warehouses on a "
                f"local disk or S3 only, not {self.warehouse.uri}")
        return serves if wanted is None else wanted

    def upgrade(self, name: str) -> int | None:
        """Turn deletion vectors on for volume `name`'s directory table (merge-on-read from
        the next batch on); the version of the upgrade, or None when it had them already."""
        spec = self.spec(name)
        self._deletion_vectors(True)
        with converted(f"volume {name!r}"):
            return self.table(spec).enable_deletion_vectors()

    @staticmethod
    def _check_options(spec: VolumeSpec) -> None:
        # Unknown option names are refused; building a lister validates the connector
        # options' values (clients and credentials are lazy: no call, no secret needed).
        check_options(spec)
        for key in ("include", "exclude"):
            value = spec.options.get(key)
            if value is not None and not (isinstance(value, str) or (
                    isinstance(value, list | tuple) and all(isinstance(v, str) for v in value))):
                raise InvalidInputError(f"volume {spec.name!r}: {key} must be a glob or a list "
                                        f"of globs, not {value!r}")
        try:
            backend_for(spec).lister(spec)
        except TypeError as exc:
            raise InvalidInputError(f"volume {spec.name!r}: bad option: {exc}") from exc
        except ValueError as exc:
            raise InvalidInputError(f"volume {spec.name!r}: {exc}") from exc

    def drop(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> bool:
        check_name(VOLUME, name)
        def drop(state: CatalogState) -> VolumeSpec | None:
            if (VOLUME, name) not in state:
                if if_exists:
                    return None
                entry(state, VOLUME, name)
            streams = sorted(n for (k, n), s in state.items()
                             if k == STREAM and s.get("volume") == name)
            if streams and not cascade:
                raise InvalidInputError.advised(
                    f"volume {name!r} has streams {streams}",
                    python="drop them first or pass cascade=True",
                    cli="drop them first or add --cascade",
                    sql=f"drop them first or write DROP VOLUME {name} CASCADE")
            for s in streams:
                del state[(STREAM, s)]
            return VolumeSpec.from_dict(state.pop((VOLUME, name)))

        spec = self.warehouse.mutate(drop)
        if spec is None:
            return False
        self.warehouse.delete_volume_root(spec.name, spec.id)
        return True

    def list(self) -> list[dict[str, Any]]:
        return [self._row(VolumeSpec.from_dict(data))
                for (kind, _), data in sorted(self.warehouse.read().items()) if kind == VOLUME]

    def _row(self, spec: VolumeSpec) -> dict[str, Any]:
        with converted(f"volume {spec.name!r}"):
            table = self.table(spec)
            return {"name": spec.name, "location": spec.location, "recursive": spec.recursive,
                    "notification": (spec.notification or {}).get("type", "LOCAL")
                    if spec.scheme == "file" else (spec.notification or {}).get("type"),
                    "version": table.version(), "files": table.file_count()}

    def describe(self, name: str) -> dict[str, Any]:
        spec = self.spec(name)
        with converted(f"volume {name!r}"):
            table = self.table(spec)
            info = self._row(spec)
            info.update(id=spec.id, options=spec.options, created_at=spec.created_at,
                        table_path=table.path, oldest_version=table.oldest_version(),
                        retention_days=spec.retention_days)
        return info

    # ------------------------------------------------------------------ refresh and watch
    def refresh(self, volume: str, progress: Progress | None = None, *,
                inventory: str | None = None) -> RefreshMetrics:
        spec = self.spec(volume)
        with converted(f"volume {volume!r}"):
            kept = self._refresh_table(spec)
            with kept.lock:  # one refresh of a volume at a time in this process
                return self._refresh(spec, kept, progress, inventory)

    def _refresh_table(self, spec: VolumeSpec) -> _Kept:
        """The volume's directory table kept open for its refreshes (a poller refreshes over
        and over: its Delta log is then brought up to date, not loaded again)."""
        key = (spec.name, spec.id)
        with self._tables_lock:
            kept = self._refresh_tables.pop(key, None)
            if kept is None:
                kept = _Kept(self.table(spec))
            self._refresh_tables[key] = kept  # the most recent last
            while len(self._refresh_tables) > 64:
                del self._refresh_tables[next(iter(self._refresh_tables))]
            return kept

    def _keep(self, kept: _Kept, stored: pa.Table, version: int) -> None:
        """Keep `stored` for the next refresh, forgetting the least recently refreshed
        volumes' rows past `_Kept.MAX_ROWS` in all."""
        with self._tables_lock:
            kept.keep(stored, version)
            total = sum(k.stored.num_rows for k in self._refresh_tables.values()
                        if k.stored is not None)
            for other in self._refresh_tables.values():  # the least recent first
                if total <= _Kept.MAX_ROWS:
                    break
                if other is not kept and other.stored is not None:
                    total -= other.stored.num_rows
                    other.forget()

    def _refresh(self, spec: VolumeSpec, kept: _Kept, progress: Progress | None = None,
                 inventory: str | None = None) -> RefreshMetrics:
        """Refresh by a listing, or with `inventory` by an inventory report (`inventory.py`):
        the same diff, dated at the report's creation, leaving paths with newer events."""
        table = kept.table
        started = datetime.now(UTC)
        report = inventory_lister(self.with_options(spec), inventory) if inventory else None
        # The version is pinned before listing: whatever the table learns while we list is
        # newer than the listing, and apply leaves it alone (ordered by version, not clock).
        dt = table.delta()
        base, layout = dt.version(), Layout.of(dt)
        buckets = layout.buckets if layout.bucketed else 1
        stored_rows = int(pc.sum(pa.table(dt.get_add_actions(flatten=True))["num_records"])
                          .as_py() or 0)
        lister = report or backend_for(spec).lister(self.with_options(spec))
        # a report's moment, never after this refresh began: nothing it writes may outrank an
        # event that follows the refresh (DESIGN §4.4; `parse_manifest` refused one dated
        # more than CLOCK_SKEW ahead)
        listed_at = min(report.manifest.created, started) if report else started
        globs = spec.options.get("include") or spec.options.get("exclude")
        accept = spec.accepts() if globs else None
        columns = ["relative_path", "size", "etag", "last_modified_time", "_sequencer",
                   "_event_time"]

        def read_stored(group: list[int] | None) -> pa.Table:
            return table.snapshot(base, columns=columns, buckets=group)

        group_rows = listing_diff.ROWS_PER_BUCKET_GROUP
        if hasattr(lister, "expected_rows"):  # a big local walk starts its helper at once
            lister.expected_rows = stored_rows
        batches = lister.list()  # a big local walk's helper process starts walking now
        try:
            stored = None  # the rows of a table of one diff group, read now
            if kept.stored_at == base:  # what the last refresh read: this version's rows
                stored = kept.stored
            elif stored_rows <= group_rows:
                stored = read_stored(None)
                self._keep(kept, stored, base)
            with Listing(buckets, spill_rows=group_rows) as listing:
                for batch in counted(batches, progress):
                    listing.add(accepted_rows(batch, accept, spec.recursive))
                listing.finish()
                threshold = spec.options.get("spark_diff_threshold")  # off unless set
                diff = (partial(diff_listing_spark, self._spark())
                        if threshold is not None and listing.rows > int(threshold) else None)
                if report is not None:  # paths with events newer than the report keep them
                    diff = snapshot_diff(listed_at, newer_tombstones(table, listed_at), diff)
                # the listing (every report file checked) is whole before the first commit;
                # the differences commit in chunks of about a bucket group's rows, so memory
                # stays bounded by a group whatever the volume's size
                invalid, counts, version = 0, [0, 0, 0], None
                for events, bad in in_commits(diff_refresh(
                        listing, read_stored, stored_rows, listed_at,
                        store_times=spec.scheme != "file",  # local mtimes are no clock (§4.2)
                        progress=progress, diff=diff, stored=stored), group_rows):
                    invalid += bad
                    if events is None:
                        continue
                    if progress is not None:
                        progress("committing", listing.rows, sum(counts))
                    result = table.apply(events, listed_at_version=base)
                    counts = [counts[0] + result.inserted, counts[1] + result.updated,
                              counts[2] + result.deleted]
                    version = result.version if result.version is not None else version
                listed = listing.rows
                if progress is not None:  # every difference is committed
                    progress("committing", listed, sum(counts))
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        # names the lister skipped as unsafe (backslash, control character, undecodable)
        invalid += int(getattr(lister, "malformed", 0) or 0)
        seconds = (datetime.now(UTC) - started).total_seconds()
        log.info("refresh %s%s: listed %d, +%d ~%d -%d%s in %.2fs", spec.name,
                 f" from the inventory of {report.manifest.created.isoformat()}" if report
                 else "", listed, *counts, f", {invalid} skipped (unsafe or undecodable names)"
                 if invalid else "", seconds)
        return RefreshMetrics(listed=listed, inserted=counts[0], updated=counts[1],
                              deleted=counts[2], version=version,
                              invalid_paths=invalid, seconds=seconds,
                              inventory_created=report.manifest.created if report else None)

    def watcher(self, volume: str) -> VolumeWatcher:
        spec = self.with_options(self.spec(volume))
        notification = (self._runtime_notifications.get(volume)
                        or notification_from_dict(spec.notification))
        with converted(f"volume {volume!r}"):
            listener = backend_for(spec).listener(spec, notification)
        return VolumeWatcher(self.table(spec), listener, spec.accepts(),
                             lambda **kw: self.refresh(volume, **kw))

    def watch(self, volume: str, *, until_idle: bool = False, timeout: float | None = None,
              refresh: bool = True) -> WatchMetrics:
        watcher = self.watcher(volume)
        with converted(f"volume {volume!r}"), watcher.listener:
            return watcher.run(until_idle=until_idle, timeout=timeout, catch_up=refresh)
