"""Alibaba Cloud OSS for volumes: which keys belong to a volume, reading objects, full listings.

`OssScope` decides whether a key belongs to a volume (bucket, prefix, recursion, suffix) and
turns it into the volume-relative path; the MNS listener and the lister share it so events and
refreshes agree. `OssReader` (`ObjectReader`) and `OssLister` (`Lister`, paginated
ListObjectsV2) are `connectors._objects.ObjectStore`s: the base pickles only the options (never
a client or a secret read from the environment), builds the `oss2.Bucket` lazily on the
executor, resumes a read cut off mid-body at the same byte with `If-Match` after a jittered
back-off, and retries calls on transient errors; this module supplies the oss2 calls.

ETags are unquoted everywhere (`normalize_etag`) and keep OSS's upper-case hex: events carry
`5D41...`, ListObjects/HeadObject `"5D41..."`; multipart ETags keep their `-N` suffix.

    >>> endpoint = "https://oss-cn-hangzhou.aliyuncs.com"
    >>> reader = OssReader("my-bucket", "images/", endpoint)   # doctest: +SKIP
    >>> with reader.open("2024/cat.jpg") as f:                  # doctest: +SKIP
    ...     header = f.read(16)
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime
from typing import Any, ClassVar

import oss2
import requests

from connectors._listing import Page
from connectors._objects import RETRY, ObjectStore, normalize_etag
from connectors.alicloud.client import AliCloudOptions, translate_oss_errors
from connectors.alicloud.sts import AliRole
from connectors.scope import BucketScope, normalize_prefix

__all__ = ["OssLister", "OssReader", "OssScope", "normalize_etag", "normalize_prefix", "oss_url"]

logger = logging.getLogger("connectors.oss")

_RANGE_HEADERS = {"x-oss-range-behavior": "standard"}


class OssScope(BucketScope):
    """Which keys of an OSS bucket a volume holds; `oss_url(bucket, key)` names any object.

    >>> (OssScope("bkt", "in").url("a b.csv"), oss_url("bkt", "a+b"))
    ('oss://bkt/in/a b.csv', 'oss://bkt/a+b')
    """

    scheme = "oss"


oss_url = OssScope.object_url  # the URL of an object, key verbatim


class _Oss(ObjectStore):
    """What OssReader and OssLister share: the `oss2.Bucket` and error conversion."""

    log: ClassVar[logging.Logger] = logger
    #: errors of a body cut off mid-read (requests wraps urllib3's in ChunkedEncodingError)
    stream_errors = (requests.exceptions.RequestException, oss2.exceptions.OssError,
                     ConnectionError, TimeoutError)

    def __init__(self, scope: OssScope, endpoint: str, access_key_id: str | None,
                 access_key_secret: str | None, security_token: str | None,
                 connect_timeout: float | None, is_path_style: bool,
                 role: dict[str, Any] | None = None) -> None:
        if not endpoint:
            raise ValueError("endpoint is required, e.g. 'https://oss-cn-hangzhou.aliyuncs.com'")
        if not endpoint.startswith(("http://", "https://")):
            endpoint = "https://" + endpoint
        self.endpoint = endpoint
        self._options = AliCloudOptions(access_key_id, access_key_secret, security_token)
        #: a RAM role to assume through STS (its credentials sign every request)
        self._role = AliRole.of(self._options, **(role or {}))
        self._client_key: str | None = None
        self._connect_timeout, self._is_path_style = connect_timeout, is_path_style
        self.scope = scope
        self.bucket, self.prefix = scope.bucket, scope.prefix

    @property
    def client(self) -> oss2.Bucket:
        """The oss2 bucket; with a role, made again whenever the role's credentials were
        refreshed (they are assumed again `role_refresh_seconds` before expiry)."""
        if self._role is None:
            return super().client
        with translate_oss_errors("STS AssumeRole for", oss_url(self.bucket, self.prefix)):
            creds = self._role.credentials()
        with self._lock:
            if self._client is None or self._client_key != creds.access_key_id:
                self._client, self._client_key = self._make_client(creds), creds.access_key_id
            return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_client_key"] = None  # the role is assumed again where the reader is used
        return state

    def _make_client(self, creds: Any = None) -> oss2.Bucket:
        creds = creds or self._options.credentials()
        auth = (oss2.StsAuth(creds.access_key_id, creds.access_key_secret, creds.security_token)
                if creds.security_token else oss2.Auth(creds.access_key_id, creds.access_key_secret))
        return oss2.Bucket(auth, self.endpoint, self.bucket, connect_timeout=self._connect_timeout,
                           is_path_style=self._is_path_style)

    def _errors(self, key: str, action: str) -> contextlib.AbstractContextManager[None]:
        return translate_oss_errors(action, oss_url(self.bucket, key))


class OssReader(_Oss):
    """Read the objects of one volume (`ObjectReader`); picklable for Spark executors.

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        endpoint: The OSS endpoint, e.g. "https://oss-cn-hangzhou.aliyuncs.com".
        access_key_id, access_key_secret, security_token: Explicit credentials (pickled with
            the reader); by default the ALIBABA_CLOUD_* variables of the process that reads.
        connect_timeout: Seconds for oss2's connect/read timeout (oss2's default: 60).
        is_path_style: Force path-style addressing (automatic for IP/localhost endpoints).
        role_arn, role_session_name, role_duration_seconds, role_refresh_seconds, sts_endpoint:
            A RAM role to assume through STS (`connectors.alicloud.sts.AliRole`) with the
            credentials above; its temporary credentials sign the requests (oss2.StsAuth).

    Example:
        >>> reader = OssReader("bkt", "logs/", "http://127.0.0.1:9000")
        >>> reader.key("2024/a.log")
        'logs/2024/a.log'
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint: str = "", *,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, connect_timeout: float | None = None,
                 is_path_style: bool = False, **role: Any) -> None:
        super().__init__(OssScope(bucket, prefix), endpoint, access_key_id, access_key_secret,
                         security_token, connect_timeout, is_path_style, role)

    def __repr__(self) -> str:
        return (f"OssReader(bucket={self.bucket!r}, prefix={self.prefix!r}, "
                f"endpoint={self.endpoint!r}, {self._options!r})")

    def _get(self, key: str) -> tuple[Any, str | None, int]:
        result = self.client.get_object(key)
        return result, result.etag, int(result.content_length)

    def _get_from(self, key: str, position: int, etag: str | None) -> Any:
        headers = dict(_RANGE_HEADERS)
        if etag:
            headers["If-Match"] = f'"{etag}"'
        return self.client.get_object(key, byte_range=(position, None), headers=headers)

    def _close_body(self, body: Any) -> None:
        body.resp.response.close()

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            result = self.client.get_object(key, byte_range=(start, start + length - 1),
                                            headers=dict(_RANGE_HEADERS))
        except oss2.exceptions.ServerError as exc:
            if exc.status == 416:  # start at or past the end
                return b""
            raise
        data = result.read()
        # without range support the whole object comes back with 200
        return data if result.status == 206 else data[start:start + length]


class OssLister(_Oss):
    """List every file of a volume (`Lister`) with paginated ListObjectsV2.

    Folder markers and keys whose relative path is unsafe ('..' segments, '//') are skipped,
    the latter with a warning. With `recursive=False` only direct children are listed
    (delimiter '/'); a recursive listing lists sub-prefixes in parallel on `list_workers`
    threads (`connectors._listing`).

    Args:
        bucket: The bucket.
        prefix: The volume's key prefix ('' for the whole bucket).
        endpoint: The OSS endpoint.
        recursive: List nested keys too.
        suffix: Keep only keys ending with this (or one of these).
        page_size: Keys per ListObjectsV2 call (at most 1000); one RecordBatch per page.
        access_key_id, access_key_secret, security_token, connect_timeout, is_path_style:
            As for `OssReader`.
        list_workers: Threads listing sub-prefixes at once (1: one serial listing).

    Example:
        >>> lister = OssLister("bkt", "in/", endpoint, recursive=False)   # doctest: +SKIP
        >>> table = pa.Table.from_batches(lister.list(), schema=LISTING_SCHEMA)  # doctest: +SKIP
    """

    def __init__(self, bucket: str, prefix: str = "", endpoint: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, *, page_size: int = 1000,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, connect_timeout: float | None = None,
                 is_path_style: bool = False, list_workers: int = 8, **role: Any) -> None:
        if not 1 <= page_size <= 1000 or list_workers < 1:
            raise ValueError(f"need page_size in 1..1000 and list_workers >= 1: {page_size}, "
                             f"{list_workers}")
        super().__init__(OssScope(bucket, prefix, recursive, suffix), endpoint, access_key_id,
                         access_key_secret, security_token, connect_timeout, is_path_style, role)
        self.page_size = page_size
        self.list_workers = list_workers

    def __repr__(self) -> str:
        return (f"OssLister({self.scope!r}, endpoint={self.endpoint!r}, "
                f"page_size={self.page_size}, {self._options!r})")

    def _page(self, prefix: str, delimiter: str, token: str | None) -> Page:
        with translate_oss_errors("ListObjectsV2", oss_url(self.scope.bucket, prefix)):
            result = RETRY(lambda: self.client.list_objects_v2(
                prefix=prefix, delimiter=delimiter, continuation_token=token or "",
                max_keys=self.page_size))()
        objects = [(obj.key, obj.size, datetime.fromtimestamp(obj.last_modified, UTC), obj.etag)
                   for obj in result.object_list]
        return (objects, list(result.prefix_list),
                result.next_continuation_token if result.is_truncated else None)
