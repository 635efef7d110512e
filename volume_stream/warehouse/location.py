"""Where a warehouse lives: a local folder or an object store, and the one storage layer over it
(DESIGN §3).

Delta tables (catalog, directory tables, tombstones, pipeline targets) are opened by delta-rs
with `storage_options` (delta-rs's keys: `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ALLOW_HTTP`,
...; when omitted, delta-rs reads the standard `AWS_*` environment, profiles and roles). The few
plain files (the marker, dead letters) go through `pyarrow.fs` built from the same options. A
warehouse on an object store never touches local disk.

    loc = Location.parse("s3://bucket/wh", {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000"})
    loc.join("_catalog")           # 's3://bucket/wh/_catalog'
    loc.write_text("x.json", "{}")
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from pyarrow import fs as pafs

from connectors.errors import ConnectorError, is_transient
from connectors.secrets import hide, is_secret, revealed
from directory_table.roles import RoleOptions, fresh, live_options
from directory_table.storage import filesystem_for, list_names, s3_client, split_s3
from volume_stream.errors import ConfigError, InvalidInputError, WarehouseError

__all__ = ["GCS_REFUSAL", "OSS_REFUSAL", "Location", "storage_error"]

#: why an `oss://` warehouse is refused (DESIGN §3.1, docs/object-storage.md)
OSS_REFUSAL = (
    "an oss:// warehouse is not supported: delta-rs has no OSS object store, and commits "
    "through OSS's S3-compatible API would not be safe (delta-rs makes a commit exclusive with "
    "If-None-Match, which OSS does not guarantee to honour; OSS's own x-oss-forbid-overwrite "
    "header cannot be sent by delta-rs). Keep the OSS volumes and put the warehouse on S3, "
    "HDFS or a shared disk")

#: why a `gs://` warehouse is refused for now (docs/object-storage.md)
GCS_REFUSAL = (
    "a gs:// warehouse is not supported yet: delta-rs writes GCS through its XML API, whose "
    "uploads the GCS emulator the tests run (fake-gcs-server) does not serve, so commits to "
    "GCS are untested. gs:// volumes work with any warehouse: keep the warehouse on S3, HDFS "
    "or a shared disk")

_SCHEMES = {"s3": "s3", "s3a": "s3", "hdfs": "hdfs", "viewfs": "hdfs"}
_CREDENTIAL_WORDS = ("InvalidAccessKeyId", "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch", "AccessDenied", "403",
                     "Forbidden", "ExpiredToken", "InvalidToken", "credential",
                     "ACCESS_DENIED")
_MISSING_WORDS = ("NoSuchBucket", "bucket does not exist", "NOT_FOUND")


def storage_error(uri: str, exc: BaseException, doing: str) -> Exception:
    """An error of the object store while `doing` something to warehouse `uri`, converted:
    bad or missing credentials -> ConfigError, anything else -> WarehouseError."""
    text = str(exc)
    if any(w.lower() in text.lower() for w in _MISSING_WORDS):
        return WarehouseError(f"warehouse {uri}: cannot {doing}: its bucket does not exist or "
                              f"is not visible with these credentials ({_short(text)})")
    if any(w.lower() in text.lower() for w in _CREDENTIAL_WORDS):
        return ConfigError(f"warehouse {uri}: cannot {doing}: the credentials were refused "
                           f"({_short(text)}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                           f"AWS_PROFILE or a role, or pass storage_options")
    return WarehouseError(f"warehouse {uri}: cannot {doing}: {_short(text)}")


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


_ENDPOINT_KEYS = ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
_ALLOW_HTTP_KEYS = ("aws_allow_http", "allow_http")


def _allow_http(options: dict[str, Any]) -> dict[str, Any]:
    """delta-rs refuses an `http://` endpoint unless told AWS_ALLOW_HTTP (its error, full of
    colour codes, named neither): an endpoint given as http:// says so already."""
    lower = {str(k).lower(): v for k, v in options.items()}
    endpoint = next((str(lower[k]) for k in _ENDPOINT_KEYS if k in lower), None) \
        or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    told = any(k in lower for k in _ALLOW_HTTP_KEYS) or "AWS_ALLOW_HTTP" in os.environ
    if endpoint and endpoint.lower().startswith("http://") and not told:
        return {**options, "AWS_ALLOW_HTTP": "true"}
    return options


@dataclass(frozen=True)
class Location:
    """A warehouse's root: `uri` is an absolute local path or `scheme://bucket/prefix` (no
    trailing `/`); `storage_options` are kept in memory only (never written, never logged),
    their secrets as `connectors.secrets.Secret` (masked, never pickled): `delta_options()`
    unwraps them for delta-rs, pyarrow and boto3."""

    uri: str
    scheme: str  # "file" | "s3" | "hdfs"
    storage_options: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, where: str | os.PathLike, storage_options: dict[str, Any] | None = None,
              *, what: str = "warehouse") -> Location:
        """The location of `where`: a local path, `file://...`, `s3://bucket/prefix` (also
        `s3a://`), `hdfs://...`. `oss://` and `gs://` are refused with the reason (OSS_REFUSAL,
        GCS_REFUSAL). A
        `role_arn` option (`AWS_ROLE_ARN`) makes the options a `RoleOptions`: the role is
        assumed through STS and its credentials refreshed before expiry (DESIGN §3.2).

        `what` is what errors call it: a warehouse's is a `ConfigError`; anything else's (a
        registered table's "location of table 't'") an `InvalidInputError`."""
        text = os.fspath(where)
        error = ConfigError if what == "warehouse" else InvalidInputError
        try:
            options = live_options(storage_options)
        except ConnectorError as exc:
            raise error(f"{what} {text}: {exc}") from exc
        if not isinstance(options, RoleOptions):
            options = hide(options)
        parsed = urlparse(text)
        scheme = parsed.scheme.lower() if len(parsed.scheme) > 1 else ""
        if isinstance(options, RoleOptions) and scheme not in ("s3", "s3a"):
            raise error(f"{what} {text}: role_arn applies to s3:// locations only")
        if scheme in ("", "file"):
            path = unquote(parsed.path) if scheme == "file" else text
            return cls(os.path.abspath(os.path.expanduser(path)), "file", options)
        if scheme == "oss":
            raise error(f"{what} {text}: " + (OSS_REFUSAL if what == "warehouse" else
                                              "oss:// is not supported: delta-rs has no OSS "
                                              "object store"))
        if scheme in ("gs", "gcs"):
            raise error(f"{what} {text}: {GCS_REFUSAL}")
        if scheme not in _SCHEMES:
            raise error(f"{what} {text}: unsupported scheme {scheme}://; use a local folder, "
                        f"file://, s3:// or hdfs://")
        if not parsed.netloc:
            raise error(f"{what} {text}: no bucket (expected {scheme}://bucket/prefix)")
        prefix = parsed.path.strip("/")
        kind = _SCHEMES[scheme]
        if kind == "s3" and not isinstance(options, RoleOptions):
            options = _allow_http(options)
        uri = f"{'s3' if kind == 's3' else scheme}://{parsed.netloc}"
        return cls(f"{uri}/{prefix}" if prefix else uri, kind, options)

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    def __str__(self) -> str:
        return self.uri

    def join(self, *parts: str) -> str:
        """`uri/part/...` (local paths joined with the OS separator). A part never leaves the
        root: '..' segments and NUL are refused (a leading '/' is relative to the root)."""
        for part in parts:
            self._inside(part)
        if self.is_local:
            return os.path.join(self.uri, *(p.lstrip("/") for p in parts))
        return "/".join([self.uri, *(p.strip("/") for p in parts)])

    # ------------------------------------------------------------------ plain files
    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem for the plain files and the root's path inside it."""
        return filesystem_for(self.uri, self.delta_options())

    def delta_options(self) -> dict[str, str]:
        """The options delta-rs gets (a local folder: none). With a role: the shared, live
        `RoleOptions`, its credentials refreshed if they near expiry (raises ConfigError naming
        the warehouse and the role when STS refuses)."""
        if not isinstance(self.storage_options, RoleOptions):
            return revealed(self.storage_options)
        try:
            return fresh(self.storage_options)
        except ConnectorError as exc:
            raise ConfigError(f"warehouse {self.uri}: {exc}") from exc

    def public_options(self) -> dict[str, str]:
        """The options without secrets: what may be pickled to executors (they take
        credentials from their own environment or role)."""
        return {k: v for k, v in self.storage_options.items() if not is_secret(k)}

    def _inside(self, relative: str) -> str:
        if "\0" in relative or ".." in relative.replace("\\", "/").split("/"):
            raise InvalidInputError(f"{relative!r} would leave {self.uri}: refused")
        return relative

    def _path(self, relative: str) -> tuple[pafs.FileSystem, str]:
        self._inside(relative)
        fs, base = self.filesystem()
        return fs, f"{base.rstrip('/')}/{relative}" if relative else base

    # On S3 the plain files go through boto3, not pyarrow's S3 (its AWS C++ SDK can abort a
    # process at exit: apache/arrow#34314); boto3's errors become OSError here. botocore retries
    # 5xx answers and resets, but not a body cut off while it is read: `_on_s3` retries every
    # transient failure (`connectors.errors.is_transient`) of a whole call a few times.
    def _on_s3(self, relative: str, call: Any, attempts: int = 6) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        import connectors.aws.client  # noqa: F401  (registers botocore's transient errors)

        bucket, prefix = split_s3(self.uri)
        key = "/".join(p for p in (prefix, relative) if p)
        for attempt in range(1, attempts + 1):
            try:
                return call(s3_client(self.delta_options()), bucket, key)
            except (BotoCoreError, ClientError) as exc:
                if attempt == attempts or not is_transient(exc):
                    raise OSError(f"{self.uri}/{relative}: {exc}") from exc
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def exists(self, relative: str = "") -> bool:
        if self.scheme == "s3":
            from botocore.exceptions import ClientError

            def head(s3: Any, bucket: str, key: str) -> bool:
                try:
                    s3.head_object(Bucket=bucket, Key=key)
                    return True
                except ClientError as exc:
                    if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                        return False
                    raise

            return self._on_s3(relative, head)
        fs, path = self._path(relative)
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    def read_text(self, relative: str) -> str:
        if self.scheme == "s3":
            return self._on_s3(relative, lambda s3, bucket, key: s3.get_object(
                Bucket=bucket, Key=key)["Body"].read().decode("utf-8"))
        fs, path = self._path(relative)
        with fs.open_input_stream(path) as f:
            return f.read().decode("utf-8")

    def write_text(self, relative: str, text: str) -> None:
        """Write a whole object (a local file appears atomically: written, then renamed)."""
        if self.scheme == "s3":
            self._on_s3(relative, lambda s3, bucket, key: s3.put_object(
                Bucket=bucket, Key=key, Body=text.encode("utf-8")))
            return
        fs, path = self._path(relative)
        if self.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.tmp-{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
            return
        with fs.open_output_stream(path) as f:
            f.write(text.encode("utf-8"))

    def create_text(self, relative: str, text: str) -> None:
        """Write `relative` only if it does not exist yet: of racing writers the first wins and
        the others keep what it wrote (S3: a conditional PUT; local: an exclusive create)."""
        if self.scheme == "s3":
            from botocore.exceptions import ClientError

            def put(s3: Any, bucket: str, key: str) -> None:
                try:
                    s3.put_object(Bucket=bucket, Key=key, Body=text.encode("utf-8"),
                                  IfNoneMatch="*")
                except ClientError as exc:  # someone (or our own cut-off try) wrote it first
                    code = exc.response.get("Error", {}).get("Code", "")
                    if code not in ("PreconditionFailed", "ConditionalRequestConflict"):
                        raise

            self._on_s3(relative, put)
            return
        if not self.is_local:
            if not self.exists(relative):
                self.write_text(relative, text)
            return
        fs, path = self._path(relative)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)

    def children(self, relative: str = "") -> list[str]:
        """The names directly under `relative` (empty if there is nothing)."""
        if self.scheme == "s3":
            return self._on_s3(relative, lambda *_: list_names(
                self.join(relative) if relative else self.uri, self.delta_options()))
        fs, path = self._path(relative)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return sorted(i.base_name for i in infos)

    def delete_tree(self, relative: str) -> None:
        """Remove everything under `relative` (best effort: missing is fine); never the root
        itself nor anything outside it."""
        if not self._inside(relative).strip("/"):
            raise InvalidInputError(f"refusing to delete the whole of {self.uri}")
        if self.scheme == "s3":
            def delete(s3: Any, bucket: str, key: str) -> None:
                pages = s3.get_paginator("list_objects_v2").paginate(
                    Bucket=bucket, Prefix=f"{key.rstrip('/')}/")
                for page in pages:
                    objects = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                    if objects:
                        s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})

            self._on_s3(relative, delete)
            return
        fs, path = self._path(relative)
        try:
            if fs.get_file_info(path).type == pafs.FileType.NotFound:
                return
            fs.delete_dir(path)
        except OSError:
            pass
