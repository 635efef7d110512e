"""What S3 and OSS notifications have in common: the object change record, its mapping to a
volume's `FileEvent`, and the field checks both pure parsers use.

    >>> rec = ObjectRecord(EventKind.REMOVED, "bkt", "in/a.txt", datetime(2024, 1, 1, tzinfo=UTC),
    ...                    "ObjectRemoved:Delete")
    >>> to_file_event(rec, BucketScope("bkt", "in/")).relative_path
    'a.txt'
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

from connectors.errors import MalformedMessageError
from connectors.events import EventKind, FileEvent
from connectors.scope import BucketScope

__all__ = ["ObjectRecord", "object_size", "optional", "required", "timestamp", "to_file_event",
           "where"]


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """One object change as the store reported it; `key` decoded, `etag` unquoted."""

    scheme: ClassVar[str] = "bucket"

    kind: EventKind
    bucket: str
    key: str
    event_time: datetime
    event_name: str
    size: int | None = None
    etag: str | None = None
    sequencer: str | None = None
    version_id: str | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


def to_file_event(record: ObjectRecord, scope: BucketScope, *,
                  source_id: str | None = None) -> FileEvent | None:
    """The `FileEvent` of `record` for the volume `scope`, or None when it is not the volume's.

    A created object's `last_modified_time` is the event time (events carry no other).

    Raises:
        InvalidPathError: the key is in the volume but its relative path is unsafe.
    """
    relative = scope.relative_path(record.bucket, record.key, validate=False)  # FileEvent does
    if relative is None:
        return None
    if record.kind is EventKind.CREATED:
        return FileEvent(EventKind.CREATED, relative, size=record.size, etag=record.etag,
                         last_modified_time=record.event_time, sequencer=record.sequencer,
                         event_time=record.event_time, source_id=source_id)
    return FileEvent(EventKind.REMOVED, relative, sequencer=record.sequencer,
                     event_time=record.event_time, source_id=source_id)


def where(message_id: str | None) -> str:
    """How errors name a message: "message <id>", or just "message"."""
    return f"message {message_id}" if message_id else "message"


def required(doc: dict, name: str, typ: type, where: str) -> Any:
    """`doc[name]`, which must be a `typ` (a non-empty one for `str`)."""
    if name not in doc or doc[name] is None:
        raise MalformedMessageError(f"{where}: missing field {name!r}")
    value = doc[name]
    if not isinstance(value, typ) or (typ is str and not value):
        raise MalformedMessageError(f"{where}: field {name!r} must be a non-empty "
                                    f"{typ.__name__}, got {value!r:.80}")
    return value


def optional(doc: dict, name: str, typ: type, where: str) -> Any:
    """`doc[name]` checked like `required`, or None when absent."""
    if doc.get(name) is None:
        return None
    return required(doc, name, typ, where)


def object_size(obj: dict, kind: EventKind, where: str) -> int | None:
    """A created object's size in bytes (required); None for a removal."""
    if kind is not EventKind.CREATED:
        return None  # real S3 sends no size on delete; moto sends the deleted object's
    if obj.get("size") is None:
        raise MalformedMessageError(f"{where}: missing field 'size' of a created object")
    size = obj["size"]
    if isinstance(size, bool) or not isinstance(size, int | float) or size < 0 or size != int(size):
        raise MalformedMessageError(f"{where}: object size {size!r} is not a count of bytes")
    return int(size)


def timestamp(text: str, where: str) -> datetime:
    """An ISO 8601 event time as an aware UTC datetime."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise MalformedMessageError(f"{where}: bad timestamp {text!r:.60}") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
