"""Amazon S3 for volumes: which keys belong to a volume, reading objects, full listings.

`S3Scope` decides whether a key belongs to a volume (bucket, prefix, recursion, suffix) and
turns it into the volume-relative path; the SQS listener and the lister share it so events and
refreshes agree. `S3Reader` implements `ObjectReader` for the UDF pipelines and `S3Lister`
implements `Lister` with paginated ListObjectsV2, both on `connectors._objects.ObjectStore`
(lazy picklable client, resumable reads pinned with `If-Match`, one retry policy): this module
supplies only the boto3 calls.

ETags are unquoted everywhere (`normalize_etag`): S3 events carry `d41d8...`, ListObjects and
HeadObject carry `"d41d8..."`; multipart ETags keep their `-N` suffix.

    >>> reader = S3Reader("my-bucket", "images/")              # doctest: +SKIP
    >>> with reader.open("2024/cat.jpg") as f:                  # doctest: +SKIP
    ...     header = f.read(16)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, ClassVar

import botocore.exceptions as bce

from connectors._listing import Page
from connectors._objects import RETRY, ObjectStore, normalize_etag
from connectors.aws.client import ClientOptions, error_code, translate_errors
from connectors.errors import ObjectChangedError, ObjectNotFoundError
from connectors.scope import BucketScope, normalize_prefix

__all__ = ["S3Lister", "S3Reader", "S3Scope", "normalize_etag", "normalize_prefix", "s3_url"]

logger = logging.getLogger("connectors.s3")

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


class S3Scope(BucketScope):
    """An S3 volume's keys (see `connectors.scope.BucketScope`); URLs are `s3://bucket/key`.

    >>> S3Scope("bkt", "in").url("a b.csv"), s3_url("bkt", "dir/a b+c.txt")
    ('s3://bkt/in/a b.csv', 's3://bkt/dir/a b+c.txt')
    """

    scheme = "s3"


#: The `s3://bucket/key` URL of an object, key verbatim (no percent-encoding).
s3_url = S3Scope.object_url


class _S3(ObjectStore):
    """What S3Reader and S3Lister share: the boto3 client and error conversion."""

    log: ClassVar[logging.Logger] = logger
    stream_errors = (bce.BotoCoreError, bce.ClientError)

    def __init__(self, scope: S3Scope, client_options: dict[str, Any]) -> None:
        self._options = ClientOptions.of(**client_options)
        self.scope = scope
        self.bucket, self.prefix = scope.bucket, scope.prefix

    def _make_client(self) -> Any:
        return self._options.client("s3")

    @contextlib.contextmanager
    def _errors(self, key: str, action: str) -> Iterator[None]:
        """`translate_errors`, plus: a missing object is `ObjectNotFoundError`, a changed one
        (If-Match failed while resuming) a `ConnectorError` saying so."""
        url = s3_url(self.bucket, key)
        with translate_errors("s3", f"{action} {url}", self._options):
            try:
                yield
            except bce.ClientError as exc:
                code = error_code(exc)
                if code in _NOT_FOUND_CODES:
                    raise ObjectNotFoundError(f"{url} does not exist") from exc
                if code == "PreconditionFailed":
                    raise ObjectChangedError(f"{url} changed while it was being read") from exc
                raise


class S3Reader(_S3):
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
        super().__init__(S3Scope(bucket, prefix), client_options)

    def __repr__(self) -> str:
        return f"S3Reader(bucket={self.bucket!r}, prefix={self.prefix!r}, {self._options!r})"

    def _get(self, key: str) -> tuple[Any, str | None, int]:
        response = self.client.get_object(Bucket=self.bucket, Key=key)
        return response["Body"], response.get("ETag"), int(response["ContentLength"])

    def _get_from(self, key: str, position: int, etag: str | None) -> Any:
        kwargs = {"IfMatch": etag} if etag else {}
        return self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={position}-",
                                      **kwargs)["Body"]

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key,
                                              Range=f"bytes={start}-{start + length - 1}")
        except bce.ClientError as exc:
            if error_code(exc) == "InvalidRange":
                return b""
            raise
        with response["Body"] as body:
            return body.read()


class S3Lister(_S3):
    """List every file of a volume (`Lister`) with paginated ListObjectsV2.

    Folder markers and keys whose relative path is unsafe ('..' segments, '//') are skipped;
    the latter with a warning. With `recursive=False` only direct children are listed
    (Delimiter='/'); a recursive listing lists sub-prefixes in parallel on `list_workers`
    threads (`connectors._listing`).

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        recursive: List nested keys too.
        suffix: Keep only keys ending with this (or one of these).
        page_size: Keys per ListObjectsV2 call (at most 1000); one RecordBatch per page.
        list_workers: Threads listing sub-prefixes at once (1: one serial listing).
        **client_options: `ClientOptions` fields.

    Example:
        >>> lister = S3Lister("bkt", "in/", recursive=False)        # doctest: +SKIP
        >>> table = pa.Table.from_batches(lister.list(), schema=LISTING_SCHEMA)  # doctest: +SKIP
    """

    def __init__(self, bucket: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 1000,
                 list_workers: int = 8, **client_options: Any) -> None:
        super().__init__(S3Scope(bucket, prefix, recursive, suffix), client_options)
        if not 1 <= page_size <= 1000 or list_workers < 1:
            raise ValueError(f"need page_size in 1..1000 and list_workers >= 1: {page_size}, "
                             f"{list_workers}")
        self.page_size = page_size
        self.list_workers = list_workers

    def __repr__(self) -> str:
        return f"S3Lister({self.scope!r}, page_size={self.page_size}, {self._options!r})"

    def _page(self, prefix: str, delimiter: str, token: str | None) -> Page:
        kwargs: dict[str, Any] = {"Bucket": self.scope.bucket, "Prefix": prefix,
                                  "MaxKeys": self.page_size}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if token:
            kwargs["ContinuationToken"] = token
        with translate_errors("s3", f"ListObjectsV2 {s3_url(self.scope.bucket, prefix)}",
                              self._options):
            page = RETRY(lambda: self.client.list_objects_v2(**kwargs))()
        objects = [(obj["Key"], obj["Size"], obj["LastModified"], obj.get("ETag"))
                   for obj in page.get("Contents", ())]
        prefixes = [p["Prefix"] for p in page.get("CommonPrefixes", ())]
        return objects, prefixes, page.get("NextContinuationToken") if page.get(
            "IsTruncated") else None
