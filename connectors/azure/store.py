"""Azure Blob Storage (and ADLS Gen2) for volumes: which blobs belong to a volume, reading them,
full listings.

`AzureScope` decides whether a blob belongs to a volume (account, container, prefix, recursion,
suffix) and names it with the volume's own URL form: `abfss://<container>@<account>.dfs.core.
windows.net/<name>` or `az://<container>/<name>`. `AzureReader` (`ObjectReader`) and
`AzureLister` (`Lister`, paged List Blobs) are `connectors._objects.ObjectStore`s on
azure-storage-blob's `ContainerClient`: the base pickles the options alone, builds the client
lazily on the executor, resumes a read cut off mid-body at the same byte pinned to the first
ETag (`If-Match`), and retries transient errors; this module supplies the SDK calls.

On an account with a hierarchical namespace the Blob API lists directories as empty blobs
with the metadata `hdi_isfolder=true`: the lister skips them. ETags are unquoted everywhere
(`"0x8DC..."` -> `0x8DC...`), as Event Grid's `data.eTag` is, so events and listings agree.

    >>> AzureScope("c", "in", account="acct", url_scheme="abfss").url("a b.csv")
    'abfss://c@acct.dfs.core.windows.net/in/a b.csv'
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError

from connectors._listing import Page
from connectors._objects import RETRY, ObjectStore
from connectors.azure.client import AzureOptions, error_code, translate_errors
from connectors.errors import ObjectChangedError, ObjectNotFoundError
from connectors.scope import BucketScope

__all__ = ["AzureLister", "AzureReader", "AzureScope"]

logger = logging.getLogger("connectors.azure")


@dataclass(frozen=True)
class AzureScope(BucketScope):
    """An Azure volume's blobs (see `connectors.scope.BucketScope`; `bucket` is the container).

    `account` (None: unknown, any account's events are taken) and `url_scheme` ("abfss", "az")
    only shape URLs and filter events of other accounts."""

    scheme: ClassVar[str] = "az"

    account: str | None = None
    url_scheme: str = "az"
    dfs_suffix: str = "dfs.core.windows.net"

    def url(self, relative_path: str) -> str:
        key = self.key(relative_path)
        if self.url_scheme == "abfss":
            return f"abfss://{self.bucket}@{self.account}.{self.dfs_suffix}/{key}"
        return f"az://{self.bucket}/{key}"


class _Azure(ObjectStore):
    """What AzureReader and AzureLister share: the container client and error conversion."""

    log: ClassVar[logging.Logger] = logger
    stream_errors = (HttpResponseError, ConnectionError, TimeoutError)

    def __init__(self, scope: AzureScope, client_options: dict[str, Any]) -> None:
        options = dict(client_options)
        if scope.account and not options.get("account_name"):
            options["account_name"] = scope.account
        self._options = AzureOptions.of(**options)
        self.scope = scope
        self.bucket, self.prefix = scope.bucket, scope.prefix

    def _make_client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        options = self._options.with_environment()
        with translate_errors("blob", "create client", options):
            service = BlobServiceClient(options.endpoint("blob"),
                                        credential=options.credential(),
                                        **options.client_kwargs())
            return service.get_container_client(self.bucket)

    def _url(self, key: str) -> str:
        return f"az://{self.bucket}/{key}"

    @contextlib.contextmanager
    def _errors(self, key: str, action: str) -> Iterator[None]:
        """`translate_errors`, plus: a missing blob is `ObjectNotFoundError`, a changed one
        (If-Match failed while resuming) `ObjectChangedError`."""
        url = self._url(key)
        with translate_errors("blob", f"{action} {url}", self._options):
            try:
                yield
            except ResourceNotFoundError as exc:
                raise ObjectNotFoundError(f"{url} does not exist ({error_code(exc)})") from exc
            except ResourceModifiedError as exc:
                raise ObjectChangedError(f"{url} changed while it was being read") from exc


class _Body:
    """A download's chunks read as a file (`StorageStreamDownloader.read(n)`)."""

    def __init__(self, downloader: Any) -> None:
        self.downloader = downloader

    def read(self, n: int) -> bytes:
        return self.downloader.read(n)

    def close(self) -> None:
        self.downloader = None


class AzureReader(_Azure):
    """Read the blobs of one volume (`ObjectReader`); picklable for Spark executors.

    Args:
        container: The container (an ADLS Gen2 file system).
        prefix: The volume's prefix ('' for the whole container).
        account: The storage account (else from the options or the environment).
        **client_options: `AzureOptions` fields (endpoints, credentials...).

    Example:
        >>> reader = AzureReader("c", "logs/", account="acct")
        >>> reader.key("2024/a.log")
        'logs/2024/a.log'
    """

    def __init__(self, container: str, prefix: str = "", *, account: str | None = None,
                 **client_options: Any) -> None:
        super().__init__(AzureScope(container, prefix, account=account), client_options)

    def __repr__(self) -> str:
        return (f"AzureReader(container={self.bucket!r}, prefix={self.prefix!r}, "
                f"{self._options!r})")

    def _get(self, key: str) -> tuple[Any, str | None, int]:
        downloader = self.client.download_blob(key, max_concurrency=1)
        return _Body(downloader), downloader.properties.etag, int(downloader.size)

    def _get_from(self, key: str, position: int, etag: str | None) -> Any:
        kwargs: dict[str, Any] = {"etag": etag, "match_condition": MatchConditions.IfNotModified} \
            if etag else {}
        return _Body(self.client.download_blob(key, offset=position, max_concurrency=1,
                                               **kwargs))

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            return self.client.download_blob(key, offset=start, length=length,
                                             max_concurrency=1).readall()
        except HttpResponseError as exc:
            if exc.status_code == 416:  # start at or past the end
                return b""
            raise


class AzureLister(_Azure):
    """List every file of a volume (`Lister`) with paged List Blobs.

    Directories of a hierarchical namespace (`hdi_isfolder`), folder markers and names whose
    relative path is unsafe are skipped, the latter with a warning. A recursive listing lists
    sub-prefixes in parallel on `list_workers` threads (`connectors._listing`).

    Args:
        container: The container.
        prefix: The volume's prefix ('' for the whole container).
        recursive: List nested blobs too.
        suffix: Keep only names ending with this (or one of these).
        page_size: Blobs per List Blobs call (at most 5000).
        list_workers: Threads listing sub-prefixes at once (1: one serial listing).
        account: The storage account.
        **client_options: `AzureOptions` fields.
    """

    def __init__(self, container: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 5000,
                 list_workers: int = 8, account: str | None = None,
                 **client_options: Any) -> None:
        if not 1 <= page_size <= 5000 or list_workers < 1:
            raise ValueError(f"need page_size in 1..5000 and list_workers >= 1: {page_size}, "
                             f"{list_workers}")
        super().__init__(AzureScope(container, prefix, recursive, suffix, account=account),
                         client_options)
        self.page_size, self.list_workers = page_size, list_workers

    def __repr__(self) -> str:
        return f"AzureLister({self.scope!r}, page_size={self.page_size}, {self._options!r})"

    def _page(self, prefix: str, delimiter: str, token: str | None) -> Page:
        def call() -> Page:
            if delimiter:
                pages = self.client.walk_blobs(name_starts_with=prefix or None,
                                               delimiter=delimiter, include=["metadata"],
                                               results_per_page=self.page_size)
            else:
                pages = self.client.list_blobs(name_starts_with=prefix or None,
                                               include=["metadata"],
                                               results_per_page=self.page_size)
            pager = pages.by_page(continuation_token=token)
            items = list(next(pager, []))
            objects, prefixes = [], []
            for item in items:
                if not hasattr(item, "size"):  # a BlobPrefix: a "folder" of the walk
                    prefixes.append(item.name)
                elif (item.metadata or {}).get("hdi_isfolder", "").lower() != "true":
                    objects.append((item.name, item.size, item.last_modified, item.etag))
            return objects, prefixes, pager.continuation_token or None

        with translate_errors("blob", f"List Blobs {self._url(prefix)}", self._options):
            return RETRY(call)()
