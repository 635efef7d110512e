"""OSS event notifications as MNS delivers them: a pure parser (DESIGN §6).

`parse_message` turns one MNS message body into `OssRecord`s. OSS publishes `{"events": [...]}`
JSON (protocols.md §2.1), and the queue body is base64 of it (§2.2) or, for queues fed another
way, the JSON itself; both are accepted (a body starting with '{' is JSON, anything else must be
base64 of JSON). Keys are raw UTF-8 (no URL decoding, unlike S3).

Which events count: `ObjectCreated:*` is CREATED and `ObjectRemoved:*` is REMOVED, except the
steps of a multipart upload (`InitiateMultipartUpload`, `UploadPart`, `UploadPartCopy`, and
`ObjectRemoved:AbortMultipartUpload`): the object is not visible until
`CompleteMultipartUpload`, which is the one event that creates it. `AppendObject` counts as
CREATED each time: an appendable object is readable at its new size after every append, and OSS
never says which append is the last. Downloads, restores, replication and unknown categories
are skipped (counted).

Ordering: OSS events carry no sequencer, only `eventTime` at second precision (ties are
likely), so `FileEvent.sequencer` stays None and `event_time` is `eventTime`; `_tie_break`
refines same-second times with MNS's EnqueueTime.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from connectors._objects import normalize_etag
from connectors._records import ObjectRecord, object_size, required, timestamp, to_file_event
from connectors._records import where as where_of
from connectors.errors import MalformedMessageError
from connectors.events import EventKind, FileEvent

__all__ = ["OssRecord", "ParsedMessage", "parse_message", "to_file_event"]

_INTERMEDIATE = frozenset({"ObjectCreated:InitiateMultipartUpload", "ObjectCreated:UploadPart",
                           "ObjectCreated:UploadPartCopy", "ObjectRemoved:AbortMultipartUpload"})


@dataclass(frozen=True, slots=True)
class OssRecord(ObjectRecord):
    """One object change as OSS reported it; `etag` unquoted (upper-case hex). OSS events carry
    no sequencer or version id, so those stay None."""

    scheme: ClassVar[str] = "oss"


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What one MNS message carried: records in order, how many events were skipped
    (multipart steps, downloads, ...), and whether the body was "base64" or "plain" JSON."""

    records: tuple[OssRecord, ...] = ()
    skipped: int = 0
    encoding: str = "base64"
    message_id: str | None = None


def parse_message(body: str | bytes, *, message_id: str | None = None) -> ParsedMessage:
    """Parse the body of an MNS message carrying OSS event notifications.

    Args:
        body: The message body as stored in the queue: base64 of the JSON, or the JSON.
        message_id: The MNS MessageId, quoted in errors.

    Raises:
        MalformedMessageError: not (base64 of) JSON, no `events` list, or a required field
            (eventName, eventTime, oss.bucket.name, oss.object.key, a created object's size)
            is missing or has the wrong type.

    Example (keys are taken verbatim):
        >>> event = {"eventName": "ObjectCreated:PutObject", "eventTime": "2024-01-02T03:04:05Z",
        ...          "oss": {"bucket": {"name": "bkt"}, "object": {"key": "in/a b+c.txt",
        ...                                                       "size": 5, "eTag": "5D41"}}}
        >>> [r.key for r in parse_message(json.dumps({"events": [event]})).records]
        ['in/a b+c.txt']
    """
    where = where_of(message_id)
    text, encoding = _decode_body(body, where)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"{where}: body is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        keys = sorted(doc)[:10] if isinstance(doc, dict) else type(doc).__name__
        raise MalformedMessageError(f"{where}: not an OSS event notification (no 'events' "
                                    f"list; got {keys})")
    records, skipped = [], 0
    for index, event in enumerate(doc["events"]):
        record = _parse_event(event, f"{where} events[{index}]")
        if record is None:
            skipped += 1
        else:
            records.append(record)
    return ParsedMessage(tuple(records), skipped, encoding, message_id)


def _tie_break(event: FileEvent, enqueue_ms: int) -> FileEvent:
    """Order same-second events across batches by when MNS enqueued them.

    OSS stamps events to the second, so a put and a delete of one key in the same second would
    otherwise compare equal, and the later one (in a later batch) would be ignored. MNS's
    EnqueueTime has milliseconds: the lag from the event's second to its enqueueing, squashed
    monotonically into [0, 1 s) and never past the lag itself (so the refined time is never
    later than the enqueueing, and never reaches the next second), orders them. A redelivered
    message keeps its EnqueueTime, so redeliveries still compare equal and change nothing.
    """
    t = event.event_time
    if t.microsecond or not enqueue_ms:
        return event
    lag_ms = enqueue_ms - int(t.timestamp()) * 1000
    if lag_ms <= 0:
        return event
    offset_us = int(lag_ms * 1000 * _SQUASH_MS / (lag_ms + _SQUASH_MS))
    return dataclasses.replace(event, event_time=t + timedelta(microseconds=offset_us))


_SQUASH_MS = 1000


def _decode_body(body: str | bytes, where: str) -> tuple[str, str]:
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessageError(f"{where}: body is not UTF-8: {exc}") from exc
    if not isinstance(body, str):
        raise MalformedMessageError(f"{where}: body is {type(body).__name__}, not text")
    text = body.strip()
    if text.startswith("{"):
        return text, "plain"
    try:
        return base64.b64decode(text, validate=True).decode("utf-8"), "base64"
    except (binascii.Error, ValueError) as exc:
        raise MalformedMessageError(f"{where}: body is neither JSON nor base64 of JSON: "
                                    f"{text[:60]!r}") from exc


def _parse_event(event: Any, at: str) -> OssRecord | None:
    if not isinstance(event, dict):
        raise MalformedMessageError(f"{at}: not an object")
    source = event.get("eventSource", "acs:oss")
    if source != "acs:oss":
        raise MalformedMessageError(f"{at}: eventSource {source!r} is not acs:oss")
    name = required(event, "eventName", str, at).removeprefix("oss:")
    if name in _INTERMEDIATE:
        return None
    if name.startswith("ObjectCreated:"):
        kind = EventKind.CREATED
    elif name.startswith("ObjectRemoved:"):
        kind = EventKind.REMOVED
    else:
        return None
    oss = required(event, "oss", dict, at)
    obj = required(oss, "object", dict, f"{at}.oss")
    etag = obj.get("eTag") if kind is EventKind.CREATED else None
    return OssRecord(
        kind=kind,
        bucket=required(required(oss, "bucket", dict, f"{at}.oss"), "name", str, at),
        key=required(obj, "key", str, f"{at}.oss.object"),
        event_time=timestamp(required(event, "eventTime", str, at), at),
        event_name=name,
        size=object_size(obj, kind, at),
        etag=normalize_etag(etag) if isinstance(etag, str) else None,
    )
