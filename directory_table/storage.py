"""pyarrow filesystems for the plain files next to Delta tables, built from delta-rs's
`storage_options` (DESIGN §3): the same endpoint, region and credentials reach delta-rs and
pyarrow. Options not given come from the standard `AWS_*` environment (profiles and roles
through the AWS SDK's default chain), so executors need nothing pickled but the non-secret
options.

    fs, path = filesystem_for("s3://bucket/wh/_catalog", {"AWS_ENDPOINT_URL": "http://h:9000"})
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from pyarrow import fs as pafs

__all__ = ["filesystem_for", "option"]


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
    return pafs.S3FileSystem(**kwargs)


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
