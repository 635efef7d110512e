"""Amazon S3 for volumes: which keys belong to a volume, reading objects, full listings.

`S3Scope` decides whether a key belongs to a volume (bucket, prefix, recursion, suffix) and
turns it into the volume-relative path; the SQS listener and the lister share it so events and
refreshes agree. `S3Reader` implements `ObjectReader` for the UDF pipelines: it pickles only
its options (never a client), makes its boto3 client lazily on the executor, streams bodies and
resumes a read cut off mid-body at the same byte with `If-Match`, so a changed object fails
instead of mixing versions. `S3Lister` implements `Lister` with paginated ListObjectsV2.

ETags are unquoted everywhere (`normalize_etag`): S3 events carry `d41d8...`, ListObjects and
HeadObject carry `"d41d8..."`; multipart ETags keep their `-N` suffix.

    >>> reader = S3Reader("my-bucket", "images/")              # doctest: +SKIP
    >>> with reader.open("2024/cat.jpg") as f:                  # doctest: +SKIP
    ...     header = f.read(16)
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import botocore.exceptions as bce
import pyarrow as pa
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from connectors._aws import ClientOptions, error_code, is_transient, translate_errors
from connectors.base import LISTING_SCHEMA
from connectors.errors import ConnectorError, ObjectNotFoundError
from connectors.events import InvalidPathError, validate_relative_path
from connectors.scope import BucketScope, normalize_prefix

__all__ = ["S3Lister", "S3Reader", "S3Scope", "normalize_etag", "normalize_prefix", "s3_url"]

logger = logging.getLogger(__name__)

_READ_ATTEMPTS = 4
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def s3_url(bucket: str, key: str) -> str:
    """The `s3://bucket/key` URL of an object, key verbatim (no percent-encoding).

    Example:
        >>> s3_url("bkt", "dir/a b+c.txt")
        's3://bkt/dir/a b+c.txt'
    """
    return f"s3://{bucket}/{key}"


def normalize_etag(etag: str | None) -> str | None:
    """Strip the quotes S3 puts around ETags in listings and HEAD/GET responses.

    Example:
        >>> normalize_etag('"5d41402abc4b2a76b9719d911017c592"')
        '5d41402abc4b2a76b9719d911017c592'
    """
    if etag is None:
        return None
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"') or None


class S3Scope(BucketScope):
    """Which keys of which bucket make up a volume (see `connectors.scope.BucketScope`).

    Example:
        >>> S3Scope("bkt", "in").url("a b.csv")
        's3://bkt/in/a b.csv'
    """

    scheme = "s3"


_retry_transient = retry(
    retry=retry_if_exception(is_transient),
    stop=stop_after_attempt(_READ_ATTEMPTS),
    wait=wait_random_exponential(multiplier=0.05, max=5.0),
    reraise=True,
)


class _LazyClient:
    """Pickles as its options alone; the boto3 client is made on first use, per process."""

    _service = "s3"

    def __init__(self, options: ClientOptions) -> None:
        self._options = options
        self._client: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._options.client(self._service)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class S3Reader(_LazyClient):
    """Read the objects of one volume (`ObjectReader`); picklable for Spark executors.

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        **client_options: `ClientOptions` fields (endpoint_url, region_name, credentials...).

    Example:
        >>> reader = S3Reader("bkt", "logs/", endpoint_url="http://127.0.0.1:5000")
        >>> reader.key("2024/a.log")
        'logs/2024/a.log'
    """

    def __init__(self, bucket: str, prefix: str = "", **client_options: Any) -> None:
        super().__init__(ClientOptions.of(**client_options))
        self.bucket = bucket
        self.prefix = normalize_prefix(prefix)

    def __repr__(self) -> str:
        return f"S3Reader(bucket={self.bucket!r}, prefix={self.prefix!r}, {self._options!r})"

    def key(self, relative_path: str) -> str:
        return self.prefix + validate_relative_path(relative_path)

    def url(self, relative_path: str) -> str:
        return s3_url(self.bucket, self.key(relative_path))

    def open(self, relative_path: str) -> io.BufferedReader:
        """Open an object as a streamed, seekable binary file.

        The GET happens here, so a missing object raises at once. A body cut off mid-read is
        resumed at the same byte with a ranged GET pinned to the first ETag.

        Raises:
            ObjectNotFoundError: the object does not exist.
            ConnectorError: any other S3 failure after retries.

        Example:
            >>> with S3Reader("bkt", "in/").open("a.json") as f:   # doctest: +SKIP
            ...     data = json.load(f)
        """
        raw = _ObjectStream(self, self.key(relative_path))
        return io.BufferedReader(raw, buffer_size=1 << 20)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        """Read up to `length` bytes from offset `start` (fewer at the end, b"" past it).

        Example:
            >>> S3Reader("bkt", "in/").read_range("a.bin", 0, 4)     # doctest: +SKIP
            b'\\x89PNG'
        """
        if start < 0 or length < 0:
            raise ValueError(f"start and length must be >= 0: {start}, {length}")
        key = self.key(relative_path)
        if length == 0:
            return b""

        @_retry_transient
        def read() -> bytes:
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
            except bce.ClientError as exc:
                if error_code(exc) == "InvalidRange":
                    return b""
                raise
            with response["Body"] as body:
                return body.read()

        with self._errors(key, "GetObject"):
            return read()

    def _errors(self, key: str, action: str):
        return _object_errors(self.bucket, key, action, self._options)


class _ObjectStream(io.RawIOBase):
    """A raw, seekable stream over one GetObject body that reopens at its position if cut off."""

    def __init__(self, reader: S3Reader, key: str) -> None:
        super().__init__()
        self._reader, self._key = reader, key
        self.name = s3_url(reader.bucket, key)
        self._pos = 0
        self._body: Any = None
        with reader._errors(key, "GetObject"):
            response = _retry_transient(
                lambda: reader.client.get_object(Bucket=reader.bucket, Key=key))()
        self._etag = response.get("ETag")
        self.size = int(response["ContentLength"])
        self._body = response["Body"]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        position = base + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        if position != self._pos:
            self._drop_body()
            self._pos = position
        return self._pos

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        want = min(len(buffer), self.size - self._pos)
        if want <= 0:
            return 0
        for attempt in range(1, _READ_ATTEMPTS + 1):
            try:
                if self._body is None:
                    self._reopen()
                data = self._body.read(want)
                if not data:
                    raise bce.IncompleteReadError(actual_bytes=self._pos,
                                                  expected_bytes=self.size)
                break
            except (bce.BotoCoreError, bce.ClientError) as exc:
                self._drop_body()
                if attempt == _READ_ATTEMPTS or not is_transient(exc):
                    with self._reader._errors(self._key, "GetObject"):
                        raise exc from None
                logger.info("read of %s cut off at byte %d (%s); resuming", self.name,
                            self._pos, type(exc).__name__)
                time.sleep(random.uniform(0, min(5.0, 0.05 * 2 ** attempt)))
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n

    def _reopen(self) -> None:
        reader = self._reader
        kwargs = {"IfMatch": self._etag} if self._etag else {}
        response = reader.client.get_object(
            Bucket=reader.bucket, Key=self._key, Range=f"bytes={self._pos}-", **kwargs)
        self._body = response["Body"]

    def _drop_body(self) -> None:
        if self._body is not None:
            try:
                self._body.close()
            finally:
                self._body = None

    def close(self) -> None:
        self._drop_body()
        super().close()


@contextlib.contextmanager
def _object_errors(bucket: str, key: str, action: str,
                   options: ClientOptions) -> Iterator[None]:
    """Like `translate_errors`, plus: a missing object is `ObjectNotFoundError`, a changed one
    (If-Match failed while resuming) a `ConnectorError` saying so."""
    with translate_errors("s3", f"{action} {s3_url(bucket, key)}", options):
        try:
            yield
        except bce.ClientError as exc:
            code = error_code(exc)
            if code in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"{s3_url(bucket, key)} does not exist") from exc
            if code == "PreconditionFailed":
                raise ConnectorError(
                    f"{s3_url(bucket, key)} changed while it was being read") from exc
            raise


class S3Lister(_LazyClient):
    """List every file of a volume (`Lister`) with paginated ListObjectsV2.

    Folder markers and keys whose relative path is unsafe ('..' segments, '//') are skipped;
    the latter with a warning. With `recursive=False` only direct children are listed
    (Delimiter='/').

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        recursive: List nested keys too.
        suffix: Keep only keys ending with this (or one of these).
        page_size: Keys per ListObjectsV2 call (at most 1000); one RecordBatch per page.
        **client_options: `ClientOptions` fields.

    Example:
        >>> lister = S3Lister("bkt", "in/", recursive=False)        # doctest: +SKIP
        >>> table = pa.Table.from_batches(lister.list(), schema=LISTING_SCHEMA)  # doctest: +SKIP
    """

    def __init__(self, bucket: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 1000,
                 **client_options: Any) -> None:
        super().__init__(ClientOptions.of(**client_options))
        self.scope = S3Scope(bucket, prefix, recursive, suffix)
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be in 1..1000: {page_size}")
        self.page_size = page_size

    def __repr__(self) -> str:
        return f"S3Lister({self.scope!r}, page_size={self.page_size}, {self._options!r})"

    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield the volume's files in `LISTING_SCHEMA`, one batch per non-empty page."""
        scope = self.scope
        kwargs: dict[str, Any] = {"Bucket": scope.bucket, "Prefix": scope.prefix,
                                  "PaginationConfig": {"PageSize": self.page_size}}
        if not scope.recursive:
            kwargs["Delimiter"] = "/"
        with translate_errors("s3", f"ListObjectsV2 {s3_url(scope.bucket, scope.prefix)}",
                              self._options):
            pages = self.client.get_paginator("list_objects_v2").paginate(**kwargs)
            for page in pages:
                batch = self._batch(page.get("Contents", ()))
                if batch.num_rows:
                    yield batch

    def _batch(self, contents: Any) -> pa.RecordBatch:
        columns: dict[str, list[Any]] = {name: [] for name in LISTING_SCHEMA.names}
        for obj in contents:
            try:
                relative = self.scope.relative_path(self.scope.bucket, obj["Key"])
            except InvalidPathError as exc:
                logger.warning("skipping %s: %s", s3_url(self.scope.bucket, obj["Key"]), exc)
                continue
            if relative is None:
                continue
            columns["relative_path"].append(relative)
            columns["size"].append(int(obj["Size"]))
            columns["last_modified_time"].append(obj["LastModified"].astimezone(UTC))
            columns["etag"].append(normalize_etag(obj.get("ETag")))
        return pa.RecordBatch.from_pydict(columns, schema=LISTING_SCHEMA)
