"""SqsListener against moto's server over HTTP, with real bucket notifications: the events of
real S3 calls arrive, other buckets/prefixes are ignored and acked, malformed messages stay on
the queue, visibility can be extended, a backlog is drained in parallel."""

# ruff: noqa: F811  (pytest fixtures imported from tests.aws_fixtures are used as parameters)

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time

import pytest

from connectors.aws.listener import SqsListener
from connectors.aws.store import normalize_etag
from connectors.errors import ConnectorError, CredentialsError
from connectors.events import EventKind
from connectors.protocols import Listener
from tests.aws_fixtures import (  # noqa: F401
    AwsRig,
    aws_env,
    make_rig,
    moto_server,
    notified_bucket,
    queue_counts,
    wait_until,
)
from tests.fakes.faulty_proxy import FaultyProxy


def listen(rig: AwsRig, prefix: str = "", **kw) -> SqsListener:
    return SqsListener(rig.queue_url, bucket=rig.bucket, prefix=prefix,
                       endpoint_url=rig.endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing-secret", **kw)


def s3_body(bucket: str, key: str, name: str = "ObjectCreated:Put") -> str:
    return json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventTime": "2024-05-01T10:00:00.000Z",
        "eventName": name, "s3": {"bucket": {"name": bucket}, "object": {"key": key, "size": 1}},
    }]})


def our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("volume-stream")]


def test_real_notifications_for_put_overwrite_copy_multipart_delete(notified_bucket):
    rig = notified_bucket
    rig.put("in/a.txt", b"hello")
    rig.put("in/a.txt", b"hello world")
    rig.s3.copy_object(Bucket=rig.bucket, Key="in/b.txt",
                       CopySource={"Bucket": rig.bucket, "Key": "in/a.txt"})
    upload = rig.s3.create_multipart_upload(Bucket=rig.bucket, Key="in/big.bin")["UploadId"]
    parts = []
    for number, body in ((1, b"x" * (5 << 20)), (2, b"tail")):
        etag = rig.s3.upload_part(Bucket=rig.bucket, Key="in/big.bin", UploadId=upload,
                                  PartNumber=number, Body=body)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    rig.s3.complete_multipart_upload(Bucket=rig.bucket, Key="in/big.bin", UploadId=upload,
                                     MultipartUpload={"Parts": parts})
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/a.txt")

    with listen(rig, "in/") as listener:
        assert isinstance(listener, Listener)
        batch = listener.receive(timeout=1)
        big_etag = normalize_etag(rig.s3.head_object(Bucket=rig.bucket, Key="in/big.bin")["ETag"])
        # moto sends two messages for a completed multipart upload (Put and
        # CompleteMultipartUpload); both describe the final object
        assert [(e.kind, e.relative_path, e.size) for e in batch.events] == [
            (EventKind.CREATED, "a.txt", 5), (EventKind.CREATED, "a.txt", 11),
            (EventKind.CREATED, "b.txt", 11), (EventKind.CREATED, "big.bin", (5 << 20) + 4),
            (EventKind.CREATED, "big.bin", (5 << 20) + 4), (EventKind.REMOVED, "a.txt", None)]
        assert batch.events[3].etag == big_etag and big_etag.endswith("-2")
        assert batch.events[0].etag == "5d41402abc4b2a76b9719d911017c592"
        assert all(e.sequencer is None for e in batch.events)  # moto sends no sequencer
        times = [e.event_time for e in batch.events]
        assert times == sorted(times)
        # the s3:TestEvent from configuring the notification: ignored, but acked
        assert (batch.ignored, batch.malformed, batch.info["test_events"]) == (1, 0, 1)
        assert len(batch.handles) == 7
        listener.ack(batch.handles)
        assert queue_counts(rig) == (0, 0)
        assert listener.receive(timeout=0).empty and listener.idle


@pytest.mark.parametrize("key", [
    "with space/a b.txt", "plus+and%2B/c++.txt", "unicode/日本語/😀 é.png",
    "deep/" + "/".join(f"level{i}" for i in range(12)) + "/leaf.csv",
    "odd/=:;,@&$!'()*~.txt", "odd/100% done?.txt",
])
def test_keys_survive_the_round_trip(notified_bucket, key):
    rig = notified_bucket
    rig.put(f"vol/{key}", b"abc")
    rig.s3.delete_object(Bucket=rig.bucket, Key=f"vol/{key}")
    with listen(rig, "vol") as listener:
        batch = listener.receive(timeout=1)
    assert [(e.kind, e.relative_path) for e in batch.events] == [
        (EventKind.CREATED, key), (EventKind.REMOVED, key)]


def test_other_buckets_prefixes_children_suffixes_and_folders_are_ignored_and_acked(moto_server):
    rig = make_rig(moto_server)
    other = make_rig(moto_server, notify=False)
    arn = rig.sqs.get_queue_attributes(QueueUrl=rig.queue_url,
                                       AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    other.s3.put_bucket_notification_configuration(Bucket=other.bucket, NotificationConfiguration={
        "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"]}]})
    rig.purge()
    other.put("in/x.csv")             # another bucket
    rig.put("out/x.csv")              # outside the prefix
    rig.put("input/x.csv")            # a sibling prefix that merely starts alike
    rig.put("in/sub/x.csv")           # not a direct child
    rig.put("in/x.json")              # wrong suffix
    rig.put("in/folder/", b"")        # folder marker
    rig.put("in/x.csv")               # the one that counts
    rig.put("in/empty.csv", b"")      # zero-byte files are files
    with listen(rig, "in/", recursive=False, suffix=".csv") as listener:
        batch = listener.receive(timeout=1)
        assert [(e.relative_path, e.size) for e in batch.events] == [("x.csv", 1),
                                                                     ("empty.csv", 0)]
        assert (batch.ignored, batch.malformed, len(batch.handles)) == (6, 0, 8)
        assert batch.info["records_ignored"] == 6
        listener.ack(batch.handles)
    assert queue_counts(rig) == (0, 0)


def test_unsafe_keys_are_logged_dropped_and_acked(notified_bucket, caplog):
    rig = notified_bucket
    rig.purge()
    caplog.set_level(logging.WARNING, logger="connectors.sqs")
    for key in ("in/a/../b.txt", "in//x.txt", "in/./c.txt", "in/ok.txt"):
        rig.put(key)
    with listen(rig, "in/") as listener:
        batch = listener.receive(timeout=1)
        assert [e.relative_path for e in batch.events] == ["ok.txt"]
        assert (batch.info["invalid_paths"], batch.ignored, len(batch.handles)) == (3, 3, 4)
        listener.ack(batch.handles)
    assert sum("ignoring s3://" in r.getMessage() for r in caplog.records) == 3
    assert queue_counts(rig) == (0, 0)


def test_malformed_messages_are_counted_logged_and_left_for_the_redrive_policy(moto_server,
                                                                              caplog):
    dlq = make_rig(moto_server, notify=False)
    dlq_arn = dlq.sqs.get_queue_attributes(QueueUrl=dlq.queue_url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    rig = make_rig(moto_server, queue_attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})})
    rig.purge()
    rig.send_raw("this is not JSON")
    rig.send_raw({"Records": [{"eventName": "ObjectCreated:Put"}]})
    rig.put("in/ok.txt")
    caplog.set_level(logging.WARNING, logger="connectors.sqs")
    with listen(rig, "in/", visibility_timeout=1) as listener:
        batch = listener.receive(timeout=1)
        assert [e.relative_path for e in batch.events] == ["ok.txt"]
        assert (batch.malformed, batch.ignored, len(batch.handles)) == (2, 0, 1)
        listener.ack(batch.handles)
        # not deleted: visible again once the visibility timeout is over
        assert wait_until(lambda: queue_counts(rig) == (2, 0), timeout=10)
        logged = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
        assert len(logged) == 2 and "not JSON" in logged[0] and "missing field" in logged[1]
        # second receive: still malformed, still not acked; then moto's redrive moves them
        again = listener.receive(timeout=1)
        assert (again.malformed, again.handles) == (2, ())
        assert wait_until(lambda: listener.receive(timeout=0).malformed == 0
                          and queue_counts(dlq) == (2, 0), timeout=10)
    assert queue_counts(rig) == (0, 0)


def test_extend_keeps_messages_invisible_and_zero_gives_them_back(notified_bucket):
    rig = notified_bucket
    rig.purge()
    rig.put("in/a.txt")
    with listen(rig, "in/", visibility_timeout=2) as listener:
        batch = listener.receive(timeout=1)
        assert len(batch.events) == 1
        listener.extend(batch.handles, 30)
        time.sleep(2.3)
        assert listener.receive(timeout=0).empty
        assert queue_counts(rig) == (0, 1)
        listener.extend(batch.handles, 0)
        again = listener.receive(timeout=1)
        assert [e.relative_path for e in again.events] == ["a.txt"]
        listener.ack(again.handles)
        with pytest.raises(ValueError):
            listener.extend(again.handles, -1)
    assert queue_counts(rig) == (0, 0)


def test_ack_with_a_stale_handle_is_logged_not_raised(notified_bucket, caplog):
    rig = notified_bucket
    with listen(rig) as listener:
        batch = listener.receive(timeout=1)
        listener.ack(batch.handles)
        caplog.set_level(logging.WARNING, logger="connectors.sqs")
        listener.ack(["not-a-receipt-handle"])
        listener.ack([])
    assert any("DeleteMessageBatch" in r.getMessage() for r in caplog.records)


def test_parallel_receive_drains_a_backlog(notified_bucket):
    rig = notified_bucket
    rig.purge()
    keys = [f"in/file-{i:03}.txt" for i in range(200)]
    for start in range(0, len(keys), 10):
        rig.sqs.send_message_batch(QueueUrl=rig.queue_url, Entries=[
            {"Id": str(i), "MessageBody": s3_body(rig.bucket, key)}
            for i, key in enumerate(keys[start:start + 10])])
    with listen(rig, "in/", max_workers=4) as listener:
        # one receive drains most of it; on a loaded machine its 2 s budget may end first, so
        # receive until every message came (a condition, not a time)
        seen, handles, calls = [], [], 0
        deadline = time.monotonic() + 120
        while len(seen) < len(keys) and time.monotonic() < deadline:
            batch = listener.receive(timeout=2)
            seen += [e.relative_path for e in batch.events]
            handles += batch.handles
            calls += batch.info["receive_calls"]
            assert our_threads() and all(n.startswith("volume-stream-sqs")
                                         for n in our_threads())
        assert sorted(seen) == sorted(k[3:] for k in keys)
        assert calls > 5 and len(handles) == 200
        listener.ack(handles)
        assert queue_counts(rig) == (0, 0)
    assert not [t for t in threading.enumerate() if t.name.startswith("volume-stream")]


def test_max_batch_messages_bounds_one_receive(notified_bucket):
    rig = notified_bucket
    rig.purge()
    for start in range(0, 60, 10):
        rig.sqs.send_message_batch(QueueUrl=rig.queue_url, Entries=[
            {"Id": str(i), "MessageBody": s3_body(rig.bucket, f"k{start + i}")}
            for i in range(10)])
    with listen(rig, max_workers=3, max_batch_messages=25) as listener:
        first = listener.receive(timeout=1)
        second = listener.receive(timeout=1)
        # at most 25 a receive; moto's threaded server now and then hands one message to two
        # parallel receivers, which the listener de-duplicates, so a receive may show 24
        for batch in (first, second):
            assert 20 <= len(batch.events) <= 25 and batch.info["messages"] <= 25
        assert not listener.idle
        listener.ack(first.handles + second.handles)
        taken = {e.relative_path for e in first.events + second.events}
    assert queue_counts(rig) == (60 - len(taken), 0)


def test_standard_configuration_from_the_environment(aws_env, notified_bucket):
    # AWS_ENDPOINT_URL, AWS_DEFAULT_REGION and the key pair come from the environment only
    with SqsListener(notified_bucket.queue_url, bucket=notified_bucket.bucket) as listener:
        batch = listener.receive(timeout=0)
        assert batch.info["test_events"] == 1
        listener.ack(batch.handles)


def test_region_comes_from_an_aws_queue_url(aws_env, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    url = "https://sqs.eu-west-1.amazonaws.com/123456789012/q"
    with SqsListener(url, bucket="bkt") as listener:
        assert listener._client.meta.region_name == "eu-west-1"
    with pytest.raises(ConnectorError, match="region"):
        SqsListener("http://127.0.0.1:1/123456789012/q", bucket="bkt")


def test_missing_credentials_name_what_was_tried(aws_env, notified_bucket, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with SqsListener(notified_bucket.queue_url, bucket=notified_bucket.bucket) as listener:
        with pytest.raises(CredentialsError, match="environment variables") as info:
            listener.receive(timeout=0)
    assert "Unable to locate credentials" in str(info.value.__cause__)
    with pytest.raises(CredentialsError, match="explicit options") as info:
        SqsListener(notified_bucket.queue_url, bucket="b", aws_access_key_id="AKIAONLYKEYID")
    with pytest.raises(CredentialsError, match="profile 'nope'"):
        SqsListener(notified_bucket.queue_url, bucket="b", profile_name="nope")


def test_repr_hides_secrets_and_closed_listener_refuses(notified_bucket):
    listener = listen(notified_bucket, aws_session_token="token-secret")
    text = repr(listener)
    assert "testing-secret" not in text and "token-secret" not in text and "***" in text
    batch = listener.receive(timeout=0)
    listener.close()
    listener.close()
    with pytest.raises(ConnectorError, match="closed"):
        listener.receive(timeout=0)
    listener.ack(batch.handles)  # a daemon may still ack its last commit after close
    assert queue_counts(notified_bucket) == (0, 0)


def test_unknown_queue_and_unknown_option(moto_server):
    rig = make_rig(moto_server, notify=False)
    with listen(rig) as ok:
        ok.receive(timeout=0)
    missing = rig.queue_url.rsplit("/", 1)[0] + "/no-such-queue"
    with SqsListener(missing, bucket="bkt", endpoint_url=moto_server, region_name="us-east-1",
                     aws_access_key_id="a", aws_secret_access_key="b") as listener:
        with pytest.raises(ConnectorError, match="ReceiveMessage"):
            listener.receive(timeout=0)
    with pytest.raises(TypeError, match="endpoint"):
        SqsListener(rig.queue_url, bucket="bkt", endpoint="http://x")


def test_drain_stops_before_its_own_messages_become_visible_again(notified_bucket):
    rig = notified_bucket
    rig.purge()
    for start in range(0, 300, 10):
        rig.sqs.send_message_batch(QueueUrl=rig.queue_url, Entries=[
            {"Id": str(i), "MessageBody": s3_body(rig.bucket, f"in/d{start + i}")}
            for i in range(10)])
    # Every call goes through a proxy adding 0.5 s, so draining all 300 messages (30 calls)
    # would take ~15 s: past the 5 s deadline (half the 10 s visibility), so the drain must stop
    # early. One worker: moto's ReceiveMessage is not atomic, and two concurrent calls can both
    # take one message (real SQS may also deliver twice; the listener keeps one, tested above).
    # Every message was received after `started`, so none can be visible again before
    # started + 10 s; the assertions that rely on that are made only when the steps they depend
    # on finished by then (measured), so a machine slowed past it cannot fail them.
    visibility = 10
    with FaultyProxy(rig.endpoint, rate=1.0, faults=("latency",), latency_s=0.5) as proxy:
        slow = dataclasses.replace(rig, endpoint=proxy.endpoint)
        with listen(slow, "in/", max_workers=1, visibility_timeout=visibility) as listener:
            started = time.monotonic()
            batch = listener.receive(timeout=2)
            elapsed = time.monotonic() - started
            paths = [e.relative_path for e in batch.events]
            assert len(paths) == len(set(paths))  # a message seen twice is delivered once
            assert 0 < len(paths) < 300  # it stopped: the rest waits for the next receive
            if elapsed < visibility:  # no message could have come back during the drain
                assert batch.info["duplicates"] == 0, (elapsed, batch.info)
    # Straight to moto, one worker: moto's DeleteMessage rebuilds the queue's message list
    # without a lock, so two concurrent DeleteMessageBatch calls can undo each other's deletes
    # (a fake's race; SQS deletes are atomic), and the undone messages come back once visible.
    with listen(rig, "in/", max_workers=1, visibility_timeout=visibility) as listener:
        listener.ack(batch.handles)
        rest = listener.receive(timeout=2)
        received = time.monotonic() - started
        if received < visibility:  # none of them could be visible again yet
            assert not {e.relative_path for e in rest.events} & set(paths), received
        assert rest.events  # the messages the drain left behind are there for the next receive


def test_each_event_maps_to_its_messages_handle_and_a_partial_ack_keeps_the_rest(
        notified_bucket):
    """Issue 16 item 4: a poison event holds only its own message, not the whole batch."""
    rig = notified_bucket
    for name in ("a.txt", "poison.txt", "c.txt"):
        rig.put(f"in/{name}", b"x")
    with listen(rig, "in/", visibility_timeout=30) as listener:
        batch = listener.receive(timeout=1)
        assert sorted(e.relative_path for e in batch.events) == ["a.txt", "c.txt", "poison.txt"]
        mapping = batch.source_handles
        assert set(mapping) == {e.source_id for e in batch.events}
        # (the batch also holds the s3:TestEvent message, ignored: its handle has no event)
        assert len(set(mapping.values())) == 3 and set(mapping.values()) <= set(batch.handles)
        assert batch.info["handle_of_source"] == dict(mapping)  # what the daemon reads today
        poison = next(e for e in batch.events if e.relative_path == "poison.txt")
        listener.ack([h for h in batch.handles if h != mapping[poison.source_id]])
        assert wait_until(lambda: queue_counts(rig) == (0, 1))  # only the poison in flight
        listener.extend([mapping[poison.source_id]], 0)  # give it back at once
        again = listener.receive(timeout=1)
        assert [e.relative_path for e in again.events] == ["poison.txt"]
        assert again.events[0].source_id == poison.source_id  # the same message
        listener.ack(again.handles)
    assert queue_counts(rig) == (0, 0)
