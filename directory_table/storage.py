"""pyarrow filesystems for the plain files next to Delta tables, built from delta-rs's
`storage_options` (DESIGN §3): the same endpoint, region and credentials reach delta-rs and
pyarrow. Options not given come from the standard `AWS_*` environment (profiles and roles
through the AWS SDK's default chain), so executors need nothing pickled but the non-secret
options.

    fs, path = filesystem_for("s3://bucket/wh/_catalog", {"AWS_ENDPOINT_URL": "http://h:9000"})
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from connectors.errors import register_transient
from directory_table.roles import fresh, live_options

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["S3_CONNECT_TIMEOUT_S", "S3_MAX_ATTEMPTS", "S3_REQUEST_TIMEOUT_S", "filesystem_for",
           "list_names", "local_rows", "option", "s3_client", "split_s3"]

#: attempts per request of pyarrow's S3 filesystem (its default is 3: at a 10% fault rate one
#: request in a thousand would fail, and a batch makes thousands)
S3_MAX_ATTEMPTS = 10
#: seconds pyarrow's S3 requests may go without a byte moving (the AWS SDK for C++ defaults to
#: 3 s, on Linux too: it is curl's low-speed window, "curlCode: 28, Timeout was reached"). A
#: store that takes longer to answer a part upload (a busy S3-compatible store, a proxy) failed
#: every attempt of it; boto3 waits 60 s (DESIGN §7)
S3_REQUEST_TIMEOUT_S = 60.0
#: seconds to open a connection (the SDK's default is 1 s, short on a loaded machine)
S3_CONNECT_TIMEOUT_S = 10.0


#: what delta-rs (object_store) says when a store call failed for a reason a retry can outlive:
#: its own retries were used up on 5xx/throttling answers, a dropped link or a cut-off body
_DELTA_RS_TRANSIENT = re.compile(
    r"error sending request|request or response body error|error reading a body|end of file "
    r"before message length|connection (?:reset|closed|refused|error)|broken pipe|timed out|"
    r"operation timed out|SlowDown|InternalError|Service ?Unavailable|Too Many Requests|"
    r"status(?: code)?:? 5\d\d|Server returned non-2xx status code: 5\d\d|"
    r"after \d+ retries", re.IGNORECASE)


def _delta_rs_transient(exc: BaseException) -> bool:
    """A delta-rs error about the store's transport or a 5xx answer (not a missing table, a
    conflict or a bad request): worth a retry with backoff (`connectors.errors.is_transient`)."""
    text = str(exc)
    return ("Generic S3 error" in text or "Object Store" in text or "ObjectStore" in text
            or "object store" in text) and bool(_DELTA_RS_TRANSIENT.search(text))


register_transient(_delta_rs_transient)


def option(options: dict[str, str] | None, *names: str) -> str | None:
    """The first of `names` set in `options` (any case), else in the environment."""
    lowered = {k.lower(): v for k, v in (options or {}).items()}
    for name in names:
        if name.lower() in lowered:
            return str(lowered[name.lower()])
    for name in names:
        if os.environ.get(name.upper()):
            return os.environ[name.upper()]
    return None


def _s3(options: dict[str, str] | None) -> pafs.S3FileSystem:
    options = fresh(live_options(options))
    kwargs: dict[str, Any] = {}
    key = option(options, "AWS_ACCESS_KEY_ID", "access_key_id")
    secret = option(options, "AWS_SECRET_ACCESS_KEY", "secret_access_key")
    if key and secret:
        kwargs.update(access_key=key, secret_key=secret,
                      session_token=option(options, "AWS_SESSION_TOKEN", "session_token"))
    region = option(options, "AWS_REGION", "region", "AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    endpoint = option(options, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "endpoint_url",
                      "endpoint")
    if endpoint:
        parsed = urlparse(endpoint)
        kwargs["endpoint_override"] = parsed.netloc or endpoint
        kwargs["scheme"] = parsed.scheme or "https"
        kwargs["force_virtual_addressing"] = False
    # every request retried where it fails (5xx, SlowDown, resets): one reset upload part must
    # not fail a whole Parquet file, and with it a pipeline's batch (DESIGN §7). The SDK's
    # default strategy, not its "standard" one: pyarrow's wrapper of the standard strategy never
    # gives back the retry quota it takes (5 of 500 tokens a retry), so a filesystem stopped
    # retrying for good after ~100 retries (measured: 120 uploads at 40% faults, 68 failed)
    return pafs.S3FileSystem(retry_strategy=pafs.AwsDefaultS3RetryStrategy(
        max_attempts=S3_MAX_ATTEMPTS), request_timeout=S3_REQUEST_TIMEOUT_S,
        connect_timeout=S3_CONNECT_TIMEOUT_S, **kwargs)


def filesystem_for(uri: str, options: dict[str, str] | None = None,
                   ) -> tuple[pafs.FileSystem, str]:
    """(a pyarrow filesystem, the path of `uri` inside it) for a local path, `file://`,
    `s3://` (endpoint and credentials from `options`, else the environment) or another scheme
    pyarrow knows (`hdfs://`)."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower() if len(parsed.scheme) > 1 else ""
    if scheme in ("", "file"):
        return pafs.LocalFileSystem(), unquote(parsed.path) if scheme else uri
    if scheme in ("s3", "s3a"):
        return _s3(options), f"{parsed.netloc}{parsed.path}".rstrip("/")
    return pafs.FileSystem.from_uri(uri)


def s3_client(options: dict[str, str] | None = None) -> Any:
    """A boto3 S3 client with `options`' endpoint, region and credentials (else boto3's chain:
    environment, profiles, roles). Driver-side listing and small objects go through boto3 rather
    than pyarrow's S3 (the AWS C++ SDK can abort a process at exit: apache/arrow#34314)."""
    import boto3  # only object-store warehouses need it

    options = fresh(live_options(options))
    kwargs: dict[str, Any] = {}
    endpoint = option(options, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "endpoint_url",
                      "endpoint")
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    region = option(options, "AWS_REGION", "region", "AWS_DEFAULT_REGION")
    if region:
        kwargs["region_name"] = region
    key = option(options, "AWS_ACCESS_KEY_ID", "access_key_id")
    secret = option(options, "AWS_SECRET_ACCESS_KEY", "secret_access_key")
    if key and secret:
        kwargs.update(aws_access_key_id=key, aws_secret_access_key=secret,
                      aws_session_token=option(options, "AWS_SESSION_TOKEN", "session_token"))
    return boto3.client("s3", **kwargs)


def split_s3(uri: str) -> tuple[str, str]:
    """('bucket', 'key/prefix') of an `s3://` (or `s3a://`) URI."""
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def list_names(uri: str, options: dict[str, str] | None = None, *,
               start_after: str | None = None) -> list[str]:
    """The names directly under folder `uri` (empty if there is none); with `start_after`,
    only the names sorting after it (on S3 the listing starts there)."""
    if urlparse(uri).scheme.lower() in ("s3", "s3a"):
        bucket, prefix = split_s3(uri)
        prefix = f"{prefix.rstrip('/')}/" if prefix else ""
        names: set[str] = set()
        extra = {"StartAfter": prefix + start_after} if start_after else {}
        pages = s3_client(options).get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/", **extra)
        for page in pages:
            names.update(o["Key"][len(prefix):] for o in page.get("Contents", []))
            names.update(p["Prefix"][len(prefix):].rstrip("/")
                         for p in page.get("CommonPrefixes", []))
        return sorted(n for n in names if n and (not start_after or n > start_after))
    fs, path = filesystem_for(uri, options)
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(
        path, allow_not_found=True)) if not start_after or i.base_name > start_after)


def local_rows(dt: DeltaTable) -> pa.Table | None:
    """Every row of `dt`'s loaded version in its schema's types, read file by file on this
    thread, for a local table without partition columns; None for others (read them through
    delta-rs's dataset). The file's data must be its rows as they are: no deletion vectors,
    no column mapping (the caller checks). A column added later is null in older files.

    Plain Parquet reads start no thread. delta-rs's dataset reads through a filesystem written
    in Python (its handler) from Arrow's I/O threads, which take the GIL: one still finishing
    as the interpreter finalizes aborts the process, after the work was done (SIGABRT,
    "terminate called without an active exception"; DESIGN §8)."""
    uris = dt.file_uris()
    if (dt.metadata().partition_columns or "://" in dt.table_uri.removeprefix("file://")
            or any("://" in u for u in uris)):
        return None
    schema = pa.schema(dt.schema().to_arrow())
    parts = []
    for uri in uris:
        got = pq.ParquetFile(uri, pre_buffer=False).read(use_threads=False)
        parts.append(pa.table([got[f.name].cast(f.type) if f.name in got.column_names
                               else pa.nulls(got.num_rows, f.type) for f in schema],
                              schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()
