"""The GCS connectors against fake-gcs-server and pstest (real processes, real SDKs over the
wire), with a real bucket notification config: the events of real uploads and deletes
arrive, an overwrite is one change, other buckets and prefixes are acked and ignored,
malformed and foreign messages are left for the dead-letter topic, messages are acked only by
`ack`; the reader resumes and pins a generation; the lister pages and recurses."""

# ruff: noqa: F811  (pytest fixtures imported from tests.gcp_fixtures are used as parameters)

from __future__ import annotations

import json
import pickle
import time

import pyarrow as pa
import pytest

from connectors.errors import CredentialsError, ObjectChangedError, ObjectNotFoundError
from connectors.events import EventKind
from connectors.gcp.events import etag_of
from connectors.gcp.listener import PubSubListener
from connectors.gcp.store import GcsLister, GcsReader
from connectors.protocols import LISTING_SCHEMA
from tests.gcp_fixtures import (  # noqa: F401
    GcsRig,
    gcp_emulators,
    gcp_env,
    gcs_rig,
    make_gcs_rig,
)


def listen(rig: GcsRig, prefix: str = "", **kw) -> PubSubListener:
    kw.setdefault("wait_time_seconds", 2)
    return PubSubListener(rig.subscription, bucket=rig.bucket_name, prefix=prefix,
                          **rig.options, **kw)


def collect(listener: PubSubListener, want: int, *, ack: bool = True, timeout: float = 20):
    """Receive until `want` events came (acking each batch), or fail."""
    events, deadline = [], time.monotonic() + timeout
    while len(events) < want:
        assert time.monotonic() < deadline, f"only {events} of {want} events"
        batch = listener.receive(timeout=1)
        events.extend(batch.events)
        if ack:
            listener.ack(batch.handles)
    return events


def test_upload_overwrite_delete_are_created_created_removed(gcs_rig):
    rig = gcs_rig
    first = rig.put("in/a.txt", b"hello")
    second = rig.put("in/a.txt", b"hello world")
    rig.delete("in/a.txt")
    with listen(rig, "in/") as listener:
        events = collect(listener, 3)
        time.sleep(0)  # nothing else may come: the overwrite's OBJECT_DELETE carried nothing
        assert listener.receive(timeout=1).events == ()
    by_seq = sorted(events, key=lambda e: e.sequencer)  # Pub/Sub keeps no order: generations do
    assert [(e.kind, e.relative_path, e.size) for e in by_seq] == [
        (EventKind.CREATED, "a.txt", 5), (EventKind.CREATED, "a.txt", 11),
        (EventKind.REMOVED, "a.txt", None)]
    assert by_seq[0].etag == etag_of(first.md5_hash, None)
    assert by_seq[1].etag == etag_of(second.md5_hash, None)
    assert by_seq[1].sequencer[:-1] == f"{second.generation:020d}"


def test_other_buckets_prefixes_and_metadata_updates_are_acked_and_ignored(gcs_rig):
    rig = gcs_rig
    rig.put("out/x.txt", b"1")
    blob = rig.put("in/a.txt", b"1")
    blob.metadata = {"colour": "blue"}
    blob.patch()
    rig.publish(json.dumps({"size": "1"}).encode(), eventType="OBJECT_FINALIZE",
                bucketId="another", objectId="in/b.txt", objectGeneration="1",
                eventTime="2026-01-01T00:00:00Z", payloadFormat="JSON_API_V1")
    with listen(rig, "in/") as listener:
        events = collect(listener, 1)
        batch = listener.receive(timeout=1)
        listener.ack(batch.handles)
    assert [e.relative_path for e in events] == ["a.txt"]
    assert rig.pending(wait=1.5) == []  # all acked, the ignored ones too


def test_malformed_and_foreign_messages_go_to_the_dead_letter_topic(gcp_emulators, caplog):
    rig = make_gcs_rig(gcp_emulators, ack_deadline=1, max_delivery_attempts=2)
    foreign = rig.publish(b"hello", origin="someone else")
    broken = rig.publish(b"{not json", eventType="OBJECT_FINALIZE", bucketId=rig.bucket_name,
                         objectId="in/a.txt", objectGeneration="1",
                         eventTime="2026-01-01T00:00:00Z")
    rig.put("in/good.txt", b"ok")
    malformed = 0
    with listen(rig, "in/") as listener:
        deadline = time.monotonic() + 20
        events = []
        while time.monotonic() < deadline:
            batch = listener.receive(timeout=1)
            malformed += batch.malformed
            events.extend(batch.events)
            listener.ack(batch.handles)
            dead = rig.pending(rig.dead_letter, wait=0.5)
            if len(dead) == 2:
                break
    assert [e.relative_path for e in events] == ["good.txt"]
    assert sorted(m.message.message_id for m in dead) == sorted([foreign, broken])
    assert malformed >= 2  # each delivered (and refused) at least once before dead-lettering
    assert "not a GCS notification" in caplog.text and foreign in caplog.text


def test_nothing_is_acked_before_ack_and_duplicates_come_again(gcp_emulators):
    rig = make_gcs_rig(gcp_emulators, ack_deadline=1)
    rig.put("in/a.txt", b"x")
    with listen(rig, "in/") as listener:
        (first,) = collect(listener, 1, ack=False)
        # not acked: redelivered once its ack deadline passes (at-least-once)
        (again,) = collect(listener, 1, ack=True)
        assert (first.relative_path, first.sequencer) == (again.relative_path, again.sequencer)
        assert listener.receive(timeout=1.5).events == ()


def test_extend_keeps_messages_hidden_and_zero_gives_them_back(gcp_emulators):
    rig = make_gcs_rig(gcp_emulators, ack_deadline=1)
    rig.put("in/a.txt", b"x")
    with listen(rig, "in/") as listener:
        batch = listener.receive(timeout=5)
        while not batch.events:
            batch = listener.receive(timeout=5)
        listener.extend(batch.handles, 30)
        time.sleep(1.5)  # past the subscription's deadline: still hidden by the extension
        assert listener.receive(timeout=0).events == ()
        listener.extend(batch.handles, 0)
        assert collect(listener, 1)[0].relative_path == "a.txt"


def test_backlog_is_drained_in_parallel_up_to_max_batch_messages(gcs_rig):
    rig = gcs_rig
    for i in range(60):
        rig.publish(json.dumps({"size": "1"}).encode(), eventType="OBJECT_FINALIZE",
                    bucketId=rig.bucket_name, objectId=f"in/{i:03d}", objectGeneration=str(i + 1),
                    eventTime="2026-01-01T00:00:00Z", payloadFormat="JSON_API_V1")
    with listen(rig, "in/", batch_size=10, max_batch_messages=40) as listener:
        first = listener.receive(timeout=5)
        assert len(first.events) == 40 and first.info["receive_calls"] >= 4
        listener.ack(first.handles)
        rest = collect(listener, 20)
    assert sorted(e.relative_path for e in (*first.events, *rest)) == [
        f"{i:03d}" for i in range(60)]


def test_repr_hides_the_key_file_and_bad_names_are_refused(gcs_rig, tmp_path):
    key = tmp_path / "secret-key-file.json"
    key.write_text("{}")
    with pytest.raises(ValueError, match="projects/PROJECT/subscriptions/NAME"):
        PubSubListener("my-sub", bucket="b")
    with pytest.raises(TypeError, match="unknown GCP client option"):
        PubSubListener(gcs_rig.subscription, bucket="b", endpoint_url="x")
    reader = GcsReader("b", "in/", credentials_file=str(key))
    assert "secret-key-file" not in repr(reader) and "***" in repr(reader)
    assert "secret-key-file" not in str(pickle.dumps(reader))
    with pytest.raises(CredentialsError, match="service-account key file") as info:
        reader.client  # noqa: B018 - an empty key file is no credential
    assert "secret-key-file" not in str(info.value)


def test_reader_reads_ranges_and_refuses_what_is_gone(gcs_rig):
    rig = gcs_rig
    data = bytes(range(256)) * 8192  # 2 MiB: the stream reads it in several ranged GETs
    rig.put("in/d/blob.bin", data)
    reader = GcsReader(rig.bucket_name, "in/", **rig.options)
    with reader.open("d/blob.bin") as f:
        assert f.read(10) == data[:10]
        f.seek(1_500_000)
        assert f.read() == data[1_500_000:]
    assert reader.read_range("d/blob.bin", 5, 7) == data[5:12]
    assert reader.read_range("d/blob.bin", len(data) + 5, 7) == b""
    with pytest.raises(ObjectNotFoundError, match="gs://.*/in/nope"):
        reader.open("nope")
    shipped = pickle.loads(pickle.dumps(reader))  # as on a Spark executor
    assert shipped.read_range("d/blob.bin", 0, 3) == data[:3]


def test_a_read_is_pinned_to_its_generation(gcs_rig):
    rig = gcs_rig
    rig.put("in/a.bin", b"a" * (3 << 20))
    reader = GcsReader(rig.bucket_name, "in/", **rig.options)
    with reader.open("a.bin") as f:
        assert f.read(1 << 20) == b"a" * (1 << 20)
        rig.put("in/a.bin", b"b" * (3 << 20))
        with pytest.raises(ObjectChangedError, match="changed while it was being read"):
            f.read()


def test_lister_pages_recurses_and_agrees_with_the_events(gcs_rig):
    rig = gcs_rig
    names = [f"in/{d}/{i}.txt" for d in "abc" for i in range(7)] + ["in/top.txt", "out/x"]
    blobs = {name: rig.put(name, name.encode()) for name in names}
    rig.put("in/folder/", b"")  # a folder marker
    for workers in (1, 4):
        lister = GcsLister(rig.bucket_name, "in/", page_size=5, list_workers=workers,
                           **rig.options)
        table = pa.Table.from_batches(list(lister.list()), schema=LISTING_SCHEMA)
        rows = {r["relative_path"]: r for r in table.to_pylist()}
        assert sorted(rows) == sorted(n[3:] for n in names if n.startswith("in/"))
        assert rows["a/3.txt"]["etag"] == etag_of(blobs["in/a/3.txt"].md5_hash, None)
        assert rows["a/3.txt"]["size"] == len("in/a/3.txt")
    flat = GcsLister(rig.bucket_name, "in/", recursive=False, **rig.options)
    assert [r["relative_path"] for b in flat.list() for r in b.to_pylist()] == ["top.txt"]
    with listen(rig, "in/") as listener:
        events = {e.relative_path: e for e in collect(listener, 22)}
    assert events["a/3.txt"].etag == rows["a/3.txt"]["etag"]


def test_the_emulator_variables_alone_reach_the_emulators(gcp_env, gcs_rig):
    gcs_rig.put("in/a.txt", b"x")
    with PubSubListener(gcs_rig.subscription, bucket=gcs_rig.bucket_name,
                        wait_time_seconds=2) as listener:
        assert [e.relative_path for e in collect(listener, 1)] == ["in/a.txt"]
    assert GcsReader(gcs_rig.bucket_name).read_range("in/a.txt", 0, 5) == b"x"
