"""The one event type every listener emits, and the rules for ordering events.

A listener (local inotify, SQS, MNS) turns whatever its source says into `FileEvent`s; the
directory table only ever sees this type (DESIGN §4.1). Ordering follows §4.2: when both events
carry an S3-style `sequencer` they are compared as AWS specifies (hex strings, the shorter one
right-padded with zeros); otherwise the event time decides, and the caller breaks ties by
arrival order.

    >>> e = FileEvent.created("a/b.txt", size=3, last_modified_time=utc_now())
    >>> e.kind is EventKind.CREATED
    True
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import InvalidPathError

__all__ = [
    "EventKind",
    "FileEvent",
    "InvalidPathError",
    "compare_sequencers",
    "is_newer",
    "utc_now",
    "validate_relative_path",
]


class EventKind(enum.StrEnum):
    CREATED = "CREATED"
    REMOVED = "REMOVED"


def utc_now() -> datetime:
    return datetime.now(UTC)


#: a backslash or a control character (C0 or DEL) anywhere in a path
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\]")


def validate_relative_path(path: str) -> str:
    """Return `path` if it is a safe '/'-separated relative key, else raise `InvalidPathError`.

    A trailing '/' (a folder marker) is allowed here; the directory table ignores such keys.
    Spaces, '+', and any unicode are fine. '.' and '..' segments, empty segments, a leading
    '/', backslashes and control characters are not: they could escape the volume or alias
    another key.
    """
    if not isinstance(path, str) or not path:
        raise InvalidPathError(f"empty relative path: {path!r}")
    if path.startswith("/"):
        raise InvalidPathError(f"relative path must not start with '/': {path!r}")
    # one regex scan: a generator over the characters cost ~8 us for an 18-character path
    # against ~2 for all of this function, which every event of a queue pays
    if _FORBIDDEN.search(path):
        raise InvalidPathError(f"relative path contains a backslash or control character: {path!r}")
    body = path[:-1] if path.endswith("/") else path
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidPathError(
                f"relative path has an empty, '.' or '..' segment: {path!r}"
            )
    return path


#: every path `validate_relative_path` refuses matches (an empty, '.' or '..' segment, a leading
#: '/', a backslash or a control character); a column is checked with it, and only the few
#: paths it matches one by one
_SUSPECT = r"^$|^/|//|(^|/)\.\.?(/|$)|[\x00-\x1f\x7f\\]"


def valid_paths(paths: pa.Array | pa.ChunkedArray,
                refused: Callable[[str | None, InvalidPathError], None] | None = None,
                ) -> np.ndarray:
    """Per path of a column, whether `validate_relative_path` takes it (a null: no);
    `refused(path, error)` is told of each path it refuses, with the reason."""
    suspect = pc.fill_null(pc.match_substring_regex(paths, _SUSPECT), True)
    ok = ~suspect.to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(~ok).tolist():
        path = paths[i].as_py()
        try:
            validate_relative_path(path)
            ok[i] = True
        except InvalidPathError as exc:
            if refused is not None:
                refused(path, exc)
    return ok


def compare_sequencers(a: str, b: str) -> int:
    """Compare two S3 event sequencers: -1, 0 or 1.

    AWS: sequencers are hexadecimal strings of possibly different lengths; right-pad the
    shorter one with zeros, then compare lexicographically (case-insensitively).
    """
    width = max(len(a), len(b))
    pa, pb = a.upper().ljust(width, "0"), b.upper().ljust(width, "0")
    return (pa > pb) - (pa < pb)


def is_newer(
    sequencer: str | None,
    event_time: datetime,
    than_sequencer: str | None,
    than_event_time: datetime | None,
) -> int:
    """Order an event against another (or a stored row): -1 older, 0 same, 1 newer."""
    if sequencer and than_sequencer:
        return compare_sequencers(sequencer, than_sequencer)
    if than_event_time is None:
        return 1
    return (event_time > than_event_time) - (event_time < than_event_time)


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class FileEvent:
    """A file appeared/changed (CREATED) or disappeared (REMOVED) under a volume.

    `relative_path` is validated on construction; `size`, `etag` and `last_modified_time`
    describe the object after the event (None for REMOVED). `source_id` names where the event
    came from (a message id, 'inotify', 'refresh') for logs; it never affects ordering.
    """

    kind: EventKind
    relative_path: str
    size: int | None = None
    etag: str | None = None
    last_modified_time: datetime | None = None
    sequencer: str | None = None
    event_time: datetime = field(default_factory=utc_now)
    source_id: str | None = None

    def __post_init__(self) -> None:
        validate_relative_path(self.relative_path)
        if type(self.kind) is not EventKind:
            object.__setattr__(self, "kind", EventKind(self.kind))
        object.__setattr__(self, "last_modified_time", _utc(self.last_modified_time))
        object.__setattr__(self, "event_time", _utc(self.event_time))
        if self.kind is EventKind.CREATED and (self.size is None or self.size < 0):
            raise ValueError(f"CREATED event for {self.relative_path!r} needs a size >= 0")

    @property
    def is_folder_marker(self) -> bool:
        return self.relative_path.endswith("/")

    @classmethod
    def created(cls, relative_path: str, *, size: int, last_modified_time: datetime,
                etag: str | None = None, **kw) -> FileEvent:
        return cls(EventKind.CREATED, relative_path, size=size, etag=etag,
                   last_modified_time=last_modified_time, **kw)

    @classmethod
    def removed(cls, relative_path: str, **kw) -> FileEvent:
        return cls(EventKind.REMOVED, relative_path, **kw)
