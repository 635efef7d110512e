"""`MnsListener` end to end: oss2 writes to the fake OSS, whose notifications land in the fake MNS
queue, which the listener reads with the real aliyun-mns-sdk."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import logging
import threading
import time

import oss2
import pytest

from connectors.alicloud.listener import MnsHandle, MnsListener
from connectors.errors import ConnectorError, CredentialsError, ListenerClosedError
from connectors.events import EventKind
from connectors.protocols import Listener
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    alicloud_env,
    make_volume,
    mns_server,
    oss_server,
    vol,
)


@pytest.fixture
def listen(vol, alicloud_env):
    opened = []

    def make(volume=vol, **options) -> MnsListener:
        options.setdefault("prefix", "in/")
        options.setdefault("wait_seconds", 0)
        listener = MnsListener(volume.mns_endpoint, volume.queue_name, bucket=volume.bucket,
                               **options)
        opened.append(listener)
        return listener

    yield make
    for listener in opened:
        listener.close()


def summary(received) -> list[tuple]:
    return [(e.kind, e.relative_path, e.size) for e in received.events]


def left(mns_server, vol) -> int:
    return len(mns_server.backend.messages(vol.queue_name))


def test_put_overwrite_delete(mns_server, vol, listen):
    listener = listen()
    assert isinstance(listener, Listener)
    vol.oss.put_object("in/a b+c é.txt", b"hello")
    vol.oss.put_object("in/a b+c é.txt", b"hi")
    vol.oss.delete_object("in/a b+c é.txt")
    got = listener.receive(timeout=0)
    assert summary(got) == [(EventKind.CREATED, "a b+c é.txt", 5),
                            (EventKind.CREATED, "a b+c é.txt", 2),
                            (EventKind.REMOVED, "a b+c é.txt", None)]
    assert got.events[0].etag == "5D41402ABC4B2A76B9719D911017C592"
    assert all(isinstance(h, MnsHandle) for h in got.handles) and len(got.handles) == 3
    assert (got.malformed, got.ignored, got.info["messages"]) == (0, 0, 3)
    assert got.events[0].source_id == got.handles[0].message_id
    assert left(mns_server, vol) == 3  # nothing is deleted before the ack
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0
    assert listener.receive(timeout=0).empty and listener.idle
    listener.ack([])  # nothing to do


def test_multi_delete_gives_one_event_per_key(mns_server, vol, listen):
    listener = listen()
    for key in ("in/x", "in/y", "out/z"):
        vol.oss.put_object(key, b"1")
    listener.ack(listener.receive(timeout=0).handles)
    vol.oss.batch_delete_objects(["in/x", "in/y", "out/z", "in/never"])
    got = listener.receive(timeout=0)
    assert summary(got) == [(EventKind.REMOVED, "x", None), (EventKind.REMOVED, "y", None)]
    assert got.ignored == 1 and len(got.handles) == 3  # out/z: not this volume, still acked
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0


def test_multipart_upload_is_one_created_event(mns_server, oss_server, listen):
    vol = make_volume(mns_server, oss_server, events=("ObjectCreated:*", "ObjectRemoved:*"))
    listener = listen(vol)
    upload = vol.oss.init_multipart_upload("in/big.bin").upload_id
    parts = [oss2.models.PartInfo(n, vol.oss.upload_part("in/big.bin", upload, n, data).etag)
             for n, data in ((1, b"a" * 100), (2, b"b" * 23))]
    aborted = vol.oss.init_multipart_upload("in/gone.bin").upload_id
    vol.oss.abort_multipart_upload("in/gone.bin", aborted)
    done = vol.oss.complete_multipart_upload("in/big.bin", upload, parts)
    got = listener.receive(timeout=0)
    assert summary(got) == [(EventKind.CREATED, "big.bin", 123)]
    assert got.events[0].etag == done.etag and done.etag.endswith("-2")
    assert got.ignored == 5 and got.info["events_skipped"] == 5 and len(got.handles) == 6
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0
    vol.close()


def test_plain_json_bodies(mns_server, oss_server, listen):
    vol = make_volume(mns_server, oss_server, base64_body=False)
    listener = listen(vol, prefix="")
    vol.oss.put_object("top.json", b"{}")
    assert summary(listener.receive(timeout=0)) == [(EventKind.CREATED, "top.json", 2)]
    vol.close()


def test_malformed_message_is_counted_and_left_on_the_queue(mns_server, vol, listen, caplog):
    listener = listen()
    mns_server.backend.send(vol.queue_name, "definitely not an event")
    vol.oss.put_object("in/ok.txt", b"ok")
    with caplog.at_level(logging.WARNING, logger="connectors.mns"):
        got = listener.receive(timeout=0)
    bad_id = mns_server.backend.messages(vol.queue_name)[0].message_id
    assert got.malformed == 1 and summary(got) == [(EventKind.CREATED, "ok.txt", 2)]
    assert len(got.handles) == 1 and bad_id in caplog.text
    listener.ack(got.handles)
    assert listener.receive(timeout=0).empty  # invisible until the visibility timeout
    mns_server.backend.advance(6)
    again = listener.receive(timeout=0)
    assert again.malformed == 1 and again.handles == ()
    (stored,) = mns_server.backend.messages(vol.queue_name)
    assert stored.message_id == bad_id and stored.dequeue_count == 2


def test_other_buckets_and_prefixes_are_ignored_and_acked(mns_server, vol, listen):
    listener = listen(recursive=False, suffix=".csv")
    vol.oss.put_object("out/a.csv", b"1")        # other prefix
    vol.oss.put_object("in/sub/a.csv", b"1")     # nested, not recursive
    vol.oss.put_object("in/a.txt", b"1")         # wrong suffix
    vol.oss.put_object("in/dir/", b"")           # folder marker
    other = json.dumps({"events": [{"eventName": "ObjectCreated:PutObject",
                                    "eventTime": "2024-01-02T03:04:05.000Z",
                                    "oss": {"bucket": {"name": "another"},
                                            "object": {"key": "in/a.csv", "size": 1}}}]})
    mns_server.backend.send(vol.queue_name, other)
    vol.oss.put_object("in/yes.csv", b"1")
    got = listener.receive(timeout=0)
    assert summary(got) == [(EventKind.CREATED, "yes.csv", 1)]
    assert got.ignored == 5 and len(got.handles) == 6 and got.info["records_ignored"] == 5
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0


def test_unsafe_paths_are_counted_and_acked(mns_server, vol, listen, caplog):
    listener = listen()
    vol.oss.put_object("in/../escape.txt", b"1")
    vol.oss.put_object("in/a//b.txt", b"1")
    with caplog.at_level(logging.WARNING, logger="connectors.mns"):
        got = listener.receive(timeout=0)
    assert got.events == () and got.ignored == 2 and got.info["invalid_paths"] == 2
    assert "escape.txt" in caplog.text
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0


def test_extend_keeps_handles_valid(mns_server, vol, listen):
    listener = listen()
    vol.oss.put_object("in/slow.txt", b"1")
    got = listener.receive(timeout=0)
    before = got.handles[0].receipt_handle
    listener.extend(got.handles * 2, 100)  # duplicates are extended once
    assert got.handles[0].receipt_handle != before and not got.handles[0].stale
    mns_server.backend.advance(50)  # past the queue's 5 s, within the extension
    assert listener.receive(timeout=0).empty
    listener.ack(got.handles)  # the same handle objects still work
    assert left(mns_server, vol) == 0
    with pytest.raises(TypeError):
        listener.extend([before], 10)


def test_stale_handles_are_logged_not_fatal(mns_server, vol, listen, caplog):
    listener = listen()
    vol.oss.put_object("in/a.txt", b"1")
    first = listener.receive(timeout=0)
    mns_server.backend.advance(6)
    second = listener.receive(timeout=0)  # redelivered: the first handle is superseded
    assert summary(second) == summary(first) and second.handles[0].dequeue_count == 2
    with caplog.at_level(logging.WARNING, logger="connectors.mns"):
        listener.ack(first.handles)
        listener.extend(first.handles, 10)
    assert "MessageNotExist" in caplog.text and first.handles[0].stale
    assert left(mns_server, vol) == 1
    listener.ack(second.handles)
    assert left(mns_server, vol) == 0


def test_ack_retries_transient_failures(mns_server, vol, listen):
    listener = listen()
    vol.oss.put_object("in/a.txt", b"1")
    got = listener.receive(timeout=0)
    mns_server.backend.fail_next("BatchDeleteMessage", "InternalError", 500, times=2)
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0
    vol.oss.put_object("in/b.txt", b"1")
    got = listener.receive(timeout=0)
    mns_server.backend.fail_next("BatchDeleteMessage", "InternalError", 500, times=10)
    try:
        with pytest.raises(ConnectorError, match="still failing"):
            listener.ack(got.handles)
    finally:
        mns_server.backend.clear_faults()


def test_backlog_is_drained_in_parallel_and_threads_stop(mns_server, vol, listen):
    listener = listen(batch_size=2, max_workers=3)
    for i in range(9):
        vol.oss.put_object(f"in/{i}.txt", b"x" * i)
    got = listener.receive(timeout=0)
    assert sorted(e.relative_path for e in got.events) == [f"{i}.txt" for i in range(9)]
    assert got.info["receive_calls"] > 1 and len(got.handles) == 9
    assert any(t.name.startswith("volume-stream-mns") for t in threading.enumerate())
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0
    listener.close()
    assert not any(t.name.startswith("volume-stream-mns") for t in threading.enumerate())
    with pytest.raises(ConnectorError):
        listener.receive(timeout=0)


def test_long_poll_and_fractional_timeouts(vol, listen):
    listener = listen(wait_seconds=5)
    started = time.monotonic()
    assert listener.receive(timeout=0.4).empty
    assert 0.3 < time.monotonic() - started < 2
    timer = threading.Timer(0.3, lambda: vol.oss.put_object("in/late.txt", b"1"))
    timer.start()
    started = time.monotonic()
    got = listener.receive(timeout=5)
    timer.join()
    assert summary(got) == [(EventKind.CREATED, "late.txt", 1)] and time.monotonic() - started < 3


def test_credentials(monkeypatch, mns_server, vol):
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", raising=False)
    with pytest.raises(CredentialsError,
                       match="ALIBABA_CLOUD_ACCESS_KEY_ID.*ALIBABA_CLOUD_ACCESS_KEY_SECRET"):
        MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket)
    with pytest.raises(CredentialsError, match="both access_key_id and access_key_secret"):
        MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket,
                    access_key_id=FAKE_ACCESS_KEY_ID)
    with MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket, wait_seconds=0,
                     access_key_id=FAKE_ACCESS_KEY_ID, access_key_secret="wrong-secret") as bad:
        assert "wrong-secret" not in repr(bad)
        with pytest.raises(CredentialsError, match="SignatureDoesNotMatch"):
            bad.receive(timeout=0)
    mns_server.backend.add_credentials("STS.fake", "sts-secret", "sts-token")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "STS.fake")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "sts-secret")
    monkeypatch.setenv("ALIBABA_CLOUD_SECURITY_TOKEN", "sts-token")
    with MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket, wait_seconds=0) as sts:
        assert sts.receive(timeout=0).empty
    monkeypatch.delenv("ALIBABA_CLOUD_SECURITY_TOKEN")
    with MnsListener(vol.mns_endpoint, vol.queue_name, bucket=vol.bucket, wait_seconds=0) as sts:
        with pytest.raises(ConnectorError, match="AccessDenied"):
            sts.receive(timeout=0)


def test_backlog_counts_waiting_messages(mns_server, vol, listen):
    listener = listen()
    assert listener.backlog() == left(mns_server, vol) == 0
    for i in range(3):
        vol.oss.put_object(f"in/b{i}.txt", b"x")
    assert listener.backlog() == 3
    got = listener.receive(timeout=0)
    listener.ack(got.handles)
    assert listener.backlog() == 0


def test_each_event_maps_to_its_messages_handle_and_a_partial_ack_keeps_the_rest(
        mns_server, vol, listen):
    """Issue 16 item 4: a poison event holds only its own message, not the whole batch."""
    listener = listen()
    for name in ("a.txt", "poison.txt", "c.txt"):
        vol.oss.put_object(f"in/{name}", b"x")
    batch = listener.receive(timeout=0)
    assert sorted(e.relative_path for e in batch.events) == ["a.txt", "c.txt", "poison.txt"]
    mapping = batch.source_handles
    assert set(mapping) == {e.source_id for e in batch.events}
    assert all(mapping[e.source_id].message_id == e.source_id for e in batch.events)
    assert len({id(h) for h in mapping.values()}) == 3
    assert batch.info["handle_of_source"] == dict(mapping)  # what the daemon reads today
    poison = next(e for e in batch.events if e.relative_path == "poison.txt")
    listener.ack([mapping[e.source_id] for e in batch.events if e is not poison])
    (kept,) = mns_server.backend.messages(vol.queue_name)
    assert kept.message_id == poison.source_id and "poison.txt" in _decoded(kept.body)


def _decoded(body: str) -> str:
    import base64
    return body if body.lstrip().startswith("{") else base64.b64decode(body).decode()


def test_drain_stops_before_its_own_messages_become_visible_again(mns_server, oss_server,
                                                                  listen):
    """The MNS drain has the same visibility guard as SQS's: it reads the queue's visibility
    timeout and stops at half of it, so it never receives its own messages a second time."""
    short = make_volume(mns_server, oss_server, visibility_timeout=1)
    for i in range(400):
        body = json.dumps({"events": [{"eventName": "ObjectCreated:PutObject",
                                       "eventTime": "2024-01-02T03:04:05.000Z",
                                       "oss": {"bucket": {"name": short.bucket},
                                               "object": {"key": f"in/d{i}", "size": 1}}}]})
        mns_server.backend.send(short.queue_name, body)
    listener = listen(short, batch_size=1, max_workers=1)
    batch = listener.receive(timeout=0)
    paths = [e.relative_path for e in batch.events]
    assert paths and len(paths) == len(set(paths)) and batch.info["duplicates"] == 0
    listener.ack(batch.handles)
    assert left(mns_server, short) == 400 - len(paths)


def test_ack_and_extend_still_work_after_close(mns_server, vol, listen):
    """As for SQS: a daemon can close its listener, finish its last commit and still ack."""
    listener = listen()
    vol.oss.put_object("in/last.txt", b"1")
    got = listener.receive(timeout=0)
    listener.close()
    with pytest.raises(ListenerClosedError):
        listener.receive(timeout=0)
    listener.extend(got.handles, 60)
    listener.ack(got.handles)
    assert left(mns_server, vol) == 0
