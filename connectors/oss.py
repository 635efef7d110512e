"""Old home of the OSS store; it lives in `connectors.alicloud.store` now (names kept)."""

from connectors.alicloud.store import (
    OssLister,
    OssReader,
    OssScope,
    normalize_etag,
    normalize_prefix,
    oss_url,
)

__all__ = ["OssLister", "OssReader", "OssScope", "normalize_etag", "normalize_prefix", "oss_url"]
