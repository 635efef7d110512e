"""parse_message and to_file_event without a network: raw, SNS- and EventBridge-wrapped S3
events, key decoding, test events, malformed bodies; and S3 sequencer ordering."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from connectors.aws.events import ParsedMessage, S3Record, parse_message, to_file_event
from connectors.aws.store import S3Scope, normalize_etag, normalize_prefix, s3_url
from connectors.errors import ConnectorError, MalformedMessageError
from connectors.events import EventKind, InvalidPathError, compare_sequencers, is_newer


def s3_record(key: str, name: str = "ObjectCreated:Put", *, bucket: str = "bkt",
              size: int | None = 5, etag: str | None = "5d41402abc4b2a76b9719d911017c592",
              sequencer: str | None = "0055AED6DCD90281E5",
              time: str = "2024-05-01T10:00:00.123Z") -> dict:
    obj = {"key": key}
    if size is not None:
        obj["size"] = size
    if etag is not None:
        obj["eTag"] = etag
    if sequencer is not None:
        obj["sequencer"] = sequencer
    return {"eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
            "eventTime": time, "eventName": name,
            "s3": {"s3SchemaVersion": "1.0", "configurationId": "cfg",
                   "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"}, "object": obj}}


def raw(*records: dict) -> str:
    return json.dumps({"Records": list(records)})


def sns(inner: str) -> str:
    return json.dumps({"Type": "Notification", "MessageId": "sns-1",
                       "TopicArn": "arn:aws:sns:us-east-1:123456789012:t",
                       "Subject": "Amazon S3 Notification", "Message": inner,
                       "Timestamp": "2024-05-01T10:00:01.000Z", "SignatureVersion": "1"})


def eventbridge(key: str, detail_type: str = "Object Created", **obj_extra) -> str:
    obj = {"key": key, "size": 5, "etag": "b1946ac92492d2347c6235b4d2611184",
           "version-id": "IYV3p45BT0ac8hjHg1houSdS1a.Mro8e", "sequencer": "0064D3901D00059242",
           **obj_extra}
    return json.dumps({
        "version": "0", "id": "f5f1e65c-dc3a-93ca-6c1e-b1647eac7963", "detail-type": detail_type,
        "source": "aws.s3", "account": "111122223333", "time": "2021-11-12T00:00:00Z",
        "region": "ca-central-1", "resources": ["arn:aws:s3:::bkt"],
        "detail": {"version": "0", "bucket": {"name": "bkt"}, "object": obj,
                   "request-id": "N4N7GDK58NMKJ12R", "requester": "123456789012",
                   "source-ip-address": "1.2.3.4", "reason": "PutObject"}})


def test_raw_created_record_keeps_every_field():
    parsed = parse_message(raw(s3_record("dir/photo.jpg")), message_id="m-1")
    assert parsed == ParsedMessage(
        (S3Record(EventKind.CREATED, "bkt", "dir/photo.jpg",
                  datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC), "ObjectCreated:Put",
                  size=5, etag="5d41402abc4b2a76b9719d911017c592",
                  sequencer="0055AED6DCD90281E5"),),
        envelope="s3", message_id="m-1")


@pytest.mark.parametrize("name", ["ObjectCreated:Put", "ObjectCreated:Post", "ObjectCreated:Copy",
                                  "ObjectCreated:CompleteMultipartUpload"])
def test_created_event_names(name):
    assert parse_message(raw(s3_record("a", name))).records[0].kind is EventKind.CREATED


@pytest.mark.parametrize("name", ["ObjectRemoved:Delete", "ObjectRemoved:DeleteMarkerCreated",
                                  "LifecycleExpiration:Delete"])
def test_removed_events_drop_size_and_etag(name):
    # moto sends the deleted object's size and eTag; real S3 sends neither
    (record,) = parse_message(raw(s3_record("a", name))).records
    assert (record.kind, record.size, record.etag) == (EventKind.REMOVED, None, None)
    (record,) = parse_message(raw(s3_record("a", name, size=None, etag=None))).records
    assert record.kind is EventKind.REMOVED


@pytest.mark.parametrize("name", ["ObjectTagging:Put", "ObjectAcl:Put", "ObjectRestore:Completed",
                                  "LifecycleTransition", "Replication:OperationFailedReplication"])
def test_events_that_do_not_change_content_are_skipped(name):
    parsed = parse_message(raw(s3_record("a", name), s3_record("b")))
    assert [r.key for r in parsed.records] == ["b"] and parsed.skipped == 1


@pytest.mark.parametrize(("encoded", "key"), [
    ("red+flower.jpg", "red flower.jpg"),
    ("c%2B%2B/a%2Bb.txt", "c++/a+b.txt"),
    ("dir%2Fa+b%2Bc%3Dd%3A%C3%A9.txt", "dir/a b+c=d:é.txt"),   # moto also escapes '/'
    ("%E6%97%A5%E6%9C%AC/%F0%9F%98%80.png", "日本/😀.png"),
    ("100%25+done", "100% done"),
])
def test_keys_are_form_decoded(encoded, key):
    assert parse_message(raw(s3_record(encoded))).records[0].key == key


def test_key_that_is_not_utf8_is_malformed():
    with pytest.raises(MalformedMessageError, match="not UTF-8"):
        parse_message(raw(s3_record("bad%FF.txt")))


def test_several_records_keep_their_order():
    parsed = parse_message(raw(s3_record("a"), s3_record("b", "ObjectRemoved:Delete"),
                               s3_record("a", bucket="other")))
    assert [(r.bucket, r.key, r.kind) for r in parsed.records] == [
        ("bkt", "a", EventKind.CREATED), ("bkt", "b", EventKind.REMOVED),
        ("other", "a", EventKind.CREATED)]


def test_sns_wrapped_message_is_decoded_twice():
    parsed = parse_message(sns(raw(s3_record("x+y.txt"))))
    assert parsed.envelope == "sns" and parsed.records[0].key == "x y.txt"


def test_sns_wrapped_test_event_and_subscription_confirmation():
    test_event = json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent",
                             "Time": "2014-10-13T15:57:02.089Z", "Bucket": "bkt"})
    assert parse_message(sns(test_event)).is_test_event
    confirmation = json.dumps({"Type": "SubscriptionConfirmation", "TopicArn": "arn:t",
                               "Token": "t", "Message": "You have chosen to subscribe"})
    parsed = parse_message(confirmation)
    assert parsed.records == () and parsed.skipped == 1


def test_test_event_is_flagged_and_carries_nothing():
    body = json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent",
                       "Time": "2014-10-13T15:57:02.089Z", "Bucket": "bkt",
                       "RequestId": "5582815E1AEA5ADF", "HostId": "8cLeGAmw"})
    parsed = parse_message(body)
    assert parsed.is_test_event and parsed.records == ()


def test_eventbridge_created_and_deleted():
    (created,) = parse_message(eventbridge("raw/x/2023-08-08T14:03:40.532432.zip")).records
    assert created == S3Record(
        EventKind.CREATED, "bkt", "raw/x/2023-08-08T14:03:40.532432.zip",
        datetime(2021, 11, 12, tzinfo=UTC), "Object Created:PutObject", size=5,
        etag="b1946ac92492d2347c6235b4d2611184", sequencer="0064D3901D00059242",
        version_id="IYV3p45BT0ac8hjHg1houSdS1a.Mro8e")
    (deleted,) = parse_message(eventbridge("a b+c.txt", "Object Deleted")).records
    assert (deleted.kind, deleted.key, deleted.size) == (EventKind.REMOVED, "a b+c.txt", None)


def test_eventbridge_moto_spelling_and_other_detail_types():
    body = json.loads(eventbridge("k"))
    body["detail"]["object"]["eTag"] = body["detail"]["object"].pop("etag")
    assert parse_message(json.dumps(body)).records[0].etag == "b1946ac92492d2347c6235b4d2611184"
    parsed = parse_message(eventbridge("k", "Object Tags Added"))
    assert parsed.records == () and parsed.skipped == 1


@pytest.mark.parametrize(("body", "match"), [
    ("not json", "not JSON"),
    ("", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"hello": "world"}', "not an S3 event notification"),
    ('{"Records": {"a": 1}}', "not a list"),
    ('{"Records": [42]}', "not an object"),
    (raw({**s3_record("a"), "eventSource": "aws:sqs"}), "eventSource"),
    (raw({**s3_record("a"), "eventVersion": "3.0"}), "eventVersion"),
    (raw({k: v for k, v in s3_record("a").items() if k != "eventName"}), "eventName"),
    (raw({k: v for k, v in s3_record("a").items() if k != "eventTime"}), "eventTime"),
    (raw({k: v for k, v in s3_record("a").items() if k != "s3"}), "'s3'"),
    (raw(s3_record("a", size=None)), "size"),
    (raw(s3_record("a", size=-1)), "size"),
    (raw(s3_record("a", time="yesterday")), "timestamp"),
    (raw(s3_record("")), "'key'"),
    (json.dumps({"Type": "Notification", "TopicArn": "arn:t", "Message": "{oops"}), "not JSON"),
    (json.dumps({"source": "aws.ec2", "detail-type": "x", "detail": {}}), "aws.s3"),
    (json.dumps({"source": "aws.s3", "detail-type": "Object Created", "time": "2021-11-12T00:00Z",
                 "detail": {"bucket": {"name": "b"}, "object": {"key": "k"}}}), "size"),
])
def test_malformed_messages_raise_a_clear_error(body, match):
    with pytest.raises(MalformedMessageError, match=match) as info:
        parse_message(body, message_id="m-42")
    assert "m-42" in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ConnectorError)


def test_to_file_event_maps_created_and_removed():
    scope = S3Scope("bkt", "in")
    (created, removed) = parse_message(raw(s3_record("in/a b.txt"),
                                           s3_record("in/a b.txt", "ObjectRemoved:Delete"))).records
    event = to_file_event(created, scope, source_id="m-1")
    assert (event.kind, event.relative_path, event.size, event.etag, event.sequencer,
            event.source_id) == (EventKind.CREATED, "a b.txt", 5,
                                 "5d41402abc4b2a76b9719d911017c592", "0055AED6DCD90281E5", "m-1")
    assert event.last_modified_time == event.event_time == created.event_time
    gone = to_file_event(removed, scope)
    assert (gone.kind, gone.size, gone.etag, gone.last_modified_time) == (
        EventKind.REMOVED, None, None, None)


@pytest.mark.parametrize(("scope", "bucket", "key", "expected"), [
    (S3Scope("bkt", "in/"), "bkt", "in/x/y.csv", "x/y.csv"),
    (S3Scope("bkt", "in/"), "other", "in/y.csv", None),
    (S3Scope("bkt", "in/"), "bkt", "input/y.csv", None),
    (S3Scope("bkt", "in/"), "bkt", "in/", None),
    (S3Scope("bkt", "in/"), "bkt", "in/folder/", None),
    (S3Scope("bkt", "in/", recursive=False), "bkt", "in/x/y.csv", None),
    (S3Scope("bkt", "in/", recursive=False), "bkt", "in/y.csv", "y.csv"),
    (S3Scope("bkt", "in/", suffix=".csv"), "bkt", "in/y.json", None),
    (S3Scope("bkt", "", suffix=(".csv", ".json")), "bkt", "y.json", "y.json"),
])
def test_scope_filters(scope, bucket, key, expected):
    assert scope.relative_path(bucket, key) == expected


@pytest.mark.parametrize("key", ["in/../etc/passwd", "in/a/./b", "in//a", "in/a\x00b", "in/.."])
def test_unsafe_keys_in_the_volume_raise_invalid_path(key):
    record = parse_message(raw(s3_record(key))).records[0]
    with pytest.raises(InvalidPathError):
        to_file_event(record, S3Scope("bkt", "in/"))


def test_helpers():
    assert s3_url("bkt", "a b/c+d%.txt") == "s3://bkt/a b/c+d%.txt"
    assert normalize_etag('"abc-2"') == "abc-2" == normalize_etag("abc-2")
    assert normalize_etag(None) is None
    assert normalize_prefix("") == "" and normalize_prefix("/a/b") == "a/b/"
    assert S3Scope("bkt", "p").url("x y.txt") == "s3://bkt/p/x y.txt"
    with pytest.raises(InvalidPathError):
        normalize_prefix("a/../b")


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("0055AED6DCD90281E5", "0055AED6DCD90281E6", -1),
    ("0055AED6DCD90281E5", "0055aed6dcd90281e5", 0),
    # different lengths: the shorter one is right-padded with zeros
    ("0055AED6DCD90281E5", "0055AED6DCD90281E500", 0),
    ("0055AED6DCD90281E5", "0055AED6DCD90281E501", -1),
    ("0055AED6DCD90281F", "0055AED6DCD90281E5FF", 1),
    ("0064D3901D00059242", "0055AED6DCD90281E5", 1),
])
def test_sequencers_compare_as_aws_specifies(a, b, expected):
    assert compare_sequencers(a, b) == expected
    assert compare_sequencers(b, a) == -expected


def test_parsed_sequencers_order_events_for_one_key():
    older, newer = (parse_message(raw(s3_record("k", sequencer=s))).records[0]
                    for s in ("0055AED6DCD90281E5", "0055AED6DCD90281E5A"))
    # the newer event has an earlier clock time: the sequencer wins
    assert is_newer(newer.sequencer, datetime(2000, 1, 1, tzinfo=UTC),
                    older.sequencer, older.event_time) == 1
