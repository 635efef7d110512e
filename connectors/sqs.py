"""Amazon SQS listener for S3 event notifications (DESIGN §6).

`parse_message` is pure: it turns one SQS message body into `S3Record`s, whichever way S3
delivered it: raw (`{"Records": [...]}`), wrapped by SNS (`Type=Notification`, the S3 JSON as a
string in `Message`) or by EventBridge (`source=aws.s3`, `detail-type` "Object Created" /
"Object Deleted"). Keys of raw and SNS events are form-encoded ('+' is a space, '%2B' a '+')
and decoded with `unquote_plus`; EventBridge keys are verbatim. `s3:TestEvent` messages and
records that do not change content (tagging, ACL, restore...) carry no records.

`SqsListener` implements the `Listener` protocol: one long poll, then, while a backlog lasts,
short polls on named worker threads that each poll again as soon as their call returns and
parse what they got; records outside the volume's `S3Scope` are ignored (their messages
acknowledged); unparseable messages are logged with their MessageId, counted and left on the
queue for its redrive policy. The boto3 calls it makes are ReceiveMessage, DeleteMessageBatch,
ChangeMessageVisibilityBatch and GetQueueAttributes (`backlog`): deploy/aws/listener-policy.json
grants exactly those.

    with SqsListener(queue_url, bucket="bkt", prefix="in/") as listener:
        batch = listener.receive(timeout=20)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

from tenacity import (
    RetryError,
    retry,
    retry_if_result,
    stop_after_attempt,
    wait_random_exponential,
)

from connectors._aws import ClientOptions, region_from_queue_url, translate_errors
from connectors.base import Received
from connectors.errors import ConnectorError, MalformedMessageError
from connectors.events import EventKind, FileEvent, InvalidPathError
from connectors.s3 import S3Scope, normalize_etag, s3_url

__all__ = ["ParsedMessage", "S3Record", "SqsListener", "parse_message", "to_file_event"]

logger = logging.getLogger(__name__)

_MAX_MESSAGES = 10  # SQS limit per ReceiveMessage / *Batch call
_CREATED_PREFIXES = ("ObjectCreated:",)
_REMOVED_PREFIXES = ("ObjectRemoved:", "LifecycleExpiration:")
_EVENTBRIDGE_KINDS = {"Object Created": EventKind.CREATED, "Object Deleted": EventKind.REMOVED}


@dataclass(frozen=True, slots=True)
class S3Record:
    """One object change as S3 reported it; `key` is decoded, `etag` unquoted."""

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
        return s3_url(self.bucket, self.key)


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
    where = f"message {message_id}" if message_id else "message"
    try:
        return _parse_document(_loads(body, where), where, message_id, wrapped=False)
    except MalformedMessageError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise MalformedMessageError(f"{where}: {type(exc).__name__}: {exc}") from exc


def to_file_event(record: S3Record, scope: S3Scope, *,
                  source_id: str | None = None) -> FileEvent | None:
    """The `FileEvent` of `record` for the volume `scope`, or None when it is not the volume's.

    A created object's `last_modified_time` is the event time (S3 events carry no other).

    Raises:
        InvalidPathError: the key is in the volume but its relative path is unsafe.

    Example:
        >>> to_file_event(record, S3Scope("bkt", "in/"), source_id="m-1")  # doctest: +SKIP
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
        inner = _parse_document(_loads(_required(doc, "Message", str, where), where),
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
        name = _required(rec, "eventName", str, at).removeprefix("s3:")
        kind = _kind_of(name)
        if kind is None:
            skipped += 1
            continue
        s3 = _required(rec, "s3", dict, at)
        obj = _required(s3, "object", dict, f"{at}.s3")
        records.append(S3Record(
            kind=kind,
            bucket=_required(_required(s3, "bucket", dict, f"{at}.s3"), "name", str, at),
            key=_decode_key(_required(obj, "key", str, f"{at}.s3.object"), at),
            event_time=_timestamp(_required(rec, "eventTime", str, at), at),
            event_name=name,
            size=_size(obj, kind, at),
            etag=normalize_etag(_optional(obj, "eTag", str, at)) if kind is EventKind.CREATED
            else None,
            sequencer=_optional(obj, "sequencer", str, at),
            version_id=_optional(obj, "versionId", str, at),
        ))
    return tuple(records), skipped


def _parse_eventbridge(doc: dict, where: str, message_id: str | None) -> ParsedMessage:
    source = doc.get("source")
    if source != "aws.s3":
        raise MalformedMessageError(f"{where}: EventBridge source {source!r} is not aws.s3")
    kind = _EVENTBRIDGE_KINDS.get(_required(doc, "detail-type", str, where))
    if kind is None:  # Object Tags Added, Object Restore Completed, ...
        return ParsedMessage(envelope="eventbridge", skipped=1, message_id=message_id)
    detail = _required(doc, "detail", dict, where)
    obj = _required(detail, "object", dict, f"{where}.detail")
    etag = _optional(obj, "etag", str, where) or _optional(obj, "eTag", str, where)
    record = S3Record(
        kind=kind,
        bucket=_required(_required(detail, "bucket", dict, f"{where}.detail"), "name", str, where),
        key=_required(obj, "key", str, f"{where}.detail.object"),  # EventBridge: not encoded
        event_time=_timestamp(_required(doc, "time", str, where), where),
        event_name=f"{doc['detail-type']}:{detail.get('reason', '')}",
        size=_size(obj, kind, where),
        etag=normalize_etag(etag) if kind is EventKind.CREATED else None,
        sequencer=_optional(obj, "sequencer", str, where),
        version_id=_optional(obj, "version-id", str, where),
    )
    return ParsedMessage((record,), "eventbridge", message_id=message_id)


def _kind_of(event_name: str) -> EventKind | None:
    if event_name.startswith(_CREATED_PREFIXES):
        return EventKind.CREATED
    if event_name.startswith(_REMOVED_PREFIXES):
        return EventKind.REMOVED
    return None


def _required(doc: dict, name: str, typ: type, where: str) -> Any:
    if name not in doc or doc[name] is None:
        raise MalformedMessageError(f"{where}: missing field {name!r}")
    value = doc[name]
    if not isinstance(value, typ) or (typ is str and not value):
        raise MalformedMessageError(f"{where}: field {name!r} must be a non-empty "
                                    f"{typ.__name__}, got {value!r:.80}")
    return value


def _optional(doc: dict, name: str, typ: type, where: str) -> Any:
    if doc.get(name) is None:
        return None
    return _required(doc, name, typ, where)


def _size(obj: dict, kind: EventKind, where: str) -> int | None:
    if kind is not EventKind.CREATED:
        return None  # real S3 sends no size on delete; moto sends the deleted object's
    if obj.get("size") is None:
        raise MalformedMessageError(f"{where}: missing field 'size' of a created object")
    size = obj["size"]
    if isinstance(size, bool) or not isinstance(size, int | float) or size < 0 or size != int(size):
        raise MalformedMessageError(f"{where}: object size {size!r} is not a count of bytes")
    return int(size)


def _decode_key(key: str, where: str) -> str:
    try:
        return unquote_plus(key, encoding="utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise MalformedMessageError(f"{where}: key {key!r:.200} is not UTF-8: {exc}") from exc


def _timestamp(text: str, where: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise MalformedMessageError(f"{where}: bad timestamp {text!r:.60}") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _chunks(items: Sequence[Any], size: int = _MAX_MESSAGES) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


@dataclass(frozen=True, slots=True)
class _Item:
    """One received message, parsed on the thread that received it."""

    message: dict[str, Any]
    parsed: ParsedMessage | None
    error: MalformedMessageError | None
    events: list[FileEvent] = field(default_factory=list)
    info: dict[str, int] = field(default_factory=dict)


class _Budget:
    """How many more messages the drain may take; hands out numbered calls to the workers."""

    def __init__(self, room: int, deadline: float = math.inf) -> None:
        self._lock = threading.Lock()
        self.room = room
        self.deadline = deadline
        self.calls = 0
        self.failure: ConnectorError | None = None

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            if self.failure is not None or self.room <= 0 or time.monotonic() > self.deadline:
                return None
            count = min(_MAX_MESSAGES, self.room)
            self.room -= count
            self.calls += 1
            return self.calls, count

    def give_back(self, count: int) -> None:
        with self._lock:
            self.room += count

    def fail(self, exc: ConnectorError) -> None:
        with self._lock:
            self.failure = exc


class SqsListener:
    """Receive the S3 events of one volume from an SQS queue (`Listener` protocol).

    Args:
        queue_url: The queue's URL.
        bucket: The volume's bucket; events of other buckets are ignored.
        prefix: The volume's key prefix; events outside it are ignored.
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only keys ending with this (or one of these).
        max_workers: Parallel ReceiveMessage calls while draining a backlog.
        wait_time_seconds: Long-poll wait of the first call (at most 20, bounded by timeout).
        visibility_timeout: VisibilityTimeout for received messages; None keeps the queue's.
        max_batch_messages: Stop draining once this many messages are received.
        **client_options: `ClientOptions` fields (endpoint_url, region_name, credentials...).

    Example:
        >>> with SqsListener(url, bucket="bkt", prefix="in/") as listener:  # doctest: +SKIP
        ...     batch = listener.receive(timeout=5)
    """

    def __init__(self, queue_url: str, *, bucket: str, prefix: str = "", recursive: bool = True,
                 suffix: str | tuple[str, ...] | None = None, max_workers: int = 4,
                 wait_time_seconds: int = 20, visibility_timeout: int | None = None,
                 max_batch_messages: int = 1000, **client_options: Any) -> None:
        if max_workers < 1 or max_batch_messages < 1:
            raise ValueError("max_workers and max_batch_messages must be >= 1")
        if not 0 <= wait_time_seconds <= 20:
            raise ValueError(f"wait_time_seconds must be in 0..20: {wait_time_seconds}")
        self.queue_url = queue_url
        self.scope = S3Scope(bucket, prefix, recursive, suffix)
        self.max_workers = max_workers
        self.wait_time_seconds = wait_time_seconds
        self.visibility_timeout = visibility_timeout
        self._queue_visibility: int | None = None
        self.max_batch_messages = max_batch_messages
        client_options.setdefault("max_pool_connections", max_workers + 2)
        self._options = ClientOptions.of(**client_options)
        with translate_errors("sqs", "configure client", self._options):
            session = self._options.session()
            if not self._options.region_name and not session.region_name:
                region = region_from_queue_url(queue_url)
                if region:
                    self._options = self._options.replace(region_name=region)
                    session = None
        self._client = self._options.client("sqs", session=session)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._idle = False

    def __repr__(self) -> str:
        return f"SqsListener({self.queue_url!r}, {self.scope!r}, {self._options!r})"

    @property
    def idle(self) -> bool:
        """True when the last receive found the queue empty; nothing is ever buffered inside."""
        return self._idle

    def receive(self, timeout: float) -> Received:
        """Long-poll up to `timeout` seconds (at most `wait_time_seconds`), then drain a backlog.

        While a backlog lasts, up to `max_workers` threads each call ReceiveMessage again as
        soon as their previous call returns (no lockstep rounds), and parse what they got while
        the others wait on the network; a thread stops when its call comes back short.

        Returns:
            The events in arrival order, the receipt handles of every well-formed message
            (including ignored ones), and counts of malformed and ignored messages. `info`
            has `messages`, `receive_calls`, `test_events`, `records_ignored`,
            `invalid_paths` and `duplicates`.

        Raises:
            CredentialsError: no usable credentials.
            ConnectorError: the queue cannot be read (after botocore's retries).
        """
        self._check_open()
        wait = int(max(0, min(self.wait_time_seconds, timeout)))
        first = self._receive_call(_MAX_MESSAGES, wait)
        items, calls = [self._parse(m) for m in first], 1
        if len(first) == _MAX_MESSAGES and len(items) < self.max_batch_messages \
                and not self._closed:
            more, extra = self._drain(self.max_batch_messages - len(items))
            items.extend(more)
            calls += extra
        self._idle = not items
        return self._digest(items, calls)

    def _drain(self, room: int) -> tuple[list[_Item], int]:
        """Short-poll on the worker threads until the backlog or `room` runs out; returns
        (the parsed messages in call order, the number of calls)."""
        # Stop well before the first messages' visibility runs out: past it, the drain would
        # receive its own messages again (and they would be redelivered to others).
        budget = _Budget(room, time.monotonic() + 0.5 * self._visibility_s())
        workers = min(self.max_workers, math.ceil(room / _MAX_MESSAGES))
        try:
            pool = self._pool()
            futures = [pool.submit(self._drain_worker, budget) for _ in range(workers)]
        except (ConnectorError, RuntimeError):  # closed meanwhile: return what we have
            return [], 0
        calls: list[tuple[int, list[_Item]]] = []
        for future in futures:
            try:
                calls.extend(future.result())
            except CancelledError:  # a concurrent close() cancels workers not yet started
                continue
        if budget.failure is not None:  # keep what the other calls received
            logger.warning("stopped draining %s early: %s", self.queue_url, budget.failure)
        calls.sort(key=lambda call: call[0])
        return [item for _, got in calls for item in got], budget.calls

    def _drain_worker(self, budget: _Budget) -> list[tuple[int, list[_Item]]]:
        done: list[tuple[int, list[_Item]]] = []
        while not self._closed:
            ticket = budget.take()
            if ticket is None:
                break
            index, count = ticket
            try:
                got = self._receive_call(count, 0)
            except ConnectorError as exc:
                budget.fail(exc)
                break
            budget.give_back(count - len(got))
            done.append((index, [self._parse(m) for m in got]))
            if len(got) < count:  # the backlog is thinning out: leave it to the next receive
                break
        return done

    def _parse(self, message: dict[str, Any]) -> _Item:
        """Parse one message and map its records to this volume's events (thread-safe)."""
        message_id = message.get("MessageId")
        try:
            parsed = parse_message(message.get("Body"), message_id=message_id)
        except MalformedMessageError as exc:
            return _Item(message, None, exc)
        info = dict.fromkeys(("records_ignored", "invalid_paths"), 0)
        return _Item(message, parsed, None, self._events_of(parsed, info), info)

    def _visibility_s(self) -> float:
        """The visibility timeout received messages get: ours, else the queue's (read once)."""
        if self.visibility_timeout is not None:
            return self.visibility_timeout
        if self._queue_visibility is None:
            try:
                with translate_errors("sqs", f"GetQueueAttributes {self.queue_url}",
                                      self._options):
                    attributes = self._client.get_queue_attributes(
                        QueueUrl=self.queue_url, AttributeNames=["VisibilityTimeout"],
                    ).get("Attributes", {})
                self._queue_visibility = int(attributes.get("VisibilityTimeout", 30))
            except ConnectorError as exc:
                logger.warning("cannot read the visibility timeout of %s (%s); assuming SQS's "
                               "default of 30 s", self.queue_url, exc)
                self._queue_visibility = 30
        return self._queue_visibility

    def backlog(self) -> int:
        """Messages waiting on the queue (its ApproximateNumberOfMessages), for metrics.

        Raises:
            ConnectorError: the attributes cannot be read (e.g. no sqs:GetQueueAttributes).

        Example:
            >>> listener.backlog()  # doctest: +SKIP
            1250
        """
        with translate_errors("sqs", f"GetQueueAttributes {self.queue_url}", self._options):
            attributes = self._client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"],
            ).get("Attributes", {})
        return int(attributes.get("ApproximateNumberOfMessages", 0))

    def ack(self, handles: Sequence[Any]) -> None:
        """Delete the messages behind `handles` (DeleteMessageBatch, 10 at a time).

        Entries failing on the service side are retried with backoff. Handles that are no
        longer valid (the message became visible again and was redelivered) are logged and
        skipped: the redelivered copy is a harmless duplicate.

        Raises:
            ConnectorError: a call failed, or entries still failed after the retries.
        """
        self._run_batches("DeleteMessageBatch", handles, {})

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep the messages invisible for `seconds` more (ChangeMessageVisibilityBatch).

        `seconds=0` makes them visible again at once (give them back).
        """
        if not 0 <= seconds <= 43200:
            raise ValueError(f"visibility seconds must be in 0..43200: {seconds}")
        self._run_batches("ChangeMessageVisibilityBatch", handles, {"VisibilityTimeout": seconds})

    def close(self) -> None:
        """Stop the worker threads. Unacknowledged messages reappear after their timeout.

        `ack` and `extend` keep working after `close` (one call at a time), so a daemon can
        close its listener, finish its last commit and still acknowledge it.
        """
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SqsListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectorError(f"{self!r} is closed")

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            self._check_open()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers,
                                                    thread_name_prefix="volume-stream-sqs")
            return self._executor

    def _receive_call(self, count: int, wait: int) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "QueueUrl": self.queue_url, "MaxNumberOfMessages": count, "WaitTimeSeconds": wait,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if self.visibility_timeout is not None:
            kwargs["VisibilityTimeout"] = self.visibility_timeout
        with translate_errors("sqs", f"ReceiveMessage {self.queue_url}", self._options):
            return self._client.receive_message(**kwargs).get("Messages", [])

    def _digest(self, items: Sequence[_Item], calls: int) -> Received:
        events: list[FileEvent] = []
        handles: list[str] = []
        seen: dict[str, int] = {}
        malformed = ignored = 0
        info = dict.fromkeys(("test_events", "records_ignored", "invalid_paths", "duplicates"), 0)
        for item in items:
            message = item.message
            message_id = message.get("MessageId")
            if message_id in seen:  # the same message twice in one batch: keep the new handle
                handles[seen[message_id]] = message["ReceiptHandle"]
                info["duplicates"] += 1
                continue
            if item.parsed is None:
                malformed += 1
                logger.warning("leaving malformed message %s on %s for its redrive policy "
                               "(receive count %s): %s", message_id, self.queue_url,
                               message.get("Attributes", {}).get("ApproximateReceiveCount"),
                               item.error)
                continue
            seen[message_id] = len(handles)
            handles.append(message["ReceiptHandle"])
            info["test_events"] += item.parsed.is_test_event
            for key, count in item.info.items():
                info[key] += count
            events.extend(item.events)
            ignored += not item.events
        info.update(messages=len(items), receive_calls=calls)
        return Received(tuple(events), tuple(handles), malformed, ignored, info=info)

    def _events_of(self, parsed: ParsedMessage, info: dict[str, int]) -> list[FileEvent]:
        found = []
        for record in parsed.records:
            try:
                event = to_file_event(record, self.scope, source_id=parsed.message_id)
            except InvalidPathError as exc:
                info["invalid_paths"] += 1
                logger.warning("ignoring %s from message %s: %s", record.url, parsed.message_id,
                               exc)
                continue
            if event is None:
                info["records_ignored"] += 1
            else:
                found.append(event)
        return found

    def _run_batches(self, action: str, handles: Sequence[Any], extra: dict[str, Any]) -> None:
        unique = list(dict.fromkeys(handles))
        if not unique:
            return
        chunks = _chunks(unique)
        if len(chunks) == 1 or self._closed:  # after close(): still works, one call at a time
            for chunk in chunks:
                self._run_batch(action, chunk, extra)
        else:
            list(self._pool().map(lambda chunk: self._run_batch(action, chunk, extra), chunks))

    def _run_batch(self, action: str, handles: Sequence[str], extra: dict[str, Any]) -> None:
        call = getattr(self._client, "delete_message_batch" if action == "DeleteMessageBatch"
                       else "change_message_visibility_batch")
        pending = {str(i): handle for i, handle in enumerate(handles)}

        @retry(retry=retry_if_result(bool), stop=stop_after_attempt(4),
               wait=wait_random_exponential(multiplier=0.1, max=2.0))
        def attempt() -> dict[str, str]:
            entries = [{"Id": i, "ReceiptHandle": h, **extra} for i, h in pending.items()]
            with translate_errors("sqs", f"{action} {self.queue_url}", self._options):
                response = call(QueueUrl=self.queue_url, Entries=entries)
            for ok in response.get("Successful", []):
                pending.pop(ok["Id"], None)
            for failed in response.get("Failed", []):
                if failed.get("SenderFault"):  # invalid or expired handle: retrying won't help
                    logger.warning("%s on %s: entry rejected: %s %s", action, self.queue_url,
                                   failed.get("Code"), failed.get("Message"))
                    pending.pop(failed["Id"], None)
            return pending

        try:
            attempt()
        except RetryError:
            raise ConnectorError(f"{action} on {self.queue_url}: {len(pending)} entries still "
                                 "failing after retries") from None
