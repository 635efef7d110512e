"""The one reader of a volume's change records between two versions (DESIGN §5).

`records(table, mode, a, b)` is what a stream shows for (a, b]; `VersionReader` adds the
version bookkeeping the stream registry and the Spark data source share: the latest and oldest
kept versions, the stale check, and admitting versions under a file or row limit. Used by
`StreamRegistry` (catalog, SQL, pipelines) and by `volume_stream.datasource` (also on the
executors, through `records`).
"""

from __future__ import annotations

import os

import pyarrow as pa

from directory_table import DirectoryTable
from volume_stream.errors import NotFoundError, WarehouseError
from volume_stream.streams import changes as ch
from volume_stream.volumes.spec import VolumeSpec
from volume_stream.warehouse import MARKER, VOLUME, Warehouse
from volume_stream.warehouse.location import Location, storage_error

__all__ = ["VersionReader", "records"]


def records(table: DirectoryTable, mode: str, a: int, b: int, *,
            initial_pending: bool = False) -> pa.Table:
    """The change records of `table` for exactly (a, b] in `mode`; with `initial_pending`, the
    files present at the stream's creation (`a`) come first as INSERTs (STANDARD: the files
    present at `b`, which already include them)."""
    if initial_pending:
        if mode == "STANDARD":
            return ch.initial_rows(table.snapshot(b))
        return pa.concat_tables([ch.initial_rows(table.snapshot(a)),
                                 ch.append_only_changes(table.changes(a, b))])
    if mode == "STANDARD":
        return ch.standard_changes(table.changes(a, b))
    return ch.append_only_changes(table.changes(a, b))


class VersionReader:
    """The versions and change records of one volume's directory table."""

    def __init__(self, spec: VolumeSpec, table: DirectoryTable):
        self.spec, self.table = spec, table

    @classmethod
    def open(cls, warehouse: str | os.PathLike, volume: str,
             storage_options: dict[str, str] | None = None) -> VersionReader:
        """The reader of `volume` in an existing warehouse (a folder or a URI; never creates
        one).

        Raises:
            WarehouseError: `warehouse` is not a volume-stream warehouse.
            NotFoundError: the warehouse has no such volume.
        """
        where = Location.parse(warehouse, storage_options)
        try:
            marked = where.exists(MARKER)
        except OSError as exc:
            raise storage_error(where.uri, exc, "open it") from exc
        if not marked:
            raise WarehouseError(f"{os.fspath(warehouse)!r} is not a volume-stream warehouse "
                                 f"(no {MARKER})")
        store = Warehouse(warehouse, storage_options)
        state = store.read()
        data = state.get((VOLUME, volume))
        if data is None:
            raise NotFoundError(VOLUME, volume, [n for k, n in state if k == VOLUME])
        spec = VolumeSpec.from_dict(data)
        return cls(spec, DirectoryTable(store.volume_root(spec.name, spec.id), spec.location,
                                        store.storage_options))

    def latest(self) -> int:
        return self.table.version()

    def oldest(self) -> int:
        """The oldest version retention kept: ranges must start at or after it."""
        return self.table.oldest_version()

    def is_kept(self, version: int) -> bool:
        """Whether a range starting at `version` can still be read (not stale)."""
        return version >= self.oldest()

    def records(self, mode: str, a: int, b: int, *, initial_pending: bool = False) -> pa.Table:
        return records(self.table, mode, a, b, initial_pending=initial_pending)

    def admit(self, start: int, latest: int, cap: int, *, distinct_files: bool) -> int:
        """The last version after `start` to read so that at most `cap` files (distinct per
        version) or change rows are read: at least one version, whole versions only."""
        # every version changes at least one file, so at most `cap` versions can fit
        upper = min(latest, start + max(cap, 1))
        cdf = self.table.changes(start, upper).select(["relative_path", "_commit_version"])
        if distinct_files:
            cdf = cdf.group_by(["_commit_version", "relative_path"]).aggregate([])
        counts = cdf.group_by("_commit_version").aggregate([("relative_path", "count")])
        per_version = dict(zip(counts["_commit_version"].to_pylist(),
                               counts["relative_path_count"].to_pylist(), strict=True))
        end, total = start, 0
        for version in range(start + 1, upper + 1):
            total += per_version.get(version, 0)
            if total > cap and end > start:
                break
            end = version
        return end
