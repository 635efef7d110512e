"""Which keys of which bucket make up a volume, shared by the object-store connectors.

An S3 or OSS volume is a bucket, a key prefix, recursion and an optional suffix filter; its
files' paths are the keys relative to the prefix. Listeners use `relative_path` to drop events
that are not the volume's; readers use `key` to go back; `url` is the directory table's `url`.

    >>> scope = BucketScope("bkt", "in", recursive=False, suffix=".csv")
    >>> scope.relative_path("bkt", "in/a.csv"), scope.relative_path("bkt", "in/x/a.csv")
    ('a.csv', None)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from connectors.events import validate_relative_path

__all__ = ["BucketScope", "normalize_prefix"]


def normalize_prefix(prefix: str | None) -> str:
    """A volume prefix as a folder: no leading '/', one trailing '/', '' for a whole bucket.

    Example:
        >>> normalize_prefix("/logs/2024")
        'logs/2024/'
    """
    prefix = (prefix or "").lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if prefix:
        validate_relative_path(prefix)
    return prefix


@dataclass(frozen=True)
class BucketScope:
    """A volume's bucket, prefix, recursion and suffix filter (see the module docstring)."""

    scheme: ClassVar[str] = "bucket"

    bucket: str
    prefix: str = ""
    recursive: bool = True
    suffix: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.bucket:
            raise ValueError("bucket must not be empty")
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))
        if isinstance(self.suffix, list):
            object.__setattr__(self, "suffix", tuple(self.suffix))

    def relative_path(self, bucket: str, key: str, *, validate: bool = True) -> str | None:
        """The path of `key` relative to the volume, or None when it is not a file of it.

        Returns None for another bucket, a key outside the prefix, a folder marker (a key
        ending in '/'), a nested key when not recursive, or a key without the suffix.
        `validate=False` skips the safety check, for callers that build a `FileEvent` (which
        checks the path itself) and so would check every key twice.

        Raises:
            InvalidPathError: the key is in the volume but its relative path could escape or
                alias another key ('..' or '.' segments, '//', control characters).
        """
        if bucket != self.bucket or not key.startswith(self.prefix):
            return None
        relative = key[len(self.prefix):]
        if not relative or relative.endswith("/"):
            return None
        if not self.recursive and "/" in relative:
            return None
        if self.suffix and not relative.endswith(self.suffix):
            return None
        return validate_relative_path(relative) if validate else relative

    def key(self, relative_path: str) -> str:
        """The object key of a volume-relative path (validated)."""
        return self.prefix + validate_relative_path(relative_path)

    def url(self, relative_path: str) -> str:
        """The `scheme://bucket/key` URL of a volume-relative path (key verbatim)."""
        return self.object_url(self.bucket, self.key(relative_path))

    @classmethod
    def object_url(cls, bucket: str, key: str) -> str:
        """The `scheme://bucket/key` URL of any object, key verbatim (no percent-encoding)."""
        return f"{cls.scheme}://{bucket}/{key}"
