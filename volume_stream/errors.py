"""Every error volume-stream raises on purpose, in one tree.

    VolumeStreamError
    ├── NotFoundError            unknown volume / stream / table (names what exists)
    ├── AlreadyExistsError       a name is taken and replace=False
    ├── StaleStreamError         the stream's offset is older than the oldest kept version
    ├── ConsumeConflictError     another consumer moved the offset first
    ├── InvalidInputError        bad argument: mode, name, path, location (also a ValueError)
    ├── SqlError                 (volume_stream.sql) a statement failed
    │   └── SqlSyntaxError       names line, column and what was expected (also InvalidInputError)
    ├── ConfigError              bad or missing configuration, credentials
    └── WarehouseError           the warehouse folder is corrupt or not a warehouse

Third-party errors are converted at the edge with `raise ... from exc`, so callers catch these.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "AlreadyExistsError",
    "ConfigError",
    "ConsumeConflictError",
    "InvalidInputError",
    "NotFoundError",
    "StaleStreamError",
    "VolumeStreamError",
    "WarehouseError",
]


class VolumeStreamError(Exception):
    """Base of every volume-stream error."""


class NotFoundError(VolumeStreamError, LookupError):
    """An object does not exist. The message lists the objects of that kind that do."""

    def __init__(self, kind: str, name: str, existing: Iterable[str] = ()):
        existing = sorted(existing)
        shown = ", ".join(existing) if existing else "none"
        super().__init__(f"{kind} {name!r} does not exist (existing {kind}s: {shown})")
        self.kind, self.name, self.existing = kind, name, existing


class AlreadyExistsError(VolumeStreamError):
    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name!r} already exists; pass replace=True to replace it")
        self.kind, self.name = kind, name


class StaleStreamError(VolumeStreamError):
    def __init__(self, stream: str, offset: int, oldest: int):
        super().__init__(
            f"stream {stream!r} is stale: its offset is version {offset} but the oldest kept "
            f"version is {oldest} (older versions were removed by retention); recreate the "
            f"stream (optionally with show_initial_rows=True) to start again"
        )
        self.stream, self.offset, self.oldest = stream, offset, oldest


class ConsumeConflictError(VolumeStreamError):
    def __init__(self, stream: str, expected: int, found: int):
        super().__init__(
            f"stream {stream!r}: another consumer committed first (this batch started at "
            f"offset {expected}, the offset is now {found}); the offset was not moved again"
        )
        self.stream, self.expected, self.found = stream, expected, found


class InvalidInputError(VolumeStreamError, ValueError):
    """A bad argument; the message says what is allowed."""


class ConfigError(VolumeStreamError):
    """Bad or missing configuration or credentials."""


class WarehouseError(VolumeStreamError):
    """The warehouse folder is not a volume-stream warehouse or is damaged."""
