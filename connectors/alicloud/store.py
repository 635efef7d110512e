"""Alibaba Cloud OSS for volumes: which keys belong to a volume, reading objects, full listings.

`OssScope` decides whether a key belongs to a volume (bucket, prefix, recursion, suffix) and
turns it into the volume-relative path; the MNS listener and the lister share it so events and
refreshes agree. `OssReader` implements `ObjectReader` on oss2: it pickles only its options
(never a client or a secret it read from the environment), builds its `oss2.Bucket` lazily on
the executor, streams bodies and resumes a read cut off mid-body at the same byte with
`If-Match`, so a changed object fails instead of mixing versions; calls are retried with
backoff on network errors, 5xx and throttling. `OssLister` implements `Lister` with paginated
ListObjectsV2.

ETags are unquoted everywhere (`normalize_etag`) and keep OSS's upper-case hex: events carry
`5D41...`, ListObjects/HeadObject `"5D41..."`; multipart ETags keep their `-N` suffix.

    >>> endpoint = "https://oss-cn-hangzhou.aliyuncs.com"
    >>> reader = OssReader("my-bucket", "images/", endpoint)   # doctest: +SKIP
    >>> with reader.open("2024/cat.jpg") as f:                  # doctest: +SKIP
    ...     header = f.read(16)
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import oss2
import pyarrow as pa
import requests
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from connectors._alicloud import AliCloudOptions, is_transient_oss, translate_oss_errors
from connectors.base import LISTING_SCHEMA
from connectors.errors import ConnectorError
from connectors.events import InvalidPathError
from connectors.scope import BucketScope, normalize_prefix

__all__ = ["OssLister", "OssReader", "OssScope", "normalize_etag", "normalize_prefix", "oss_url"]

logger = logging.getLogger(__name__)

_ATTEMPTS = 4
#: Exponential backoff from 50 ms, capped at 5 s, plus up to 50 ms of jitter.
_BACKOFF = wait_exponential(multiplier=0.05, max=5.0) + wait_random(0, 0.05)
#: Errors of a body cut off mid-read (requests wraps urllib3's in ChunkedEncodingError).
_STREAM_ERRORS = (requests.exceptions.RequestException, oss2.exceptions.RequestError,
                  ConnectionError, TimeoutError)


def oss_url(bucket: str, key: str) -> str:
    """The `oss://bucket/key` URL of an object, key verbatim (no percent-encoding).

    Example:
        >>> oss_url("bkt", "dir/a b+c.txt")
        'oss://bkt/dir/a b+c.txt'
    """
    return f"oss://{bucket}/{key}"


def normalize_etag(etag: str | None) -> str | None:
    """Strip the quotes OSS puts around ETags in listings and HEAD/GET responses.

    Example:
        >>> normalize_etag('"5D41402ABC4B2A76B9719D911017C592"')
        '5D41402ABC4B2A76B9719D911017C592'
    """
    if etag is None:
        return None
    return etag.strip().removeprefix("W/").strip('"') or None


class OssScope(BucketScope):
    """Which keys of which bucket make up a volume (see `connectors.scope.BucketScope`).

    Example:
        >>> OssScope("bkt", "in").url("a b.csv")
        'oss://bkt/in/a b.csv'
    """

    scheme = "oss"


_retry_transient = retry(
    retry=retry_if_exception(is_transient_oss),
    stop=stop_after_attempt(_ATTEMPTS),
    wait=_BACKOFF,
    reraise=True,
)


class _LazyBucket:
    """Pickles as its options alone; the `oss2.Bucket` is made on first use, per process."""

    def __init__(self, bucket: str, endpoint: str, options: AliCloudOptions,
                 connect_timeout: float | None, is_path_style: bool) -> None:
        if not endpoint.startswith(("http://", "https://")):
            endpoint = "https://" + endpoint
        self.endpoint = endpoint
        self._bucket_name = bucket
        self._options = options
        self._connect_timeout = connect_timeout
        self._is_path_style = is_path_style
        self._client: oss2.Bucket | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> oss2.Bucket:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    creds = self._options.credentials()
                    auth = (oss2.StsAuth(creds.access_key_id, creds.access_key_secret,
                                         creds.security_token) if creds.security_token
                            else oss2.Auth(creds.access_key_id, creds.access_key_secret))
                    self._client = oss2.Bucket(auth, self.endpoint, self._bucket_name,
                                               connect_timeout=self._connect_timeout,
                                               is_path_style=self._is_path_style)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class OssReader(_LazyBucket):
    """Read the objects of one volume (`ObjectReader`); picklable for Spark executors.

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        endpoint: The OSS endpoint, e.g. "https://oss-cn-hangzhou.aliyuncs.com".
        access_key_id, access_key_secret, security_token: Explicit credentials (pickled with
            the reader); by default the ALIBABA_CLOUD_* variables of the process that reads.
        connect_timeout: Seconds for oss2's connect/read timeout (oss2's default: 60).
        is_path_style: Force path-style addressing (automatic for IP/localhost endpoints).

    Example:
        >>> reader = OssReader("bkt", "logs/", "http://127.0.0.1:9000")
        >>> reader.key("2024/a.log")
        'logs/2024/a.log'
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint: str = "", *,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, connect_timeout: float | None = None,
                 is_path_style: bool = False) -> None:
        if not endpoint:
            raise ValueError("endpoint is required, e.g. 'https://oss-cn-hangzhou.aliyuncs.com'")
        options = AliCloudOptions(access_key_id, access_key_secret, security_token)
        super().__init__(bucket, endpoint, options, connect_timeout, is_path_style)
        self.scope = OssScope(bucket, prefix)
        self.bucket, self.prefix = bucket, self.scope.prefix

    def __repr__(self) -> str:
        return (f"OssReader(bucket={self.bucket!r}, prefix={self.prefix!r}, "
                f"endpoint={self.endpoint!r}, {self._options!r})")

    def key(self, relative_path: str) -> str:
        return self.scope.key(relative_path)

    def url(self, relative_path: str) -> str:
        return self.scope.url(relative_path)

    def open(self, relative_path: str) -> io.BufferedReader:
        """Open an object as a streamed, seekable binary file.

        The GET happens here, so a missing object raises at once.

        Raises:
            ObjectNotFoundError: the object does not exist.
            CredentialsError: no credentials, or OSS rejected them.
            ConnectorError: any other OSS failure after retries.

        Example:
            >>> with OssReader("bkt", "in/", endpoint).open("a.json") as f:  # doctest: +SKIP
            ...     data = json.load(f)
        """
        return io.BufferedReader(_ObjectStream(self, self.key(relative_path)), buffer_size=1 << 20)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        """Read up to `length` bytes from offset `start` (fewer at the end, b"" past it).

        Example:
            >>> OssReader("bkt", "in/", endpoint).read_range("a.bin", 0, 4)  # doctest: +SKIP
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
                result = self.client.get_object(key, byte_range=(start, start + length - 1),
                                                headers={"x-oss-range-behavior": "standard"})
            except oss2.exceptions.ServerError as exc:
                if exc.status == 416:  # start at or past the end
                    return b""
                raise
            data = result.read()
            # without range support the whole object comes back with 200
            return data if result.status == 206 else data[start:start + length]

        with translate_oss_errors("GetObject", oss_url(self.bucket, key)):
            return read()


class _ObjectStream(io.RawIOBase):
    """A raw, seekable stream over one GetObject body that reopens at its position if cut off."""

    def __init__(self, reader: OssReader, key: str) -> None:
        super().__init__()
        self._reader, self._key = reader, key
        self.name = oss_url(reader.bucket, key)
        self._pos = 0
        self._body: Any = None
        with translate_oss_errors("GetObject", self.name):
            result = _retry_transient(lambda: reader.client.get_object(key))()
        self._etag = result.etag
        self.size = int(result.content_length)
        self._body = result

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
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                if self._body is None:
                    self._reopen()
                data = self._body.read(want)
                if not data:
                    raise ConnectionError(f"body ended at byte {self._pos} of {self.size}")
                break
            except (*_STREAM_ERRORS, oss2.exceptions.ServerError) as exc:
                self._drop_body()
                transient = isinstance(exc, _STREAM_ERRORS) or is_transient_oss(exc)
                if attempt == _ATTEMPTS or not transient:
                    with translate_oss_errors("GetObject", self.name):
                        if isinstance(exc, oss2.exceptions.PreconditionFailed):
                            raise ConnectorError(
                                f"{self.name} changed while it was being read") from exc
                        if isinstance(exc, oss2.exceptions.OssError):
                            raise exc from None
                        raise ConnectorError(f"reading {self.name} failed at byte {self._pos}: "
                                             f"{type(exc).__name__}: {exc}") from exc
                logger.info("read of %s cut off at byte %d (%s); resuming", self.name, self._pos,
                            type(exc).__name__)
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n

    def _reopen(self) -> None:
        headers = {"x-oss-range-behavior": "standard"}
        if self._etag:
            headers["If-Match"] = f'"{self._etag}"'
        self._body = self._reader.client.get_object(self._key, byte_range=(self._pos, None),
                                                    headers=headers)

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.resp.response.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                pass

    def close(self) -> None:
        self._drop_body()
        super().close()


class OssLister(_LazyBucket):
    """List every file of a volume (`Lister`) with paginated ListObjectsV2.

    Folder markers and keys whose relative path is unsafe ('..' segments, '//') are skipped,
    the latter with a warning. With `recursive=False` only direct children are listed
    (delimiter '/').

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        endpoint: The OSS endpoint.
        recursive: List nested keys too.
        suffix: Keep only keys ending with this (or one of these).
        page_size: Keys per ListObjectsV2 call (at most 1000); one RecordBatch per page.
        access_key_id, access_key_secret, security_token, connect_timeout, is_path_style:
            As for `OssReader`.

    Example:
        >>> lister = OssLister("bkt", "in/", endpoint, recursive=False)   # doctest: +SKIP
        >>> table = pa.Table.from_batches(lister.list(), schema=LISTING_SCHEMA)  # doctest: +SKIP
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 1000,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, connect_timeout: float | None = None,
                 is_path_style: bool = False) -> None:
        if not endpoint:
            raise ValueError("endpoint is required, e.g. 'https://oss-cn-hangzhou.aliyuncs.com'")
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be in 1..1000: {page_size}")
        options = AliCloudOptions(access_key_id, access_key_secret, security_token)
        super().__init__(bucket, endpoint, options, connect_timeout, is_path_style)
        self.scope = OssScope(bucket, prefix, recursive, suffix)
        self.page_size = page_size

    def __repr__(self) -> str:
        return (f"OssLister({self.scope!r}, endpoint={self.endpoint!r}, "
                f"page_size={self.page_size}, {self._options!r})")

    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield the volume's files in `LISTING_SCHEMA`, one batch per non-empty page."""
        scope, token = self.scope, ""
        delimiter = "" if scope.recursive else "/"
        page = _retry_transient(self._page)
        while True:
            with translate_oss_errors("ListObjectsV2", oss_url(scope.bucket, scope.prefix)):
                result = page(scope.prefix, delimiter, token)
            batch = self._batch(result.object_list)
            if batch.num_rows:
                yield batch
            if not result.is_truncated:
                return
            token = result.next_continuation_token

    def _page(self, prefix: str, delimiter: str, token: str) -> Any:
        return self.client.list_objects_v2(prefix=prefix, delimiter=delimiter,
                                           continuation_token=token, max_keys=self.page_size)

    def _batch(self, objects: Any) -> pa.RecordBatch:
        columns: dict[str, list[Any]] = {name: [] for name in LISTING_SCHEMA.names}
        for obj in objects:
            try:
                relative = self.scope.relative_path(self.scope.bucket, obj.key)
            except InvalidPathError as exc:
                logger.warning("skipping %s: %s", oss_url(self.scope.bucket, obj.key), exc)
                continue
            if relative is None:
                continue
            columns["relative_path"].append(relative)
            columns["size"].append(int(obj.size))
            columns["last_modified_time"].append(datetime.fromtimestamp(obj.last_modified, UTC))
            columns["etag"].append(normalize_etag(obj.etag))
        return pa.RecordBatch.from_pydict(columns, schema=LISTING_SCHEMA)
