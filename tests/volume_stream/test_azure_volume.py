"""`abfss://` and `az://` volumes end to end through the catalog, on Azurite: the real SDKs write
blobs, tests/azure_fixtures.py delivers the Event Grid messages of each write (Azurite emits
none) to a Storage Queue, `Catalog.watch` drains it, `Catalog.refresh` lists the container.
Assertions are on stream records.

The S3 scenarios, repeated: at-least-once delivery and duplicates, an overwrite as one UPDATE
pair, a delete, out-of-order delivery ordered by the events' sequencer, malformed and foreign
messages left on the queue until its dequeue count moves them to the poison queue, a crash
between the commit and the ack, the listing backfill, and pipelines reading the blobs.
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import time

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from tests.azure_fixtures import (  # noqa: F401
    ACCOUNT,
    AzureRig,
    azure_env,
    azure_executors,
    azure_rig,
    azurite,
    event_message,
    make_rig,
)
from tests.volume_stream.conftest import rows


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")  # no Spark needed: Arrow reads only


def location(rig: AzureRig, prefix: str = "in/") -> str:
    return f"abfss://{rig.container}@{ACCOUNT}.dfs.core.windows.net/{prefix}"


def add_volume(cat, rig: AzureRig, name: str = "vol", **note_options):
    note = vs.AzureQueueNotification(rig.queue_name, **{"wait_seconds": 0, **note_options})
    return cat.create_volume(name, location(rig), notification=note)


def watch(cat, name: str = "vol"):
    return cat.watch(name, until_idle=True, timeout=60, refresh=False)  # the listener alone


def files(cat, name: str = "vol") -> dict[str, int]:
    snap = cat.directory_table(name).snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(snap["relative_path"], snap["size"], strict=True))


def test_an_overwrite_is_one_update_pair_and_a_delete_a_delete(cat, azure_rig):
    add_volume(cat, azure_rig)
    cat.create_stream("s", "vol")
    azure_rig.put("in/a.csv", b"abc")
    assert watch(cat).versions == [1]
    cat.create_stream("after", "vol")
    azure_rig.put("in/a.csv", b"abcde")
    assert watch(cat).versions == [2]
    assert rows(cat.read_stream_arrow("after")) == [("UPDATE_AFTER", "a.csv", 5, 2),
                                                    ("UPDATE_BEFORE", "a.csv", 3, 1)]
    azure_rig.delete("in/a.csv")
    assert watch(cat).versions == [3]
    assert rows(cat.read_stream_arrow("after")) == [("DELETE", "a.csv", 3, 1)]
    assert cat.read_stream_arrow("s").num_rows == 0  # absent at both ends
    assert files(cat) == {} and azure_rig.counts() == (0, 0)


def test_duplicates_and_out_of_order_delivery_order_by_sequencer(cat, azure_rig):
    add_volume(cat, azure_rig)
    cat.create_stream("std", "vol")
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    put1 = azure_rig.put("in/a.txt", b"1", deliver=False)
    put2 = azure_rig.put("in/a.txt", b"22", deliver=False)
    removal = azure_rig.delete("in/a.txt", deliver=False)
    # the sequencers grow 1, 2, 3 with the writes; the rig stamped the events' times from the
    # blob's Last-Modified (whole seconds): only the sequencer orders them
    for message in (put2, put1):  # reordered within one batch: put2 is the newer
        azure_rig.send(message)
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 1, [1])
    assert files(cat) == {"a.txt": 2}
    expected = [("INSERT", "a.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("std")) == expected

    for message in (put1, put2, put1):  # duplicates and an older copy: nothing changes
        azure_rig.send(message)
    m = watch(cat)
    assert (m.received, m.applied, m.ignored, m.versions) == (3, 0, 3, [])
    assert azure_rig.counts() == (0, 0)

    cat.create_stream("after", "vol")
    for message in (removal, put1, removal):  # the delete is the newest; it counts once
        azure_rig.send(message)
    assert watch(cat).versions == [2] and files(cat) == {}
    assert rows(cat.read_stream_arrow("after")) == [("DELETE", "a.txt", 2, 1)]
    for message in (put2, put1):  # late copies of older puts never bring the file back
        azure_rig.send(message)
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 0, [])
    assert files(cat) == {} and rows(cat.read_stream_arrow("ao")) == expected


def test_a_sequencer_decides_across_hex_digits_not_the_event_time(cat, azure_rig):
    """...09 then ...0A: a digit-wise (string) comparison of the fixed-width hex; the event
    times say the opposite."""
    add_volume(cat, azure_rig)
    blob = azure_rig.blobs.get_blob_client("in/a.txt")
    sizes = {}
    for sequencer, data in (("0A", b"newer"), ("09", b"old")):
        blob.upload_blob(data, overwrite=True)
        props = blob.get_blob_properties()
        sizes[sequencer] = event_message(
            "BlobCreated", azure_rig.container, "in/a.txt", sequencer=sequencer.rjust(32, "0"),
            etag=props.etag, size=props.size,
            when=props.last_modified.replace(second=0 if sequencer == "0A" else 30))
    azure_rig.send(sizes["09"])
    assert watch(cat).versions == [1] and files(cat) == {"a.txt": 3}
    azure_rig.send(sizes["0A"])
    assert watch(cat).versions == [2] and files(cat) == {"a.txt": 5}
    azure_rig.send(sizes["09"])
    assert watch(cat).versions == [] and files(cat) == {"a.txt": 5}


def test_malformed_and_foreign_messages_stay_for_the_dequeue_count_then_the_poison_queue(
        cat, azure_rig, caplog):
    add_volume(cat, azure_rig, visibility_timeout=1, max_dequeue_count=2, wait_seconds=2)
    azure_rig.send("not an event")
    azure_rig.send(json.dumps({"eventType": "Microsoft.Resources.ResourceWriteSuccess",
                               "subject": "/subscriptions/x", "eventTime": "2024-01-01T00:00:00Z",
                               "data": {}}))
    azure_rig.put("in/good.csv", b"ok")
    m = watch(cat)
    assert (m.received, m.versions) == (1, [1]) and files(cat) == {"good.csv": 2}
    assert "leaving malformed message" in caplog.text
    deadline = time.monotonic() + 60
    while azure_rig.counts() != (0, 2):  # received twice more, then moved
        assert time.monotonic() < deadline, azure_rig.counts()
        cat.watch("vol", timeout=3, refresh=False)
    assert files(cat) == {"good.csv": 2}


def test_events_of_other_containers_prefixes_and_accounts_are_acked_and_ignored(cat, azure_rig):
    add_volume(cat, azure_rig)
    azure_rig.put("out/a.csv", b"x")
    azure_rig.send(event_message("BlobCreated", azure_rig.container, "in/b.csv",
                                 sequencer="1".rjust(32, "0"), etag="0x1", size=1,
                                 account="someoneelse"))
    azure_rig.send(event_message("BlobCreated", "other", "in/c.csv",
                                 sequencer="1".rjust(32, "0"), etag="0x1", size=1))
    azure_rig.send(event_message("BlobTierChanged", azure_rig.container, "in/d.csv",
                                 sequencer="1".rjust(32, "0"), size=1))
    m = watch(cat)
    assert (m.received, m.versions) == (0, []) and azure_rig.counts() == (0, 0)


def test_crash_after_commit_before_ack_duplicates_nothing(cat, azure_rig):
    add_volume(cat, azure_rig, visibility_timeout=1)
    cat.create_stream("s", "vol")
    azure_rig.put("in/a.txt", b"a")
    azure_rig.put("in/b.txt", b"bb")
    watcher = cat.watcher("vol")
    with watcher.listener as listener:
        got = listener.receive(timeout=5)
        while len(got.events) < 2:
            got = type(got)(got.events + listener.receive(timeout=1).events)
        assert watcher.table.apply(got.events).version == 1
    records = [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1)]
    assert rows(cat.read_stream_arrow("s")) == records
    time.sleep(0)  # the messages come back once their visibility runs out
    deadline = time.monotonic() + 30
    while azure_rig.queue.peek_messages(5) == []:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    m = watch(cat)
    assert (m.received, m.applied, m.versions) == (2, 0, [])
    assert azure_rig.counts() == (0, 0) and rows(cat.read_stream_arrow("s")) == records


def test_refresh_backfills_and_heals_missed_events(cat, azure_rig):
    azure_rig.put("in/old.txt", b"old", deliver=False)  # before the subscription
    azure_rig.put("in/sub/x.txt", b"x", deliver=False)
    add_volume(cat, azure_rig)
    cat.create_stream("s", "vol")
    m = cat.refresh("vol")
    assert (m.listed, m.inserted, m.version) == (2, 2, 1)
    azure_rig.put("in/a.txt", b"a")
    assert watch(cat).versions == [2]
    azure_rig.delete("in/a.txt", deliver=False)  # events that never arrive
    azure_rig.put("in/old.txt", b"older", deliver=False)
    m = cat.refresh("vol")
    assert (m.listed, m.deleted, m.updated, m.version) == (2, 1, 1, 3)
    assert cat.refresh("vol").version is None  # listing ETags match the events': no update
    assert files(cat) == {"old.txt": 5, "sub/x.txt": 1}
    azure_rig.put("in/b.txt", b"bb")  # an event after a refresh counts
    assert watch(cat).versions == [4] and cat.refresh("vol").version is None


def test_az_locations_take_the_account_from_the_options_or_the_environment(cat, azure_rig):
    note = vs.AzureQueueNotification(azure_rig.queue_name, wait_seconds=0)
    spec = cat.create_volume("v", f"az://{azure_rig.container}/in", notification=note)
    assert spec.location == f"az://{azure_rig.container}/in/"
    azure_rig.put("in/a.txt", b"abc")
    assert watch(cat, "v").versions == [1]
    url = cat.directory_table("v").snapshot(columns=["url"]).to_pylist()[0]["url"]
    assert url == f"az://{azure_rig.container}/in/a.txt"
    cat.create_volume("w", location(azure_rig))
    assert cat.refresh("w").inserted == 1
    url = cat.directory_table("w").snapshot(columns=["url"]).to_pylist()[0]["url"]
    assert url == f"abfss://{azure_rig.container}@{ACCOUNT}.dfs.core.windows.net/in/a.txt"


def test_bad_locations_and_options_are_refused_naming_the_volume(cat, azure_rig):
    with pytest.raises(vs.InvalidInputError, match="abfss://CONTAINER@ACCOUNT"):
        cat.create_volume("v", f"abfss://{azure_rig.container}/in/")
    with pytest.raises(vs.InvalidInputError, match="account_nam"):
        cat.create_volume("v", f"az://{azure_rig.container}/in/", acount_name="x")
    cat.create_volume("v", f"az://{azure_rig.container}/in/")
    with pytest.raises(vs.ConfigError, match="notification=AzureQueueNotification"):
        cat.watch("v", timeout=1, refresh=False)


def test_secrets_given_to_create_volume_stay_in_this_process(cat, azure_rig, monkeypatch,
                                                             tmp_path):
    conn = azure_rig.emulator.connection_string
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    note = vs.AzureQueueNotification(azure_rig.queue_name, wait_seconds=0,
                                     connection_string=conn)
    cat.create_volume("vol", location(azure_rig), notification=note, connection_string=conn,
                      blob_endpoint=azure_rig.emulator.blob)
    azure_rig.put("in/a.txt", b"abc")
    assert watch(cat).versions == [1]
    key = conn.split("AccountKey=")[1].split(";")[0]
    for path in (tmp_path / "warehouse").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    stored = cat.describe_volume("vol")
    assert "connection_string" not in json.dumps(stored, default=str)
    assert stored["options"]["blob_endpoint"] == azure_rig.emulator.blob


@vs.file_udf("content string")
def content(file: vs.FileRecord):
    return {"content": file.read_bytes().decode()}


def test_a_pipeline_reads_the_blobs(tmp_path, azure_rig, azure_executors):
    """The reader goes to the executors pickled: the endpoint travels, the key comes from
    the executor's own environment (AZURE_STORAGE_CONNECTION_STRING)."""
    cat = vs.connect(tmp_path / "warehouse", spark=azure_executors)
    add_volume(cat, azure_rig)
    cat.create_stream("s", "vol")
    azure_rig.put("in/a.txt", b"hello")
    azure_rig.put("in/sub/b.txt", b"azure!")
    assert watch(cat).versions == [1]
    m = cat.pipeline("s", content, "out").run_once()
    assert m.files_ok == 2, m
    got = DeltaTable(str(tmp_path / "warehouse" / "tables" / "out")).to_pyarrow_table()
    assert sorted(zip(got["relative_path"].to_pylist(), got["content"].to_pylist(),
                      strict=True)) == [("a.txt", "hello"), ("sub/b.txt", "azure!")]


def test_no_azure_secret_is_shown_logged_raised_or_written(cat, azure_rig, monkeypatch,
                                                          tmp_path, caplog):
    """Azurite's key given as options (connection string, account key, SAS): used for real,
    and found in no repr, str or pickle of what holds it, no log line, no error and no
    warehouse file."""
    import logging
    import pickle

    from volume_stream.volumes import backend_for

    caplog.set_level(logging.INFO)  # as test_secret_leaks: INFO elsewhere, DEBUG of ours
    for name in ("volume_stream", "connectors", "directory_table"):
        caplog.set_level(logging.DEBUG, logger=name)
    conn = azure_rig.emulator.connection_string
    key = conn.split("AccountKey=")[1].split(";")[0]
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    note = vs.AzureQueueNotification(azure_rig.queue_name, wait_seconds=0,
                                     connection_string=conn)
    spec = cat.create_volume("vol", location(azure_rig), notification=note, account_key=key,
                             blob_endpoint=azure_rig.emulator.blob)
    azure_rig.put("in/a.txt", b"abc")
    assert watch(cat).versions == [1] and cat.refresh("vol").version is None
    live = cat.volume_spec("vol")
    backend = backend_for(live)
    held = [note, spec, live, backend.reader(live), backend.lister(live)]
    listener = backend.listener(live, note)  # never pickled: it holds threads and clients
    errors = []
    bad = cat.create_volume("bad", location(azure_rig), sas_token=f"sv=1&sig={key}",
                            blob_endpoint=azure_rig.emulator.blob)
    with pytest.raises(vs.VolumeStreamError) as info:
        cat.refresh(bad.name)
    exc: BaseException | None = info.value
    while exc is not None:
        errors += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__
    texts = [caplog.text, *errors, repr(listener), str(listener)]
    for obj in held:
        texts += [repr(obj), str(obj), pickle.dumps(obj).decode("latin-1")]
    for text in texts:
        assert key not in text
    for path in (tmp_path / "warehouse").rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
