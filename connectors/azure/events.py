"""Azure Blob Storage events as Event Grid delivers them to a Storage Queue: a pure parser
(DESIGN §6).

Event Grid writes each event to the queue as one message whose body is the event's JSON,
base64-encoded; `parse_message` also takes the JSON itself (a queue written by hand or by
another tool), one event or an array of them, in either schema Event Grid can deliver:

* the **Event Grid schema**: `eventType`, `eventTime`, `topic`, `subject`, `data`;
* **CloudEvents 1.0**: `specversion`, `type`, `time`, `source`, `subject`, `data`.

The container and blob name come from the subject (`/blobServices/default/containers/<c>/blobs/
<name>`, the name verbatim), the account from the topic / source (`.../storageAccounts/<a>`,
else the host of `data.url`). `Microsoft.Storage.BlobCreated` is a CREATED record (size
`contentLength`, ETag `eTag` unquoted), except the `CreateFile` of a hierarchical-namespace
(ADLS Gen2) account: an empty file whose content its `FlushWithClose` event brings, so it is
skipped as not yet complete (DESIGN §4.3). `Microsoft.Storage.BlobDeleted` is a REMOVED record.
`data.sequencer` orders the events of one blob: Azure documents it as opaque, compared as
plain strings; it is a fixed-width hex string (upper-cased here, so the directory table's
sequencer comparison, DESIGN §4.2, is that string comparison). Renames and directory deletes of
an ADLS Gen2 account (`BlobRenamed`, `DirectoryRenamed`, `DirectoryDeleted`) name no file's size
or ETag: they are returned as `refresh` paths, and a listener whose volume they touch asks for
a refresh. Other storage events (tier changes, directory creation, ...) change no content and
are skipped; an event that is not a storage event at all is malformed (a foreign message).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote, urlparse

from connectors._objects import normalize_etag
from connectors._records import ObjectRecord, object_size, optional, required, timestamp
from connectors._records import to_file_event as _record_event
from connectors._records import where as where_of
from connectors.errors import MalformedMessageError
from connectors.events import EventKind, FileEvent
from connectors.scope import BucketScope

__all__ = ["AzureRecord", "ParsedMessage", "parse_message", "to_file_event"]

CREATED, DELETED = "Microsoft.Storage.BlobCreated", "Microsoft.Storage.BlobDeleted"
#: ADLS Gen2 events that move or remove many paths at once, or a path without its size
_STRUCTURAL = frozenset({"Microsoft.Storage.BlobRenamed", "Microsoft.Storage.DirectoryRenamed",
                         "Microsoft.Storage.DirectoryDeleted"})
_SUBJECT = re.compile(r"^/blobServices/default/containers/([^/]+)/blobs/(.+)$", re.DOTALL)
_ACCOUNT = re.compile(r"/storageAccounts/([^/]+)", re.IGNORECASE)
_HEX = re.compile(r"^[0-9A-Fa-f]+$")


@dataclass(frozen=True, slots=True)
class AzureRecord(ObjectRecord):
    """One blob change as Event Grid reported it: `bucket` is the container, `key` the blob
    name, `account` the storage account (None when the event does not say)."""

    scheme: ClassVar[str] = "az"
    account: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """What one queue message carried.

    Attributes:
        records: The blob changes, in message order.
        schema: "eventgrid" or "cloudevents".
        skipped: Storage events that change no content (tiers, CreateFile, directories...).
        refresh: (account, container, path) of ADLS Gen2 renames and directory deletes.
        message_id: The queue message id, when known.
    """

    records: tuple[AzureRecord, ...] = ()
    schema: str = "eventgrid"
    skipped: int = 0
    refresh: tuple[tuple[str | None, str, str], ...] = ()
    message_id: str | None = None


def parse_message(body: Any, *, message_id: str | None = None) -> ParsedMessage:
    """Parse the body of a Storage Queue message carrying Event Grid blob events.

    Raises:
        MalformedMessageError: not base64 JSON nor JSON, not Event Grid events of a storage
            account, or a required field is missing or has the wrong type.

    Example:
        >>> body = ('{"topic":"/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/'
        ...         'storageAccounts/acct","subject":"/blobServices/default/containers/c/blobs/'
        ...         'in/a b.txt","eventType":"Microsoft.Storage.BlobCreated","eventTime":'
        ...         '"2024-01-01T00:00:00.1234567Z","id":"1","data":{"api":"PutBlob","eTag":'
        ...         '"0x8DC","contentLength":3,"sequencer":"000000000000000000000000000000a1"}}')
        >>> record = parse_message(base64.b64encode(body.encode()).decode()).records[0]
        >>> record.account, record.bucket, record.key, record.size, record.sequencer
        ('acct', 'c', 'in/a b.txt', 3, '000000000000000000000000000000A1')
    """
    where = where_of(message_id)
    try:
        doc = _loads(body, where)
        events = doc if isinstance(doc, list) else [doc]
        if not events:
            raise MalformedMessageError(f"{where}: an empty array of events")
        records: list[AzureRecord] = []
        refresh: list[tuple[str | None, str, str]] = []
        skipped, schemas = 0, set()
        for index, event in enumerate(events):
            at = where if len(events) == 1 else f"{where} event[{index}]"
            schema, kind, record = _parse_event(event, at)
            schemas.add(schema)
            if kind in _STRUCTURAL:
                refresh.append(record)
            elif record is None:
                skipped += 1
            else:
                records.append(record)
        return ParsedMessage(tuple(records), "+".join(sorted(schemas)), skipped, tuple(refresh),
                             message_id)
    except MalformedMessageError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedMessageError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _loads(body: Any, where: str) -> Any:
    if isinstance(body, bytes):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedMessageError(f"{where}: body is not UTF-8: {exc}") from exc
    if not isinstance(body, str):
        raise MalformedMessageError(f"{where}: body is {type(body).__name__}, not a string")
    text = body.strip()
    if not text.startswith(("{", "[")):  # Event Grid's base64 (a JSON document never is)
        try:
            text = base64.b64decode(text, validate=True).decode("utf-8")
        except (binascii.Error, ValueError) as exc:
            raise MalformedMessageError(f"{where}: body is neither JSON nor base64 JSON") \
                from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedMessageError(f"{where}: body is not JSON: {exc}") from exc


def _parse_event(event: Any, at: str) -> tuple[str, str, Any]:
    """(schema, event type, an `AzureRecord`, a refresh triple, or None when skipped)."""
    if not isinstance(event, dict):
        raise MalformedMessageError(f"{at}: an event must be a JSON object, got "
                                    f"{type(event).__name__}")
    if "specversion" in event:
        schema, kind_key, time_key, topic_key = "cloudevents", "type", "time", "source"
        if str(event["specversion"]) != "1.0":
            raise MalformedMessageError(f"{at}: CloudEvents specversion "
                                        f"{event['specversion']!r} is not 1.0")
    elif "eventType" in event:
        schema, kind_key, time_key, topic_key = "eventgrid", "eventType", "eventTime", "topic"
    else:
        raise MalformedMessageError(f"{at}: not an Event Grid event (no eventType nor "
                                    f"specversion; top-level keys {sorted(event)[:10]})")
    kind = required(event, kind_key, str, at)
    if not kind.startswith("Microsoft.Storage."):
        raise MalformedMessageError(f"{at}: event type {kind!r} is not a storage event")
    if kind not in (CREATED, DELETED) and kind not in _STRUCTURAL:
        return schema, kind, None  # BlobTierChanged, DirectoryCreated, ...: no content change
    data = required(event, "data", dict, at)
    account = _account(event.get(topic_key), data.get("url"))
    if kind in _STRUCTURAL:
        container, path = _where_in(event, data, at)
        return schema, kind, (account, container, path)
    api = optional(data, "api", str, at)
    if kind == CREATED and api == "CreateFile":
        return schema, kind, None  # ADLS Gen2: the empty file; FlushWithClose brings content
    container, name = _where_in(event, data, at)
    record_kind = EventKind.CREATED if kind == CREATED else EventKind.REMOVED
    obj = {"size": data.get("contentLength")}
    return schema, kind, AzureRecord(
        kind=record_kind,
        bucket=container,
        key=name,
        event_time=timestamp(required(event, time_key, str, at), at),
        event_name=f"{kind.removeprefix('Microsoft.Storage.')}:{api or ''}",
        size=object_size(obj, record_kind, f"{at}.data (contentLength)"),
        etag=normalize_etag(optional(data, "eTag", str, at)) if record_kind is EventKind.CREATED
        else None,
        sequencer=_sequencer(data, at),
        account=account,
    )


def _where_in(event: dict, data: dict, at: str) -> tuple[str, str]:
    """(container, blob name): from the subject (verbatim), else from `data.url` (decoded)."""
    subject = event.get("subject")
    if isinstance(subject, str):
        match = _SUBJECT.match(subject)
        if match:
            return match.group(1), match.group(2)
    url = data.get("url") or data.get("destinationUrl")
    if isinstance(url, str):
        parts = unquote(urlparse(url).path).lstrip("/").split("/", 1)
        if len(parts) == 2 and parts[0] and parts[1]:
            return parts[0], parts[1]
    raise MalformedMessageError(f"{at}: no blob in subject {subject!r:.120} nor data.url")


def _account(topic: Any, url: Any) -> str | None:
    if isinstance(topic, str):
        match = _ACCOUNT.search(topic)
        if match:
            return match.group(1)
    if isinstance(url, str):
        host = urlparse(url).hostname or ""
        if host.count(".") >= 3:  # <account>.blob.core.windows.net, not 127.0.0.1
            return host.split(".", 1)[0]
    return None


def _sequencer(data: dict, at: str) -> str | None:
    value = optional(data, "sequencer", str, at)
    if value is None:
        return None
    if not _HEX.match(value):
        raise MalformedMessageError(f"{at}: sequencer {value!r:.60} is not a hex string")
    return value.upper()


def to_file_event(record: AzureRecord, scope: BucketScope, *,
                  source_id: str | None = None) -> FileEvent | None:
    """The `FileEvent` of `record` for the volume `scope` (an `AzureScope`), or None when the
    blob is not the volume's: another account (when both name theirs), container or prefix.

    Raises:
        InvalidPathError: the blob is in the volume but its relative path is unsafe.
    """
    account = getattr(scope, "account", None)
    if account and record.account and record.account.lower() != account.lower():
        return None
    return _record_event(record, scope, source_id=source_id)
