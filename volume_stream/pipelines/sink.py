"""The Delta side of a pipeline: the target and errors tables, their exactly-once bookkeeping,
and commits of the data files executors wrote.

Exactly-once rests on Delta app transactions (`txn` actions), written by delta-rs in the same
commit as the data files. Each commit of stream batch `B` carries three of them for the
stream's app id: `app_id` = `B * 2**32 + files_done` (how far into the batch's planned file list
the table is), `app_id/end` = the batch's pinned end version, `app_id/plan` = a fingerprint of
the planned file list. A retried run reads them back (`DeltaTable.transaction_version`) to pin
the same range, skip files already committed and refuse to resume if the plan changed. Two runs
committing the same app id at once conflict in delta-rs ("Concurrent transaction failed").

With `on_delete="delete_rows"` a commit also rewrites the data files that hold rows of the
batch's paths (copy-on-write: remove the old file, add one without those rows), in that same
commit, so readers never see a path with neither its old nor its new rows.
"""

from __future__ import annotations

import bisect
import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyarrow import fs as pafs
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from connectors.errors import is_transient
from directory_table.roles import fresh, live_options
from directory_table.storage import filesystem_for
from volume_stream.errors import InvalidInputError, VolumeStreamError
from volume_stream.pipelines.executor import stats_json, write_parquet
from volume_stream.warehouse import check_name

__all__ = ["DeltaSink", "Progress", "resolve_target"]

_STEP = 2 ** 32
_NOT_TYPE_KEYS = {"nullable", "containsNull", "valueContainsNull", "metadata"}
#: attempts of each step on the Delta tables (open, read progress, rewrite, commit) failing
#: transiently (`connectors.errors.is_transient`: 5xx, SlowDown, resets, cut-off bodies that
#: delta-rs's own retries do not cover), with random exponential back-off
STEP_ATTEMPTS = 8


def retried(fn: Any) -> Any:
    """fn(), retried where it fails transiently, so a batch converges on a faulty store."""
    for attempt in Retrying(retry=retry_if_exception(is_transient),
                            stop=stop_after_attempt(STEP_ATTEMPTS), reraise=True,
                            wait=wait_random_exponential(multiplier=0.05, max=2.0)):
        with attempt:
            return fn()
    raise AssertionError("unreachable")


def resolve_target(warehouse_root: Path | str, target: str) -> str:
    """A target's table location: a bare name is `<warehouse>/tables/<name>`; a path is made
    absolute; a URI (`s3://...`) is kept; `file://` URIs become paths.

    Example:
        >>> resolve_target(Path("/wh"), "image_meta")
        '/wh/tables/image_meta'
    """
    if not isinstance(target, str) or not target.strip():
        raise InvalidInputError(f"target must be a table name or path, not {target!r}")
    parsed = urlparse(target)
    if parsed.scheme == "file":
        return os.path.abspath(unquote(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:
        return target.rstrip("/")
    if "/" in target or os.sep in target or target.startswith("."):
        if not os.path.isabs(os.path.expanduser(target)) and ".." in Path(target).parts:
            raise InvalidInputError(
                f"target {target!r} climbs out with '..': give a bare name (a table under "
                f"{Path(warehouse_root) / 'tables'}) or an absolute path or URI")
        return os.path.abspath(os.path.expanduser(target))
    check_name("target", target)
    if isinstance(warehouse_root, str) and "://" in warehouse_root:
        return f"{warehouse_root.rstrip('/')}/tables/{target}"  # an object-store warehouse
    return str(Path(warehouse_root) / "tables" / target)


@dataclass(frozen=True)
class Progress:
    """How far a table is into one stream batch, as its app transactions say."""

    batch_id: int
    done: int
    end_version: int | None
    plan: int | None


def _types(schema_json: str) -> list[tuple[str, Any]]:
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in _NOT_TYPE_KEYS}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return [(f["name"], strip(f["type"])) for f in json.loads(schema_json)["fields"]]


class DeltaSink:
    """One Delta table a pipeline writes: created on first use, schema checked, committed."""

    def __init__(self, uri: str, schema: pa.Schema, role: str = "target",
                 storage_options: dict[str, str] | None = None) -> None:
        self.uri, self.schema, self.role = uri, schema, role
        self._options = live_options(storage_options)
        self._delta_schema = Schema.from_arrow(schema)

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's options with current credentials (DESIGN §3.2)."""
        return fresh(self._options)

    def __repr__(self) -> str:
        return f"DeltaSink({self.uri!r})"

    def ensure(self) -> DeltaTable:
        """Open the table, creating it with the pipeline's schema if it does not exist."""
        return retried(self._ensure)

    def _ensure(self) -> DeltaTable:
        try:
            dt = DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            try:
                DeltaTable.create(self.uri, schema=self._delta_schema, mode="ignore",
                                  storage_options=self.storage_options,
                                  name=os.path.basename(self.uri.rstrip("/")),
                                  description=f"volume-stream pipeline {self.role} table")
            except Exception as exc:  # lost a race to create it? then it exists now
                try:
                    DeltaTable(self.uri, storage_options=self.storage_options)
                except TableNotFoundError:
                    raise exc from None
            dt = DeltaTable(self.uri, storage_options=self.storage_options)
        want, have = _types(self._delta_schema.to_json()), _types(dt.schema().to_json())
        if want != have:
            raise InvalidInputError(
                f"{self.role} table {self.uri} has columns {[n for n, _ in have]} with other "
                f"types than the pipeline writes ({[n for n, _ in want]}); write to a new "
                f"target, or migrate the table. Nothing was written.")
        return dt

    @staticmethod
    def progress(dt: DeltaTable, app_id: str) -> Progress | None:
        version = retried(lambda: dt.transaction_version(app_id))
        if version is None:
            return None
        return Progress(version // _STEP, version % _STEP,
                        dt.transaction_version(f"{app_id}/end"),
                        dt.transaction_version(f"{app_id}/plan"))

    @staticmethod
    def add_actions(manifest: Iterable[dict[str, Any]]) -> list[AddAction]:
        now = int(time.time() * 1000)
        return [AddAction(m["path"], int(m["size"]), {}, now, True, m["stats"])
                for m in manifest]

    def commit(self, dt: DeltaTable, actions: list[AddAction | RemoveAction], *, app_id: str,
               batch_id: int, done: int, end_version: int, plan: int,
               metadata: dict[str, Any]) -> None:
        """One commit: the actions plus the app transactions recording progress.

        Raises:
            CommitFailedError: another run committed the same app id concurrently.
        """
        if not 0 <= done < _STEP:
            raise VolumeStreamError(f"a pipeline batch holds at most {_STEP - 1} files")
        txns = [Transaction(app_id, batch_id * _STEP + done),
                Transaction(f"{app_id}/end", end_version), Transaction(f"{app_id}/plan", plan)]
        mark = batch_id * _STEP + done
        token = uuid.uuid4().hex  # this call's attempts, told apart from another run's commit

        def once() -> None:
            # a failed attempt may have landed (its answer lost): the app transaction says the
            # batch is committed, and the commit carries this call's token. The same batch
            # committed by ANOTHER run (two runs racing) is a CommitFailedError: the caller
            # discards this run's files and reports the conflict.
            retried(dt.update_incremental)
            if (dt.transaction_version(app_id) or -1) >= mark:
                if any(c.get("volume_stream_attempt") == token for c in dt.history(limit=20)):
                    return
                raise CommitFailedError(f"{self.uri}: batch {batch_id} of {app_id} was "
                                        f"committed by another run")
            dt.create_write_transaction(
                actions, mode="append", schema=self.schema,
                commit_properties=CommitProperties(app_transactions=txns, custom_metadata={
                    "volume_stream": json.dumps(metadata, sort_keys=True),
                    "volume_stream_attempt": token}))

        retried(once)
        retried(dt.update_incremental)

    def discard(self, manifest: Iterable[dict[str, Any]]) -> None:
        """Delete data files that will not be committed (best effort; vacuum would too)."""
        fs, base = filesystem_for(self.uri, self.storage_options)
        for m in manifest:
            try:
                fs.delete_file(f"{base}/{m['path']}")
            except OSError:
                pass

    def discard_prefix(self, prefix: str) -> None:
        """Delete the uncommitted data files whose names start with `prefix` (one run's)."""
        fs, base = filesystem_for(self.uri, self.storage_options)
        try:
            infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        except OSError:
            return
        self.discard({"path": i.base_name} for i in infos if i.base_name.startswith(prefix))

    def rewrite_without(self, dt: DeltaTable, paths: set[str]
                        ) -> tuple[list[AddAction | RemoveAction], int]:
        """Actions removing every row whose `relative_path` is in `paths` (copy-on-write of
        the data files holding them, found by their min/max stats); and the rows removed."""
        if not paths:
            return [], 0
        return retried(lambda: self._rewrite_without(dt, paths))

    def _rewrite_without(self, dt: DeltaTable, paths: set[str]
                         ) -> tuple[list[AddAction | RemoveAction], int]:
        features = getattr(dt.protocol(), "writer_features", None) or []
        if "deletionVectors" in features:
            raise InvalidInputError(f"{self.role} table {self.uri} uses deletion vectors, which "
                                    f"on_delete='delete_rows' cannot rewrite; use a new target")
        wanted = sorted(paths)
        files = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        fs, base = filesystem_for(self.uri, self.storage_options)
        value_set = pa.array(wanted, pa.string())
        actions: list[AddAction | RemoveAction] = []
        removed = 0
        now = int(time.time() * 1000)
        for f in files:
            lo, hi = f.get("min.relative_path"), f.get("max.relative_path")
            if lo is not None and hi is not None:
                i = bisect.bisect_left(wanted, lo)
                if i == len(wanted) or wanted[i] > hi:
                    continue  # no wanted path within this file's [min, max]
            where = f"{base}/{unquote(f['path'])}"
            keys = pq.read_table(where, filesystem=fs, columns=["relative_path"],
                                 use_threads=False)
            n_hit = pc.sum(pc.is_in(keys["relative_path"], value_set=value_set)).as_py() or 0
            if not n_hit:
                continue
            removed += n_hit
            actions.append(RemoveAction(f["path"], True, now, f["size_bytes"], {}))
            table = pq.read_table(where, filesystem=fs, schema=self.schema, use_threads=False)
            hit = pc.is_in(table["relative_path"], value_set=value_set)
            keep = table.filter(pc.invert(pc.fill_null(hit, False)))
            if keep.num_rows:
                name = f"part-rw-{uuid.uuid4().hex}.snappy.parquet"
                size = write_parquet(fs, f"{base}/{name}", keep)  # verified: reads back
                actions.append(AddAction(name, size, {}, now, True, stats_json(keep)))
        return actions, removed

