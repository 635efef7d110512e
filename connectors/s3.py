"""Old home of the S3 store; it lives in `connectors.aws.store` now (names kept)."""

from connectors.aws.store import (
    S3Lister,
    S3Reader,
    S3Scope,
    normalize_etag,
    normalize_prefix,
    s3_url,
)

__all__ = ["S3Lister", "S3Reader", "S3Scope", "normalize_etag", "normalize_prefix", "s3_url"]
