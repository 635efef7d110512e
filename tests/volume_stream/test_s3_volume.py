"""An `s3://` volume end to end through the catalog, against moto's server over HTTP: boto3
writes objects, a real bucket notification configuration delivers their events to SQS (raw,
through SNS or through EventBridge), `Catalog.watch` drains the queue, `Catalog.refresh` lists
the bucket. Assertions are on stream records (STANDARD and APPEND_ONLY).

moto stamps S3 events to the millisecond and sends no `sequencer`, so events of one key order by
event time. Tests about sequencer ordering take the bodies moto really sent off the queue, give
them realistic per-key sequencers (and event times that disagree with them) and send them back
duplicated and out of order.

The volumes here use boto3's standard configuration: `aws_env` sets fake credentials and
`AWS_ENDPOINT_URL`, and `create_volume` gets no endpoint or credential option, except in the
test of explicit options.
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

import volume_stream as vs
from connectors.aws.store import normalize_etag
from tests.aws_fixtures import (  # noqa: F401
    FAKE_ENV,
    AwsRig,
    aws_env,
    make_rig,
    moto_server,
    queue_counts,
    rig,
    wait_until,
)
from tests.volume_stream.conftest import rows
from volume_stream.volumes import backend_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")  # no Spark needed: Arrow reads only


def add_volume(cat, rig: AwsRig, name: str = "vol", prefix: str = "in/", *,
               notification: dict[str, Any] | None = None, **options):
    """Register the rig's bucket/prefix as an s3:// volume fed by its queue (short polls)."""
    note = vs.SqsNotification(rig.queue_url, **(notification if notification is not None
                                                else {"wait_time_seconds": 0}))
    return cat.create_volume(name, f"s3://{rig.bucket}/{prefix}", notification=note, **options)


def watch(cat, name: str = "vol"):
    return cat.watch(name, until_idle=True, timeout=60, refresh=False)  # the listener alone


def version(cat, name: str = "vol") -> int:
    return cat.directory_table(name).version()


def files(cat, name: str = "vol") -> dict[str, int]:
    snap = cat.directory_table(name).snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(snap["relative_path"], snap["size"], strict=True))


def take_bodies(rig: AwsRig, queue_url: str | None = None) -> list[dict]:
    """Receive and delete every visible message; their JSON bodies, in order."""
    queue_url = queue_url or rig.queue_url
    docs = []
    while True:
        got = rig.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                      WaitTimeSeconds=0).get("Messages", [])
        if not got:
            return docs
        docs += [json.loads(m["Body"]) for m in got]
        rig.sqs.delete_message_batch(QueueUrl=queue_url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])


def send(rig: AwsRig, *docs: dict | str) -> None:
    for doc in docs:
        rig.send_raw(doc)


def event_time(doc: dict) -> datetime:
    return datetime.fromisoformat(doc["Records"][0]["eventTime"])


def craft(doc: dict, *, sequencer: str, when: datetime, event_name: str | None = None) -> dict:
    """A copy of a real S3 notification body with a sequencer and another eventTime."""
    doc = copy.deepcopy(doc)
    record = doc["Records"][0]
    record["s3"]["object"]["sequencer"] = sequencer
    record["eventTime"] = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    if event_name:
        record["eventName"] = event_name
    return doc


def etag_of(rig: AwsRig, key: str) -> str:
    return normalize_etag(rig.s3.head_object(Bucket=rig.bucket, Key=key)["ETag"])


def set_notifications(rig: AwsRig, on: bool) -> None:
    """Turn the bucket's notification configuration on (fresh queue config) or off entirely."""
    config: dict[str, Any] = {}
    if on:
        arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"])
        config = {"QueueConfigurations": [{
            "QueueArn": arn["Attributes"]["QueueArn"],
            "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]}
    rig.s3.put_bucket_notification_configuration(Bucket=rig.bucket,
                                                 NotificationConfiguration=config)


def client(rig: AwsRig, service: str):
    return boto3.client(service, endpoint_url=rig.endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing-secret")


def queue_arn(rig: AwsRig) -> str:
    return rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url, AttributeNames=["QueueArn"]
                                        )["Attributes"]["QueueArn"]


# ---------------------------------------------------------------------------------- scenarios
def test_put_overwrite_delete_copy(cat, rig):
    add_volume(cat, rig, notification={})  # the default: 20 s long polls
    cat.create_stream("std", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    rig.put("in/a.txt", b"hello")
    rig.put("in/b.txt", b"bb")
    m = watch(cat)
    assert (m.received, m.applied, m.malformed, m.versions) == (2, 2, 0, [1])
    assert queue_counts(rig) == (0, 0)
    a, b = sorted(cat.read_stream_arrow("std").to_pylist(), key=lambda r: r["relative_path"])
    assert a["url"] == f"s3://{rig.bucket}/in/a.txt" and a["etag"] == etag_of(rig, "in/a.txt")
    assert (a["__change_type"], a["size"], b["size"]) == ("INSERT", 5, 2)
    assert rows(cat.read_stream_arrow("ao")) == rows(cat.read_stream_arrow("std"))

    cat.create_stream("later", "vol")
    rig.put("in/a.txt", b"hello world")
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/b.txt")
    rig.s3.copy_object(Bucket=rig.bucket, Key="in/c.txt",
                       CopySource={"Bucket": rig.bucket, "Key": "in/a.txt"})
    for data in (b"1", b"22"):  # created, overwritten and removed within one batch: no trace
        rig.put("in/d.txt", data)
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/d.txt")
    m = watch(cat)
    assert (m.received, m.versions) == (6, [2]) and queue_counts(rig) == (0, 0)
    assert rows(cat.read_stream_arrow("later")) == [("DELETE", "b.txt", 2, 1),
                                                    ("INSERT", "c.txt", 11, 2),
                                                    ("UPDATE_AFTER", "a.txt", 11, 2),
                                                    ("UPDATE_BEFORE", "a.txt", 5, 1)]
    assert rows(cat.read_stream_arrow("std")) == [("INSERT", "a.txt", 11, 2),
                                                  ("INSERT", "c.txt", 11, 2)]
    assert rows(cat.read_stream_arrow("ao")) == [("INSERT", "a.txt", 5, 1),
                                                 ("INSERT", "b.txt", 2, 1),
                                                 ("INSERT", "c.txt", 11, 2)]
    copied = next(r for r in cat.read_stream_arrow("later").to_pylist()
                  if r["relative_path"] == "c.txt")
    assert copied["etag"] == etag_of(rig, "in/c.txt") == etag_of(rig, "in/a.txt")
    # what the events built is what a listing finds (listings carry LastModified to the
    # second, events to the millisecond: etag and size decide), so refresh has nothing to do
    for _ in range(2):
        assert cat.refresh("vol").version is None
    assert version(cat) == 2


def test_multipart_upload(cat, rig):
    spec = add_volume(cat, rig)
    cat.create_stream("s", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    data = [b"a" * (5 << 20), b"tail"]  # S3's minimum part size is 5 MiB
    upload = rig.s3.create_multipart_upload(Bucket=rig.bucket, Key="in/big.bin")["UploadId"]
    parts = [{"PartNumber": n, "ETag": rig.s3.upload_part(
        Bucket=rig.bucket, Key="in/big.bin", UploadId=upload, PartNumber=n, Body=d)["ETag"]}
        for n, d in enumerate(data, 1)]
    gone = rig.s3.create_multipart_upload(Bucket=rig.bucket, Key="in/gone.bin")["UploadId"]
    rig.s3.abort_multipart_upload(Bucket=rig.bucket, Key="in/gone.bin", UploadId=gone)
    rig.s3.complete_multipart_upload(Bucket=rig.bucket, Key="in/big.bin", UploadId=upload,
                                     MultipartUpload={"Parts": parts})
    m = watch(cat)
    # moto announces a completed upload twice (Put, CompleteMultipartUpload); same object
    assert (m.received, m.malformed, m.versions) == (2, 0, [1])
    (record,) = cat.read_stream_arrow("s").to_pylist()
    size = (5 << 20) + 4
    assert (record["__change_type"], record["relative_path"], record["size"]) == (
        "INSERT", "big.bin", size)
    assert record["etag"] == etag_of(rig, "in/big.bin") and record["etag"].endswith("-2")
    assert rows(cat.read_stream_arrow("ao")) == [("INSERT", "big.bin", size, 1)]
    # the volume's reader (what pipelines ship to executors) reads what the events announced
    reader = pickle.loads(pickle.dumps(backend_for(spec).reader(spec)))
    with reader.open("big.bin") as f:
        f.seek((5 << 20) - 2)
        assert f.read() == b"aatail"
    assert reader.read_range("big.bin", 0, 3) == b"aaa"
    assert cat.refresh("vol").version is None


ODD_KEYS = ["a b+c.txt", "100% +%2B.csv", "ünï cødé/文件 ✓.txt", "😀 é.png",
            "d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/deep.bin", "q?x=1&y=2#frag.json",
            "trailing space .txt", "+plus+/~tilde~.dat", "odd/=:;,@&$!'()*.txt"]


def test_odd_keys_under_a_deep_odd_prefix(cat, rig):
    prefix = "land ing/ü+ber/2024/07/"
    spec = add_volume(cat, rig, prefix=prefix)
    cat.create_stream("s", "vol")
    for i, key in enumerate(ODD_KEYS):
        rig.put(prefix + key, key.encode() * (i + 1))
    rig.put(prefix + "folder/", b"")          # a folder marker is not a file
    rig.put("land ing/ü+ber/2024/x.txt")      # a sibling outside the volume
    m = watch(cat)
    assert (m.received, m.versions) == (len(ODD_KEYS), [1]) and queue_counts(rig) == (0, 0)
    records = cat.read_stream_arrow("s").to_pylist()
    assert sorted(r["relative_path"] for r in records) == sorted(ODD_KEYS)
    assert {r["url"] for r in records} == {f"s3://{rig.bucket}/{prefix}{k}" for k in ODD_KEYS}
    assert {r["relative_path"]: r["size"] for r in records} == {
        k: len(k.encode()) * (i + 1) for i, k in enumerate(ODD_KEYS)}
    reader = backend_for(spec).reader(spec)
    for i, key in enumerate(ODD_KEYS):
        with reader.open(key) as f:
            assert f.read() == key.encode() * (i + 1)
    assert cat.refresh("vol").version is None  # listing keys == event keys, byte for byte
    cat.create_stream("gone", "vol")
    rig.s3.delete_objects(Bucket=rig.bucket, Delete={
        "Objects": [{"Key": prefix + k} for k in ODD_KEYS] + [{"Key": prefix + "never"}]})
    assert watch(cat).versions == [2]
    assert sorted(r[1] for r in rows(cat.read_stream_arrow("gone"))
                  if r[0] == "DELETE") == sorted(ODD_KEYS)
    assert files(cat) == {}


def test_duplicated_and_reordered_messages_order_by_sequencer(cat, rig):
    add_volume(cat, rig)
    cat.create_stream("std", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    rig.put("in/a.txt", b"1")
    rig.put("in/a.txt", b"22")
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/a.txt")
    put1, put2, removal = take_bodies(rig)  # the real bodies S3 (moto) sent
    # Real S3 gives each event of a key a sequencer; moto gives none. Give them ones as AWS
    # would (hex, growing per key; a longer one is not newer for being longer) and event times
    # in the opposite order, so only a correct sequencer comparison gets the final state right.
    t = event_time(put1)
    put1 = craft(put1, sequencer="0062E99A88DC40745FFF", when=t + timedelta(seconds=2))
    put2 = craft(put2, sequencer="0062E99A88DC407461", when=t + timedelta(seconds=1))
    removal = craft(removal, sequencer="0062E99A88DC4074620000", when=t)

    send(rig, put2, put1)  # reordered within one batch: put2 is the newer
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 1, [1])
    assert files(cat) == {"a.txt": 2}
    expected = [("INSERT", "a.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("std")) == expected
    assert rows(cat.read_stream_arrow("ao")) == expected

    send(rig, put1, put2, put1)  # duplicates and an older copy, later: nothing changes
    m = watch(cat)
    assert (m.received, m.applied, m.ignored, m.versions) == (3, 0, 3, [])
    assert version(cat) == 1 and queue_counts(rig) == (0, 0)

    cat.create_stream("after", "vol")
    send(rig, removal, put1, removal)  # the delete is the newest; it counts once
    assert watch(cat).versions == [2]
    assert files(cat) == {}
    assert cat.read_stream_arrow("std").num_rows == 0  # absent at both ends
    assert rows(cat.read_stream_arrow("ao")) == expected
    assert rows(cat.read_stream_arrow("after")) == [("DELETE", "a.txt", 2, 1)]

    send(rig, put2, put1)  # late copies of older puts must not resurrect the file
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 0, [])
    assert files(cat) == {} and version(cat) == 2 and queue_counts(rig) == (0, 0)
    assert rows(cat.read_stream_arrow("after")) == [("DELETE", "a.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("ao")) == expected


def test_one_message_with_several_records(cat, rig):
    add_volume(cat, rig)
    cat.create_stream("s", "vol")
    rig.put("in/x.txt", b"x")
    rig.put("in/y.txt", b"yy")
    rig.put("elsewhere/z.txt", b"z")
    docs = take_bodies(rig)
    merged = {"Records": [d["Records"][0] for d in docs]}
    send(rig, merged)
    m = watch(cat)
    assert (m.received, m.ignored, m.versions) == (2, 0, [1]) and queue_counts(rig) == (0, 0)
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "x.txt", 1, 1),
                                                ("INSERT", "y.txt", 2, 1)]


def test_sns_wrapped_events(cat, aws_env):
    rig = make_rig(aws_env, notify=False)
    sns = client(rig, "sns")
    topic = sns.create_topic(Name=rig.bucket)["TopicArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn(rig))
    rig.s3.put_bucket_notification_configuration(Bucket=rig.bucket, NotificationConfiguration={
        "TopicConfigurations": [{"TopicArn": topic,
                                 "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"]}]})
    try:
        add_volume(cat, rig)
        cat.create_stream("std", "vol")
        cat.create_stream("ao", "vol", mode="APPEND_ONLY")
        rig.put("in/x y+z.txt", b"1")
        rig.put("in/b.txt", b"bb")
        m = watch(cat)  # the first message is the SNS-wrapped s3:TestEvent: ignored, acked
        assert (m.received, m.ignored, m.malformed, m.versions) == (2, 1, 0, [1])
        assert queue_counts(rig) == (0, 0)
        cat.create_stream("later", "vol")
        rig.put("in/x y+z.txt", b"333")
        rig.s3.delete_object(Bucket=rig.bucket, Key="in/b.txt")
        assert watch(cat).versions == [2]
        assert rows(cat.read_stream_arrow("later")) == [("DELETE", "b.txt", 2, 1),
                                                        ("UPDATE_AFTER", "x y+z.txt", 3, 2),
                                                        ("UPDATE_BEFORE", "x y+z.txt", 1, 1)]
        assert rows(cat.read_stream_arrow("std")) == [("INSERT", "x y+z.txt", 3, 2)]
        assert rows(cat.read_stream_arrow("ao")) == [("INSERT", "b.txt", 2, 1),
                                                     ("INSERT", "x y+z.txt", 1, 1)]
    finally:
        sns.delete_topic(TopicArn=topic)
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_eventbridge_wrapped_events(cat, aws_env):
    rig = make_rig(aws_env, notify=False)
    events = client(rig, "events")
    rule = f"vs-{uuid.uuid4().hex[:12]}"
    events.put_rule(Name=rule, EventPattern=json.dumps(
        {"source": ["aws.s3"], "detail": {"bucket": {"name": [rig.bucket]}}}))
    events.put_targets(Rule=rule, Targets=[{"Id": "queue", "Arn": queue_arn(rig)}])
    rig.s3.put_bucket_notification_configuration(
        Bucket=rig.bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    try:
        add_volume(cat, rig)
        cat.create_stream("std", "vol")
        cat.create_stream("ao", "vol", mode="APPEND_ONLY")
        rig.put("in/x y+z.txt", b"1")  # EventBridge keys are not form-encoded
        rig.put("in/b.txt", b"bb")
        m = watch(cat)  # moto also sends "Object Tags Added" per put: skipped, acked
        assert (m.received, m.ignored, m.malformed, m.versions) == (2, 2, 0, [1])
        assert files(cat) == {"x y+z.txt": 1, "b.txt": 2} and queue_counts(rig) == (0, 0)

        # moto stamps every EventBridge event with one constant sequencer, so its overwrite
        # and delete would look like duplicates of the creates. Take the real bodies and give
        # them the growing sequencers S3 would.
        rig.put("in/x y+z.txt", b"333")
        rig.s3.delete_object(Bucket=rig.bucket, Key="in/b.txt")
        docs = [d for d in take_bodies(rig) if d["detail-type"] in ("Object Created",
                                                                    "Object Deleted")]
        assert [d["detail-type"] for d in docs] == ["Object Created", "Object Deleted"]
        stored = docs[0]["detail"]["object"]["sequencer"]
        for doc, seq in zip(docs, (stored + "0001", stored + "0002"), strict=True):
            doc["detail"]["object"]["sequencer"] = seq
        cat.create_stream("later", "vol")
        send(rig, docs[1], docs[0], docs[1])
        assert watch(cat).versions == [2]
        assert rows(cat.read_stream_arrow("later")) == [("DELETE", "b.txt", 2, 1),
                                                        ("UPDATE_AFTER", "x y+z.txt", 3, 2),
                                                        ("UPDATE_BEFORE", "x y+z.txt", 1, 1)]
        assert rows(cat.read_stream_arrow("ao")) == [("INSERT", "b.txt", 2, 1),
                                                     ("INSERT", "x y+z.txt", 1, 1)]
        assert cat.refresh("vol").version is None
    finally:
        events.remove_targets(Rule=rule, Ids=["queue"])
        events.delete_rule(Name=rule)
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_malformed_messages_are_counted_and_left_to_the_redrive_policy(cat, aws_env, caplog):
    dlq = make_rig(aws_env, notify=False)
    dlq_arn = queue_arn(dlq)
    # long enough that one watch (a Spark-free commit, but on a busy machine) ends before the
    # malformed messages it received become visible again
    rig = make_rig(aws_env, queue_attributes={
        "VisibilityTimeout": "5",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})})
    rig.purge()
    add_volume(cat, rig)
    no_size = {"Records": [{"eventVersion": "2.1", "eventSource": "aws:s3",
                            "eventTime": "2024-01-02T03:04:05.000Z",
                            "eventName": "ObjectCreated:Put",
                            "s3": {"bucket": {"name": rig.bucket}, "object": {"key": "in/x"}}}]}
    bad = ["definitely not an event", '{"Records": [', json.dumps({"hello": "world"}),
           json.dumps(no_size)]
    ids = {rig.sqs.send_message(QueueUrl=rig.queue_url, MessageBody=b)["MessageId"]
           for b in bad}
    rig.put("in/ok.txt", b"ok")
    with caplog.at_level(logging.WARNING, logger="connectors.sqs"):
        m = watch(cat)
    assert (m.malformed, m.applied, m.versions) == (4, 1, [1])
    assert all(i in caplog.text for i in ids)
    assert queue_counts(rig) == (0, 4)  # received, not deleted: in flight
    # they come back after the visibility timeout; the listener keeps going
    assert wait_until(lambda: queue_counts(rig) == (4, 0), timeout=30)
    rig.put("in/ok2.txt", b"ok2")
    m = watch(cat)
    assert (m.malformed, m.applied, m.versions) == (4, 1, [2])
    assert files(cat) == {"ok.txt": 2, "ok2.txt": 3}
    # received twice (maxReceiveCount): the next receive moves them to the dead-letter queue
    assert wait_until(lambda: queue_counts(rig) == (4, 0), timeout=30)
    m = watch(cat)
    assert (m.malformed, m.received, m.versions) == (0, 0, [])
    assert queue_counts(rig) == (0, 0)
    assert sorted(json.dumps(d) if isinstance(d, dict) else d
                  for d in _raw_bodies(dlq)) == sorted(bad)
    for r in (rig, dlq):
        r.sqs.delete_queue(QueueUrl=r.queue_url)


def _raw_bodies(rig: AwsRig) -> list[str]:
    got = rig.sqs.receive_message(QueueUrl=rig.queue_url, MaxNumberOfMessages=10,
                                  WaitTimeSeconds=0).get("Messages", [])
    return [m["Body"] for m in got]


def test_test_event_and_events_of_other_buckets_and_prefixes_are_acked(cat, aws_env):
    rig = make_rig(aws_env)  # the queue holds the s3:TestEvent of the set-up
    add_volume(cat, rig)
    rig.put("out/x.txt", b"1")  # the notification sends the whole bucket; the volume is in/
    rig.put("input/x.txt", b"1")  # a sibling prefix that merely starts alike
    rig.put("in/elsewhere.txt", b"1")
    *_, outside = take_bodies(rig)
    other = copy.deepcopy(outside)
    other["Records"][0]["s3"]["bucket"]["name"] = "another-bucket"  # the same key elsewhere
    assert outside["Records"][0]["s3"]["object"]["key"] == "in%2Felsewhere.txt"
    send(rig, other)
    rig.put("out/y.txt", b"1")
    rig.put("in/dir/", b"")        # a folder marker
    rig.put("in/../up.txt", b"1")  # in the prefix, but its relative path is unsafe
    m = watch(cat)
    assert (m.received, m.ignored, m.malformed, m.versions) == (0, 4, 0, [])
    assert queue_counts(rig) == (0, 0) and version(cat) == 0  # all acked, nothing committed
    rig.put("in/yes.txt", b"1")
    assert watch(cat).versions == [1] and files(cat) == {"yes.txt": 1}
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_test_event_alone_is_acked(cat, aws_env):
    rig = make_rig(aws_env)
    (doc,) = take_bodies(rig)
    assert doc["Event"] == "s3:TestEvent"
    send(rig, doc)
    add_volume(cat, rig)
    m = watch(cat)
    assert (m.received, m.ignored, m.malformed, m.versions) == (0, 1, 0, [])
    assert queue_counts(rig) == (0, 0)
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_crash_after_commit_before_delete_in_process(cat, rig):
    """One watcher step with the ack cut off, as if the process died right after the commit."""
    add_volume(cat, rig)
    cat.create_stream("s", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    rig.put("in/a.txt", b"a")
    rig.put("in/b.txt", b"bb")
    watcher = cat.watcher("vol")
    with watcher.listener as listener:
        got = listener.receive(timeout=5)
        assert watcher.table.apply(got.events).version == 1
    records = [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("s")) == records
    assert queue_counts(rig) == (0, 2)  # committed, never deleted
    assert wait_until(lambda: queue_counts(rig) == (2, 0), timeout=10)  # redelivered
    m = watch(cat)
    assert (m.received, m.applied, m.ignored, m.versions) == (2, 0, 2, [])
    assert queue_counts(rig) == (0, 0) and version(cat) == 1
    assert rows(cat.read_stream_arrow("s")) == records  # no duplicate records
    assert rows(cat.read_stream_arrow("ao")) == records


CRASHING_WATCHER = textwrap.dedent("""
    import sys, time
    import volume_stream as vs

    watcher = vs.connect(sys.argv[1]).watcher("vol")

    def ack(handles):  # the commit is durable; stop here until the parent kills us
        print("committed", watcher.table.version(), len(handles), flush=True)
        time.sleep(600)

    watcher.listener.ack = ack
    watcher.step(timeout=5)
""")


def test_crash_after_commit_before_delete_sigkill(cat, rig, tmp_path):
    """A real watcher process is SIGKILLed between its commit and its DeleteMessageBatch;
    the messages come back and a new watch commits nothing twice."""
    add_volume(cat, rig)
    cat.create_stream("s", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    rig.put("in/a.txt", b"a")
    rig.put("in/b.txt", b"bb")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # aws_env's endpoint and fake keys
    child = subprocess.Popen([sys.executable, "-c", CRASHING_WATCHER, str(tmp_path / "warehouse")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=REPO)
    try:
        line = child.stdout.readline()
        assert line.split() == ["committed", "1", "2"], (line, child.stderr.read()
                                                         if child.poll() is not None else "")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    records = [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("s")) == records
    assert queue_counts(rig)[0] == 0  # in flight: received by the dead process
    assert wait_until(lambda: queue_counts(rig) == (2, 0), timeout=10)
    rig.put("in/c.txt", b"ccc")
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (3, 1, [2]) and queue_counts(rig) == (0, 0)
    assert rows(cat.read_stream_arrow("s")) == records + [("INSERT", "c.txt", 3, 2)]
    assert rows(cat.read_stream_arrow("ao")) == records + [("INSERT", "c.txt", 3, 2)]


def test_refresh_backfills_and_heals_missed_events(cat, aws_env):
    rig = make_rig(aws_env, notify=False)
    rig.put("in/old.txt", b"old")  # from before the queue was set up
    set_notifications(rig, True)
    rig.purge()
    add_volume(cat, rig)
    cat.create_stream("s", "vol")
    assert watch(cat).versions == []
    m = cat.refresh("vol")
    assert (m.listed, m.inserted, m.version) == (1, 1, 1)
    rig.put("in/a.txt", b"a")
    assert watch(cat).versions == [2]
    set_notifications(rig, False)  # a delete and an overwrite whose events never arrive
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/a.txt")
    rig.put("in/old.txt", b"older")
    set_notifications(rig, True)
    m = watch(cat)  # only the TestEvent of the new configuration
    assert (m.received, m.ignored, m.versions) == (0, 1, [])
    assert files(cat) == {"old.txt": 3, "a.txt": 1}
    m = cat.refresh("vol")
    assert (m.listed, m.deleted, m.updated, m.version) == (1, 1, 1, 3)
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "old.txt", 5, 3)]
    assert cat.refresh("vol").version is None  # twice: no spurious update
    rig.put("in/a.txt", b"again")  # events after a refresh count
    assert watch(cat).versions == [4] and files(cat) == {"old.txt": 5, "a.txt": 5}
    assert cat.refresh("vol").version is None
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_an_event_for_an_object_a_refresh_already_listed_changes_nothing(cat, rig):
    """The daemon starts its listener, then refreshes: objects written meanwhile reach the
    table through the listing first (LastModified to the second) and their events, stamped
    after the refresh began, come later. Same etag and size: no update pair."""
    add_volume(cat, rig)
    cat.create_stream("s", "vol")
    rig.put("in/a.txt", b"hello")
    rig.put("in/b.txt", b"bb")
    put_a, put_b = take_bodies(rig)
    assert cat.refresh("vol").inserted == 2
    after = datetime.now(UTC) + timedelta(seconds=5)
    send(rig, craft(put_a, sequencer="0062E99A88DC407460", when=after), put_b)
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 0, [])
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "a.txt", 5, 1),
                                                ("INSERT", "b.txt", 2, 1)]
    rig.put("in/a.txt", b"changed")  # a real change after it still counts
    assert watch(cat).versions == [2] and files(cat) == {"a.txt": 7, "b.txt": 2}


def test_watch_drains_a_backlog_with_parallel_receivers_and_returns(cat, rig):
    add_volume(cat, rig, notification={"wait_time_seconds": 0, "max_workers": 3})
    cat.create_stream("s", "vol")
    keys = [f"in/batch/{i:03d}.json" for i in range(45)]
    for key in keys:
        rig.put(key, b"{}")
    with cat.watcher("vol").listener as listener:  # what the daemon's backlog gauge reads
        assert listener.backlog() == 45
    started = time.monotonic()
    m = watch(cat)
    assert time.monotonic() - started < 30
    assert (m.received, m.applied) == (45, 45) and 1 <= len(m.versions) <= 2
    assert queue_counts(rig) == (0, 0) and len(files(cat)) == 45
    assert len(cat.read_stream_arrow("s")) == 45
    # an empty queue: a watch returns at once with nothing
    assert watch(cat).versions == []


def test_explicit_options_override_the_environment_and_secrets_stay_in_memory(
        cat, rig, tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    secret = "explicit-secret-" + uuid.uuid4().hex
    explicit = {"endpoint_url": rig.endpoint, "region_name": "us-east-1",
                "aws_access_key_id": "AKIDEXPLICIT", "aws_secret_access_key": secret}
    rig.put("in/before.txt", b"1")
    add_volume(cat, rig, **explicit)
    cat.create_stream("s", "vol")
    assert cat.refresh("vol").inserted == 1
    rig.put("in/after.txt", b"22")
    assert watch(cat).versions == [2]
    assert files(cat) == {"before.txt": 1, "after.txt": 2}
    for path in (p for p in (tmp_path / "warehouse").rglob("*") if p.is_file()):
        assert secret.encode() not in path.read_bytes(), path
    assert secret not in repr(cat.describe_volume("vol"))
    # another process knows the endpoint (stored) but not the credentials (never stored)
    again = vs.connect(tmp_path / "warehouse")
    for call in (lambda: again.refresh("vol"), lambda: watch(again)):
        with pytest.raises(vs.ConfigError, match="volume 'vol'.*credentials") as exc:
            call()
        assert secret not in str(exc.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_ENV["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_ENV["AWS_SECRET_ACCESS_KEY"])
    assert again.refresh("vol").version is None and watch(again).versions == []
