"""Is it safe to commit to this object store? (DESIGN §3.1)

Every commit of volume-stream (catalog compare-and-swap, offsets, directory-table applies,
pipeline targets) relies on delta-rs writing `_delta_log/<version>.json` only if it does not
exist yet: on S3, a `PUT` with `If-None-Match: *` (deltalake >= 1.6). A server that ignores the
header would let two writers both "win" a version and silently lose a commit, so a warehouse on
such a server is refused when it is opened: the probe writes a scratch object under
`<warehouse>/_probe/` with `If-None-Match: *` twice, and the second write must be refused. It
runs once per process, bucket and endpoint, and deletes its object. (delta-rs looks for the
next version before it writes, so a probe through delta-rs alone would not see the header
ignored: only a real race would.)
"""

from __future__ import annotations

import threading
import uuid

from directory_table.storage import option, s3_client
from volume_stream.errors import WarehouseError
from volume_stream.warehouse.location import Location, storage_error

__all__ = ["check_conditional_writes"]

_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()


def check_conditional_writes(loc: Location) -> None:
    """Refuse (WarehouseError) an S3 store that overwrites an object on a `PUT` with
    `If-None-Match: *`. A missing bucket or refused credentials raise WarehouseError /
    ConfigError naming the warehouse. Other schemes (HDFS: atomic rename) pass."""
    if loc.scheme != "s3":
        return
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = loc.uri[len("s3://"):].partition("/")
    endpoint = option(loc.storage_options, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") or ""
    with _lock:
        if (bucket, endpoint) in _checked:
            return
        key = "/".join(p for p in (prefix, "_probe", uuid.uuid4().hex) if p)
        try:
            client = s3_client(loc.delta_options())  # an assumed role's current credentials
            client.put_object(Bucket=bucket, Key=key, Body=b"1", IfNoneMatch="*")
            try:
                try:
                    client.put_object(Bucket=bucket, Key=key, Body=b"2", IfNoneMatch="*")
                except ClientError as exc:
                    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                    if status in (409, 412):
                        _checked.add((bucket, endpoint))
                        return
                    raise
                raise WarehouseError(
                    f"warehouse {loc.uri}: the object store does not honour conditional writes "
                    f"(a PUT with If-None-Match: * overwrote an existing object), so concurrent "
                    f"commits could be lost; refusing to use it. Use Amazon S3 (or an "
                    f"S3-compatible store that supports If-None-Match), HDFS or a shared disk. "
                    f"Nothing was created.")
            finally:
                try:
                    client.delete_object(Bucket=bucket, Key=key)
                except (BotoCoreError, ClientError):
                    pass
        except (BotoCoreError, ClientError) as exc:
            raise storage_error(loc.uri, exc, "open it") from exc
