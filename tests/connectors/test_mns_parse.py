"""`connectors.alicloud.events.parse_message` / `to_file_event`: OSS event notifications, no
network."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from connectors.alicloud.events import parse_message, to_file_event
from connectors.alicloud.store import OssScope
from connectors.errors import MalformedMessageError
from connectors.events import EventKind, InvalidPathError


def event(name: str = "ObjectCreated:PutObject", key: str = "in/a.txt", *, bucket: str = "bkt",
          size: int | None = 5, etag: str = "5D41402ABC4B2A76B9719D911017C592",
          time: str = "2024-01-02T03:04:05.000Z") -> dict:
    obj = {"deltaSize": size or 0, "eTag": etag, "key": key}
    if size is not None:
        obj["size"] = size
    return {"eventName": name, "eventSource": "acs:oss", "eventTime": time, "eventVersion": "1.0",
            "oss": {"bucket": {"arn": f"acs:oss:cn-hangzhou:1:{bucket}", "name": bucket,
                               "ownerIdentity": "1", "virtualBucket": ""},
                    "object": obj, "ossSchemaVersion": "1.0", "ruleId": "r"},
            "region": "cn-hangzhou", "requestParameters": {"sourceIPAddress": "1.2.3.4"},
            "responseElements": {"requestId": "5A81"}, "userIdentity": {"principalId": "1"}}


def body(*events: dict, b64: bool = True) -> str:
    text = json.dumps({"events": list(events)}, ensure_ascii=False)
    return base64.b64encode(text.encode()).decode() if b64 else text


@pytest.mark.parametrize("b64", [True, False])
def test_base64_and_plain_bodies(b64):
    parsed = parse_message(body(event(), b64=b64), message_id="m1")
    assert parsed.encoding == ("base64" if b64 else "plain") and parsed.message_id == "m1"
    (record,) = parsed.records
    assert record.kind is EventKind.CREATED and record.bucket == "bkt" and record.key == "in/a.txt"
    assert record.size == 5 and record.etag == "5D41402ABC4B2A76B9719D911017C592"
    assert record.event_time == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert record.url == "oss://bkt/in/a.txt"


def test_bytes_body_and_surrounding_whitespace():
    assert parse_message(("\n " + body(event()) + "\n").encode()).records[0].key == "in/a.txt"
    assert parse_message(b" " + body(event(), b64=False).encode()).records[0].size == 5


def test_several_events_in_one_message_keep_their_order():
    parsed = parse_message(body(
        event(key="in/1"), event("ObjectRemoved:DeleteObject", "in/2", size=0),
        event("ObjectRemoved:DeleteObjects", "in/3", size=None),
        event("ObjectCreated:CompleteMultipartUpload", "in/4", etag="AB-3"),
        event("ObjectCreated:CopyObject", "in/5"), event("ObjectCreated:PostObject", "in/6"),
        event("ObjectCreated:AppendObject", "in/7")))
    assert [(r.key, r.kind) for r in parsed.records] == [
        ("in/1", EventKind.CREATED), ("in/2", EventKind.REMOVED), ("in/3", EventKind.REMOVED),
        ("in/4", EventKind.CREATED), ("in/5", EventKind.CREATED), ("in/6", EventKind.CREATED),
        ("in/7", EventKind.CREATED)]
    removed = parsed.records[1]
    assert removed.size is None and removed.etag is None  # OSS's removal fields are unreliable
    assert parsed.records[3].etag == "AB-3"


@pytest.mark.parametrize("name", [
    "ObjectCreated:InitiateMultipartUpload", "ObjectCreated:UploadPart",
    "ObjectCreated:UploadPartCopy", "ObjectRemoved:AbortMultipartUpload",
    "ObjectDownloaded:GetObject", "ObjectRestore:FinishRestore", "ObjectReplication:Put",
    "SomethingElse", "Future:Event",
])
def test_multipart_steps_and_other_categories_are_skipped(name):
    parsed = parse_message(body(event(name, size=None), event()))
    assert parsed.skipped == 1
    assert [r.event_name for r in parsed.records] == ["ObjectCreated:PutObject"]


def test_unknown_created_and_removed_names_still_count():
    parsed = parse_message(body(event("ObjectCreated:PutSymlink"), event("oss:ObjectCreated:Foo"),
                                event("ObjectRemoved:Bar", size=None)))
    assert [(r.event_name, r.kind) for r in parsed.records] == [
        ("ObjectCreated:PutSymlink", EventKind.CREATED), ("ObjectCreated:Foo", EventKind.CREATED),
        ("ObjectRemoved:Bar", EventKind.REMOVED)]


@pytest.mark.parametrize("key", [
    "in/with space.txt", "in/a+b.txt", "in/%2F not decoded.txt", "in/é/中文/ü.png",
    "in/" + "/".join(f"d{i}" for i in range(40)) + "/deep.bin", "in/a:b=c&d?.txt",
])
def test_odd_keys_are_raw_and_map_to_relative_paths(key):
    record = parse_message(body(event(key=key))).records[0]
    assert record.key == key
    file_event = to_file_event(record, OssScope("bkt", "in/"), source_id="m1")
    assert file_event.relative_path == key.removeprefix("in/")
    assert file_event.size == 5 and file_event.last_modified_time == record.event_time
    assert file_event.sequencer is None and file_event.source_id == "m1"


def test_to_file_event_filters_by_scope():
    def relative(key: str, scope: OssScope, bucket: str = "bkt") -> str | None:
        record = parse_message(body(event(key=key, bucket=bucket))).records[0]
        result = to_file_event(record, scope)
        return None if result is None else result.relative_path

    scope = OssScope("bkt", "in")  # prefix normalised to "in/"
    assert relative("in/a.txt", scope) == "a.txt"
    assert relative("in/a.txt", scope, bucket="other") is None
    assert relative("inbox/a.txt", scope) is None
    assert relative("in/", scope) is None and relative("in/dir/", scope) is None
    flat = OssScope("bkt", "in/", recursive=False, suffix=(".csv", ".json"))
    assert relative("in/a.csv", flat) == "a.csv" and relative("in/a.txt", flat) is None
    assert relative("in/sub/a.csv", flat) is None
    assert relative("a.txt", OssScope("bkt")) == "a.txt"


def test_removed_event_to_file_event():
    record = parse_message(body(event("ObjectRemoved:DeleteObject", size=0))).records[0]
    removed = to_file_event(record, OssScope("bkt", "in/"))
    assert removed.kind is EventKind.REMOVED and removed.size is None
    assert removed.event_time == record.event_time


@pytest.mark.parametrize("key", ["in/../etc/passwd", "in/a//b", "in/./a", "in/a\x00b"])
def test_unsafe_keys_raise_invalid_path(key):
    record = parse_message(body(event(key=key))).records[0]  # parsing itself is fine
    with pytest.raises(InvalidPathError):
        to_file_event(record, OssScope("bkt", "in/"))


@pytest.mark.parametrize("raw", [
    "", "not json", "eyJub3QiOiAianNvbiI",  # broken base64
    base64.b64encode(b"[1, 2]").decode(), base64.b64encode(b"\xff\xfe").decode(),
    '{"Records": []}', '{"events": {}}', '["events"]', "{",
    body({"eventName": "ObjectCreated:PutObject"}),  # no eventTime, no oss
    body(event(size=None)), body(event(size=-1)), body(event(time="yesterday")),
    body(event(key="")), body(event(bucket="")), body("not an object"),
    body(dict(event(), eventSource="acs:mns")), body(dict(event(), eventName=7)),
])
def test_malformed_bodies_name_the_message(raw):
    with pytest.raises(MalformedMessageError, match="message m-42"):
        parse_message(raw, message_id="m-42")
    assert issubclass(MalformedMessageError, ValueError)


def test_empty_event_list_is_well_formed():
    parsed = parse_message(body())
    assert parsed.records == () and parsed.skipped == 0


def test_same_second_events_keep_message_order_and_time():
    parsed = parse_message(body(event(key="in/a", size=1),
                                event("ObjectRemoved:DeleteObject", "in/a", size=0),
                                event(key="in/a", size=3)))
    assert [r.size for r in parsed.records] == [1, None, 3]
    assert len({r.event_time for r in parsed.records}) == 1


def test_same_second_events_are_ordered_by_enqueue_time():
    from datetime import UTC, datetime, timedelta

    from connectors.alicloud.events import _tie_break
    from connectors.events import FileEvent, is_newer

    second = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
    put = FileEvent.created("a", size=1, last_modified_time=second, event_time=second)
    gone = FileEvent.removed("a", event_time=second)
    ms = int(second.timestamp()) * 1000
    refined_put, refined_gone = _tie_break(put, ms + 120), _tie_break(gone, ms + 130)
    assert is_newer(None, refined_gone.event_time, None, refined_put.event_time) > 0
    # a redelivery keeps its EnqueueTime: equal again
    assert _tie_break(put, ms + 120).event_time == refined_put.event_time
    # never later than the enqueueing, never into the next second, still ordered
    for lag in (1, 999, 5_000, 60_000):
        t = _tie_break(put, ms + lag).event_time
        assert second < t < second + timedelta(seconds=1)
        assert t <= second + timedelta(milliseconds=lag)
    assert _tie_break(put, ms + 60_000).event_time > _tie_break(put, ms + 59_000).event_time
    assert refined_put.last_modified_time == second
