"""A local fake of the Alibaba Cloud MNS queue REST API, as aliyun-mns-sdk 1.3.0 uses it.

Written from /work/shared/specs/protocols.md §1. `MnsBackend` holds the state and the rules
(queues, visibility timeouts, receipt handles, long polling); `MnsHandler` only parses and
writes the wire format; `FakeMnsServer` runs both on 127.0.0.1. Tests talk to it with the real
SDK (`mns.account.Account(server.endpoint, ak, secret)`).

Behaviour worth knowing:
  * every request is signed (MNS V1, HMAC-SHA1): an unknown AccessKeyId gives 403
    `InvalidAccessKeyId`, a wrong secret 403 `SignatureDoesNotMatch`; a body's content-md5 must be
    base64 of the *hex* MD5 (the SDK quirk) or the request fails with 400 `InvalidArgument`.
  * each receive mints a fresh receipt handle (URL-safe) and only the latest one works: a
    handle that was superseded (re-receive, change visibility) or whose visibility expired gives
    404 `MessageNotExist`; one the server never issued gives 400 `ReceiptHandleError`.
  * long polling (`waitseconds`, else the queue's PollingWaitSeconds) waits on a condition
    variable and returns as soon as a message is visible; empty gives 404 `MessageNotExist`.
  * time is `time.time()` plus an offset: `backend.advance(seconds)` moves the clock so tests
    can expire visibility timeouts without sleeping.
  * `backend.fail_next(action, code, status)` makes the next request of an action fail
    (actions: CreateQueue, SendMessage, BatchSendMessage, ReceiveMessage, BatchReceiveMessage,
    DeleteMessage, BatchDeleteMessage, ChangeMessageVisibility, PeekMessage, ...).
  * message bodies are stored verbatim (base64 or not is the client's convention).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler, new_request_id

__all__ = ["FakeMnsServer", "MnsBackend", "MnsError", "StoredMessage"]

XMLNS = "http://mns.aliyuncs.com/doc/v1/"
_QUEUE_DEFAULTS = {"VisibilityTimeout": 30, "MaximumMessageSize": 65536,
                   "MessageRetentionPeriod": 345600, "DelaySeconds": 0,
                   "PollingWaitSeconds": 0}
_QUEUE_LIMITS = {"VisibilityTimeout": (1, 43200), "MaximumMessageSize": (1024, 65536),
                 "MessageRetentionPeriod": (60, 604800), "DelaySeconds": (0, 604800),
                 "PollingWaitSeconds": (0, 30)}


class MnsError(Exception):
    """An MNS error response: `code` and HTTP `status`; `sub_errors` for batch deletes."""

    def __init__(self, code: str, status: int, message: str = "",
                 sub_errors: list[tuple[str, str, str]] | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.code, self.status, self.message = code, status, message or code
        self.sub_errors = sub_errors or []


@dataclass
class StoredMessage:
    message_id: str
    body: str
    priority: int
    enqueue_ms: int
    visible_at: float
    seq: int
    dequeue_count: int = 0
    first_dequeue_ms: int = 0
    handle: str | None = None

    @property
    def body_md5(self) -> str:
        return hashlib.md5(self.body.encode("utf-8")).hexdigest().upper()


@dataclass
class _Queue:
    name: str
    attrs: dict
    created: int
    modified: int
    logging: bool = False
    messages: dict[str, StoredMessage] = field(default_factory=dict)
    issued: dict[str, str] = field(default_factory=dict)  # every handle ever -> message id


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class MnsBackend:
    """Queues and their messages; thread-safe; all waiting on one condition variable."""

    def __init__(self) -> None:
        self.credentials: dict[str, tuple[str, str | None]] = {}
        self.queues: dict[str, _Queue] = {}
        self._cond = threading.Condition()
        self._offset = 0.0
        self._seq = itertools.count(1)
        self._faults: list[list] = []
        self.closing = False

    # -- test controls ----------------------------------------------------------------------
    def add_credentials(self, access_key_id: str, secret: str, security_token: str | None = None):
        self.credentials[access_key_id] = (secret, security_token)

    def now(self) -> float:
        return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake clock forward (expires visibility timeouts, ends long polls early)."""
        with self._cond:
            self._offset += seconds
            self._cond.notify_all()

    def fail_next(self, action: str, code: str = "InternalError", status: int = 500,
                  times: int = 1) -> None:
        with self._cond:
            self._faults.append([action, code, status, times])

    def clear_faults(self) -> None:
        with self._cond:
            self._faults.clear()

    def take_fault(self, action: str) -> MnsError | None:
        with self._cond:
            for fault in self._faults:
                if fault[0] == action and fault[3] > 0:
                    fault[3] -= 1
                    return MnsError(fault[1], fault[2], "injected fault")
        return None

    def messages(self, queue: str) -> list[StoredMessage]:
        """Snapshot of a queue's messages in enqueue order (for assertions)."""
        with self._cond:
            return sorted(self._queue(queue).messages.values(), key=lambda m: m.seq)

    def close(self) -> None:
        with self._cond:
            self.closing = True
            self._cond.notify_all()

    # -- queues -------------------------------------------------------------------------------
    def _queue(self, name: str) -> _Queue:
        try:
            return self.queues[name]
        except KeyError:
            raise MnsError("QueueNotExist", 404,
                           "The queue name you provided is not exist.") from None

    def create_queue(self, name: str, attrs: dict[str, int], logging: bool | None = None) -> int:
        _check_attrs(attrs)
        with self._cond:
            existing = self.queues.get(name)
            if existing is not None:
                same = all(existing.attrs[k] == v for k, v in attrs.items())
                if not same or (logging is not None and logging != existing.logging):
                    raise MnsError("QueueAlreadyExist", 409,
                                   "The queue you want to create is already exist.")
                return 204
            now = int(self.now())
            self.queues[name] = _Queue(name, {**_QUEUE_DEFAULTS, **attrs}, now, now, bool(logging))
            return 201

    def set_queue_attributes(self, name: str, attrs: dict[str, int], logging: bool | None) -> None:
        _check_attrs(attrs)
        with self._cond:
            queue = self._queue(name)
            queue.attrs.update(attrs)
            if logging is not None:
                queue.logging = logging
            queue.modified = int(self.now())

    def delete_queue(self, name: str) -> None:
        with self._cond:
            self._queue(name)
            del self.queues[name]
            self._cond.notify_all()

    # -- messages -----------------------------------------------------------------------------
    def send(self, queue_name: str, body: str, *, delay_seconds: int | None = None,
             priority: int | None = None) -> StoredMessage:
        with self._cond:
            queue = self._queue(queue_name)
            if not body:
                raise MnsError("InvalidArgument", 400, "The message body must not be empty.")
            if len(body.encode("utf-8")) > queue.attrs["MaximumMessageSize"]:
                raise MnsError("InvalidArgument", 400, "The message body is too long.")
            delay = queue.attrs["DelaySeconds"] if delay_seconds is None else delay_seconds
            prio = 8 if priority is None else priority
            if not 0 <= delay <= 604800 or not 1 <= prio <= 16:
                raise MnsError("InvalidArgument", 400, "DelaySeconds or Priority out of range.")
            now = self.now()
            msg = StoredMessage(uuid.uuid4().hex.upper(), body, prio, _ms(now), now + delay,
                                next(self._seq))
            queue.messages[msg.message_id] = msg
            self._cond.notify_all()
            return msg

    def receive(self, queue_name: str, count: int, wait_seconds: int | None) -> list[StoredMessage]:
        if not 1 <= count <= 16:
            raise MnsError("InvalidArgument", 400, "numOfMessages must be between 1 and 16.")
        with self._cond:
            queue = self._queue(queue_name)
            wait = queue.attrs["PollingWaitSeconds"] if wait_seconds is None else wait_seconds
            if not 0 <= wait <= 30:
                raise MnsError("InvalidArgument", 400, "waitseconds must be between 0 and 30.")
            deadline = self.now() + wait
            while True:
                queue = self._queue(queue_name)
                now = self.now()
                visible = sorted((m for m in queue.messages.values() if m.visible_at <= now),
                                 key=lambda m: (m.priority, m.seq))[:count]
                if visible:
                    return [self._deliver(queue, m, now) for m in visible]
                remaining = deadline - now
                if remaining <= 0 or self.closing:
                    raise MnsError("MessageNotExist", 404, "Message not exist.")
                upcoming = [m.visible_at - now for m in queue.messages.values()]
                self._cond.wait(min([remaining, 1.0, *upcoming]))

    def _deliver(self, queue: _Queue, msg: StoredMessage, now: float) -> StoredMessage:
        msg.dequeue_count += 1
        msg.first_dequeue_ms = msg.first_dequeue_ms or _ms(now)
        msg.visible_at = now + queue.attrs["VisibilityTimeout"]
        msg.handle = self._new_handle(queue, msg)
        return StoredMessage(**vars(msg))

    def _new_handle(self, queue: _Queue, msg: StoredMessage) -> str:
        handle = f"{msg.message_id}-{uuid.uuid4().hex[:16].upper()}"
        queue.issued[handle] = msg.message_id
        return handle

    def _held(self, queue: _Queue, handle: str) -> StoredMessage:
        """The message `handle` currently holds, or the error the service gives."""
        if not handle:
            raise MnsError("MissingReceiptHandle", 400, "The receipt handle is missing.")
        message_id = queue.issued.get(handle)
        if message_id is None:
            raise MnsError("ReceiptHandleError", 400,
                           f"The receipt handle you provided is not valid: {handle}")
        msg = queue.messages.get(message_id)
        if msg is None or msg.handle != handle or msg.visible_at <= self.now():
            raise MnsError("MessageNotExist", 404, "Message not exist or the handle has expired.")
        return msg

    def delete(self, queue_name: str, handle: str) -> None:
        with self._cond:
            queue = self._queue(queue_name)
            del queue.messages[self._held(queue, handle).message_id]

    def batch_delete(self, queue_name: str, handles: list[str]) -> None:
        if not 1 <= len(handles) <= 16:
            raise MnsError("InvalidArgument", 400, "A batch delete takes 1 to 16 receipt handles.")
        errors = []
        with self._cond:
            queue = self._queue(queue_name)
            for handle in handles:
                try:
                    del queue.messages[self._held(queue, handle).message_id]
                except MnsError as exc:
                    errors.append((exc.code, exc.message, handle))
        if errors:
            raise MnsError(errors[0][0], 404, errors[0][1], sub_errors=errors)

    def change_visibility(self, queue_name: str, handle: str, seconds: int) -> tuple[str, int]:
        if not 1 <= seconds <= 43200:
            raise MnsError("InvalidArgument", 400, "VisibilityTimeout must be between 1 and 43200.")
        with self._cond:
            queue = self._queue(queue_name)
            msg = self._held(queue, handle)
            msg.visible_at = self.now() + seconds
            msg.handle = self._new_handle(queue, msg)
            return msg.handle, _ms(msg.visible_at)

    def peek(self, queue_name: str, count: int) -> list[StoredMessage]:
        if not 1 <= count <= 16:
            raise MnsError("InvalidArgument", 400, "numOfMessages must be between 1 and 16.")
        with self._cond:
            now = self.now()
            visible = sorted((m for m in self._queue(queue_name).messages.values()
                              if m.visible_at <= now), key=lambda m: (m.priority, m.seq))[:count]
            if not visible:
                raise MnsError("MessageNotExist", 404, "Message not exist.")
            return [StoredMessage(**vars(m)) for m in visible]

    def queue_attributes(self, name: str) -> dict[str, str]:
        with self._cond:
            queue = self._queue(name)
            now = self.now()
            active = sum(1 for m in queue.messages.values() if m.visible_at <= now)
            delayed = sum(1 for m in queue.messages.values()
                          if m.visible_at > now and not m.dequeue_count)
            inactive = len(queue.messages) - active - delayed
            return {"QueueName": name, "CreateTime": str(queue.created),
                    "LastModifyTime": str(queue.modified), "ActiveMessages": str(active),
                    "InactiveMessages": str(inactive), "DelayMessages": str(delayed),
                    **{k: str(v) for k, v in queue.attrs.items()},
                    "LoggingEnabled": "True" if queue.logging else "False"}


def _check_attrs(attrs: dict[str, int]) -> None:
    for name, value in attrs.items():
        low, high = _QUEUE_LIMITS[name]
        if not low <= value <= high:
            raise MnsError("InvalidArgument", 400, f"{name} must be between {low} and {high}.")


# -- wire ---------------------------------------------------------------------------------------

def _xml(root: str, fields: list[tuple[str, object]]) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{XMLNS}">'
            + _elements(fields) + f"</{root}>").encode("utf-8")


def _elements(fields: list[tuple[str, object]]) -> str:
    return "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in fields)


def _xml_list(root: str, item: str, rows: list[list[tuple[str, object]]]) -> bytes:
    inner = "".join(f"<{item}>{_elements(row)}</{item}>" for row in rows)
    head = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{XMLNS}">'
    return (head + inner + f"</{root}>").encode("utf-8")


def _message_fields(m: StoredMessage, *, with_handle: bool) -> list[tuple[str, object]]:
    fields: list[tuple[str, object]] = [("MessageId", m.message_id)]
    if with_handle:
        fields.append(("ReceiptHandle", m.handle))
    fields += [("MessageBodyMD5", m.body_md5), ("MessageBody", m.body),
               ("EnqueueTime", m.enqueue_ms)]
    if with_handle:
        fields.append(("NextVisibleTime", _ms(m.visible_at)))
    # never empty: the SDK's list parser drops empty elements and then fails the response
    fields += [("FirstDequeueTime", m.first_dequeue_ms or m.enqueue_ms),
               ("DequeueCount", m.dequeue_count), ("Priority", m.priority)]
    return fields


def _children(body: bytes) -> ET.Element:
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        raise MnsError("MalformedXML", 400, "The XML you provided was not well-formed.") from None
    for element in root.iter():
        element.tag = element.tag.rsplit("}", 1)[-1]
    return root


def _raw_query(query: str) -> dict[str, str]:
    """Split on '&' and the first '=', never unquote: receipt handles are sent raw."""
    params = {}
    for part in query.split("&") if query else ():
        name, _, value = part.partition("=")
        params[name] = value
    return params


def _int(value: str | None, name: str) -> int:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MnsError("InvalidArgument", 400,
                       f"{name} is not a valid integer: {value!r}") from None


class MnsHandler(FakeRequestHandler):
    backend: MnsBackend

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_GET

    def _handle(self) -> None:
        self.backend = self.server.state
        self.request_id = new_request_id()
        body = self.read_body()
        try:
            self._authenticate(body)
            path, _, query = self.path.partition("?")
            status, payload, headers = self._dispatch(path.split("/"), _raw_query(query), body)
        except MnsError as exc:
            self._send_error(exc)
            return
        except Exception as exc:  # a fake bug must surface as an error, not a hang
            self._send_error(MnsError("InternalError", 500, repr(exc)))
            return
        self._send(status, payload, headers)

    def _send(self, status: int, payload: bytes = b"", headers: dict | None = None) -> None:
        base = {"x-mns-request-id": self.request_id}
        if payload:
            base["Content-Type"] = "text/xml;charset=utf-8"
        self.respond(status, payload, {**base, **(headers or {})})

    def _send_error(self, exc: MnsError) -> None:
        if exc.sub_errors:
            rows = [[("ErrorCode", c), ("ErrorMessage", m), ("ReceiptHandle", h)]
                    for c, m, h in exc.sub_errors]
            self._send(exc.status, _xml_list("Errors", "Error", rows))
            return
        self._send(exc.status, _xml("Error", [("Code", exc.code), ("Message", exc.message),
                                              ("RequestId", self.request_id),
                                              ("HostId", self.server.endpoint)]))

    def _authenticate(self, body: bytes) -> None:
        auth = self.headers.get("Authorization", "")
        scheme, _, rest = auth.partition(" ")
        access_key_id, _, signature = rest.rpartition(":")
        if scheme != "MNS" or not access_key_id:
            raise MnsError("AccessDenied", 403, "Authorization header is missing or malformed.")
        if access_key_id not in self.backend.credentials:
            raise MnsError("InvalidAccessKeyId", 403, "The access Id you provided is not exist.")
        secret, token = self.backend.credentials[access_key_id]
        if token is not None and self.headers.get("security-token") != token:
            raise MnsError("AccessDenied", 403, "The security token is missing or not valid.")
        mns_headers = sorted((k.lower(), v) for k, v in self.headers.items()
                             if k.lower().startswith("x-mns-"))
        string_to_sign = "\n".join([
            self.command, self.headers.get("content-md5", ""), self.headers.get("content-type", ""),
            self.headers.get("date", ""),
            "".join(f"{k}:{v}\n" for k, v in mns_headers) + self.path])
        expected = base64.b64encode(hmac.new(secret.encode(), string_to_sign.encode("utf-8"),
                                             hashlib.sha1).digest()).decode()
        if not hmac.compare_digest(expected, signature):
            raise MnsError("SignatureDoesNotMatch", 403, "The request signature we calculated "
                           "does not match the signature you provided.")
        md5 = self.headers.get("content-md5")
        if body and md5 is not None:
            if md5 != base64.b64encode(hashlib.md5(body).hexdigest().encode()).decode():
                raise MnsError("InvalidArgument", 400,
                               "The Content-MD5 you specified is not valid.")

    def _fault(self, action: str) -> None:
        fault = self.backend.take_fault(action)
        if fault is not None:
            raise fault

    def _dispatch(self, parts: list[str], params: dict[str, str], body: bytes):
        b = self.backend
        if len(parts) == 3 and parts[1] == "queues" and parts[2]:
            return self._queue_op(parts[2], params, body)
        if len(parts) != 4 or parts[1] != "queues" or parts[3] != "messages":
            raise MnsError("InvalidArgument", 400, f"Unsupported resource {self.path}")
        queue, method = parts[2], self.command
        if method == "POST":
            root = _children(body)
            if root.tag == "Messages":
                self._fault("BatchSendMessage")
                rows = [[("MessageId", m.message_id), ("MessageBodyMD5", m.body_md5)]
                        for m in (self._send_one(queue, item) for item in root.findall("Message"))]
                return 201, _xml_list("Messages", "Message", rows), None
            self._fault("SendMessage")
            m = self._send_one(queue, root)
            return 201, _xml("Message", [("MessageId", m.message_id),
                                         ("MessageBodyMD5", m.body_md5)]), None
        if method == "GET":
            count = params.get("numOfMessages")
            if params.get("peekonly") == "true":
                self._fault("PeekMessage")
                msgs = b.peek(queue, _int(count or "1", "numOfMessages"))
                if count is None:
                    return 200, _xml("Message", _message_fields(msgs[0], with_handle=False)), None
                rows = [_message_fields(m, with_handle=False) for m in msgs]
                return 200, _xml_list("Messages", "Message", rows), None
            wait = params.get("waitseconds")
            wait_seconds = None if wait is None else _int(wait, "waitseconds")
            if count is None:
                self._fault("ReceiveMessage")
                m = b.receive(queue, 1, wait_seconds)[0]
                return 200, _xml("Message", _message_fields(m, with_handle=True)), None
            self._fault("BatchReceiveMessage")
            msgs = b.receive(queue, _int(count, "numOfMessages"), wait_seconds)
            return 200, _xml_list("Messages", "Message",
                                  [_message_fields(m, with_handle=True) for m in msgs]), None
        if method == "DELETE":
            if body:
                self._fault("BatchDeleteMessage")
                handles = [e.text or "" for e in _children(body).findall("ReceiptHandle")]
                b.batch_delete(queue, handles)
                return 204, b"", None
            self._fault("DeleteMessage")
            b.delete(queue, params.get("ReceiptHandle", ""))
            return 204, b"", None
        if method == "PUT":
            self._fault("ChangeMessageVisibility")
            if "VisibilityTimeout" not in params:
                raise MnsError("MissingVisibilityTimeout", 400, "VisibilityTimeout is missing.")
            seconds = _int(params["VisibilityTimeout"], "VisibilityTimeout")
            handle, next_visible = b.change_visibility(queue, params.get("ReceiptHandle", ""),
                                                       seconds)
            return 200, _xml("ChangeVisibility", [("ReceiptHandle", handle),
                                                  ("NextVisibleTime", next_visible)]), None
        raise MnsError("InvalidArgument", 400, f"Unsupported method {method}")

    def _send_one(self, queue: str, element: ET.Element) -> StoredMessage:
        def opt(tag: str) -> int | None:
            text = element.findtext(tag)
            return None if text is None else _int(text, tag)
        return self.backend.send(queue, element.findtext("MessageBody") or "",
                                 delay_seconds=opt("DelaySeconds"), priority=opt("Priority"))

    def _queue_op(self, name: str, params: dict[str, str], body: bytes):
        b, method = self.backend, self.command
        if method == "GET":
            self._fault("GetQueueAttributes")
            return 200, _xml("Queue", list(b.queue_attributes(name).items())), None
        if method == "DELETE":
            self._fault("DeleteQueue")
            b.delete_queue(name)
            return 204, b"", None
        if method == "PUT":
            root = _children(body) if body else ET.Element("Queue")
            attrs = {k: _int(root.findtext(k), k) for k in _QUEUE_DEFAULTS
                     if root.find(k) is not None}
            logging_text = root.findtext("LoggingEnabled")
            logging = None if logging_text is None else logging_text.lower() == "true"
            if params.get("metaoverride") == "true":
                self._fault("SetQueueAttributes")
                b.set_queue_attributes(name, attrs, logging)
                return 204, b"", None
            self._fault("CreateQueue")
            status = b.create_queue(name, attrs, logging)
            return status, b"", {"Location": f"{self.server.endpoint}/queues/{name}"}
        raise MnsError("InvalidArgument", 400, f"Unsupported method {method}")


class FakeMnsServer(FakeHTTPServer):
    """`FakeMnsServer(credentials={"ak": "secret"})`: `.endpoint`, `.backend`, `.start()`..."""

    def __init__(self, credentials: dict[str, str] | None = None,
                 backend: MnsBackend | None = None):
        self.backend = backend or MnsBackend()
        for access_key_id, secret in (credentials or {}).items():
            self.backend.add_credentials(access_key_id, secret)
        super().__init__("fake-mns", MnsHandler, self.backend)

    def stop(self) -> None:
        self.backend.close()
        super().stop()
