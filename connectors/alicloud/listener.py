"""Alibaba Cloud MNS listener for OSS event notifications (DESIGN §6).

`parse_message` is pure: it turns one MNS message body into `OssRecord`s. OSS publishes
`{"events": [...]}` JSON (protocols.md §2.1), and the queue body is base64 of it (§2.2) or, for
queues fed another way, the JSON itself; both are accepted (a body starting with '{' is JSON,
anything else must be base64 of JSON). Keys are raw UTF-8 (no URL decoding, unlike S3).

Which events count: `ObjectCreated:*` is CREATED and `ObjectRemoved:*` is REMOVED, except the
steps of a multipart upload (`InitiateMultipartUpload`, `UploadPart`, `UploadPartCopy`, and
`ObjectRemoved:AbortMultipartUpload`): the object is not visible until
`CompleteMultipartUpload`, which is the one event that creates it. `AppendObject` counts as
CREATED each time: an appendable object is readable at its new size after every append, and OSS
never says which append is the last. Downloads, restores, replication and unknown categories
are skipped (counted).

Ordering: OSS events carry no sequencer, only `eventTime` at second precision (ties are
likely), so `FileEvent.sequencer` stays None and `event_time` is `eventTime`. Within one
`Received`, events are sorted by (event_time, MNS EnqueueTime, arrival) so the caller's
"same time -> arrival order" rule follows the order OSS published in.

`MnsListener` implements the `Listener` protocol on aliyun-mns-sdk: one long poll, then, while
a backlog lasts, parallel short polls on `volume-stream-mns-*` threads, each with its own SDK
client (the SDK's HTTP connection is not thread-safe). Handles are `MnsHandle` objects whose
receipt handle `extend` updates in place, because ChangeMessageVisibility issues a new one.

    with MnsListener(endpoint, "q", bucket="bkt", prefix="in/") as listener:
        batch = listener.receive(timeout=20)
        table.apply(batch.events)
        listener.ack(batch.handles)
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from mns.account import Account
from mns.mns_exception import MNSServerException
from tenacity import (
    RetryError,
    retry,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from connectors._alicloud import AliCloudOptions, is_transient_mns, translate_mns_errors
from connectors.base import Received
from connectors.errors import ConnectorError, MalformedMessageError
from connectors.events import EventKind, FileEvent, InvalidPathError
from connectors.oss import OssScope, normalize_etag, oss_url

__all__ = ["MnsHandle", "MnsListener", "OssRecord", "ParsedMessage", "parse_message",
           "to_file_event"]

logger = logging.getLogger(__name__)

_MAX_MESSAGES = 16  # MNS limit per BatchReceive / BatchDelete
_INTERMEDIATE = frozenset({"ObjectCreated:InitiateMultipartUpload", "ObjectCreated:UploadPart",
                           "ObjectCreated:UploadPartCopy", "ObjectRemoved:AbortMultipartUpload"})
_STALE_CODES = frozenset({"MessageNotExist", "ReceiptHandleError"})
#: Exponential backoff from 100 ms, capped at 2 s, plus up to 100 ms of jitter.
_BACKOFF = wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1)


@dataclass(frozen=True, slots=True)
class OssRecord:
    """One object change as OSS reported it; `etag` unquoted (upper-case hex)."""

    kind: EventKind
    bucket: str
    key: str
    event_time: datetime
    event_name: str
    size: int | None = None
    etag: str | None = None

    @property
    def url(self) -> str:
        return oss_url(self.bucket, self.key)


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

    Example:
        >>> body = ('{"events":[{"eventName":"ObjectCreated:PutObject","eventTime":'
        ...         '"2024-01-02T03:04:05.000Z","oss":{"bucket":{"name":"bkt"},'
        ...         '"object":{"key":"in/a b+c.txt","size":5,"eTag":"5D41"}}}]}')
        >>> parse_message(body).records[0].key
        'in/a b+c.txt'
    """
    where = f"message {message_id}" if message_id else "message"
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


def to_file_event(record: OssRecord, scope: OssScope, *,
                  source_id: str | None = None) -> FileEvent | None:
    """The `FileEvent` of `record` for the volume `scope`, or None when it is not the volume's.

    A created object's `last_modified_time` is the event time (the event carries no other).

    Raises:
        InvalidPathError: the key is in the volume but its relative path is unsafe.
    """
    relative = scope.relative_path(record.bucket, record.key)
    if relative is None:
        return None
    if record.kind is EventKind.CREATED:
        return FileEvent(EventKind.CREATED, relative, size=record.size, etag=record.etag,
                         last_modified_time=record.event_time, event_time=record.event_time,
                         source_id=source_id)
    return FileEvent(EventKind.REMOVED, relative, event_time=record.event_time,
                     source_id=source_id)


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
    name = _required(event, "eventName", str, at).removeprefix("oss:")
    if name in _INTERMEDIATE:
        return None
    if name.startswith("ObjectCreated:"):
        kind = EventKind.CREATED
    elif name.startswith("ObjectRemoved:"):
        kind = EventKind.REMOVED
    else:
        return None
    oss = _required(event, "oss", dict, at)
    obj = _required(oss, "object", dict, f"{at}.oss")
    size = None
    if kind is EventKind.CREATED:
        size = obj.get("size")
        if (isinstance(size, bool) or not isinstance(size, int | float) or size < 0
                or size != int(size)):
            raise MalformedMessageError(f"{at}: object size {size!r} of a created object is "
                                        "not a count of bytes")
        size = int(size)
    etag = obj.get("eTag") if kind is EventKind.CREATED else None
    return OssRecord(
        kind=kind,
        bucket=_required(_required(oss, "bucket", dict, f"{at}.oss"), "name", str, at),
        key=_required(obj, "key", str, f"{at}.oss.object"),
        event_time=_timestamp(_required(event, "eventTime", str, at), at),
        event_name=name,
        size=size,
        etag=normalize_etag(etag) if isinstance(etag, str) else None,
    )


def _required(doc: dict, name: str, typ: type, where: str) -> Any:
    value = doc.get(name)
    if not isinstance(value, typ) or (typ is str and not value):
        raise MalformedMessageError(f"{where}: field {name!r} must be a non-empty "
                                    f"{typ.__name__}, got {value!r:.80}")
    return value


def _timestamp(text: str, where: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise MalformedMessageError(f"{where}: bad eventTime {text!r:.60}") from exc
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class MnsHandle:
    """The acknowledgement handle of one received message.

    Mutable on purpose: MNS invalidates a receipt handle when ChangeMessageVisibility issues a
    new one, so `MnsListener.extend` stores the new handle here and the caller's `Received`
    stays valid. `stale` is set when MNS said the handle no longer holds the message (its
    visibility ran out and it may be redelivered). Compared by identity.
    """

    __slots__ = ("dequeue_count", "enqueue_time", "message_id", "receipt_handle", "stale")

    def __init__(self, message_id: str, receipt_handle: str, dequeue_count: int = 1,
                 enqueue_time: int = 0) -> None:
        self.message_id, self.receipt_handle = message_id, receipt_handle
        self.dequeue_count, self.enqueue_time = dequeue_count, enqueue_time
        self.stale = False

    def __repr__(self) -> str:
        return f"MnsHandle({self.message_id!r}, dequeue_count={self.dequeue_count})"


def _receipt(handle: Any) -> str:
    return handle.receipt_handle if isinstance(handle, MnsHandle) else str(handle)


_retry_transient = retry(retry=retry_if_exception(is_transient_mns), stop=stop_after_attempt(4),
                         wait=_BACKOFF, reraise=True)


class MnsListener:
    """Receive the OSS events of one volume from an MNS queue (`Listener` protocol).

    Args:
        endpoint: The MNS account endpoint, "https://<account>.mns.<region>.aliyuncs.com".
        queue_name: The queue OSS notifies.
        bucket: The volume's bucket; events of other buckets are ignored (and acked).
        prefix: The volume's key prefix; events outside it are ignored (and acked).
        recursive: When False, only direct children of the prefix count.
        suffix: Keep only keys ending with this (or one of these).
        access_key_id, access_key_secret, security_token: Explicit credentials; by default
            ALIBABA_CLOUD_ACCESS_KEY_ID / _SECRET / _SECURITY_TOKEN.
        wait_seconds: Long-poll wait of the first call (0..30, bounded by `timeout`).
        batch_size: Messages per BatchReceiveMessage call (1..16).
        max_workers: Parallel short polls while draining a backlog.
        max_batch_messages: Stop draining once this many messages are received.

    Raises:
        CredentialsError: no credentials were given or found in the environment.
    """

    def __init__(self, endpoint: str, queue_name: str, *, bucket: str, prefix: str = "",
                 recursive: bool = True, suffix: str | tuple[str, ...] | None = None,
                 access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, wait_seconds: int = 20,
                 batch_size: int = _MAX_MESSAGES, max_workers: int = 4,
                 max_batch_messages: int = 1000) -> None:
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https://: {endpoint!r}")
        if not 0 <= wait_seconds <= 30:
            raise ValueError(f"wait_seconds must be in 0..30: {wait_seconds}")
        if not 1 <= batch_size <= _MAX_MESSAGES:
            raise ValueError(f"batch_size must be in 1..16: {batch_size}")
        if max_workers < 1 or max_batch_messages < 1:
            raise ValueError("max_workers and max_batch_messages must be >= 1")
        self.endpoint, self.queue_name = endpoint.rstrip("/"), queue_name
        self.scope = OssScope(bucket, prefix, recursive, suffix)
        self.wait_seconds, self.batch_size = wait_seconds, batch_size
        self.max_workers, self.max_batch_messages = max_workers, max_batch_messages
        self._options = AliCloudOptions(access_key_id, access_key_secret, security_token)
        self._credentials = self._options.credentials()  # fail fast
        self._local = threading.local()
        self._accounts: list[Account] = []
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._idle = False

    def __repr__(self) -> str:
        return (f"MnsListener({self.endpoint!r}, {self.queue_name!r}, {self.scope!r}, "
                f"{self._options!r})")

    @property
    def idle(self) -> bool:
        """True once a receive found the queue empty (nothing is buffered inside)."""
        return self._idle and not self._closed.is_set()

    def receive(self, timeout: float) -> Received:
        """Long-poll up to `timeout` seconds (at most `wait_seconds`), then drain a backlog.

        Returns:
            The events, sorted by (event_time, EnqueueTime, arrival); the `MnsHandle`s of every
            well-formed message (ignored ones too, so they get acked); the count of malformed
            messages (left on the queue) and of ignored ones. `info` has `messages`,
            `receive_calls`, `events_skipped`, `records_ignored`, `invalid_paths`, `duplicates`.

        Raises:
            CredentialsError: MNS rejected the credentials.
            ConnectorError: the queue cannot be read (after retries).
        """
        self._check_open()
        started = time.monotonic()
        wait = int(max(0, min(self.wait_seconds, timeout)))
        first = self._receive_call(self.batch_size, wait)
        messages, calls = list(first), 1
        full = len(first) == self.batch_size
        while full and len(messages) < self.max_batch_messages and not self._closed.is_set():
            room = self.max_batch_messages - len(messages)
            sizes = [min(self.batch_size, room - i * self.batch_size)
                     for i in range(min(self.max_workers, math.ceil(room / self.batch_size)))]
            rounds = list(self._pool().map(lambda n: self._receive_call(n, 0), sizes))
            calls += len(rounds)
            for got in rounds:
                messages.extend(got)
            full = any(len(got) == n for got, n in zip(rounds, sizes, strict=True))
        self._idle = not messages
        if not messages:  # MNS waits whole seconds: wait out a fraction rather than spin
            bound = min(self.wait_seconds, max(0.0, timeout))
            self._closed.wait(max(0.0, bound - (time.monotonic() - started)))
        return self._digest(messages, calls)

    def ack(self, handles: Sequence[Any]) -> None:
        """Delete the messages behind `handles` (BatchDeleteMessage, 16 at a time).

        Entries failing on the service side are retried with backoff. Handles that no longer
        hold their message (it became visible again and was or will be redelivered) are logged
        and skipped: the redelivered copy is a harmless duplicate.

        Raises:
            ConnectorError: entries still failed after the retries.
        """
        unique = list(dict.fromkeys(_receipt(h) for h in handles))
        chunks = [unique[i:i + _MAX_MESSAGES] for i in range(0, len(unique), _MAX_MESSAGES)]
        if len(chunks) <= 1:
            for chunk in chunks:
                self._delete_batch(chunk)
        else:
            list(self._pool().map(self._delete_batch, chunks))

    def extend(self, handles: Sequence[Any], seconds: int) -> None:
        """Keep the messages invisible for `seconds` more (ChangeMessageVisibility each).

        Each `MnsHandle` gets the new receipt handle MNS returns. `seconds=0` gives a message
        back as soon as MNS allows (1 s, its minimum). A stale handle is logged and marked.
        """
        if not 0 <= seconds <= 43200:
            raise ValueError(f"visibility seconds must be in 0..43200: {seconds}")
        if not all(isinstance(h, MnsHandle) for h in handles):
            raise TypeError("extend needs the MnsHandle objects from receive()")
        items = list(dict.fromkeys(handles))
        if len(items) <= _MAX_MESSAGES:
            for handle in items:
                self._change_visibility(handle, max(1, seconds))
        else:
            list(self._pool().map(lambda h: self._change_visibility(h, max(1, seconds)), items))

    def close(self) -> None:
        """Stop the worker threads and close the connections. Unacked messages reappear
        after their visibility timeout."""
        with self._lock:
            self._closed.set()
            executor, self._executor = self._executor, None
            accounts, self._accounts = self._accounts, []
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        for account in accounts:
            account.mns_client.close_connection()

    def __enter__(self) -> MnsListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ConnectorError(f"{self!r} is closed")

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            self._check_open()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.max_workers,
                                                    thread_name_prefix="volume-stream-mns")
            return self._executor

    def backlog(self) -> int:
        """Messages waiting on the queue (its ActiveMessages attribute), for metrics.

        Raises:
            ConnectorError: the attributes cannot be read (e.g. no mns:GetQueueAttributes).

        Example:
            >>> listener.backlog()  # doctest: +SKIP
            1250
        """
        with translate_mns_errors(f"GetQueueAttributes {self.queue_name}"), \
                warnings.catch_warnings():
            # aliyun-mns-sdk 1.3 marks ActiveMessages deprecated but offers no replacement yet
            warnings.simplefilter("ignore", DeprecationWarning)
            return int(self._queue().get_attributes().active_messages)

    def _queue(self) -> Any:
        """This thread's SDK queue client (one HTTP connection each; raw, undecoded bodies)."""
        self._check_open()  # also stops retries of calls cut off by close()
        queue = getattr(self._local, "queue", None)
        if queue is None:
            creds = self._credentials
            account = Account(self.endpoint, creds.access_key_id, creds.access_key_secret,
                              creds.security_token or "")
            with self._lock:
                self._check_open()
                self._accounts.append(account)
            queue = account.get_queue(self.queue_name)
            queue.set_encoding(False)  # we decode base64 ourselves, tolerating plain JSON
            self._local.queue = queue
        return queue

    def _receive_call(self, count: int, wait: int) -> list[Any]:
        @_retry_transient
        def call() -> list[Any]:
            try:
                return self._queue().batch_receive_message(count, wait_seconds=wait)
            except MNSServerException as exc:
                if exc.type == "MessageNotExist":  # the queue is empty
                    return []
                raise

        with translate_mns_errors(f"BatchReceiveMessage {self.queue_name}"):
            return call()

    def _digest(self, messages: list[Any], calls: int) -> Received:
        found: list[tuple[datetime, int, int, FileEvent]] = []
        handles: list[MnsHandle] = []
        seen: dict[str, int] = {}
        malformed = ignored = 0
        info = dict.fromkeys(("events_skipped", "records_ignored", "invalid_paths",
                              "duplicates"), 0)
        for message in messages:
            message_id = message.message_id
            handle = MnsHandle(message_id, message.receipt_handle, message.dequeue_count,
                               message.enqueue_time)
            if message_id in seen:  # the same message twice in one batch: keep the new handle
                handles[seen[message_id]] = handle
                info["duplicates"] += 1
                continue
            try:
                parsed = parse_message(message.message_body, message_id=message_id)
            except MalformedMessageError as exc:
                malformed += 1
                logger.warning("leaving malformed message %s on MNS queue %s (dequeue count "
                               "%s): %s", message_id, self.queue_name, message.dequeue_count, exc)
                continue
            seen[message_id] = len(handles)
            handles.append(handle)
            info["events_skipped"] += parsed.skipped
            events = [_tie_break(e, message.enqueue_time)
                      for e in self._events_of(parsed, info)]
            found.extend((e.event_time, message.enqueue_time, len(found) + i, e)
                         for i, e in enumerate(events))
            ignored += not events
        info.update(messages=len(messages), receive_calls=calls)
        found.sort(key=lambda item: item[:3])
        return Received(tuple(item[3] for item in found), tuple(handles), malformed, ignored,
                        info=info)

    def _events_of(self, parsed: ParsedMessage, info: dict[str, int]) -> list[FileEvent]:
        events = []
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
                events.append(event)
        return events

    def _delete_batch(self, receipts: list[str]) -> None:
        pending = set(receipts)

        @retry(retry=retry_if_result(bool), stop=stop_after_attempt(4),
               wait=_BACKOFF)
        def attempt() -> set[str]:
            try:
                self._queue().batch_delete_message(sorted(pending))
                pending.clear()
            except MNSServerException as exc:
                if not exc.sub_errors:
                    if exc.type in _STALE_CODES:  # a whole-request answer for one handle
                        logger.warning("BatchDeleteMessage on %s: %s", self.queue_name, exc.type)
                        pending.clear()
                    elif not is_transient_mns(exc):
                        raise
                    return pending
                failed = {e.get("ReceiptHandle"): e for e in exc.sub_errors}
                pending.intersection_update(failed)  # the others were deleted
                for receipt, error in failed.items():
                    if error.get("ErrorCode") in _STALE_CODES:
                        logger.warning("BatchDeleteMessage on %s: handle no longer valid "
                                       "(%s); the message will be redelivered",
                                       self.queue_name, error.get("ErrorCode"))
                        pending.discard(receipt)
            except Exception as exc:
                if not is_transient_mns(exc):
                    raise
            return pending

        with translate_mns_errors(f"BatchDeleteMessage {self.queue_name}"):
            try:
                attempt()
            except RetryError:
                raise ConnectorError(f"BatchDeleteMessage on {self.queue_name}: {len(pending)} "
                                     "entries still failing after retries") from None

    def _change_visibility(self, handle: MnsHandle, seconds: int) -> None:
        @_retry_transient
        def call() -> Any:
            return self._queue().change_message_visibility(handle.receipt_handle, seconds)

        with translate_mns_errors(f"ChangeMessageVisibility {self.queue_name}"):
            try:
                handle.receipt_handle = call().receipt_handle
            except MNSServerException as exc:
                if exc.type not in _STALE_CODES:
                    raise
                handle.stale = True
                logger.warning("ChangeMessageVisibility on %s: message %s no longer held (%s)",
                               self.queue_name, handle.message_id, exc.type)
