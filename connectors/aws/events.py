"""S3 event notifications as SQS delivers them: a pure parser (DESIGN §6).

`parse_message` turns one SQS message body into `S3Record`s, whichever way S3 delivered it:
raw (`{"Records": [...]}`), wrapped by SNS (`Type=Notification`, the S3 JSON as a string in
`Message`) or by EventBridge (`source=aws.s3`, `detail-type` "Object Created" / "Object
Deleted"). Keys of raw and SNS events are form-encoded ('+' is a space, '%2B' a '+') and
decoded with `unquote_plus`; EventBridge keys are verbatim. `s3:TestEvent` messages and records
that do not change content (tagging, ACL, restore...) carry no records. `to_file_event` maps a
record to a volume's `FileEvent` (or None when the key is not the volume's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote_plus

from connectors._objects import normalize_etag
from connectors._records import (
    ObjectRecord,
    object_size,
    optional,
    required,
    timestamp,
    to_file_event,
)
from connectors._records import where as where_of
from connectors.errors import MalformedMessageError
from connectors.events import EventKind

__all__ = ["ParsedMessage", "S3Record", "parse_message", "to_file_event"]

_CREATED_PREFIXES = ("ObjectCreated:",)
_REMOVED_PREFIXES = ("ObjectRemoved:", "LifecycleExpiration:")
_EVENTBRIDGE_KINDS = {"Object Created": EventKind.CREATED, "Object Deleted": EventKind.REMOVED}


@dataclass(frozen=True, slots=True)
class S3Record(ObjectRecord):
    """One object change as S3 reported it; `key` is decoded, `etag` unquoted."""

    scheme: ClassVar[str] = "s3"


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What one SQS message carried.

    Attributes:
        records: The object changes, in message order.
        envelope: "s3" (raw), "sns" or "eventbridge".
        is_test_event: The `s3:TestEvent` S3 sends when a notification is configured.
        skipped: Records/events that do not change object content (tags, ACLs, restores).
        message_id: The SQS MessageId, when known.
    """

    records: tuple[S3Record, ...] = ()
    envelope: str = "s3"
    is_test_event: bool = False
    skipped: int = 0
    message_id: str | None = None


def parse_message(body: str, *, message_id: str | None = None) -> ParsedMessage:
    """Parse the body of an SQS message carrying S3 event notifications.

    Args:
        body: The message body (JSON).
        message_id: The SQS MessageId, quoted in errors.

    Returns:
        The records, in order; none for a test event.

    Raises:
        MalformedMessageError: not JSON, not an S3 notification, or a required field is
            missing or has the wrong type.

    Example:
        >>> body = ('{"Records":[{"eventVersion":"2.1","eventSource":"aws:s3",'
        ...         '"eventTime":"2024-01-01T00:00:00.000Z","eventName":"ObjectCreated:Put",'
        ...         '"s3":{"bucket":{"name":"bkt"},"object":{"key":"a+b%2B.txt","size":3}}}]}')
        >>> parse_message(body).records[0].key
        'a b+.txt'
    """
    where = where_of(message_id)
    try:
        return _parse_document(_loads(body, where), where, message_id, wrapped=False)
    except MalformedMessageError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedMessageError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _loads(body: Any, where: str) -> Any:
    if not isinstance(body, str):
        raise MalformedMessageError(f"{where}: body is {type(body).__name__}, not a string")
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"{where}: body is not JSON: {exc}") from exc


def _parse_document(doc: Any, where: str, message_id: str | None, *,
                    wrapped: bool) -> ParsedMessage:
    if not isinstance(doc, dict):
        raise MalformedMessageError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("Event") == "s3:TestEvent":
        return ParsedMessage(envelope="s3", is_test_event=True, message_id=message_id)
    if "Records" in doc:
        records, skipped = _parse_records(doc["Records"], where)
        return ParsedMessage(records, "s3", skipped=skipped, message_id=message_id)
    if "detail-type" in doc or "detail" in doc:
        return _parse_eventbridge(doc, where, message_id)
    if "Type" in doc and "TopicArn" in doc and not wrapped:
        if doc["Type"] != "Notification":  # SubscriptionConfirmation and the like
            return ParsedMessage(envelope="sns", skipped=1, message_id=message_id)
        inner = _parse_document(_loads(required(doc, "Message", str, where), where),
                                f"{where} (SNS Message)", message_id, wrapped=True)
        return ParsedMessage(inner.records, "sns", inner.is_test_event, inner.skipped,
                             message_id)
    raise MalformedMessageError(
        f"{where}: not an S3 event notification (no Records, Event, detail or SNS Message; "
        f"top-level keys {sorted(doc)[:10]})")


def _parse_records(raw: Any, where: str) -> tuple[tuple[S3Record, ...], int]:
    if not isinstance(raw, list):
        raise MalformedMessageError(f"{where}: Records is {type(raw).__name__}, not a list")
    records, skipped = [], 0
    for index, rec in enumerate(raw):
        at = f"{where} Records[{index}]"
        if not isinstance(rec, dict):
            raise MalformedMessageError(f"{at}: not an object")
        source = rec.get("eventSource", "aws:s3")
        if source != "aws:s3":
            raise MalformedMessageError(f"{at}: eventSource {source!r} is not aws:s3")
        version = str(rec.get("eventVersion", "2"))
        if version.split(".")[0] != "2":
            raise MalformedMessageError(f"{at}: unsupported eventVersion {version!r}")
        name = required(rec, "eventName", str, at).removeprefix("s3:")
        kind = _kind_of(name)
        if kind is None:
            skipped += 1
            continue
        s3 = required(rec, "s3", dict, at)
        obj = required(s3, "object", dict, f"{at}.s3")
        records.append(S3Record(
            kind=kind,
            bucket=required(required(s3, "bucket", dict, f"{at}.s3"), "name", str, at),
            key=_decode_key(required(obj, "key", str, f"{at}.s3.object"), at),
            event_time=timestamp(required(rec, "eventTime", str, at), at),
            event_name=name,
            size=object_size(obj, kind, at),
            etag=normalize_etag(optional(obj, "eTag", str, at)) if kind is EventKind.CREATED
            else None,
            sequencer=optional(obj, "sequencer", str, at),
            version_id=optional(obj, "versionId", str, at),
        ))
    return tuple(records), skipped


def _parse_eventbridge(doc: dict, where: str, message_id: str | None) -> ParsedMessage:
    source = doc.get("source")
    if source != "aws.s3":
        raise MalformedMessageError(f"{where}: EventBridge source {source!r} is not aws.s3")
    kind = _EVENTBRIDGE_KINDS.get(required(doc, "detail-type", str, where))
    if kind is None:  # Object Tags Added, Object Restore Completed, ...
        return ParsedMessage(envelope="eventbridge", skipped=1, message_id=message_id)
    detail = required(doc, "detail", dict, where)
    obj = required(detail, "object", dict, f"{where}.detail")
    etag = optional(obj, "etag", str, where) or optional(obj, "eTag", str, where)
    record = S3Record(
        kind=kind,
        bucket=required(required(detail, "bucket", dict, f"{where}.detail"), "name", str, where),
        key=required(obj, "key", str, f"{where}.detail.object"),  # EventBridge: not encoded
        event_time=timestamp(required(doc, "time", str, where), where),
        event_name=f"{doc['detail-type']}:{detail.get('reason', '')}",
        size=object_size(obj, kind, where),
        etag=normalize_etag(etag) if kind is EventKind.CREATED else None,
        sequencer=optional(obj, "sequencer", str, where),
        version_id=optional(obj, "version-id", str, where),
    )
    return ParsedMessage((record,), "eventbridge", message_id=message_id)


def _kind_of(event_name: str) -> EventKind | None:
    if event_name.startswith(_CREATED_PREFIXES):
        return EventKind.CREATED
    if event_name.startswith(_REMOVED_PREFIXES):
        return EventKind.REMOVED
    return None








def _decode_key(key: str, where: str) -> str:
    try:
        return unquote_plus(key, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise MalformedMessageError(f"{where}: key {key!r:.200} is not UTF-8: {exc}") from exc

