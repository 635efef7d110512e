"""`connectors.memory`: the in-memory listener and store keep the contracts the real providers
keep (queue semantics, handle per event, closed error, listing schema, pickling)."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pytest

from connectors.errors import ListenerClosedError, ObjectNotFoundError
from connectors.events import EventKind, FileEvent
from connectors.memory import MemoryListener, MemoryStore
from connectors.protocols import LISTING_SCHEMA, Listener, Lister, ObjectReader


def test_store_events_reach_the_listener_and_ack_removes_them():
    listener = MemoryListener()
    store = MemoryStore(listener)
    assert isinstance(listener, Listener) and isinstance(store, ObjectReader | Lister)
    store.put("a.txt", b"hello")
    store.put("dir/b.txt", b"x")
    store.delete("a.txt")
    assert listener.backlog() == 3 and not listener.idle
    batch = listener.receive(timeout=0)
    assert [(e.kind, e.relative_path) for e in batch.events] == [
        (EventKind.CREATED, "a.txt"), (EventKind.CREATED, "dir/b.txt"),
        (EventKind.REMOVED, "a.txt")]
    assert batch.events[0].size == 5 and batch.events[0].etag
    assert dict(batch.source_handles) == {e.source_id: e.source_id for e in batch.events}
    assert batch.info["handle_of_source"] == dict(batch.source_handles)
    assert listener.backlog() == 0 and listener.idle  # in flight, not visible
    assert listener.receive(timeout=0).empty
    listener.ack(batch.handles[:2])
    listener.extend(batch.handles[2:], 0)  # give the last one back
    again = listener.receive(timeout=0)
    assert [e.relative_path for e in again.events] == ["a.txt"] and again.events[0].kind == "REMOVED"
    listener.ack(again.handles)
    listener.ack(again.handles)  # stale: ignored
    assert listener.acked == list(batch.handles)


def test_malformed_messages_stay_and_refresh_is_asked_once():
    listener = MemoryListener()
    bad = listener.send_malformed()
    listener.request_refresh()
    first = listener.receive(timeout=0)
    assert first.malformed == 1 and first.needs_refresh and not first.handles
    second = listener.receive(timeout=0)
    assert second.malformed == 1 and not second.needs_refresh
    listener.ack([bad])
    assert listener.receive(timeout=0).empty


def test_receive_waits_for_a_message_sent_from_another_thread():
    listener = MemoryListener()
    sender = threading.Timer(0.05, lambda: listener.send(FileEvent.removed("late.txt")))
    sender.start()
    got = listener.receive(timeout=10)
    sender.join()
    assert [e.relative_path for e in got.events] == ["late.txt"]


def test_closed_listener_raises_the_common_error():
    with MemoryListener("q") as listener:
        pass
    with pytest.raises(ListenerClosedError, match="MemoryListener"):
        listener.receive(timeout=0)
    with pytest.raises(ValueError):
        MemoryListener().extend([], -1)


def test_store_reads_lists_and_pickles():
    store = MemoryStore()
    assert list(store.list()) == []
    store.put("b.bin", b"0123456789")
    store.put("a/c.txt", b"")
    with store.open("b.bin") as f:
        assert f.read() == b"0123456789"
    assert store.read_range("b.bin", 8, 5) == b"89" and store.read_range("b.bin", 20, 1) == b""
    table = pa.Table.from_batches(store.list(), schema=LISTING_SCHEMA)
    assert table.column("relative_path").to_pylist() == ["a/c.txt", "b.bin"]
    assert table.column("size").to_pylist() == [0, 10]
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read_range("b.bin", 0, 2) == b"01"
    with pytest.raises(ObjectNotFoundError):
        store.open("missing")
    with pytest.raises(ValueError):
        store.open("../escape")
