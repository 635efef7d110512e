"""GCS Pub/Sub notifications: a pure parser (DESIGN §6).

A bucket's notification config publishes one Pub/Sub message per object change: the
attributes say what happened (`eventType`, `bucketId`, `objectId`, `objectGeneration`,
`eventTime`, `payloadFormat`, and on an overwrite `overwroteGeneration` on the new object's
`OBJECT_FINALIZE` and `overwrittenByGeneration` on the old one's `OBJECT_DELETE` /
`OBJECT_ARCHIVE`); with the `JSON_API_V1` payload the data is the object's JSON resource
(`size`, `md5Hash`, `crc32c`, `generation`, all sizes as strings).

`parse_message` turns one message (its `data` and `attributes`) into `GcsRecord`s:

- `OBJECT_FINALIZE` -> CREATED (an overwrite too: the directory table makes it an UPDATE);
- `OBJECT_DELETE` / `OBJECT_ARCHIVE` -> REMOVED, except when `overwrittenByGeneration` says
  the object was replaced, not removed: that half of an overwrite carries no record (the new
  generation's `OBJECT_FINALIZE` is the change), so an overwrite is one UPDATE pair;
- `OBJECT_METADATA_UPDATE` -> nothing (the content did not change; counted as skipped).

The sequencer orders the events of one key (the directory table compares sequencers of the
same width as strings): the object generation, a decimal int64, zero-padded to 20 digits, then
`0` for the generation's creation and `1` for its removal, so a generation's removal sorts
after its creation and a later generation after both, whatever order Pub/Sub delivers them in.

    >>> sequencer(7, removed=False) < sequencer(7, removed=True) < sequencer(10, removed=False)
    True
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from connectors._records import ObjectRecord, optional, required, timestamp, to_file_event
from connectors._records import where as where_of
from connectors.errors import MalformedMessageError
from connectors.events import EventKind

__all__ = ["GcsRecord", "ParsedMessage", "etag_of", "parse_message", "sequencer",
           "to_file_event"]

_CREATED = frozenset({"OBJECT_FINALIZE"})
_REMOVED = frozenset({"OBJECT_DELETE", "OBJECT_ARCHIVE"})
_SKIPPED = frozenset({"OBJECT_METADATA_UPDATE"})
#: digits of the widest int64
_WIDTH = 20


@dataclass(frozen=True, slots=True)
class GcsRecord(ObjectRecord):
    """One object change as GCS reported it; `version_id` is the object generation."""

    scheme: ClassVar[str] = "gs"


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What one Pub/Sub message carried.

    Attributes:
        records: The object change (none for a metadata update or an overwrite's old half).
        event_type: The `eventType` attribute.
        skipped: 1 when the message carries no content change (metadata, overwritten).
        message_id: The Pub/Sub message id, when known.
    """

    records: tuple[GcsRecord, ...] = ()
    event_type: str = ""
    skipped: int = 0
    message_id: str | None = None


def sequencer(generation: int, *, removed: bool) -> str:
    """The sequencer of a generation's creation or removal (module docstring).

    Example:
        >>> sequencer(1700000000123456, removed=True)
        '000017000000001234561'
    """
    if generation < 0:
        raise ValueError(f"generation must be >= 0: {generation}")
    return f"{generation:0{_WIDTH}d}{int(removed)}"


def etag_of(md5_hash: str | None, crc32c: str | None) -> str | None:
    """The etag volume-stream keeps for a GCS object: its MD5 in hex (GCS gives base64), or,
    for composite objects that have none, `crc32c-` and the CRC32C in hex.

    Example:
        >>> etag_of("XUFAKrxLKna5cZ2REBfFkg==", None), etag_of(None, "yZRlqg==")
        ('5d41402abc4b2a76b9719d911017c592', 'crc32c-c99465aa')
    """
    for value, prefix in ((md5_hash, ""), (crc32c, "crc32c-")):
        if value:
            try:
                return prefix + base64.b64decode(value, validate=True).hex()
            except (binascii.Error, ValueError):
                return None
    return None


def parse_message(message: Mapping[str, Any], *, message_id: str | None = None) -> ParsedMessage:
    """Parse one Pub/Sub message of a GCS notification config.

    Args:
        message: `{"attributes": {...}, "data": bytes}` (`data` may also be text, or base64
            text as Pub/Sub's REST and push deliveries carry it).
        message_id: The Pub/Sub message id, quoted in errors.

    Raises:
        MalformedMessageError: not a GCS notification (no eventType/bucketId/objectId), a
            payload that is not `JSON_API_V1`, or a field missing or of the wrong type.

    Example:
        >>> m = {"attributes": {"eventType": "OBJECT_DELETE", "bucketId": "bkt",
        ...                     "objectId": "in/a.csv", "objectGeneration": "7",
        ...                     "eventTime": "2026-01-01T00:00:00Z",
        ...                     "payloadFormat": "JSON_API_V1"}, "data": b'{"size": "3"}'}
        >>> rec = parse_message(m).records[0]
        >>> rec.kind.value, rec.key, rec.sequencer
        ('REMOVED', 'in/a.csv', '000000000000000000071')
    """
    where = where_of(message_id)
    try:
        return _parse(message, where, message_id)
    except MalformedMessageError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedMessageError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _parse(message: Mapping[str, Any], where: str, message_id: str | None) -> ParsedMessage:
    if not isinstance(message, Mapping):
        raise MalformedMessageError(f"{where}: expected a Pub/Sub message, got "
                                    f"{type(message).__name__}")
    attributes = message.get("attributes") or {}
    if not isinstance(attributes, Mapping) or "eventType" not in attributes:
        raise MalformedMessageError(
            f"{where}: not a GCS notification (no eventType attribute; attributes "
            f"{sorted(attributes)[:10] if isinstance(attributes, Mapping) else attributes!r:.80})")
    attributes = dict(attributes)
    event_type = required(attributes, "eventType", str, where)
    if event_type not in _CREATED | _REMOVED | _SKIPPED:
        raise MalformedMessageError(f"{where}: unknown GCS eventType {event_type!r}")
    bucket = required(attributes, "bucketId", str, where)
    key = required(attributes, "objectId", str, where)
    generation = _generation(attributes, "objectGeneration", where)
    if event_type in _SKIPPED:
        return ParsedMessage(event_type=event_type, skipped=1, message_id=message_id)
    if event_type in _REMOVED and attributes.get("overwrittenByGeneration"):
        _generation(attributes, "overwrittenByGeneration", where)  # checked, then dropped
        return ParsedMessage(event_type=event_type, skipped=1, message_id=message_id)
    event_time = timestamp(required(attributes, "eventTime", str, where), where)
    fmt = attributes.get("payloadFormat", "JSON_API_V1")
    if fmt != "JSON_API_V1":
        raise MalformedMessageError(f"{where}: payloadFormat {fmt!r}: volume-stream needs the "
                                    "JSON_API_V1 payload (the object's size and hash)")
    resource = _payload(message.get("data"), where)
    updated = _updated(resource, where)
    if event_type in _CREATED:
        # the object's `updated` time: the store's clock with microseconds, as a listing
        # reports it (the eventTime may have whole seconds only)
        record = GcsRecord(EventKind.CREATED, bucket, key, updated or event_time, event_type,
                           size=_size(resource, where),
                           etag=etag_of(optional(resource, "md5Hash", str, where),
                                        optional(resource, "crc32c", str, where)),
                           sequencer=sequencer(generation, removed=False),
                           version_id=str(generation))
    else:
        # a removal comes after the removed generation's last update, whatever the clocks
        if updated is not None:
            event_time = max(event_time, updated + timedelta(microseconds=1))
        record = GcsRecord(EventKind.REMOVED, bucket, key, event_time, event_type,
                           sequencer=sequencer(generation, removed=True),
                           version_id=str(generation))
    return ParsedMessage((record,), event_type, message_id=message_id)


def _updated(resource: dict[str, Any], where: str) -> datetime | None:
    text = optional(resource, "updated", str, where)
    return timestamp(text, where) if text else None


def _generation(attributes: dict[str, Any], name: str, where: str) -> int:
    text = required(attributes, name, str, where)
    if not text.isdigit() or len(text) > _WIDTH - 1:
        raise MalformedMessageError(f"{where}: {name} {text!r:.40} is not a generation number")
    return int(text)


def _payload(data: Any, where: str) -> dict[str, Any]:
    if isinstance(data, bytes | bytearray | memoryview):
        text = bytes(data).decode("utf-8")
    elif isinstance(data, str):
        text = data
    else:
        raise MalformedMessageError(f"{where}: no JSON_API_V1 payload (data is "
                                    f"{type(data).__name__})")
    try:
        resource = json.loads(text)
    except json.JSONDecodeError as exc:
        try:  # base64, as Pub/Sub's REST and push deliveries carry data
            resource = json.loads(base64.b64decode(text, validate=True).decode("utf-8"))
        except (binascii.Error, ValueError):
            raise MalformedMessageError(f"{where}: data is not JSON (nor base64 of JSON): "
                                        f"{exc}") from exc
    if not isinstance(resource, dict):
        raise MalformedMessageError(f"{where}: data is not a JSON object")
    return resource


def _size(resource: dict[str, Any], where: str) -> int:
    value = resource.get("size")
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if not text.isdigit():
        raise MalformedMessageError(f"{where}: object size {value!r:.40} is not a count of bytes")
    return int(text)
