"""An `oss://` volume end to end through the catalog: oss2 writes to the local OSS fake, whose
event notifications land in the local MNS fake, which `Catalog.watch` drains with the real
aliyun-mns-sdk; `Catalog.refresh` lists with the real oss2. Assertions are on stream records.

Real OSS stamps events to the second, and so does the fake: an event on a path is ignored when
it is not newer than what the directory table holds for it, so tests that touch one path again
in a later batch first wait for the wall clock to enter a new second (`Clock.gap`).
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import base64
import copy
import json
import logging
import pickle
import time
from datetime import datetime, timedelta
from pathlib import Path

import oss2
import pytest
from mns.queue import Message

import volume_stream as vs
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    alicloud_env,
    make_volume,
    mns_server,
    oss_server,
)
from tests.volume_stream.conftest import rows
from volume_stream.volumes import backend_for

VISIBILITY = 5  # the test queues' VisibilityTimeout, seconds


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")  # no Spark needed: Arrow reads only


@pytest.fixture
def vol(mns_server, oss_server, alicloud_env):
    volume = make_volume(mns_server, oss_server, prefix="in/", visibility_timeout=VISIBILITY)
    yield volume
    volume.close()


def add_volume(cat, vol, name="vol", *, notification=None, **options):
    """Register `vol` as an oss:// volume fed by its MNS queue (short polls unless told)."""
    note = vs.MnsNotification(vol.mns_endpoint, vol.queue_name,
                              **(notification if notification is not None
                                 else {"wait_seconds": 0}))
    return cat.create_volume(name, f"oss://{vol.bucket}/{vol.prefix}", endpoint=vol.oss_endpoint,
                             notification=note, **options)


def watch(cat, name="vol"):
    return cat.watch(name, until_idle=True, timeout=60, refresh=False)  # the listener alone


def left(mns_server, vol) -> int:
    return len(mns_server.backend.messages(vol.queue_name))


def version(cat, name="vol") -> int:
    return cat.directory_table(name).version()


def files(cat, name="vol") -> dict[str, int]:
    snap = cat.directory_table(name).snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(snap["relative_path"], snap["size"], strict=True))


def next_second() -> None:
    time.sleep(1.01 - time.time() % 1.0)


def take_bodies(vol) -> list[dict]:
    """Receive and delete every message on the queue with the SDK; their JSON, in order."""
    docs = []
    while True:
        try:
            got = vol.queue.batch_receive_message(16, wait_seconds=0)
        except Exception as exc:  # the SDK's MessageNotExist: the queue is empty
            assert getattr(exc, "type", "") == "MessageNotExist", exc
            return docs
        docs += [json.loads(m.message_body) for m in got]  # the SDK undid the base64
        vol.queue.batch_delete_message([m.receipt_handle for m in got])


def send(vol, doc: dict) -> None:
    """Send an event body the way OSS does: base64 of the JSON (the SDK's default encoding)."""
    vol.queue.send_message(Message(json.dumps(doc)))


def at(doc: dict, when: datetime, event_name: str | None = None) -> dict:
    """A copy of a notification body with another eventTime (and event name)."""
    doc = copy.deepcopy(doc)
    doc["events"][0]["eventTime"] = when.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    if event_name:
        doc["events"][0]["eventName"] = event_name
    return doc


def event_time(doc: dict) -> datetime:
    return datetime.fromisoformat(doc["events"][0]["eventTime"])


# ---------------------------------------------------------------------------------- scenarios
def test_put_overwrite_delete(cat, mns_server, vol):
    add_volume(cat, vol, notification={})  # default long polling
    cat.create_stream("std", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    put = vol.oss.put_object("in/a.txt", b"hello")
    vol.oss.put_object("in/b.txt", b"bb")
    m = watch(cat)
    assert (m.received, m.applied, m.malformed, m.versions) == (2, 2, 0, [1])
    assert left(mns_server, vol) == 0
    (a, b) = sorted(cat.read_stream_arrow("std").to_pylist(), key=lambda r: r["relative_path"])
    assert a["url"] == f"oss://{vol.bucket}/in/a.txt" and a["etag"] == put.etag.strip('"')
    assert (a["__change_type"], a["size"], b["size"]) == ("INSERT", 5, 2)
    assert rows(cat.read_stream_arrow("ao")) == rows(cat.read_stream_arrow("std"))

    cat.create_stream("later", "vol")
    next_second()
    vol.oss.put_object("in/a.txt", b"hello world")
    vol.oss.delete_object("in/b.txt")
    for data in (b"1", b"22"):  # created, overwritten and removed within one batch: no trace
        vol.oss.put_object("in/c.txt", data)
    vol.oss.delete_object("in/c.txt")
    m = watch(cat)
    assert m.versions == [2] and left(mns_server, vol) == 0
    assert rows(cat.read_stream_arrow("later")) == [("DELETE", "b.txt", 2, 1),
                                                    ("UPDATE_AFTER", "a.txt", 11, 2),
                                                    ("UPDATE_BEFORE", "a.txt", 5, 1)]
    assert rows(cat.read_stream_arrow("std")) == [("INSERT", "a.txt", 11, 2)]
    assert rows(cat.read_stream_arrow("ao")) == [("INSERT", "a.txt", 5, 1),
                                                 ("INSERT", "b.txt", 2, 1)]
    # what the events built is what a listing finds: refresh has nothing to do
    assert cat.refresh("vol").version is None


def test_multi_delete(cat, mns_server, vol):
    add_volume(cat, vol)
    for key in ("x", "y", "z", "keep"):
        vol.oss.put_object(f"in/{key}.txt", key.encode())
    assert watch(cat).versions == [1]
    cat.create_stream("s", "vol")
    next_second()
    vol.oss.batch_delete_objects(["in/x.txt", "in/y.txt", "in/z.txt", "in/never.txt"])
    m = watch(cat)
    assert (m.received, m.versions) == (3, [2]) and left(mns_server, vol) == 0
    assert rows(cat.read_stream_arrow("s")) == [("DELETE", "x.txt", 1, 1), ("DELETE", "y.txt", 1, 1),
                                                ("DELETE", "z.txt", 1, 1)]
    assert files(cat) == {"keep.txt": 4}


def test_multipart_and_append_on_a_whole_bucket_volume(cat, mns_server, oss_server,
                                                        alicloud_env):
    vol = make_volume(mns_server, oss_server, events=("ObjectCreated:*", "ObjectRemoved:*"))
    spec = add_volume(cat, vol)  # oss://bucket/ : every key
    cat.create_stream("s", "vol")
    data = [b"a" * 100_000, b"b" * 123]
    upload = vol.oss.init_multipart_upload("big/file.bin").upload_id
    parts = [oss2.models.PartInfo(n, vol.oss.upload_part("big/file.bin", upload, n, d).etag)
             for n, d in enumerate(data, 1)]
    gone = vol.oss.init_multipart_upload("gone.bin").upload_id
    vol.oss.abort_multipart_upload("gone.bin", gone)
    done = vol.oss.complete_multipart_upload("big/file.bin", upload, parts)
    position = vol.oss.append_object("log.txt", 0, b"abc").next_position
    vol.oss.append_object("log.txt", position, b"defg")
    m = watch(cat)
    # initiate x2, upload part x2 and abort carry nothing (5 ignored); complete and both
    # appends do, and the first append is superseded by the second in the same commit (1)
    assert (m.received, m.ignored, m.versions) == (3, 6, [1]) and left(mns_server, vol) == 0
    records = {r["relative_path"]: r for r in cat.read_stream_arrow("s").to_pylist()}
    assert {p: (r["__change_type"], r["size"]) for p, r in records.items()} == {
        "big/file.bin": ("INSERT", 100_123), "log.txt": ("INSERT", 7)}
    assert records["big/file.bin"]["etag"] == done.etag.strip('"') and done.etag.endswith("-2")
    # the volume's reader (what pipelines ship to executors) reads what the events announced
    reader = pickle.loads(pickle.dumps(backend_for(spec).reader(spec)))
    with reader.open("big/file.bin") as f:
        assert f.read() == b"".join(data)
    assert reader.read_range("log.txt", 2, 3) == b"cde"
    assert cat.refresh("vol").version is None
    vol.close()


ODD_KEYS = ["a b+c.txt", "100% +%2B.csv", "ünï cødé/文件 ✓.txt", "d1/d2/d3/d4/d5/d6/deep.bin",
            "q?x=1&y=2#frag.json", "trailing space .txt", "+plus+/~tilde~.dat"]


def test_odd_keys(cat, mns_server, vol):
    spec = add_volume(cat, vol)
    cat.create_stream("s", "vol")
    for i, key in enumerate(ODD_KEYS):
        vol.oss.put_object("in/" + key, key.encode() * (i + 1))
    vol.oss.put_object("in/folder/", b"")  # a folder marker is not a file
    m = watch(cat)
    assert m.versions == [1] and left(mns_server, vol) == 0
    records = cat.read_stream_arrow("s").to_pylist()
    assert sorted(r["relative_path"] for r in records) == sorted(ODD_KEYS)
    assert {r["url"] for r in records} == {f"oss://{vol.bucket}/in/{k}" for k in ODD_KEYS}
    reader = backend_for(spec).reader(spec)
    for i, key in enumerate(ODD_KEYS):
        with reader.open(key) as f:
            assert f.read() == key.encode() * (i + 1)
    assert cat.refresh("vol").version is None  # listing keys == event keys, byte for byte
    cat.create_stream("gone", "vol")
    next_second()
    vol.oss.batch_delete_objects(["in/" + k for k in ODD_KEYS])
    assert watch(cat).versions == [2]
    assert sorted(r[1] for r in rows(cat.read_stream_arrow("gone"))) == sorted(ODD_KEYS)
    assert files(cat) == {}


def test_duplicated_and_reordered_messages(cat, mns_server, vol):
    add_volume(cat, vol)
    cat.create_stream("std", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    vol.oss.put_object("in/a.txt", b"1")
    next_second()
    vol.oss.put_object("in/a.txt", b"22")
    first, second = take_bodies(vol)  # the real notification bodies OSS sent
    assert event_time(first) < event_time(second)

    send(vol, second)  # delivered out of order within one batch: event time decides
    send(vol, first)
    assert watch(cat).versions == [1]
    assert files(cat) == {"a.txt": 2}
    expected = [("INSERT", "a.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("std")) == expected
    assert rows(cat.read_stream_arrow("ao")) == expected

    # duplicates and older copies arriving later change nothing and make no version
    send(vol, second)
    send(vol, first)
    send(vol, at(first, event_time(first) - timedelta(minutes=5)))
    send(vol, at(second, event_time(first), "ObjectRemoved:DeleteObject"))  # an older delete
    m = watch(cat)
    assert (m.received, m.applied, m.ignored, m.versions) == (4, 0, 4, [])
    assert version(cat) == 1 and left(mns_server, vol) == 0
    assert rows(cat.read_stream_arrow("std")) == expected
    assert rows(cat.read_stream_arrow("ao")) == expected

    # the real delete is newer than everything stored: it counts, once
    next_second()
    vol.oss.delete_object("in/a.txt")
    (removal,) = take_bodies(vol)
    send(vol, removal)
    send(vol, removal)
    assert watch(cat).versions == [2]
    assert cat.read_stream_arrow("std").num_rows == 0  # absent at both ends
    assert rows(cat.read_stream_arrow("ao")) == expected


def test_malformed_bodies_are_counted_and_left_on_the_queue(cat, mns_server, vol, caplog):
    add_volume(cat, vol)
    backend = mns_server.backend
    no_size = {"events": [{"eventName": "ObjectCreated:PutObject",
                           "eventTime": "2024-01-02T03:04:05.000Z",
                           "oss": {"bucket": {"name": vol.bucket}, "object": {"key": "in/x"}}}]}
    bad = [backend.send(vol.queue_name, "definitely not an event"),
           backend.send(vol.queue_name, base64.b64encode(b"{not json").decode()),
           backend.send(vol.queue_name, json.dumps({"Records": []})),  # an S3-shaped body
           backend.send(vol.queue_name, json.dumps(no_size))]
    vol.oss.put_object("in/ok.txt", b"ok")
    with caplog.at_level(logging.WARNING, logger="connectors.mns"):
        m = watch(cat)
    assert (m.malformed, m.applied, m.versions) == (4, 1, [1])
    assert all(b.message_id in caplog.text for b in bad)
    assert {s.message_id for s in backend.messages(vol.queue_name)} == {
        b.message_id for b in bad}  # left for the queue's dead-letter policy
    # they come back after the visibility timeout; the watch still drains and returns
    backend.advance(VISIBILITY + 1)
    vol.oss.put_object("in/ok2.txt", b"ok2")
    m = watch(cat)
    assert (m.malformed, m.applied, m.versions) == (4, 1, [2])
    assert [s.dequeue_count for s in backend.messages(vol.queue_name)] == [2, 2, 2, 2]
    assert files(cat) == {"ok.txt": 2, "ok2.txt": 3}


def test_events_for_other_buckets_and_prefixes_are_acked(cat, mns_server, vol):
    add_volume(cat, vol)
    vol.oss.put_object("out/x.txt", b"1")  # the rule sends the whole bucket; the volume is in/
    (outside,) = take_bodies(vol)
    send(vol, outside)  # back on the queue as OSS sent it; and a copy from another bucket:
    other = copy.deepcopy(outside)
    other["events"][0]["oss"]["bucket"]["name"] = "another-bucket"
    other["events"][0]["oss"]["object"]["key"] = "in/x.txt"
    send(vol, other)
    vol.oss.put_object("in/dir/", b"")        # a folder marker
    vol.oss.put_object("in/../up.txt", b"1")  # in the prefix, but its relative path is unsafe
    m = watch(cat)
    assert (m.received, m.ignored, m.malformed, m.versions) == (0, 4, 0, [])
    assert left(mns_server, vol) == 0 and version(cat) == 0  # all acked, nothing committed
    vol.oss.put_object("in/yes.txt", b"1")
    assert watch(cat).versions == [1] and files(cat) == {"yes.txt": 1}


def test_crash_between_commit_and_delete(cat, mns_server, vol):
    add_volume(cat, vol)
    cat.create_stream("s", "vol")
    vol.oss.put_object("in/a.txt", b"a")
    vol.oss.put_object("in/b.txt", b"bb")
    watcher = cat.watcher("vol")
    with watcher.listener as listener:  # one step with the ack cut off, as if the process died
        got = listener.receive(timeout=5)
        assert watcher.table.apply(got.events).version == 1
    records = rows(cat.read_stream_arrow("s"))
    assert records == [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1)]
    assert left(mns_server, vol) == 2  # committed, never deleted
    mns_server.backend.advance(VISIBILITY + 1)  # the restarted watcher gets them again
    m = watch(cat)
    assert (m.received, m.applied, m.ignored, m.versions) == (2, 0, 2, [])
    assert left(mns_server, vol) == 0 and version(cat) == 1
    assert rows(cat.read_stream_arrow("s")) == records  # no duplicate records
    vol.oss.put_object("in/c.txt", b"c")
    assert watch(cat).versions == [2]


def test_refresh_backfills_and_heals_missed_events(cat, mns_server, vol):
    events = vol.rule.events
    vol.rule.events = ()  # notifications off: objects from before the queue existed
    vol.oss.put_object("in/old.txt", b"old")
    vol.rule.events = events
    add_volume(cat, vol)
    cat.create_stream("s", "vol")
    assert watch(cat).versions == []
    m = cat.refresh("vol")
    assert (m.listed, m.inserted, m.version) == (1, 1, 1)
    vol.oss.put_object("in/a.txt", b"a")
    assert watch(cat).versions == [2]
    vol.rule.events = ()  # a delete and an overwrite whose events never arrive
    vol.oss.delete_object("in/a.txt")
    vol.oss.put_object("in/old.txt", b"older")
    vol.rule.events = events
    assert watch(cat).versions == [] and files(cat) == {"old.txt": 3, "a.txt": 1}
    m = cat.refresh("vol")
    assert (m.deleted, m.updated, m.version) == (1, 1, 3)
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "old.txt", 5, 3)]
    next_second()  # events after a refresh count once they are newer than it
    vol.oss.put_object("in/a.txt", b"again")
    assert watch(cat).versions == [4] and files(cat) == {"old.txt": 5, "a.txt": 5}


def test_same_second_delete_from_a_later_batch_is_ordered_by_enqueue_time(cat, mns_server,
                                                                         vol):
    """OSS stamps events to the second and carries no sequencer: a delete stamped in the same
    second as the stored create is ordered by MNS's millisecond EnqueueTime, so it applies;
    a redelivery of the same message (same EnqueueTime) still changes nothing."""
    add_volume(cat, vol)
    cat.create_stream("s", "vol")
    vol.oss.put_object("in/a.txt", b"a")
    (created,) = take_bodies(vol)
    send(vol, created)
    assert watch(cat).versions == [1]
    events = vol.rule.events
    vol.rule.events = ()
    vol.oss.delete_object("in/a.txt")
    vol.rule.events = events
    send(vol, at(created, event_time(created), "ObjectRemoved:DeleteObject"))  # same second
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (1, 1, [2])
    assert files(cat) == {} and cat.read_stream_arrow("s").num_rows == 0
    assert cat.refresh("vol").version is None


def test_credentials_errors_are_config_errors(cat, tmp_path, mns_server, vol, monkeypatch):
    add_volume(cat, vol, "wrong", access_key_id=FAKE_ACCESS_KEY_ID,
               access_key_secret="wrong-secret")
    for call in (lambda: watch(cat, "wrong"), lambda: cat.refresh("wrong")):
        with pytest.raises(vs.ConfigError, match="volume 'wrong'.*SignatureDoesNotMatch") as exc:
            call()
        assert "wrong-secret" not in str(exc.value)
    add_volume(cat, vol, "unknown", access_key_id="LTAI-nobody", access_key_secret="x")
    with pytest.raises(vs.ConfigError, match="InvalidAccessKeyId"):
        watch(cat, "unknown")

    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID")
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
    add_volume(cat, vol, "noenv")
    for call in (lambda: watch(cat, "noenv"), lambda: cat.refresh("noenv")):
        with pytest.raises(vs.ConfigError, match="volume 'noenv'.*ALIBABA_CLOUD_ACCESS_KEY_ID"):
            call()

    # explicit credentials work, live in this process only and are never written down
    add_volume(cat, vol, "explicit", access_key_id=FAKE_ACCESS_KEY_ID,
               access_key_secret=FAKE_ACCESS_KEY_SECRET)
    vol.oss.put_object("in/a.txt", b"a")
    assert watch(cat, "explicit").versions == [1]
    warehouse = tmp_path / "warehouse"
    for path in (p for p in Path(warehouse).rglob("*") if p.is_file()):
        assert FAKE_ACCESS_KEY_SECRET.encode() not in path.read_bytes(), path
    again = vs.connect(warehouse)  # another process: no secret, no environment
    with pytest.raises(vs.ConfigError, match="ALIBABA_CLOUD_ACCESS_KEY_ID"):
        again.refresh("explicit")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", FAKE_ACCESS_KEY_ID)
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", FAKE_ACCESS_KEY_SECRET)
    assert again.refresh("explicit").version is None and watch(again, "explicit").versions == []
