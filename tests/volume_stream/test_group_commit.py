"""Group commit (`volume_stream.volumes.batching`, issue 26): the next batch takes everything
pending while a commit runs, capped by memory and by a target commit interval, so batch sizes
grow with the load; in the daemon (over the in-package `MemoryListener` and a real directory
table) and in `VolumeWatcher.step` (what `Catalog.watch` runs). The SIGKILL scenario is in
`test_group_commit_kills.py`."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

import volume_stream as vs
from connectors.events import FileEvent
from connectors.memory import MemoryListener
from volume_stream.daemon import Daemon
from volume_stream.volumes.batching import BatchLimits, CommitModel, event_bytes, gather
from volume_stream.volumes.watcher import VolumeWatcher

from .test_daemon import config, metric, wait_for

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def created(i: int, prefix: str = "f") -> FileEvent:
    t = T0 + timedelta(milliseconds=i)
    return FileEvent.created(f"{prefix}/{i:06d}.txt", size=i % 50, last_modified_time=t,
                             event_time=t)


class Feeder(threading.Thread):
    """Sends `total` CREATED events to a `MemoryListener`, `per_message` to a message, at
    about `rate` events/s (None: as fast as it can)."""

    def __init__(self, listener: MemoryListener, total: int, rate: float | None,
                 start: int = 0, per_message: int = 1):
        super().__init__(name="group-commit-feeder", daemon=True)
        self.listener, self.total, self.rate = listener, total, rate
        self.first, self.per_message = start, per_message

    def run(self) -> None:
        began = time.monotonic()
        for sent in range(0, self.total, self.per_message):
            i = self.first + sent
            self.listener.send(*(created(j) for j in range(i, min(i + self.per_message,
                                                                  self.first + self.total))))
            if self.rate:
                lag = began + (sent + self.per_message) / self.rate - time.monotonic()
                if lag > 0:
                    time.sleep(lag)


# ---------------------------------------------------------------------- the model and caps
def test_commit_model_caps_by_the_target_interval_and_the_fixed_part():
    model = CommitModel()
    assert model.cap(5.0) is None                   # no evidence: no cap
    model.observe(100, 1.1)
    model.observe(120, 1.12)
    assert model.cap(5.0) is None                   # sizes too alike to fit a line
    for n, s in ((1_000, 1.9), (10_000, 10.9)):     # 1 s fixed + 1 ms per event
        model.observe(n, s)
    assert model.cap(5.0) == pytest.approx(4_000, rel=0.02)
    floor = CommitModel()                           # a copy-on-write floor of 8 s
    for n, s in ((1_000, 8.01), (20_000, 8.2), (50_000, 8.5)):
        floor.observe(n, s)
    # the variable part may take as long as the fixed part: at least half the best throughput
    assert floor.cap(5.0) >= 700_000
    flat = CommitModel()
    for n, s in ((10, 2.0), (1_000, 1.5)):          # bigger was not slower
        flat.observe(n, s)
    assert flat.cap(5.0) is None


def test_gather_takes_everything_pending_up_to_the_memory_cap():
    with MemoryListener() as listener:
        for i in range(50):
            listener.send(*(created(100 * i + j) for j in range(100)))
        everything = gather(listener.receive, poll_s=1, limits=BatchLimits(max_wait_s=60))
        assert len(everything.events) == 5_000 and everything.closed_by == "quiet"
        listener.extend(everything.handles, 0)      # give them back

        one = event_bytes(created(0))
        calls = []

        def receive_one_message(timeout):
            calls.append(timeout)
            got = listener.receive(timeout)         # one message a call, as a queue page
            listener.extend(got.handles[1:], 0)
            return type(got)(events=got.events[:100], handles=got.handles[:1])

        capped = gather(receive_one_message, poll_s=1,
                        limits=BatchLimits(max_batch_bytes=one * 250, max_wait_s=60))
        assert capped.closed_by == "cap" and len(capped.events) == 300  # 3 messages of 100
        assert capped.bytes >= one * 250 and calls[0] == 1 and set(calls[1:]) == {0.0}
        listener.extend(capped.handles, 0)
        model = CommitModel()
        model.observe(100, 0.2)
        model.observe(1_000, 1.1)                   # 1 ms an event, 0.1 s fixed: 490 in 0.59 s
        modelled = gather(receive_one_message, poll_s=1, model=model,
                          limits=BatchLimits(target_commit_s=0.59, max_wait_s=60))
        assert modelled.closed_by == "cap" and len(modelled.events) == 500


def test_gather_closes_when_the_queue_gives_back_what_the_batch_holds():
    """A queue whose visibility timeout is shorter than the batch hands the same messages out
    again: nothing new, so the batch commits (waiting on would only count more receives of
    them towards their redrive limit: found with SQS VisibilityTimeout=0, where the message
    went to the dead-letter queue after being received maxReceiveCount times)."""
    with MemoryListener() as listener:
        listener.send(created(1), created(2))
        calls = []

        def receive_again(timeout):
            got = listener.receive(timeout)
            calls.append(len(got.events))
            listener.extend(got.handles, 0)         # visible again at once
            return got

        batch = gather(receive_again, poll_s=1, limits=BatchLimits(max_wait_s=60))
        assert batch.closed_by == "quiet" and calls == [2, 2]
        assert {e.relative_path for e in batch.events} == {"f/000001.txt", "f/000002.txt"}


def test_gather_tells_a_message_received_again_by_its_id():
    """Events the listener names a message for count by message id (hashing each event
    costs ~0.5-1 us: a second or two of a batch of 1M); events without one are compared
    whole."""
    with MemoryListener() as listener:
        listener.send(*(created(i) for i in range(100)))
        replies = []

        def receive(timeout):
            got = listener.receive(timeout)
            listener.extend(got.handles, 0)         # visible again at once
            if len(replies) == 1:                   # and one event without a message
                got = type(got)(events=(*got.events, created(999)), handles=got.handles,
                                source_handles=got.source_handles)
            replies.append(len(got.events))
            return got

        batch = gather(receive, poll_s=1, limits=BatchLimits(max_wait_s=60))
        # the second receive brought a new event (no message id): the third only repeats
        assert replies == [100, 101, 100] and batch.closed_by == "quiet"
        assert len(batch.events) == 301 and len(set(batch.events)) == 101


def test_watch_step_batches_grow_with_the_load(tmp_path):
    """`VolumeWatcher.step`, as `Catalog.watch` runs it, over a real directory table: a trickle
    commits events one by one, a flood in batches of hundreds; every event lands once."""
    cat = vs.connect(tmp_path / "wh")
    (tmp_path / "data").mkdir()
    cat.create_volume("vol", tmp_path / "data")
    table = cat.directory_table("vol")
    listener = MemoryListener()
    watcher = VolumeWatcher(table, listener, lambda p: True, lambda **kw: None)
    sizes: dict[str, list[int]] = {"trickle": [], "flood": []}
    with listener:
        for i in range(10):                             # a trickle: each event commits alone
            listener.send(created(i))
            step = watcher.step(timeout=5)
            sizes["trickle"].append(step.result.inserted)
        feeder = Feeder(listener, 4_000, None, start=10, per_message=20)
        feeder.start()                                  # a flood: it piles up during commits
        while sum(sizes["flood"]) < 4_000:
            step = watcher.step(timeout=5)
            if step.result is not None:
                sizes["flood"].append(step.result.inserted)
        feeder.join()
    assert sizes["trickle"] == [1] * 10
    assert max(sizes["flood"]) >= 200 and len(sizes["flood"]) < 4_000 / 20, sizes
    rows = table.snapshot(columns=["relative_path"])["relative_path"].to_pylist()
    assert len(rows) == len(set(rows)) == 4_010
    assert watcher.model.as_dict()["samples"] >= 2 and not listener.backlog()


def test_daemon_group_commit_reports_growing_batches_in_metrics(tmp_path):
    """The daemon over a `MemoryListener`: a flood sent while a commit runs is taken by the
    next batch; `/metrics` has the batch size, bytes, latency and commit time histograms."""
    (tmp_path / "data").mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", tmp_path / "data")
    listener = MemoryListener()
    table = cat.directory_table("vol")
    first_commit = threading.Event()

    class Slow(VolumeWatcher):
        def commit(self, events):            # the first commit is slow: the flood piles up
            result = super().commit(events)
            if not first_commit.is_set():
                first_commit.set()
                wait_for(lambda: listener.backlog() >= 200, timeout=30, interval=0.01)
            return result

    def open_watcher(name):
        return Slow(cat.directory_table(name), listener, lambda p: True, lambda **kw: None)

    cfg = config(tmp_path, volumes={"vol": {"refresh_on_start": False, "max_wait_s": 0.2,
                                            "poll_s": 0.1}})
    with Daemon(cfg, catalog=cat, open_watcher=open_watcher) as daemon:
        listener.send(created(0))
        assert first_commit.wait(30)
        Feeder(listener, 4_000, None, start=1, per_message=20).run()
        wait_for(lambda: table.snapshot(columns=["relative_path"]).num_rows == 4_001)
        # a batch's metrics are observed just after its commit lands: wait for them too
        wait_for(lambda: metric(daemon, "volume_stream_batch_events_sum", volume="vol") == 4_001)
        count = metric(daemon, "volume_stream_batch_events_count", volume="vol")
        assert count <= 10, count
        big = metric(daemon, "volume_stream_batch_events_bucket", volume="vol", le="1000.0")
        assert big < count                    # some batch held more than 1,000 events
        assert metric(daemon, "volume_stream_batch_bytes_sum", volume="vol") > 4_001 * 700
        assert metric(daemon, "volume_stream_batch_latency_seconds_count", volume="vol") == count
        assert metric(daemon, "volume_stream_commit_seconds_count", volume="vol") == count
        text = daemon.metrics.render().decode()
        assert "volume_stream_batch_cap_events" in text
        wait_for(lambda: not listener.backlog() and len(listener.acked) == 201)
    table = cat.directory_table("vol")
    versions = Counter(r["relative_path"] for r in table.changes(0, table.version())
                       .to_pylist() if r["_change_type"] == "insert")
    assert len(versions) == 4_001 and set(versions.values()) == {1}
