"""Is it safe to commit to this object store? (DESIGN §3.1)

Every commit of volume-stream (catalog compare-and-swap, offsets, directory-table applies,
pipeline targets) relies on delta-rs writing `_delta_log/<version>.json` only if it does not
exist yet (S3's conditional `PUT` with `If-None-Match: *`). A server that ignores the header
would let two writers both "win" a version and silently lose one commit, so a warehouse on
such a server is refused when it is opened: two writers race for version 1 of a scratch table
under `<warehouse>/_probe/`, and the second must be told it lost. The probe runs once per
process and object-store endpoint/bucket, and removes its scratch table.
"""

from __future__ import annotations

import threading
import uuid

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from directory_table.storage import option
from volume_stream.errors import WarehouseError
from volume_stream.warehouse.location import Location

__all__ = ["check_conditional_writes"]

_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()
_SCHEMA = pa.schema([("probe", pa.int64())])


def _key(loc: Location) -> tuple[str, str]:
    bucket = loc.uri.split("/", 3)[2]
    endpoint = option(loc.storage_options, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") or ""
    return (f"{loc.scheme}://{bucket}", endpoint)


def check_conditional_writes(loc: Location) -> None:
    """Refuse (WarehouseError) a store that lets a second writer overwrite a committed Delta
    version. Errors of the store itself (no bucket, bad credentials) propagate."""
    key = _key(loc)
    with _lock:
        if key in _checked:
            return
        scratch = f"_probe/{uuid.uuid4().hex}"
        path = loc.join(scratch)
        options = loc.delta_options()
        try:
            DeltaTable.create(path, schema=_SCHEMA, storage_options=options)
            first = DeltaTable(path, storage_options=options)
            second = DeltaTable(path, storage_options=options)
            no_retry = CommitProperties(max_commit_retries=0)
            write_deltalake(first, pa.table({"probe": [1]}, _SCHEMA), mode="append",
                            commit_properties=no_retry)
            try:
                write_deltalake(second, pa.table({"probe": [2]}, _SCHEMA), mode="append",
                                commit_properties=no_retry)
            except CommitFailedError:
                _checked.add(key)
                return
            raise WarehouseError(
                f"warehouse {loc.uri}: the object store does not honour conditional writes "
                f"(a PUT with If-None-Match: * overwrote an existing object), so concurrent "
                f"commits could be lost; refusing to use it. Use Amazon S3, or an "
                f"S3-compatible store that supports If-None-Match, HDFS, or a shared disk. "
                f"Nothing was created.")
        finally:
            loc.delete_tree(scratch)
            if not loc.children("_probe"):
                loc.delete_tree("_probe")
