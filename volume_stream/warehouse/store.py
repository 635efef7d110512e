"""The warehouse: its folder layout, its marker file, and the catalog of volumes and streams.

The catalog is a small Delta table (`_catalog/`) with one row per object holding its spec as
JSON. Every change is a compare-and-swap: read the catalog at version v, change it, commit at
exactly v+1 (no silent retry at a later version); if another process committed first, re-read
and re-check. Stream offsets live here too, so "move the offset from a to b" is atomic and two
racing consumers cannot both move it (DESIGN §3, §5).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from volume_stream.errors import (
    InvalidInputError,
    NotFoundError,
    VolumeStreamError,
    WarehouseError,
)

__all__ = ["STREAM", "VOLUME", "CatalogState", "Warehouse", "check_name", "entry", "now"]

MARKER = "volume-stream.json"
FORMAT = "volume-stream-warehouse"
FORMAT_VERSION = 1
_SCHEMA = pa.schema([("kind", pa.string()), ("name", pa.string()), ("spec", pa.string())])
_MAX_ATTEMPTS = 50

#: {("volume"|"stream", name): spec dict}
CatalogState = dict[tuple[str, str], dict[str, Any]]

#: the kinds of catalog entries volumes and streams are kept under
VOLUME, STREAM = "volume", "stream"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """`name` if it is a valid object name, else InvalidInputError saying what is allowed."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(
            f"invalid {kind} name {name!r}: use letters, digits and '_', starting with a letter "
            f"or '_' (at most 128 characters)")
    return name


def entry(state: CatalogState, kind: str, name: str) -> dict[str, Any]:
    """The spec of (kind, name), or NotFoundError listing the existing objects of that kind."""
    spec = state.get((kind, name))
    if spec is None:
        raise NotFoundError(kind, name, [n for k, n in state if k == kind])
    return spec


def now() -> str:
    """The current UTC time, ISO formatted, as the catalog stores timestamps."""
    return datetime.now(UTC).isoformat()


class Warehouse:
    """A warehouse folder: opened if it is one, initialised if it is new or empty (unless
    `create=False`: then WarehouseError), refused otherwise (a foreign or damaged folder is
    never overwritten)."""

    def __init__(self, root: str | os.PathLike, *, create: bool = True):
        self.root = Path(root).expanduser().resolve()
        self.catalog_path = str(self.root / "_catalog")
        try:
            self._open_or_init(create)
        except OSError as exc:  # a folder that cannot be made or read: /proc/x, no permission
            raise WarehouseError(f"warehouse {self.root} cannot be opened or created: "
                                 f"{exc.strerror or exc}") from exc

    def _open_or_init(self, create: bool = True) -> None:
        marker = self.root / MARKER
        if self.root.exists() and not self.root.is_dir():
            raise WarehouseError(f"warehouse {self.root} is a file, not a folder")
        if marker.exists():
            try:
                meta = json.loads(marker.read_text())
            except (OSError, ValueError) as exc:
                raise WarehouseError(f"warehouse marker {marker} is unreadable or corrupt: {exc}"
                                     ) from exc
            if meta.get("format") != FORMAT:
                raise WarehouseError(f"{marker} does not describe a volume-stream warehouse")
            if meta.get("format_version", 0) > FORMAT_VERSION:
                raise WarehouseError(
                    f"warehouse {self.root} has format version {meta['format_version']}; this "
                    f"volume-stream reads up to {FORMAT_VERSION}: upgrade volume-stream")
            if not DeltaTable.is_deltatable(self.catalog_path):
                raise WarehouseError(
                    f"warehouse {self.root} is damaged: its catalog table {self.catalog_path} "
                    f"is missing or not a Delta table")
            return
        if not create:
            raise WarehouseError(
                f"no volume-stream warehouse at {self.root} (nothing was created there): "
                f"create a volume first (`volume-stream volume create`, or CREATE EXTERNAL "
                f"VOLUME in SQL), or point --warehouse / $VOLUME_STREAM_WAREHOUSE at an "
                f"existing one")
        if self.root.exists() and any(self.root.iterdir()):
            shown = ", ".join(sorted(p.name for p in self.root.iterdir())[:5])
            raise WarehouseError(
                f"{self.root} is not a volume-stream warehouse (no {MARKER}; it contains: "
                f"{shown}); pass a new or empty folder. Nothing was changed.")
        self.root.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(self.catalog_path, schema=_SCHEMA, name="volume_stream_catalog",
                          configuration={"delta.logRetentionDuration": "interval 7 days"})
        tmp = self.root / f".{MARKER}.tmp"
        tmp.write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                                   "created_at": datetime.now(UTC).isoformat()}))
        tmp.replace(marker)  # the marker appears last: a half-made warehouse is just "empty"

    def volume_root(self, name: str, volume_id: str) -> str:
        return str(self.root / "volumes" / f"{name}-{volume_id}")

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    # ------------------------------------------------------------------ catalog
    def _table(self) -> DeltaTable:
        try:
            return DeltaTable(self.catalog_path)
        except TableNotFoundError as exc:
            raise WarehouseError(f"catalog table {self.catalog_path} is missing") from exc

    @staticmethod
    def _decode(dt: DeltaTable) -> CatalogState:
        rows = dt.to_pyarrow_dataset().to_table().to_pylist()
        return {(r["kind"], r["name"]): json.loads(r["spec"]) for r in rows}

    def read(self) -> CatalogState:
        """The catalog as of now."""
        return self._decode(self._table())

    def mutate(self, change: Callable[[CatalogState], Any]) -> Any:
        """Apply `change` to the catalog atomically and return its result.

        `change` gets a fresh copy of the state, edits it in place and may raise to abort. It
        can run more than once (after losing a race), so it must only look at its argument.
        """
        for _attempt in range(_MAX_ATTEMPTS):
            dt = self._table()
            state = self._decode(dt)
            result = change(state)
            rows = [{"kind": k, "name": n, "spec": json.dumps(spec, sort_keys=True)}
                    for (k, n), spec in sorted(state.items())]
            try:
                write_deltalake(dt, pa.Table.from_pylist(rows, schema=_SCHEMA), mode="overwrite",
                                commit_properties=CommitProperties(max_commit_retries=0))
            except CommitFailedError:
                continue
            return result
        raise VolumeStreamError(f"catalog {self.catalog_path}: too much contention, gave up")
