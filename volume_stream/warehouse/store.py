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
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from connectors.errors import CredentialsError, is_transient
from directory_table.files import CommitLog
from directory_table.roles import generation
from directory_table.storage import local_rows
from volume_stream.errors import (
    ConfigError,
    InvalidInputError,
    NotFoundError,
    VolumeStreamError,
    WarehouseError,
)
from volume_stream.warehouse.location import Location, storage_error
from volume_stream.warehouse.probe import check_conditional_writes

__all__ = ["NAME_PATTERN", "NAME_RULE", "STREAM", "VOLUME", "CatalogState", "Warehouse", "check_name",
           "entry", "now"]

MARKER = "volume-stream.json"
FORMAT = "volume-stream-warehouse"
FORMAT_VERSION = 1
_SCHEMA = pa.schema([("kind", pa.string()), ("name", pa.string()), ("spec", pa.string())])
_MAX_ATTEMPTS = 50
#: commitInfo key naming one `mutate` call, to tell whether a write that failed had landed
_MUTATION_KEY = "volume_stream_mutation"

#: {("volume"|"stream", name): spec dict}
CatalogState = dict[tuple[str, str], dict[str, Any]]

#: the kinds of catalog entries volumes and streams are kept under
VOLUME, STREAM = "volume", "stream"
NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
NAME_RULE = "use letters, digits and '_', starting with a letter or '_' (at most 128 characters)"


def check_name(kind: str, name: str) -> str:
    """`name` if it is a valid object name, else InvalidInputError saying what is allowed.

    Every object a user names (volumes, streams, tables, connections, pipeline targets, change
    logs) is stored under a folder of that name, so this is also what keeps a name from
    climbing out of the warehouse: no '/', '.', NUL or other separator ever passes.
    """
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 60 \
            else f"{name[:60]!r}... ({len(name)} characters)"
        raise InvalidInputError(f"invalid {kind} name {shown}: {NAME_RULE}")
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
    """A warehouse (a local folder, or a prefix on S3 or HDFS): opened if it is one,
    initialised if it is new or empty (unless `create=False`: then WarehouseError), refused
    otherwise (a foreign or damaged one is never overwritten). Everything under it goes
    through `location` (DESIGN §3)."""

    def __init__(self, root: str | os.PathLike,
                 storage_options: dict[str, Any] | None = None, *, create: bool = True):
        self.location = Location.parse(root, storage_options)
        self.uri = self.location.uri
        #: a `Path` for a local folder, the URI string for an object store
        self.root: Path | str = Path(self.uri) if self.location.is_local else self.uri
        self.catalog_path = self.location.join("_catalog")
        self._lock = threading.RLock()
        self._dt: DeltaTable | None = None
        #: a local catalog's log, looked at before a delta-rs update (a stat, against ~1 ms)
        self._log = CommitLog(self.catalog_path) if self.location.is_local else None
        self._generation = 0
        self._state: tuple[int, dict[tuple[str, str], str]] | None = None
        with self._storage("open"):
            try:
                self._open_or_init(create)
            except OSError as exc:  # a folder that cannot be made or read: /proc/x, no rights
                if not self.location.is_local:
                    raise
                raise WarehouseError(f"warehouse {self.uri} cannot be opened or created: "
                                     f"{exc.strerror or exc}") from exc

    def __repr__(self) -> str:
        return f"Warehouse({self.uri!r})"

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options with current credentials (an assumed role's are refreshed before
        they expire: DESIGN §3.2)."""
        return self.location.delta_options()

    @contextmanager
    def _storage(self, doing: str) -> Iterator[None]:
        if self.location.is_local:
            yield
            return
        try:
            yield
        except VolumeStreamError:
            raise
        except CredentialsError as exc:  # an assumed role STS refused (DESIGN §3.2)
            raise ConfigError(f"warehouse {self.uri}: cannot {doing}: {exc}") from exc
        except (OSError, DeltaError) as exc:
            raise storage_error(self.uri, exc, doing) from exc

    def _open_or_init(self, create: bool = True) -> None:
        loc = self.location
        if loc.is_local and os.path.exists(self.uri) and not os.path.isdir(self.uri):
            raise WarehouseError(f"warehouse {self.uri} is a file, not a folder")
        if not loc.is_local:
            check_conditional_writes(loc)
        if loc.exists(MARKER):
            marker = loc.join(MARKER)
            try:
                meta = json.loads(loc.read_text(MARKER))
            except (OSError, ValueError) as exc:
                raise WarehouseError(f"warehouse marker {marker} is unreadable or corrupt: {exc}"
                                     ) from exc
            if meta.get("format") != FORMAT:
                raise WarehouseError(f"{marker} does not describe a volume-stream warehouse")
            if meta.get("format_version", 0) > FORMAT_VERSION:
                raise WarehouseError(
                    f"warehouse {self.uri} has format version {meta['format_version']}; this "
                    f"volume-stream reads up to {FORMAT_VERSION}: upgrade volume-stream")
            if not DeltaTable.is_deltatable(self.catalog_path, self.storage_options):
                raise WarehouseError(
                    f"warehouse {self.uri} is damaged: its catalog table {self.catalog_path} "
                    f"is missing or not a Delta table")
            return
        if not create:
            raise WarehouseError(
                f"no volume-stream warehouse at {self.uri} (nothing was created there): "
                f"create a volume first (`volume-stream volume create`, or CREATE EXTERNAL "
                f"VOLUME in SQL), or point --warehouse / $VOLUME_STREAM_WAREHOUSE at an "
                f"existing one")
        present = [n for n in loc.children() if n != "_probe"]  # another process probing
        if present:
            raise WarehouseError(
                f"{self.uri} is not a volume-stream warehouse (no {MARKER}; it contains: "
                f"{', '.join(present[:5])}); pass a new or empty folder. Nothing was changed.")
        if loc.is_local:
            os.makedirs(self.uri, exist_ok=True)
        try:
            DeltaTable.create(self.catalog_path, schema=_SCHEMA, name="volume_stream_catalog",
                              configuration={"delta.logRetentionDuration": "interval 7 days"},
                              storage_options=self.storage_options)
        except Exception:
            # another process may have made the catalog at the same moment: fine if it did
            if not DeltaTable.is_deltatable(self.catalog_path, self.storage_options):
                raise
        # the marker appears last: a half-made warehouse is just "empty"
        loc.write_text(MARKER, json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                                           "created_at": datetime.now(UTC).isoformat()}))

    def volume_root(self, name: str, volume_id: str) -> str:
        return self.location.join("volumes", f"{name}-{volume_id}")

    def delete_volume_root(self, name: str, volume_id: str) -> None:
        """Remove a volume's tables (best effort)."""
        self.location.delete_tree(f"volumes/{name}-{volume_id}")

    def table_path(self, name: str) -> str:
        """Where a pipeline target given by a bare name lives: `<warehouse>/tables/<name>`."""
        return self.location.join("tables", name)

    def dead_letter(self, volume: str) -> str:
        """The dead-letter place of `volume`: `<warehouse>/_dead_letter/<volume>`."""
        return self.location.join("_dead_letter", volume)

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex[:12]

    # ------------------------------------------------------------------ catalog
    def _table(self) -> DeltaTable:
        """The catalog table brought up to date. Kept open: on an object store, opening it
        afresh would read every commit since the last checkpoint; catching up reads only the
        new ones (one LIST when nothing changed; a local one is looked at first, so a read of
        an unchanged catalog costs a stat: the shard API checks it on every request)."""
        return _retried(self._open)

    def _open(self) -> DeltaTable:
        try:
            options = self.storage_options
            if self._dt is None or generation(options) != self._generation:
                self._dt = DeltaTable(self.catalog_path, storage_options=options)
                self._generation = generation(options)
            elif self._log is None or self._log.newer_than(self._dt.version()):
                self._dt.update_incremental()
            return self._dt
        except TableNotFoundError as exc:
            self._dt = None
            raise WarehouseError(f"catalog table {self.catalog_path} is missing") from exc

    def _decode(self, dt: DeltaTable) -> CatalogState:
        """The state at `dt`'s version (decoded once per version), as a fresh copy."""
        version = dt.version()
        if self._state is None or self._state[0] != version:
            # a local catalog is read file by file on this thread (`local_rows`: no thread left
            # to race the interpreter's exit, DESIGN §8); scans over delta-rs's filesystem
            # handler are single-threaded everywhere: with pyarrow's scan threads, deltalake
            # 1.6.6 + pyarrow 25/26 aborted the process at interpreter exit in ~60% of runs
            table = local_rows(dt)
            if table is None:
                table = dt.to_pyarrow_dataset().to_table(use_threads=False)
            rows = table.to_pylist()
            self._state = (version, {(r["kind"], r["name"]): r["spec"] for r in rows})
        return {key: json.loads(spec) for key, spec in self._state[1].items()}

    def read(self) -> CatalogState:
        """The catalog as of now."""
        with self._lock:
            return _retried(lambda: self._decode(self._table()))

    def mutate(self, change: Callable[[CatalogState], Any]) -> Any:
        """Apply `change` to the catalog atomically and return its result.

        `change` gets a fresh copy of the state, edits it in place and may raise to abort. It
        can run more than once (after losing a race), so it must only look at its argument.
        """
        with self._lock:
            return self._mutate(change)

    def _mutate(self, change: Callable[[CatalogState], Any]) -> Any:
        token, transient = uuid.uuid4().hex, 0
        for _attempt in range(_MAX_ATTEMPTS):
            dt = self._table()
            read = dt.version()
            state = _retried(lambda dt=dt: self._decode(dt))
            result = change(state)
            rows = [{"kind": k, "name": n, "spec": json.dumps(spec, sort_keys=True)}
                    for (k, n), spec in sorted(state.items())]
            try:
                write_deltalake(dt, pa.Table.from_pylist(rows, schema=_SCHEMA), mode="overwrite",
                                commit_properties=CommitProperties(
                                    max_commit_retries=0, custom_metadata={_MUTATION_KEY: token}))
            except CommitFailedError:
                self._dt = None  # another process committed first: re-read and re-check
                if self._landed(token, read):  # or our own retried PUT, its answer lost
                    return result
                time.sleep(random.uniform(0, 0.02 * (_attempt + 1)))
                continue
            except (OSError, DeltaError) as exc:
                # a 5xx, reset or cut-off body that delta-rs's retries did not outlive, before
                # the commit (nothing landed) or after it (a post-commit LIST): which, the log
                # says, so the change is applied exactly once (DESIGN §7)
                transient += 1
                if transient >= READ_ATTEMPTS or not is_transient(exc):
                    raise
                self._dt = None
                if self._landed(token, read):
                    return result
                time.sleep(min(2.0, 0.05 * 2 ** transient) * (0.5 + random.random()))
                continue
            return result
        raise VolumeStreamError(f"catalog {self.catalog_path}: too much contention, gave up")

    def _landed(self, token: str, read: int) -> bool:
        """Whether the catalog has a commit of mutation `token` after version `read`."""
        dt = self._table()
        newer = dt.version() - read
        if newer <= 0:
            return False
        return any(c.get(_MUTATION_KEY) == token for c in _retried(lambda: dt.history(newer)))


#: attempts of a catalog read failing transiently (a cut-off body delta-rs does not retry)
READ_ATTEMPTS = 8


def _retried(fn: Callable[[], Any]) -> Any:
    """fn() (a read: no effect to repeat), retried with back-off while it fails transiently."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return fn()
        except (OSError, DeltaError) as exc:
            if attempt == READ_ATTEMPTS or not is_transient(exc):
                raise
            time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")
