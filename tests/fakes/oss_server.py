"""A local fake of the Alibaba Cloud OSS REST API subset oss2 2.19.1 uses, with event notifications.

Written from /work/shared/specs/protocols.md §2 and §4. `OssBackend` holds buckets, objects,
multipart uploads and notification rules; `OssHandler` parses and writes the wire format;
`FakeOssServer` runs them on 127.0.0.1. With an IP endpoint oss2 addresses path-style
(`/{bucket}/{quote(key, safe='')}`), which is all this fake serves.

Supported: create/delete bucket, PutObject, CopyObject, AppendObject, GetObject (Range, with and
without `x-oss-range-behavior: standard`), HeadObject (errors in `x-oss-err`), DeleteObject,
DeleteMultipleObjects, ListObjects v1 and v2 (prefix, delimiter, marker/continuation token,
start-after, max-keys, encoding-type=url), multipart init/upload part/complete/abort. Every
request is checked against the V1 signature: unknown key 403 `InvalidAccessKeyId`, wrong secret
403 `SignatureDoesNotMatch`. GET/HEAD honour `If-Match` (412 `PreconditionFailed`).
`backend.fail_next(action, code, status)` injects a failure (actions are the OSS API names,
e.g. GetObject, PutObject, ListObjectsV2); `fail_next("TruncateBody")` makes the next GET send
half of its body and drop the connection.

Notifications: `backend.add_notification_rule(bucket, queue, ...)` delivers one MNS message per
event into a queue of an in-process `MnsBackend`, as OSS does: `{"events": [...]}` JSON (§2.1),
base64-encoded by default (§2.2; `base64_body=False` for plain JSON), `eventTime` at second
precision with `.000Z` like every real sample (`time_precision="ms"` for milliseconds). A delete
of a missing key sends nothing; a removal carries size 0, deltaSize -old size and the last eTag.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import formatdate
from urllib.parse import parse_qsl, quote, unquote
from xml.sax.saxutils import escape

import crcmod

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler, new_request_id
from tests.fakes.mns_server import MnsBackend, MnsError

__all__ = ["DEFAULT_EVENTS", "FakeOssServer", "NotificationRule", "OssBackend", "OssError"]

_crc64 = crcmod.mkCrcFun(0x142F0E1EBA9EA3693, initCrc=0, rev=True, xorOut=0xFFFFFFFFFFFFFFFF)

#: What a rule subscribes to unless told otherwise: the events that make or remove an object.
DEFAULT_EVENTS = ("ObjectCreated:PutObject", "ObjectCreated:PostObject", "ObjectCreated:CopyObject",
                  "ObjectCreated:AppendObject", "ObjectCreated:CompleteMultipartUpload",
                  "ObjectRemoved:DeleteObject", "ObjectRemoved:DeleteObjects")

# the query parameters oss2 signs (a subset of oss2.auth.ProviderAuth._subresource_key_set)
_SUBRESOURCES = frozenset({
    "acl", "uploads", "uploadId", "partNumber", "delete", "objectMeta", "append", "position",
    "continuation-token", "versionId", "versions", "tagging", "security-token", "x-oss-process",
    "symlink", "restore", "location", "bucketInfo", "stat", "cors", "lifecycle", "logging",
    "website", "referer", "response-content-type", "response-content-language",
    "response-cache-control", "response-content-encoding", "response-expires",
    "response-content-disposition", "callback", "callback-var", "encryption", "policy",
    "versioning", "objectInfo"})


class OssError(Exception):
    def __init__(self, code: str, status: int, message: str = "", key: str | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.code, self.status, self.message, self.key = code, status, message or code, key


@dataclass
class StoredObject:
    data: bytes
    etag: str  # upper-case hex, no quotes ("HEX-N" for multipart)
    last_modified: float
    content_type: str = "application/octet-stream"
    object_type: str = "Normal"

    @property
    def crc64(self) -> int:
        return _crc64(self.data)


@dataclass
class NotificationRule:
    queue: str
    prefix: str = ""
    suffix: str = ""
    events: tuple[str, ...] = DEFAULT_EVENTS  # fnmatch patterns, e.g. "ObjectCreated:*"
    base64_body: bool = True
    rule_id: str = "fake-rule"
    time_precision: str = "s"

    def matches(self, event_name: str, key: str) -> bool:
        return (key.startswith(self.prefix) and key.endswith(self.suffix)
                and any(fnmatch.fnmatchcase(event_name, p) for p in self.events))


@dataclass
class _Upload:
    bucket: str
    key: str
    content_type: str
    parts: dict[int, tuple[bytes, str]] = field(default_factory=dict)


def _md5_hex(data: bytes) -> str:
    return hashlib.md5(data).hexdigest().upper()


class OssBackend:
    """Buckets, objects, uploads, notification rules; one lock; events go to `mns`."""

    def __init__(self, mns: MnsBackend | None = None, *, region: str = "cn-hangzhou",
                 owner_id: str = "1234567890") -> None:
        self.mns, self.region, self.owner_id = mns, region, owner_id
        self.credentials: dict[str, tuple[str, str | None]] = {}
        self.buckets: dict[str, dict[str, StoredObject]] = {}
        self.rules: dict[str, list[NotificationRule]] = {}
        self.uploads: dict[str, _Upload] = {}
        self._lock = threading.RLock()
        self._faults: list[list] = []

    # -- test controls --------------------------------------------------------------------------
    def add_credentials(self, access_key_id: str, secret: str, security_token: str | None = None):
        self.credentials[access_key_id] = (secret, security_token)

    def add_notification_rule(self, bucket: str, queue: str, **options) -> NotificationRule:
        rule = NotificationRule(queue, **options)
        with self._lock:
            self.rules.setdefault(bucket, []).append(rule)
        return rule

    def fail_next(self, action: str, code: str = "InternalError", status: int = 500,
                  times: int = 1) -> None:
        with self._lock:
            self._faults.append([action, code, status, times])

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def take_fault(self, action: str) -> OssError | None:
        with self._lock:
            for fault in self._faults:
                if fault[0] == action and fault[3] > 0:
                    fault[3] -= 1
                    return OssError(fault[1], fault[2], "injected fault")
        return None

    # -- buckets and objects --------------------------------------------------------------------
    def create_bucket(self, name: str) -> None:
        with self._lock:
            if name in self.buckets:
                raise OssError("BucketAlreadyExists", 409,
                               "The requested bucket name is not available.")
            self.buckets[name] = {}

    def delete_bucket(self, name: str) -> None:
        with self._lock:
            if self._bucket(name):
                raise OssError("BucketNotEmpty", 409,
                               "The bucket you tried to delete is not empty.")
            del self.buckets[name]

    def _bucket(self, name: str) -> dict[str, StoredObject]:
        try:
            return self.buckets[name]
        except KeyError:
            raise OssError("NoSuchBucket", 404, "The specified bucket does not exist.") from None

    def get(self, bucket: str, key: str) -> StoredObject:
        with self._lock:
            try:
                return self._bucket(bucket)[key]
            except KeyError:
                raise OssError("NoSuchKey", 404, "The specified key does not exist.", key) from None

    def put(self, bucket: str, key: str, data: bytes, content_type: str = "",
            event: str = "ObjectCreated:PutObject", object_type: str = "Normal",
            etag: str | None = None, request_id: str = "") -> StoredObject:
        with self._lock:
            objects = self._bucket(bucket)
            old = objects.get(key)
            obj = StoredObject(data, etag or _md5_hex(data), time.time(),
                               content_type or "application/octet-stream", object_type)
            objects[key] = obj
            self._notify(bucket, event, key, obj, old, request_id)
            return obj

    def append(self, bucket: str, key: str, position: int, data: bytes, content_type: str = "",
               request_id: str = "") -> StoredObject:
        with self._lock:
            old = self._bucket(bucket).get(key)
            if old is not None and old.object_type != "Appendable":
                raise OssError("ObjectNotAppendable", 409, "The object is not appendable.", key)
            current = old.data if old else b""
            if position != len(current):
                raise OssError("PositionNotEqualToLength", 409,
                               "Position is not equal to file length.", key)
            content_type = content_type or (old.content_type if old else "")
            return self.put(bucket, key, current + data, content_type,
                            "ObjectCreated:AppendObject", "Appendable", request_id=request_id)

    def delete(self, bucket: str, key: str, event: str = "ObjectRemoved:DeleteObject",
               request_id: str = "") -> None:
        with self._lock:
            old = self._bucket(bucket).pop(key, None)
            if old is not None:
                self._notify(bucket, event, key, None, old, request_id)

    # -- multipart ------------------------------------------------------------------------------
    def init_upload(self, bucket: str, key: str, content_type: str, request_id: str = "") -> str:
        with self._lock:
            self._bucket(bucket)
            upload_id = uuid.uuid4().hex.upper()
            self.uploads[upload_id] = _Upload(bucket, key, content_type)
            self._notify(bucket, "ObjectCreated:InitiateMultipartUpload", key, None, None,
                         request_id)
            return upload_id

    def _upload(self, bucket: str, key: str, upload_id: str) -> _Upload:
        upload = self.uploads.get(upload_id)
        if upload is None or (upload.bucket, upload.key) != (bucket, key):
            raise OssError("NoSuchUpload", 404, "The specified upload does not exist.", key)
        return upload

    def upload_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes,
                    request_id: str = "") -> str:
        with self._lock:
            upload = self._upload(bucket, key, upload_id)
            if not 1 <= number <= 10000:
                raise OssError("InvalidArgument", 400, "Part number must be between 1 and 10000.")
            upload.parts[number] = (data, _md5_hex(data))
            part = StoredObject(data, upload.parts[number][1], time.time())
            self._notify(bucket, "ObjectCreated:UploadPart", key, part, None, request_id)
            return upload.parts[number][1]

    def complete_upload(self, bucket: str, key: str, upload_id: str,
                        parts: list[tuple[int, str]] | None, request_id: str = "") -> StoredObject:
        with self._lock:
            upload = self._upload(bucket, key, upload_id)
            if parts is None:  # x-oss-complete-all: yes
                parts = [(n, etag) for n, (_, etag) in sorted(upload.parts.items())]
            numbers = [n for n, _ in parts]
            if numbers != sorted(set(numbers)):
                raise OssError("InvalidPartOrder", 400,
                               "The list of parts was not in ascending order.")
            for number, etag in parts:
                if number not in upload.parts or upload.parts[number][1] != etag.strip('"').upper():
                    raise OssError("InvalidPart", 400,
                                   f"Part {number} is missing or its ETag differs.")
            digests = b"".join(hashlib.md5(upload.parts[n][0]).digest() for n in numbers)
            data = b"".join(upload.parts[n][0] for n in numbers)
            del self.uploads[upload_id]
            return self.put(bucket, key, data, upload.content_type,
                            "ObjectCreated:CompleteMultipartUpload", "Multipart",
                            f"{_md5_hex(digests)}-{len(numbers)}", request_id)

    def abort_upload(self, bucket: str, key: str, upload_id: str, request_id: str = "") -> None:
        with self._lock:
            self._upload(bucket, key, upload_id)
            del self.uploads[upload_id]
            self._notify(bucket, "ObjectRemoved:AbortMultipartUpload", key, None, None, request_id)

    # -- listing --------------------------------------------------------------------------------
    def list(self, bucket: str, prefix: str, delimiter: str, marker: str,
             max_keys: int) -> tuple[list[tuple[str, StoredObject]], list[str], str | None]:
        """(contents, common prefixes, next marker or None): entries after `marker`, in order."""
        with self._lock:
            keys = sorted(k for k in self._bucket(bucket) if k.startswith(prefix) and k > marker)
            objects = dict(self._bucket(bucket))
        # a page may end on a common prefix: skip the keys inside it
        marker_is_prefix = (bool(delimiter) and marker.endswith(delimiter)
                            and marker.startswith(prefix)
                            and marker.find(delimiter, len(prefix)) == len(marker) - len(delimiter))
        contents, prefixes, last = [], [], None
        for key in keys:
            if marker_is_prefix and key.startswith(marker):
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            entry = key[: cut + len(delimiter)] if cut >= 0 else key
            if entry == last:
                continue
            if len(contents) + len(prefixes) == max_keys:
                return contents, prefixes, last
            if cut >= 0:
                prefixes.append(entry)
            else:
                contents.append((key, objects[key]))
            last = entry
        return contents, prefixes, None

    # -- notifications --------------------------------------------------------------------------
    def _notify(self, bucket: str, event_name: str, key: str, obj: StoredObject | None,
                old: StoredObject | None, request_id: str) -> None:
        for rule in self.rules.get(bucket, ()):
            if self.mns is None or not rule.matches(event_name, key):
                continue
            body = json.dumps(self.event_json(bucket, event_name, key, obj, old, rule, request_id))
            if rule.base64_body:
                body = base64.b64encode(body.encode("utf-8")).decode("ascii")
            try:
                self.mns.send(rule.queue, body)
            except MnsError:
                pass  # OSS drops what it cannot deliver (missing queue)

    def event_json(self, bucket: str, event_name: str, key: str, obj: StoredObject | None,
                   old: StoredObject | None, rule: NotificationRule, request_id: str) -> dict:
        # the event carries the request's time, which is also the object's Last-Modified (so a
        # listing after the event agrees with it); a removal is stamped when it happens
        now = datetime.fromtimestamp(obj.last_modified, UTC) if obj else datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S") + (
            f".{now.microsecond // 1000:03d}Z" if rule.time_precision == "ms" else ".000Z")
        size = len(obj.data) if obj else 0
        old_size = len(old.data) if old else 0
        etag = obj.etag if obj else (old.etag if old else "")
        object_info: dict = {"deltaSize": size - old_size, "eTag": etag, "key": key, "size": size}
        if event_name == "ObjectCreated:AppendObject":
            object_info["position"] = old_size
        return {"events": [{
            "eventName": event_name, "eventSource": "acs:oss", "eventTime": stamp,
            "eventVersion": "1.0",
            "oss": {"bucket": {"arn": f"acs:oss:{self.region}:{self.owner_id}:{bucket}",
                               "name": bucket, "ownerIdentity": self.owner_id, "virtualBucket": ""},
                    "object": object_info, "ossSchemaVersion": "1.0", "ruleId": rule.rule_id},
            "region": self.region, "requestParameters": {"sourceIPAddress": "127.0.0.1"},
            "responseElements": {"requestId": request_id},
            "userIdentity": {"principalId": self.owner_id}}]}


# -- wire -----------------------------------------------------------------------------------------

def _xml(root: str, inner: str) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<{root}>{inner}</{root}>'.encode()


def _el(tag: str, value: object) -> str:
    return f"<{tag}>{escape(str(value))}</{tag}>"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class OssHandler(FakeRequestHandler):
    backend: OssBackend

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        self.backend = self.server.state
        self.request_id = new_request_id()
        raw_path, _, query = self.path.partition("?")
        self.params = dict(parse_qsl(query, keep_blank_values=True))
        bucket, _, quoted_key = raw_path[1:].partition("/")
        key = unquote(quoted_key)
        body = self.read_body()
        try:
            self._authenticate(bucket, key, body)
            status, payload, headers = self._dispatch(bucket, key, body)
        except OssError as exc:
            self._send_error(exc)
            return
        except Exception as exc:  # a fake bug must surface as an error, not a hang
            self._send_error(OssError("InternalError", 500, repr(exc)))
            return
        headers = {"x-oss-request-id": self.request_id, **(headers or {})}
        if self.command == "GET" and self.backend.take_fault("TruncateBody"):
            # a connection dropped mid-body: full Content-Length, half the bytes, then close
            self.close_connection = True
            self.respond(status, payload[: len(payload) // 2],
                         {**headers, "Content-Length": str(len(payload))})
            return
        self.respond(status, payload, headers)

    def _send_error(self, exc: OssError) -> None:
        inner = (_el("Code", exc.code) + _el("Message", exc.message)
                 + _el("RequestId", self.request_id)
                 + _el("HostId", f"127.0.0.1:{self.server.port}")
                 + (_el("Key", exc.key) if exc.key else ""))
        body = _xml("Error", inner)
        headers = {"x-oss-request-id": self.request_id, "Content-Type": "application/xml"}
        if self.command == "HEAD":
            headers["x-oss-err"] = base64.b64encode(body).decode()
            self.respond(exc.status, b"", {**headers, "Content-Length": "0"})
            return
        self.respond(exc.status, body, headers)

    def _authenticate(self, bucket: str, key: str, body: bytes) -> None:
        scheme, _, rest = self.headers.get("authorization", "").partition(" ")
        access_key_id, _, signature = rest.rpartition(":")
        if scheme != "OSS" or not access_key_id:
            raise OssError("AccessDenied", 403, "You have no right to access this object.")
        if access_key_id not in self.backend.credentials:
            raise OssError("InvalidAccessKeyId", 403, "The OSS Access Key Id you provided does "
                           "not exist in our records.")
        secret, token = self.backend.credentials[access_key_id]
        if token is not None and self.headers.get("x-oss-security-token") != token:
            raise OssError("AccessDenied", 403, "The security token you provided is not valid.")
        oss_headers = sorted((k.lower(), v) for k, v in self.headers.items()
                             if k.lower().startswith("x-oss-"))
        sub = sorted((k, v) for k, v in self.params.items() if k in _SUBRESOURCES)
        resource = f"/{bucket}/{key}" if bucket else "/"
        if sub:
            resource += "?" + "&".join(f"{k}={v}" if v else k for k, v in sub)
        string_to_sign = "\n".join([
            self.command, self.headers.get("content-md5", ""), self.headers.get("content-type", ""),
            self.headers.get("x-oss-date") or self.headers.get("date", ""),
            "".join(f"{k}:{v}\n" for k, v in oss_headers) + resource])
        expected = base64.b64encode(hmac.new(secret.encode(), string_to_sign.encode("utf-8"),
                                             hashlib.sha1).digest()).decode()
        if not hmac.compare_digest(expected, signature):
            raise OssError("SignatureDoesNotMatch", 403, "The request signature we calculated "
                           "does not match the signature you provided.")
        md5 = self.headers.get("content-md5")
        if md5 is not None and md5 != base64.b64encode(hashlib.md5(body).digest()).decode():
            raise OssError("InvalidDigest", 400, "The Content-MD5 you specified is not valid.")

    def _fault(self, action: str) -> None:
        fault = self.backend.take_fault(action)
        if fault is not None:
            raise fault

    def _dispatch(self, bucket: str, key: str, body: bytes):
        if not bucket:
            raise OssError("InvalidArgument", 400, "Service-level requests are not supported.")
        if not key:
            return self._bucket_op(bucket, body)
        return self._object_op(bucket, key, body)

    def _bucket_op(self, bucket: str, body: bytes):
        b, p, method = self.backend, self.params, self.command
        if method == "PUT":
            self._fault("PutBucket")
            b.create_bucket(bucket)
            return 200, b"", {"Location": f"/{bucket}"}
        if method == "DELETE":
            self._fault("DeleteBucket")
            b.delete_bucket(bucket)
            return 204, b"", None
        if method == "POST" and "delete" in p:
            self._fault("DeleteMultipleObjects")
            return self._delete_many(bucket, body)
        if method == "GET":
            return self._list(bucket)
        raise OssError("InvalidArgument", 400, f"Unsupported bucket request {method} {self.path}")

    def _delete_many(self, bucket: str, body: bytes):
        try:
            root = ET.fromstring(body)
        except ET.ParseError:
            raise OssError("MalformedXML", 400,
                           "The XML you provided was not well-formed.") from None
        keys = [o.findtext("Key") or "" for o in root.findall("Object")]
        if not 1 <= len(keys) <= 1000:
            raise OssError("MalformedXML", 400, "A multi-delete takes 1 to 1000 keys.")
        url = self.params.get("encoding-type") == "url"
        for key in keys:
            self.backend.delete(bucket, key, "ObjectRemoved:DeleteObjects", self.request_id)
        if (root.findtext("Quiet") or "").lower() == "true":
            return 200, _xml("DeleteResult", ""), {"Content-Type": "application/xml"}
        inner = (_el("EncodingType", "url") if url else "") + "".join(
            f"<Deleted>{_el('Key', quote(k, safe='/') if url else k)}</Deleted>" for k in keys)
        return 200, _xml("DeleteResult", inner), {"Content-Type": "application/xml"}

    def _list(self, bucket: str):
        p = self.params
        v2 = p.get("list-type") == "2"
        self._fault("ListObjectsV2" if v2 else "ListObjects")
        try:
            max_keys = int(p.get("max-keys") or 100)
        except ValueError:
            max_keys = -1
        if not 1 <= max_keys <= 1000:
            raise OssError("InvalidArgument", 400, "max-keys must be between 1 and 1000.")
        prefix, delimiter = p.get("prefix", ""), p.get("delimiter", "")
        token = p.get("continuation-token", "")
        if v2 and token:
            try:
                marker = bytes.fromhex(token).decode("utf-8")
            except ValueError:
                raise OssError("InvalidArgument", 400,
                               "The continuation token provided is incorrect.") from None
        else:
            marker = p.get("start-after", "") if v2 else p.get("marker", "")
        contents, prefixes, next_marker = self.backend.list(bucket, prefix, delimiter, marker,
                                                            max_keys)
        url = p.get("encoding-type") == "url"
        enc = (lambda s: quote(s, safe="/")) if url else (lambda s: s)  # noqa: E731
        owner_id = self.backend.owner_id
        owner = f"<Owner>{_el('ID', owner_id)}{_el('DisplayName', owner_id)}</Owner>"
        show_owner = not v2 or p.get("fetch-owner") == "true"
        parts = [_el("Name", bucket), _el("Prefix", enc(prefix)), _el("MaxKeys", max_keys),
                 _el("Delimiter", enc(delimiter)), _el("EncodingType", "url") if url else "",
                 _el("IsTruncated", "true" if next_marker is not None else "false")]
        if v2:
            parts += [_el("ContinuationToken", token) if token else "",
                      _el("StartAfter", enc(p["start-after"])) if p.get("start-after") else "",
                      _el("KeyCount", len(contents) + len(prefixes))]
            if next_marker is not None:
                parts.append(_el("NextContinuationToken", next_marker.encode("utf-8").hex()))
        else:
            parts.append(_el("Marker", enc(marker)))
            if next_marker is not None:
                parts.append(_el("NextMarker", enc(next_marker)))
        for key, obj in contents:
            parts.append("<Contents>" + _el("Key", enc(key))
                         + _el("LastModified", _iso(obj.last_modified))
                         + _el("ETag", f'"{obj.etag}"') + _el("Type", obj.object_type)
                         + _el("Size", len(obj.data)) + _el("StorageClass", "Standard")
                         + (owner if show_owner else "") + "</Contents>")
        parts += [f"<CommonPrefixes>{_el('Prefix', enc(cp))}</CommonPrefixes>" for cp in prefixes]
        return 200, _xml("ListBucketResult", "".join(parts)), {"Content-Type": "application/xml"}

    def _object_headers(self, obj: StoredObject) -> dict[str, str]:
        return {"ETag": f'"{obj.etag}"',
                "Last-Modified": formatdate(obj.last_modified, usegmt=True),
                "Content-Type": obj.content_type, "x-oss-object-type": obj.object_type,
                "x-oss-storage-class": "Standard", "x-oss-hash-crc64ecma": str(obj.crc64),
                "Accept-Ranges": "bytes"}

    def _object_op(self, bucket: str, key: str, body: bytes):
        b, p, method, rid = self.backend, self.params, self.command, self.request_id
        content_type = self.headers.get("content-type", "")
        if method in ("GET", "HEAD"):
            self._fault("HeadObject" if method == "HEAD" else "GetObject")
            obj = b.get(bucket, key)
            headers = self._object_headers(obj)
            if_match = self.headers.get("If-Match")
            if if_match is not None and if_match.strip('"').upper() != obj.etag:
                raise OssError("PreconditionFailed", 412, "At least one of the pre-conditions "
                               "you specified did not hold.")
            if method == "HEAD":
                return 200, b"", {**headers, "Content-Length": str(len(obj.data))}
            return self._ranged(obj, headers)
        if method == "PUT" and "uploadId" in p:
            self._fault("UploadPart")
            number = int(p.get("partNumber") or 0)
            etag = b.upload_part(bucket, key, p["uploadId"], number, body, rid)
            return 200, b"", {"ETag": f'"{etag}"', "x-oss-hash-crc64ecma": str(_crc64(body))}
        if method == "PUT" and self.headers.get("x-oss-copy-source"):
            self._fault("CopyObject")
            src_bucket, _, src_key = self.headers["x-oss-copy-source"][1:].partition("/")
            src = b.get(src_bucket, unquote(src_key))
            obj = b.put(bucket, key, src.data, src.content_type, "ObjectCreated:CopyObject",
                        request_id=rid)
            inner = _el("ETag", f'"{obj.etag}"') + _el("LastModified", _iso(obj.last_modified))
            return 200, _xml("CopyObjectResult", inner), {"ETag": f'"{obj.etag}"',
                                                          "Content-Type": "application/xml"}
        if method == "PUT":
            self._fault("PutObject")
            obj = b.put(bucket, key, body, content_type, request_id=rid)
            return 200, b"", {"ETag": f'"{obj.etag}"', "x-oss-hash-crc64ecma": str(obj.crc64)}
        if method == "POST" and "append" in p:
            self._fault("AppendObject")
            obj = b.append(bucket, key, int(p.get("position") or 0), body, content_type, rid)
            return 200, b"", {"ETag": f'"{obj.etag}"', "x-oss-hash-crc64ecma": str(obj.crc64),
                              "x-oss-next-append-position": str(len(obj.data))}
        if method == "POST" and "uploads" in p:
            self._fault("InitiateMultipartUpload")
            upload_id = b.init_upload(bucket, key, content_type, rid)
            inner = _el("Bucket", bucket) + _el("Key", key) + _el("UploadId", upload_id)
            return 200, _xml("InitiateMultipartUploadResult", inner), {
                "Content-Type": "application/xml"}
        if method == "POST" and "uploadId" in p:
            self._fault("CompleteMultipartUpload")
            parts = None
            if body:
                root = ET.fromstring(body)
                parts = [(int(e.findtext("PartNumber") or 0), e.findtext("ETag") or "")
                         for e in root.findall("Part")]
            elif self.headers.get("x-oss-complete-all") != "yes":
                raise OssError("MalformedXML", 400, "The XML you provided was not well-formed.")
            obj = b.complete_upload(bucket, key, p["uploadId"], parts, rid)
            inner = (_el("Location", f"{self.server.endpoint}/{bucket}/{quote(key)}")
                     + _el("Bucket", bucket) + _el("Key", key) + _el("ETag", f'"{obj.etag}"'))
            return 200, _xml("CompleteMultipartUploadResult", inner), {
                "ETag": f'"{obj.etag}"', "x-oss-hash-crc64ecma": str(obj.crc64),
                "Content-Type": "application/xml"}
        if method == "DELETE" and "uploadId" in p:
            self._fault("AbortMultipartUpload")
            b.abort_upload(bucket, key, p["uploadId"], rid)
            return 204, b"", None
        if method == "DELETE":
            self._fault("DeleteObject")
            b.delete(bucket, key, request_id=rid)
            return 204, b"", None
        raise OssError("InvalidArgument", 400, f"Unsupported object request {method} {self.path}")

    def _ranged(self, obj: StoredObject, headers: dict[str, str]):
        size, spec = len(obj.data), self.headers.get("range", "")
        standard = self.headers.get("x-oss-range-behavior", "").lower() == "standard"
        first, _, last = spec.removeprefix("bytes=").partition("-")
        if not spec.startswith("bytes=") or "," in spec or not (first or last):
            return 200, obj.data, headers  # no or unparseable range: the whole object
        try:
            start, end = (size - int(last), size - 1) if not first else (
                int(first), int(last) if last else size - 1)
        except ValueError:
            return 200, obj.data, headers
        if standard:
            if start >= size:
                raise OssError("InvalidRange", 416, "The requested range cannot be satisfied.")
            start, end = max(start, 0), min(end, size - 1)
        elif start < 0 or start > end or end >= size:
            return 200, obj.data, headers  # OSS ignores an invalid range without the header
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return 206, obj.data[start:end + 1], headers


class FakeOssServer(FakeHTTPServer):
    """`FakeOssServer(mns_backend, credentials={"ak": "secret"})`; `.endpoint`, `.backend`."""

    def __init__(self, mns: MnsBackend | None = None, credentials: dict[str, str] | None = None,
                 backend: OssBackend | None = None):
        self.backend = backend or OssBackend(mns)
        for access_key_id, secret in (credentials or {}).items():
            self.backend.add_credentials(access_key_id, secret)
        super().__init__("fake-oss", OssHandler, self.backend)
