"""Google Cloud Storage for volumes: which objects belong to a volume, reading them, full
listings.

`GcsScope` decides whether an object belongs to a volume (bucket, prefix, recursion, suffix)
and turns it into the volume-relative path; the Pub/Sub listener and the lister share it so
events and refreshes agree. `GcsReader` (`ObjectReader`) and `GcsLister` (`Lister`, paginated
objects.list) are `connectors._objects.ObjectStore`s: the base pickles only the options, makes
the `google.cloud.storage.Client` lazily on the executor, resumes a read cut off mid-body and
retries transient errors; this module supplies the google-cloud-storage calls.

A read is pinned to the generation its first call found: the rest of it (ranged GETs of that
generation) fails with `ObjectChangedError` if the object was replaced meanwhile, instead of
mixing two versions. ETags are `connectors.gcp.events.etag_of` (the MD5 in hex) on both sides,
so a listing and the events agree.

    >>> reader = GcsReader("my-bucket", "images/")             # doctest: +SKIP
    >>> with reader.open("2024/cat.jpg") as f:                  # doctest: +SKIP
    ...     header = f.read(16)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import google.api_core.exceptions as gexc
import requests

from connectors._listing import Page
from connectors._objects import RETRY, ObjectStore
from connectors.errors import ObjectChangedError, ObjectNotFoundError
from connectors.gcp.client import GcpOptions, translate_errors
from connectors.gcp.events import etag_of
from connectors.scope import BucketScope

__all__ = ["GcsLister", "GcsReader", "GcsScope", "gs_url"]

logger = logging.getLogger("connectors.gcs")


class GcsScope(BucketScope):
    """A GCS volume's objects (see `connectors.scope.BucketScope`); URLs are `gs://bucket/key`.

    >>> GcsScope("bkt", "in").url("a b.csv")
    'gs://bkt/in/a b.csv'
    """

    scheme = "gs"


#: The `gs://bucket/key` URL of an object, name verbatim.
gs_url = GcsScope.object_url


class _Body:
    """One generation of an object read from `position` on, a ranged GET per `read`."""

    def __init__(self, blob: Any, position: int, timeout: float) -> None:
        self.blob, self.position, self.timeout = blob, position, timeout

    def read(self, n: int) -> bytes:
        try:
            data = self.blob.download_as_bytes(start=self.position, end=self.position + n - 1,
                                               raw_download=True, checksum=None,
                                               timeout=self.timeout)
        except gexc.NotFound as exc:  # the generation was replaced or deleted
            raise gexc.PreconditionFailed(f"generation {self.blob.generation} of "
                                          f"{self.blob.name} is gone") from exc
        self.position += len(data)
        return data

    def close(self) -> None:
        """Nothing is held open between reads."""


class _Gcs(ObjectStore):
    """What GcsReader and GcsLister share: the storage client and error conversion."""

    log: ClassVar[logging.Logger] = logger
    stream_errors = (gexc.GoogleAPIError, requests.RequestException)

    def __init__(self, scope: GcsScope, client_options: dict[str, Any]) -> None:
        self._options = GcpOptions.of(**client_options)
        self.scope = scope
        self.bucket, self.prefix = scope.bucket, scope.prefix

    def _make_client(self) -> Any:
        return self._options.storage_client()

    def _bucket(self) -> Any:
        return self.client.bucket(self.bucket)

    @contextlib.contextmanager
    def _errors(self, key: str, action: str) -> Iterator[None]:
        """`translate_errors`, plus: a missing object is `ObjectNotFoundError`; a generation
        gone while a read resumed, `ObjectChangedError`."""
        url = gs_url(self.bucket, key)
        with translate_errors("storage", f"{action} {url}", self._options):
            try:
                yield
            except gexc.NotFound as exc:
                raise ObjectNotFoundError(f"{url} does not exist") from exc
            except gexc.PreconditionFailed as exc:
                raise ObjectChangedError(f"{url} changed while it was being read") from exc

    def _get(self, key: str) -> tuple[Any, str | None, int]:
        blob = self._bucket().get_blob(key, timeout=self._options.timeout)
        if blob is None:
            raise gexc.NotFound(f"{key} not found")
        pinned = self._bucket().blob(key, generation=blob.generation)
        # the "etag" the base hands back to `_get_from` is the generation the read is pinned to
        return _Body(pinned, 0, self._options.timeout), str(blob.generation), int(blob.size or 0)

    def _get_from(self, key: str, position: int, etag: str | None) -> Any:
        try:
            blob = self._bucket().blob(key, generation=int(etag) if etag else None)
            body = _Body(blob, position, self._options.timeout)
            body.blob.reload(timeout=self._options.timeout)
        except gexc.NotFound as exc:  # that generation was replaced or deleted
            raise gexc.PreconditionFailed(f"generation {etag} of {key} is gone") from exc
        return body

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            return self._bucket().blob(key).download_as_bytes(
                start=start, end=start + length - 1, raw_download=True, checksum=None,
                timeout=self._options.timeout)
        except gexc.RequestRangeNotSatisfiable:
            return b""


class GcsReader(_Gcs):
    """Read the objects of one volume (`ObjectReader`); picklable for Spark executors.

    Args:
        bucket: The bucket.
        prefix: The volume's prefix ('' for the whole bucket).
        **client_options: `GcpOptions` fields (project, credentials_file, storage_endpoint).

    Example:
        >>> reader = GcsReader("bkt", "logs/", storage_endpoint="http://127.0.0.1:4443")
        >>> reader.key("2024/a.log")
        'logs/2024/a.log'
    """

    def __init__(self, bucket: str, prefix: str = "", **client_options: Any) -> None:
        super().__init__(GcsScope(bucket, prefix), client_options)

    def __repr__(self) -> str:
        return f"GcsReader(bucket={self.bucket!r}, prefix={self.prefix!r}, {self._options!r})"


class GcsLister(_Gcs):
    """List every file of a volume (`Lister`) with paginated objects.list calls.

    Folder markers and unsafe relative paths are skipped (the latter with a warning); with
    `recursive=False` only direct children are listed (delimiter '/'); a recursive listing
    lists sub-prefixes in parallel on `list_workers` threads (`connectors._listing`).

    Args:
        bucket: The bucket.
        prefix: The volume's prefix ('' for the whole bucket).
        recursive: List nested objects too.
        suffix: Keep only names ending with this (or one of these).
        page_size: Objects per call (at most 1000); one RecordBatch per page.
        list_workers: Threads listing sub-prefixes at once (1: one serial listing).
        **client_options: `GcpOptions` fields.
    """

    def __init__(self, bucket: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 1000,
                 list_workers: int = 8, **client_options: Any) -> None:
        super().__init__(GcsScope(bucket, prefix, recursive, suffix), client_options)
        if not 1 <= page_size <= 1000 or list_workers < 1:
            raise ValueError(f"need page_size in 1..1000 and list_workers >= 1: {page_size}, "
                             f"{list_workers}")
        self.page_size, self.list_workers = page_size, list_workers

    def __repr__(self) -> str:
        return f"GcsLister({self.scope!r}, page_size={self.page_size}, {self._options!r})"

    def _page(self, prefix: str, delimiter: str, token: str | None) -> Page:
        def call() -> Page:
            listing = self.client.list_blobs(
                self.bucket, prefix=prefix, delimiter=delimiter or None,
                max_results=self.page_size, page_token=token, timeout=self._options.timeout,
                fields="items(name,size,updated,md5Hash,crc32c),prefixes,nextPageToken")
            page = next(listing.pages)
            objects = [(blob.name, int(blob.size or 0), blob.updated,
                        etag_of(blob.md5_hash, blob.crc32c)) for blob in page]
            return objects, sorted(page.prefixes), listing.next_page_token

        with translate_errors("storage", f"objects.list {gs_url(self.bucket, prefix)}",
                              self._options):
            return RETRY(call)()
