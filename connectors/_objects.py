"""The object-store base: lazy picklable client, resumable ranged reads, paged listings.

S3 and OSS differ only in their SDK calls, so a store supplies:

- `_make_client()`: the SDK client, built lazily once per process (the store pickles as its
  options alone, never a client, so it can be shipped to Spark executors);
- `_get(key)` -> (body, etag, size), `_get_from(key, position, etag)` -> body (a ranged GET
  pinned to the first ETag), `_read_body(body, n)`, `_close_body(body)`;
- `_get_range(key, start, length)` -> bytes (b"" past the end);
- `_errors(key, action)`: a context manager converting SDK errors to `connectors.errors`;
- `_page(prefix, delimiter, token)` -> (objects, common prefixes, next token): one
  ListObjectsV2 call, objects as (key, size, last_modified, etag).

The base gives `open()` a seekable stream that resumes a body cut off mid-read at the same
byte after a jittered back-off (a changed object fails instead of mixing versions),
`read_range()`, `list()` in `LISTING_SCHEMA`, and one retry policy (`RETRY`, `BACKOFF`)
judged by `connectors.errors.is_transient`. A recursive `list()` runs in parallel
(`connectors._listing.parallel_pages`): the first levels of "folders" are found with
delimiter listings, then each sub-prefix is listed flat by a pool of `list_workers` threads.

    >>> normalize_etag('W/"5d41402abc4b2a76b9719d911017c592"')
    '5d41402abc4b2a76b9719d911017c592'
"""

from __future__ import annotations

import io
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, ClassVar

import pyarrow as pa
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from connectors._listing import Page, parallel_pages
from connectors.errors import ConnectorError, TransientError, is_transient
from connectors.events import InvalidPathError
from connectors.protocols import LISTING_SCHEMA, Lister, ObjectReader

__all__ = ["ATTEMPTS", "BACKOFF", "RETRY", "LazyClient", "ObjectStore", "backoff_s",
           "normalize_etag"]

#: Calls per operation, the first included.
ATTEMPTS = 4
#: Full-jitter exponential back-off: uniform(0, min(5 s, 50 ms * 2**attempt)).
BACKOFF = wait_random_exponential(multiplier=0.05, max=5.0)
#: Retry a call on transient errors (`is_transient`), then raise the last error.
RETRY = retry(retry=retry_if_exception(is_transient), stop=stop_after_attempt(ATTEMPTS),
              wait=BACKOFF, reraise=True)


def backoff_s(attempt: int) -> float:
    """The pause before retry `attempt` (1-based), drawn like `BACKOFF`."""
    return random.uniform(0, min(5.0, 0.05 * 2 ** attempt))


def normalize_etag(etag: str | None) -> str | None:
    """Strip the quotes (and a weak `W/`) stores put around ETags in listings and HEAD/GET.

    Example:
        >>> normalize_etag('"5D41402ABC4B2A76B9719D911017C592"')
        '5D41402ABC4B2A76B9719D911017C592'
    """
    if etag is None:
        return None
    return etag.strip().removeprefix("W/").strip('"') or None


class LazyClient:
    """Pickles as its options alone; the SDK client is made on first use, per process."""

    _client: Any = None

    def _make_client(self) -> Any:
        raise NotImplementedError

    @property
    def client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    @property
    def _lock(self) -> threading.Lock:
        lock = self.__dict__.get("_client_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_client_lock", threading.Lock())
        return lock

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state.pop("_client_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


class ObjectStore(LazyClient, ObjectReader, Lister):
    """A volume's objects in one bucket: read (`ObjectReader`) and list (`Lister`)."""

    log: ClassVar[logging.Logger] = logging.getLogger("connectors.objects")
    scope: Any  # a `BucketScope`

    # -- provider hooks -----------------------------------------------------------------------
    def _get(self, key: str) -> tuple[Any, str | None, int]:
        raise NotImplementedError

    def _get_from(self, key: str, position: int, etag: str | None) -> Any:
        raise NotImplementedError

    def _read_body(self, body: Any, n: int) -> bytes:
        return body.read(n)

    def _close_body(self, body: Any) -> None:
        body.close()

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        raise NotImplementedError

    def _errors(self, key: str, action: str) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _page(self, prefix: str, delimiter: str, token: str | None) -> Page:
        """One listing call: (objects, common prefixes, the next page's token or None)."""
        raise NotImplementedError

    #: threads of a recursive listing (sub-prefixes listed at once); 1: one serial listing
    list_workers: int = 8

    def _pages(self) -> Iterator[Iterable[tuple[str, int, datetime, str | None]]]:
        scope = self.scope
        return parallel_pages(self._page, scope.prefix, recursive=scope.recursive,
                              workers=self.list_workers)

    #: SDK errors a body may raise mid-read (besides `ConnectorError`s)
    stream_errors: ClassVar[tuple[type[BaseException], ...]] = (OSError,)

    # -- ObjectReader ---------------------------------------------------------------------------
    def key(self, relative_path: str) -> str:
        return self.scope.key(relative_path)

    def url(self, relative_path: str) -> str:
        return self.scope.url(relative_path)

    def open(self, relative_path: str) -> io.BufferedReader:
        """Open an object as a streamed, seekable binary file.

        The GET happens here, so a missing object raises at once. A body cut off mid-read is
        resumed at the same byte with a ranged GET pinned to the first ETag.

        Raises:
            ObjectNotFoundError: the object does not exist.
            CredentialsError: no credentials, or the store rejected them.
            ConnectorError: any other failure after retries (also: it changed mid-read).
        """
        return io.BufferedReader(ObjectStream(self, self.key(relative_path)),
                                 buffer_size=1 << 20)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        """Read up to `length` bytes from offset `start` (fewer at the end, b"" past it)."""
        if start < 0 or length < 0:
            raise ValueError(f"start and length must be >= 0: {start}, {length}")
        key = self.key(relative_path)
        if length == 0:
            return b""
        with self._errors(key, "GetObject"):
            return RETRY(lambda: self._get_range(key, start, length))()

    # -- Lister -------------------------------------------------------------------------------
    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield the volume's files in `LISTING_SCHEMA`, one batch per non-empty page.

        Keys that are not safe relative paths are skipped and counted in `malformed`."""
        self.malformed = 0
        for page in self._pages():
            batch = self._batch(page)
            if batch.num_rows:
                yield batch

    def _batch(self, objects: Iterable[tuple[str, int, datetime, str | None]]) -> pa.RecordBatch:
        columns: dict[str, list[Any]] = {name: [] for name in LISTING_SCHEMA.names}
        scope = self.scope
        for key, size, modified, etag in objects:
            try:
                relative = scope.relative_path(scope.bucket, key)
            except InvalidPathError as exc:
                self.malformed = getattr(self, "malformed", 0) + 1
                self.log.warning("skipping %s: %s", f"{scope.scheme}://{scope.bucket}/{key}", exc)
                continue
            if relative is None:
                continue
            columns["relative_path"].append(relative)
            columns["size"].append(int(size))
            columns["last_modified_time"].append(modified.astimezone(UTC))
            columns["etag"].append(normalize_etag(etag))
        return pa.RecordBatch.from_pydict(columns, schema=LISTING_SCHEMA)


class ObjectStream(io.RawIOBase):
    """A raw, seekable stream over one GET body that reopens at its position if cut off."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__()
        self._store, self._key = store, key
        self.name = f"{store.scope.scheme}://{store.scope.bucket}/{key}"
        self._pos = 0
        self._body: Any = None
        with store._errors(key, "GetObject"):
            body, self._etag, self.size = RETRY(lambda: store._get(key))()
        self._body = body

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
        store = self._store
        for attempt in range(1, ATTEMPTS + 1):
            try:
                if self._body is None:
                    self._body = store._get_from(self._key, self._pos, self._etag)
                data = store._read_body(self._body, want)
                if not data:
                    raise TransientError(f"body ended at byte {self._pos} of {self.size}")
                break
            except (*store.stream_errors, ConnectorError) as exc:
                self._drop_body()
                if attempt == ATTEMPTS or not is_transient(exc):
                    self._fail(exc)
                store.log.info("read of %s cut off at byte %d (%s); resuming", self.name,
                               self._pos, type(exc).__name__)
                time.sleep(backoff_s(attempt))
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n

    def _fail(self, exc: BaseException) -> None:
        try:
            with self._store._errors(self._key, "GetObject"):
                raise exc
        except ConnectorError:
            raise
        except Exception:  # not an SDK error the store converts
            raise ConnectorError(f"reading {self.name} failed at byte {self._pos}: "
                                 f"{type(exc).__name__}: {exc}") from exc

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                self._store._close_body(body)
            except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                pass

    def close(self) -> None:
        self._drop_body()
        super().close()
