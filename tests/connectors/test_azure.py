"""The Azure connectors on Azurite through the real SDKs: the Storage Queue listener (receive,
ack after commit, extend, duplicates, the poison queue after the dequeue count, refresh on ADLS
renames), the lister and the reader, and credentials kept out of every repr and pickle."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from connectors.azure.client import AzureOptions
from connectors.azure.listener import AzureQueueListener
from connectors.azure.store import AzureLister, AzureReader
from connectors.errors import CredentialsError, ObjectNotFoundError
from connectors.events import EventKind
from tests.azure_fixtures import ACCOUNT, AZURITE_KEY, event_message, make_rig
from tests.azure_fixtures import azure_env as azure_env
from tests.azure_fixtures import azure_rig as azure_rig
from tests.azure_fixtures import azurite as azurite


def listener(rig, prefix="in/", **kw):
    kw.setdefault("wait_seconds", 0)
    return AzureQueueListener(rig.queue_name, container=rig.container, prefix=prefix,
                              account=ACCOUNT, **kw)


def receive_all(lst, want, timeout=10):
    """Receive until `want` messages were seen (events + ignored + malformed)."""
    events, handles, malformed = [], [], 0
    for _ in range(50):
        got = lst.receive(timeout=1)
        events += got.events
        handles += got.handles
        malformed += got.malformed
        if len(handles) + malformed >= want:
            break
    return events, handles, malformed


def test_events_come_with_the_blob_s_real_properties_and_are_deleted_only_on_ack(azure_rig):
    azure_rig.put("in/a.csv", b"abc")
    azure_rig.put("elsewhere/b.csv", b"x")
    with listener(azure_rig) as lst:
        events, handles, malformed = receive_all(lst, 2)
        (event,) = events
        props = azure_rig.blobs.get_blob_client("in/a.csv").get_blob_properties()
        assert (event.kind, event.relative_path, event.size) == (EventKind.CREATED, "a.csv", 3)
        assert event.etag == props.etag.strip('"') and len(handles) == 2 and not malformed
        assert azure_rig.counts() == (2, 0)  # received, not acked: still on the queue
        lst.ack(handles)
        assert azure_rig.counts() == (0, 0)


def test_an_unacked_message_comes_back_and_extend_keeps_it_hidden(azure_rig):
    azure_rig.put("in/a.csv", b"abc")
    with listener(azure_rig, visibility_timeout=1) as lst:
        first = receive_all(lst, 1)[1]
        lst.extend(first, 30)  # a new pop receipt, kept in the handle
        assert lst.receive(timeout=0).empty
        lst.extend(first, 0)  # give it back now
        again = receive_all(lst, 1)[1]
        assert again[0].message_id == first[0].message_id and again[0].dequeue_count == 2
        lst.ack(first)  # the old receipt: stale, logged, no error
        assert first[0].stale
        lst.ack(again)
    assert azure_rig.counts() == (0, 0)


def test_malformed_messages_stay_until_the_dequeue_count_then_go_to_the_poison_queue(azure_rig):
    azure_rig.send("definitely not an event")
    azure_rig.send(event_message("BlobCreated", azure_rig.container, "in/x", sequencer="zz",
                                 etag="e", size=1))  # a sequencer that is not hex
    azure_rig.put("in/good.csv", b"1")
    with listener(azure_rig, visibility_timeout=1, max_dequeue_count=2, wait_seconds=2) as lst:
        events, handles, malformed = receive_all(lst, 3)
        assert [e.relative_path for e in events] == ["good.csv"] and malformed == 2
        lst.ack(handles)
        poisoned = 0
        for _ in range(40):  # received twice more (visibility 1 s), moved on the third
            poisoned += lst.receive(timeout=2).info.get("poisoned", 0)
            if poisoned == 2:
                break
        assert poisoned == 2
    assert azure_rig.counts() == (0, 2)
    body = azure_rig.queue.__class__.from_connection_string(
        azure_rig.emulator.connection_string, f"{azure_rig.queue_name}-poison").peek_messages(5)
    assert {m.content for m in body} >= {"definitely not an event"}


def test_duplicates_of_one_message_in_a_batch_are_kept_once(azure_rig):
    message = azure_rig.put("in/a.csv", b"abc", deliver=False)
    azure_rig.send(message)
    azure_rig.send(message)  # Event Grid delivers at least once: a second copy
    with listener(azure_rig) as lst:
        events, handles, _ = receive_all(lst, 2)
        # two queue messages with one event id each: both carry the same blob and sequencer,
        # which the directory table keeps once (tests/volume_stream/test_azure_volumes.py)
        assert len(events) == 2 and len({e.sequencer for e in events}) == 1
        lst.ack(handles)


def test_an_adls_directory_delete_in_the_volume_asks_for_a_refresh(azure_rig):
    azure_rig.send(event_message("DirectoryDeleted", azure_rig.container, "in/day1",
                                 sequencer="01", api="DeleteDirectory"))
    with listener(azure_rig) as lst:
        got = lst.receive(timeout=5)
        for _ in range(20):
            if got.handles:
                break
            got = lst.receive(timeout=1)
        assert got.needs_refresh and got.info["refresh_events"] == 1
        lst.ack(got.handles)
    azure_rig.send(event_message("DirectoryDeleted", azure_rig.container, "other/day1",
                                 sequencer="02", api="DeleteDirectory"))
    with listener(azure_rig) as lst:
        events, handles, _ = receive_all(lst, 1)
        assert handles and not lst.receive(timeout=0).needs_refresh
        lst.ack(handles)


def test_cloudevents_messages_are_read_as_well(azure_env):
    rig = make_rig(azure_env, schema="cloudevents")
    rig.put("in/a.csv", b"abc")
    rig.delete("in/a.csv")
    with listener(rig) as lst:
        events, handles, _ = receive_all(lst, 2)
        assert [e.kind for e in events] == [EventKind.CREATED, EventKind.REMOVED]
        assert events[0].sequencer < events[1].sequencer
        lst.ack(handles)


def test_the_lister_skips_adls_directories_and_folder_markers(azure_rig):
    azure_rig.put("in/a.csv", b"abc", deliver=False)
    azure_rig.put("in/sub/b.csv", b"abcd", deliver=False)
    azure_rig.put("in/marker/", b"", deliver=False)
    azure_rig.blobs.get_blob_client("in/dir").upload_blob(b"", metadata={"hdi_isfolder": "true"})
    azure_rig.put("out/c.csv", b"x", deliver=False)
    for workers in (1, 4):
        lister = AzureLister(azure_rig.container, "in/", list_workers=workers, page_size=1)
        rows = pa.Table.from_batches(list(lister.list())).to_pylist()
        assert sorted((r["relative_path"], r["size"]) for r in rows) == [
            ("a.csv", 3), ("sub/b.csv", 4)]
    flat = AzureLister(azure_rig.container, "in/", recursive=False)
    assert [r["relative_path"] for b in flat.list() for r in b.to_pylist()] == ["a.csv"]


def test_the_reader_reads_ranges_and_whole_blobs_after_a_pickle(azure_rig):
    azure_rig.put("in/a.bin", bytes(range(256)) * 10, deliver=False)
    reader = pickle.loads(pickle.dumps(AzureReader(azure_rig.container, "in/")))
    with reader.open("a.bin") as f:
        f.seek(250)
        assert f.read(8) == bytes(range(250, 256)) + bytes(range(2))
        f.seek(0)
        assert f.read() == bytes(range(256)) * 10
    assert reader.read_range("a.bin", 2550, 100) == bytes(range(246, 256))
    assert reader.read_range("a.bin", 5000, 10) == b""
    with pytest.raises(ObjectNotFoundError, match="missing"):
        reader.open("missing")


def test_credentials_never_show_nor_travel(azurite, monkeypatch):
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY"):
        monkeypatch.delenv(name, raising=False)
    options = AzureOptions.of(connection_string=azurite.connection_string)
    assert options.account_name == ACCOUNT and options.blob_endpoint == azurite.blob
    reader = AzureReader("c", "in/", connection_string=azurite.connection_string,
                         sas_token="sv=2024&sig=SASMARK")
    lister = AzureLister("c", "in/", account_key="KEYMARK")
    texts = [repr(options), str(options), repr(reader), repr(lister),
             pickle.dumps(reader), pickle.dumps(lister)]
    for text in texts:
        text = text if isinstance(text, str) else text.decode("latin-1")
        for marker in (AZURITE_KEY, "SASMARK", "KEYMARK"):
            assert marker not in text
    copy = pickle.loads(pickle.dumps(reader))  # the endpoints travel, the key does not
    assert copy._options.blob_endpoint == azurite.blob and copy._options.account_key is None


def test_a_wrong_key_is_a_credentials_error(azure_rig, monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    lister = AzureLister(azure_rig.container, blob_endpoint=azure_rig.emulator.blob,
                         account_name=ACCOUNT, account_key="d3Jvbmcga2V5")
    with pytest.raises(CredentialsError, match="rejected"):
        list(lister.list())
