"""The watcher's commit-then-ack cycle and its visibility keep-alive."""

from __future__ import annotations

import time

from connectors.events import FileEvent, utc_now
from connectors.protocols import Received
from directory_table import DirectoryTable
from volume_stream.volumes.watcher import VolumeWatcher, keep_invisible


class RecordingListener:
    """A listener double: hands out one prepared batch, records acks and extensions."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.calls = []

    def receive(self, timeout):
        return self.batches.pop(0) if self.batches else Received()

    def ack(self, handles):
        self.calls.append(("ack", tuple(handles)))

    def extend(self, handles, seconds):
        self.calls.append(("extend", tuple(handles), seconds))

    @property
    def idle(self):
        return not self.batches

    def close(self):
        pass


def test_keep_invisible_extends_while_the_block_runs_then_stops():
    listener = RecordingListener([])
    with keep_invisible(listener, ["h1", "h2"], every_s=0.05, visibility_s=90):
        time.sleep(0.3)
    n = len(listener.calls)
    assert n >= 3 and all(c == ("extend", ("h1", "h2"), 90) for c in listener.calls)
    time.sleep(0.2)
    assert len(listener.calls) == n  # stopped with the block
    with keep_invisible(listener, [], every_s=0.01, visibility_s=90):
        time.sleep(0.05)
    assert len(listener.calls) == n  # nothing to keep


def test_ack_comes_after_the_commit_and_covers_ignored_messages(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/")
    now = utc_now()
    batch = Received(events=(FileEvent.created("a", size=1, last_modified_time=now),
                             FileEvent.created("skip.tmp", size=1, last_modified_time=now)),
                     handles=("m1", "m2", "test-event"), ignored=1)
    listener = RecordingListener([batch])
    watcher = VolumeWatcher(table, listener, lambda p: not p.endswith(".tmp"), lambda: None,
                            extend_every_s=0.001)
    step = watcher.step(0.1)
    assert step.result.version == 1 and table.version() == 1
    assert listener.calls[-1] == ("ack", ("m1", "m2", "test-event"))
    assert watcher.metrics.filtered == 1 and watcher.metrics.ignored == 1
    assert watcher.step(0.1).idle


def test_failed_commit_acks_nothing(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/")
    batch = Received(events=(FileEvent.created("a", size=1, last_modified_time=utc_now()),),
                     handles=("m1",))
    listener = RecordingListener([batch])

    def refresh():
        raise AssertionError("not called")

    watcher = VolumeWatcher(table, listener, lambda p: True, refresh)
    import shutil
    shutil.rmtree(table.path)  # the table is gone: the commit fails
    try:
        watcher.step(0.1)
    except Exception:
        pass
    else:  # pragma: no cover - the commit must fail here
        raise AssertionError("commit unexpectedly succeeded")
    assert not [c for c in listener.calls if c[0] == "ack"]
