"""Local volumes: the inotify/polling listener on real files, the lister and the reader.

Everything runs on real directories under `tmp_path` with real inotify (or real polling);
the debounce logic is also driven directly with a fake clock, without threads or sleeping.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from watchdog.events import (
    DirCreatedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
)
from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent

from connectors.errors import ListenerClosedError
from connectors.events import EventKind, FileEvent, InvalidPathError
from connectors.local import (
    LocalListener,
    LocalLister,
    LocalReader,
    _PendingFiles,
    file_url,
    list_local,
)
from connectors.protocols import LISTING_SCHEMA, Listener, Lister, ObjectReader

DEBOUNCE = 0.05


@dataclass
class Got:
    events: list[FileEvent] = field(default_factory=list)
    needs_refresh: bool = False
    malformed: int = 0

    def add(self, received) -> None:
        self.events.extend(received.events)
        self.needs_refresh |= received.needs_refresh
        self.malformed += received.malformed

    def of(self, path: str) -> list[FileEvent]:
        return [e for e in self.events if e.relative_path == path]

    def kinds(self) -> set[tuple[str, str]]:
        return {(e.kind.value, e.relative_path) for e in self.events}


def receive_until(listener: LocalListener, done, timeout: float = 5.0) -> Got:
    """Receive until `done(got)` holds; fail after `timeout` seconds."""
    got = Got()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got.add(listener.receive(timeout=0.1))
        if done(got):
            return got
    pytest.fail(f"timed out; got {got}")


def receive_for(listener: LocalListener, seconds: float) -> Got:
    """Everything received during `seconds`."""
    got = Got()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        got.add(listener.receive(timeout=min(left, 0.1)))
    return got


def has(*pairs: tuple[str, str]):
    return lambda got: set(pairs) <= got.kinds()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "volume"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    path = tmp_path / "staging"
    path.mkdir()
    return path


@pytest.fixture
def listen(root: Path):
    listeners: list[LocalListener] = []

    def start(**kwargs) -> LocalListener:
        kwargs.setdefault("debounce_s", DEBOUNCE)
        listener = LocalListener(kwargs.pop("path", root), **kwargs)
        listeners.append(listener)
        return listener

    yield start
    for listener in listeners:
        listener.close()


# ------------------------------------------------------------------------- inotify listener


def test_closed_file_is_one_created_event_with_its_stat(root: Path, listen) -> None:
    listener = listen()
    assert isinstance(listener, Listener) and listener.backend == "inotify"
    (root / "a.txt").write_bytes(b"hello")
    (root / "empty").write_bytes(b"")

    got = receive_until(listener, has(("CREATED", "a.txt"), ("CREATED", "empty")))
    got.add(listener.receive(timeout=0.2))
    [event] = got.of("a.txt")
    st = os.stat(root / "a.txt")
    assert event.size == 5 and event.source_id == "inotify"
    assert event.etag == f"{st.st_mtime_ns:x}-{st.st_size:x}"
    assert event.last_modified_time == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=st.st_mtime_ns // 1000)
    assert abs(event.event_time - datetime.now(UTC)) < timedelta(seconds=10)
    assert got.of("empty")[0].size == 0  # zero-byte files are files
    assert len(got.events) == 2 and not got.needs_refresh
    assert listener.idle


def test_half_written_file_never_appears_until_closed(root: Path, listen) -> None:
    listener = listen()
    with open(root / "big.bin", "wb") as f:
        f.write(b"x" * 1000)
        f.flush()
        os.fsync(f.fileno())
        assert receive_for(listener, 0.4).events == []
        f.write(b"y" * 1000)
    got = receive_until(listener, has(("CREATED", "big.bin")))
    assert [e.size for e in got.of("big.bin")] == [2000]


def test_writer_closing_several_times_within_the_debounce_gives_at_most_two_events(
        root: Path, listen) -> None:
    """A burst: its first close may be reported at once, the rest once quiet, as one event."""
    listener = listen(debounce_s=0.3)
    for i in range(5):
        with open(root / "log.txt", "ab") as f:
            f.write(b"line %d\n" % i)
    final = os.path.getsize(root / "log.txt")
    got = receive_until(listener, lambda g: any(e.size == final for e in g.of("log.txt")))
    got.add(receive_for(listener, 0.4))
    sizes = [e.size for e in got.of("log.txt")]
    assert sizes[-1] == final and len(sizes) <= 2, sizes


def test_a_closed_file_is_not_held_back_by_the_debounce(root: Path, listen) -> None:
    """A close is a complete file: it comes at once, even with a debounce far above the
    receive timeout used here (the wait ends on the event, not on the clock)."""
    (root / "gone.txt").write_bytes(b"x")
    listener = listen(debounce_s=60)
    (root / "now.txt").write_bytes(b"complete")
    (root / "gone.txt").unlink()
    got = receive_until(listener, has(("CREATED", "now.txt"), ("REMOVED", "gone.txt")),
                        timeout=20)
    assert [e.size for e in got.of("now.txt")] == [8]


def test_overwrite_gives_created_with_new_size_and_etag(root: Path, listen) -> None:
    listener = listen()
    (root / "f").write_bytes(b"1")
    first = receive_until(listener, has(("CREATED", "f"))).of("f")[0]
    (root / "f").write_bytes(b"22222")
    second = receive_until(listener, has(("CREATED", "f"))).of("f")[0]
    assert (first.size, second.size) == (1, 5)
    assert first.etag != second.etag


def test_delete_gives_removed(root: Path, listen) -> None:
    (root / "old.txt").write_bytes(b"x")
    listener = listen()
    (root / "old.txt").unlink()
    got = receive_until(listener, has(("REMOVED", "old.txt")))
    assert got.kinds() == {("REMOVED", "old.txt")}


def test_rename_into_place_from_outside_the_root(root: Path, outside: Path, listen) -> None:
    listener = listen()
    tmp = outside / ".part-1"
    with open(tmp, "wb") as f:
        f.write(b"payload")
    assert receive_for(listener, 0.2).events == []
    os.rename(tmp, root / "done.csv")
    got = receive_until(listener, has(("CREATED", "done.csv")))
    assert got.of("done.csv")[0].size == 7 and len(got.events) == 1


def test_rename_within_root_removes_old_and_creates_new(root: Path, listen) -> None:
    (root / "a").write_bytes(b"abc")
    listener = listen()
    os.rename(root / "a", root / "b")
    got = receive_until(listener, has(("REMOVED", "a"), ("CREATED", "b")))
    assert got.kinds() == {("REMOVED", "a"), ("CREATED", "b")}
    # one batch, removals first, so a consumer applying in order sees the rename
    assert [(e.kind, e.relative_path) for e in got.events] == [
        (EventKind.REMOVED, "a"), (EventKind.CREATED, "b")]


def test_directory_moved_in_reports_every_file(root: Path, outside: Path, listen) -> None:
    tree = outside / "batch"
    (tree / "deep" / "er").mkdir(parents=True)
    for rel in ("1.txt", "deep/2.txt", "deep/er/3.txt"):
        (tree / rel).write_bytes(rel.encode())
    listener = listen()
    os.rename(tree, root / "batch")
    want = [("CREATED", f"batch/{r}") for r in ("1.txt", "deep/2.txt", "deep/er/3.txt")]
    got = receive_until(listener, has(*want))
    got.add(receive_for(listener, 0.2))
    assert got.kinds() == set(want) and not got.needs_refresh


def test_directory_moved_out_asks_for_refresh(root: Path, outside: Path, listen) -> None:
    (root / "sub").mkdir()
    (root / "sub" / "f").write_bytes(b"x")
    listener = listen()
    os.rename(root / "sub", outside / "sub")
    got = receive_until(listener, lambda g: g.needs_refresh)  # after watchdog's 0.5 s pairing
    assert got.needs_refresh


def test_directory_renamed_within_root(root: Path, listen) -> None:
    (root / "x" / "y").mkdir(parents=True)
    (root / "x" / "y" / "f").write_bytes(b"1")
    listener = listen()
    os.rename(root / "x", root / "z")
    want = {("REMOVED", "x/y/f"), ("CREATED", "z/y/f")}
    got = receive_until(listener, has(*want))
    got.add(receive_for(listener, 0.2))
    assert got.kinds() == want and not got.needs_refresh


def test_new_directory_then_file_is_reported_once(root: Path, listen) -> None:
    listener = listen()
    (root / "n1" / "n2").mkdir(parents=True)
    (root / "n1" / "n2" / "f").write_bytes(b"abc")
    got = receive_until(listener, has(("CREATED", "n1/n2/f")))
    got.add(receive_for(listener, 0.3))
    assert [e.size for e in got.of("n1/n2/f")] == [3]


def test_non_recursive_ignores_files_in_sub_directories(root: Path, outside: Path,
                                                        listen) -> None:
    (root / "sub").mkdir()
    listener = listen(recursive=False)
    (root / "sub" / "deep.txt").write_bytes(b"x")
    (outside / "d").mkdir()
    (outside / "d" / "f").write_bytes(b"x")
    os.rename(outside / "d", root / "d")
    (root / "top.txt").write_bytes(b"x")
    got = receive_until(listener, has(("CREATED", "top.txt")))
    got.add(receive_for(listener, 0.3))
    assert got.kinds() == {("CREATED", "top.txt")}


def test_names_with_spaces_plus_and_unicode(root: Path, listen) -> None:
    listener = listen()
    names = ["a b.txt", "c+d.txt", "données/été 😀.json"]
    (root / "données").mkdir()
    for name in names:
        (root / name).write_bytes(b"1")
    got = receive_until(listener, has(*[("CREATED", n) for n in names]))
    assert got.malformed == 0


def test_unsafe_names_are_counted_not_raised(root: Path, listen) -> None:
    listener = listen()
    (root / "back\\slash").write_bytes(b"1")
    (root / "new\nline").write_bytes(b"1")
    (root / "ok").write_bytes(b"1")
    got = receive_until(listener, lambda g: g.malformed == 2 and g.of("ok"))
    assert got.kinds() == {("CREATED", "ok")}


def test_symlinks_are_never_created(root: Path, outside: Path, listen) -> None:
    (outside / "target").write_bytes(b"secret")
    listener = listen()
    os.symlink(outside / "target", root / "link")
    os.symlink(outside / "target", outside / "link2")
    os.rename(outside / "link2", root / "link2")
    (root / "real").write_bytes(b"1")
    got = receive_until(listener, has(("CREATED", "real")))
    got.add(receive_for(listener, 0.2))
    assert ("CREATED", "link") not in got.kinds() and ("CREATED", "link2") not in got.kinds()


def test_too_many_raw_events_ask_for_refresh(root: Path, listen) -> None:
    listener = listen(max_pending=5)
    for i in range(40):
        (root / f"f{i}").write_bytes(b"x")
    time.sleep(0.3)  # let watchdog deliver them before the first receive
    got = receive_until(listener, lambda g: g.needs_refresh)
    assert got.needs_refresh


def test_inotify_queue_overflow_asks_for_refresh(root: Path, listen) -> None:
    listener = listen()
    assert not listener.receive(timeout=0).needs_refresh
    overflow = InotifyEvent(-1, InotifyConstants.IN_Q_OVERFLOW, 0, b"")
    # what the kernel sends when its queue overflows, through watchdog's real handler
    listener._observer._inotify_fd.handle_event(overflow)
    received = listener.receive(timeout=1.0)
    assert received.needs_refresh and "overflowed" in received.info["refresh_reasons"][0]
    assert not listener.receive(timeout=0).needs_refresh  # reported once
    (root / "after").write_bytes(b"1")  # still watching after watchdog rebuilt its watches
    receive_until(listener, has(("CREATED", "after")))


def test_root_deleted_asks_for_refresh(root: Path, listen) -> None:
    listener = listen()
    root.rmdir()
    assert receive_until(listener, lambda g: g.needs_refresh).needs_refresh


def test_threads_are_named_and_joined_on_close(root: Path) -> None:
    listener = LocalListener(root, debounce_s=DEBOUNCE)
    ours = [t for t in threading.enumerate() if t.name.startswith("volume-stream")]
    assert len(ours) >= 2
    with listener:
        pass
    assert not any(t.is_alive() for t in ours)
    listener.close()  # idempotent
    with pytest.raises(ListenerClosedError, match="closed"):  # the same error as SQS/MNS
        listener.receive(timeout=0)
    listener.ack(())
    listener.extend((), 30)


class _NoInotify(LocalListener):
    def _start_inotify(self):
        raise OSError(errno.ENOSPC, "inotify watch limit reached")


def test_falls_back_to_polling_when_inotify_cannot_start(root: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="connectors.local"):
        with _NoInotify(root, debounce_s=DEBOUNCE, poll_interval_s=0.1) as listener:
            assert listener.backend == "poll"
            (root / "f").write_bytes(b"1")
            got = receive_until(listener, has(("CREATED", "f")))
            assert got.of("f")[0].source_id == "poll"
    assert "polling" in caplog.text
    with pytest.raises(OSError, match="limit"):
        _NoInotify(root, polling=False)


def test_missing_root_raises_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        LocalListener(tmp_path / "nope")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="file"):
        LocalListener(tmp_path / "file")


# ------------------------------------------------------------------------- polling listener


def test_polling_detects_create_overwrite_delete(root: Path, listen) -> None:
    listener = listen(polling=True, poll_interval_s=0.1)
    assert listener.backend == "poll"
    (root / "sub").mkdir()
    (root / "sub" / "p.txt").write_bytes(b"12")
    assert receive_until(listener, has(("CREATED", "sub/p.txt"))).of("sub/p.txt")[0].size == 2
    (root / "sub" / "p.txt").write_bytes(b"12345")
    got = receive_until(listener, lambda g: g.of("sub/p.txt"))
    assert got.of("sub/p.txt")[0].size == 5
    (root / "sub" / "p.txt").unlink()
    receive_until(listener, has(("REMOVED", "sub/p.txt")))


def test_polling_waits_until_a_growing_file_is_stable(root: Path, listen) -> None:
    listener = listen(polling=True, poll_interval_s=0.1)
    path = root / "growing.bin"
    end = time.monotonic() + 0.8
    while time.monotonic() < end:
        with open(path, "ab") as f:
            f.write(b"x" * 100)
        assert listener.receive(timeout=0.03).events == ()
    got = receive_until(listener, has(("CREATED", "growing.bin")))
    assert got.of("growing.bin")[0].size == path.stat().st_size


# ----------------------------------------------------------------- debounce with a fake clock


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pending_files(root: Path, **kwargs) -> _PendingFiles:
    options = dict(recursive=True, debounce_s=1.0, settle_s=1.0, complete_on_close=True,
                   source_id="inotify", max_pending=100)
    options.update(kwargs)
    return _PendingFiles(str(root), **options)


WALL = datetime(2024, 1, 1, tzinfo=UTC)


def test_each_raw_event_pushes_the_deadline(root: Path) -> None:
    state = pending_files(root)
    (root / "f").write_bytes(b"abc")
    state.feed(FileClosedEvent(str(root / "f")), 0.0, WALL)
    state.feed(FileClosedEvent(str(root / "f")), 0.8, WALL + timedelta(seconds=1))
    assert state.collect(1.5) == ([], 0)
    assert state.next_deadline() == 1.8
    [event], malformed = state.collect(1.8)
    assert (event.kind, event.size, event.event_time, malformed) == (
        EventKind.CREATED, 3, WALL + timedelta(seconds=1), 0)
    assert not state.pending and state.next_deadline() is None


def test_complete_events_are_due_at_once_and_bursts_are_debounced(root: Path) -> None:
    state = pending_files(root)
    (root / "f").write_bytes(b"1")
    (root / "g").write_bytes(b"22")
    state.feed(FileClosedEvent(str(root / "f")), 0.0, WALL)
    assert [e.relative_path for e in state.collect(0.0)[0]] == ["f"]   # no wait
    state.feed(FileClosedEvent(str(root / "f")), 0.5, WALL)            # again: a burst
    state.feed(FileClosedEvent(str(root / "g")), 0.5, WALL)
    assert [e.relative_path for e in state.collect(0.5)[0]] == ["g"]
    assert state.next_deadline() == 1.5
    assert [e.relative_path for e in state.collect(1.5)[0]] == ["f"]
    state.feed(FileClosedEvent(str(root / "f")), 3.0, WALL)            # quiet since 1.5 s
    assert [e.relative_path for e in state.collect(3.0)[0]] == ["f"]
    (root / "g").unlink()
    state.feed(FileDeletedEvent(str(root / "g")), 3.0, WALL)           # deletes: at once too
    assert [(e.kind, e.relative_path) for e in state.collect(3.0)[0]] == [
        (EventKind.REMOVED, "g")]
    state.feed(FileAttribEvent(str(root / "f")), 5.0, WALL)            # not proof of a file
    assert state.collect(5.0) == ([], 0) and state.next_deadline() == 6.0
    assert not state._recent  # complete events older than the debounce are forgotten


def test_last_raw_event_decides_and_stat_confirms(root: Path) -> None:
    state = pending_files(root)
    (root / "back").write_bytes(b"1")
    state.feed(FileClosedEvent(str(root / "gone")), 0.0, WALL)  # closed, then deleted
    state.feed(FileDeletedEvent(str(root / "back")), 0.0, WALL)  # deleted, then recreated
    state.feed(FileClosedEvent(str(root / "outside/../../x")), 0.0, WALL)
    state.feed(FileClosedEvent("/elsewhere/f"), 0.0, WALL)
    events, _ = state.collect(5.0)
    assert [(e.kind, e.relative_path) for e in events] == [(EventKind.REMOVED, "gone")]


def test_candidates_wait_for_two_equal_checks(root: Path) -> None:
    state = pending_files(root, complete_on_close=False, source_id="poll")
    path = root / "g"
    path.write_bytes(b"1")
    state.feed(FileModifiedEvent(str(path)), 0.0, WALL)
    assert state.collect(1.0) == ([], 0)  # first look: remember (size, mtime)
    path.write_bytes(b"12")
    assert state.collect(2.0) == ([], 0)  # changed: look again later
    [event], _ = state.collect(3.0)
    assert (event.size, event.source_id) == (2, "poll")


def test_polling_moves_wait_for_stability_but_inotify_moves_do_not(root: Path) -> None:
    (root / "m").write_bytes(b"1")
    moved = FileMovedEvent("", str(root / "m"))
    inotify, poll = pending_files(root), pending_files(root, complete_on_close=False)
    inotify.feed(moved, 0.0, WALL)
    poll.feed(moved, 0.0, WALL)
    assert len(inotify.collect(1.0)[0]) == 1
    assert poll.collect(1.0)[0] == [] and len(poll.collect(2.0)[0]) == 1


def test_directory_walk_does_not_downgrade_a_closed_file(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"1")
    state = pending_files(root)
    state.feed(FileClosedEvent(str(root / "d" / "f")), 0.0, WALL)
    state.feed(DirCreatedEvent(str(root / "d")), 0.0, WALL)
    assert len(state.collect(1.0)[0]) == 1


def test_too_many_pending_paths_are_dropped_for_a_refresh(root: Path) -> None:
    state = pending_files(root, max_pending=3)
    for i in range(4):
        state.feed(FileClosedEvent(str(root / f"f{i}")), 0.0, WALL)
    assert not state.pending and state.next_deadline() is None
    reasons = state.take_refresh()
    assert reasons and "3" in reasons[0] and state.take_refresh() == []


# ---------------------------------------------------------------------------------- lister


def make_tree(root: Path) -> set[str]:
    files = {"a.txt": b"a", "b c+d.bin": b"bb", "s/1": b"111", "s/t/2": b"", "s/t/u/3 é": b"3"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return set(files)


def listing(batches) -> dict[str, dict]:
    table = pa.Table.from_batches(list(batches), schema=LISTING_SCHEMA)
    return {row["relative_path"]: row for row in table.to_pylist()}


def test_lister_recursive_and_not(root: Path, outside: Path) -> None:
    files = make_tree(root)
    (outside / "t").write_bytes(b"x")
    os.symlink(outside / "t", root / "link")
    os.symlink(outside, root / "dirlink")
    os.mkfifo(root / "fifo")
    assert isinstance(LocalLister(root), Lister)

    rows = listing(list_local(root))
    assert set(rows) == files
    st = os.stat(root / "s/1")
    assert rows["s/1"]["size"] == 3
    assert rows["s/1"]["etag"] == f"{st.st_mtime_ns:x}-{st.st_size:x}"
    assert rows["s/1"]["last_modified_time"] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=st.st_mtime_ns // 1000)
    assert set(listing(list_local(root, recursive=False))) == {"a.txt", "b c+d.bin"}
    batches = list(LocalLister(root, batch_size=2).list())
    assert [b.num_rows for b in batches] == [2, 2, 1]
    assert all(b.schema == LISTING_SCHEMA for b in batches)
    empty = outside / "empty"
    empty.mkdir()
    assert list(list_local(empty)) == []


def test_lister_agrees_with_listener_events(root: Path, listen) -> None:
    listener = listen()
    (root / "same").write_bytes(b"12345")
    [event] = receive_until(listener, has(("CREATED", "same"))).of("same")
    row = listing(list_local(root))["same"]
    assert (row["size"], row["etag"], row["last_modified_time"]) == (
        event.size, event.etag, event.last_modified_time)


def test_lister_skips_and_counts_unsafe_names(root: Path) -> None:
    (root / "ok").write_bytes(b"")
    (root / "back\\slash").write_bytes(b"")
    os.close(os.open(os.fsencode(root) + b"/bad-\xff", os.O_CREAT | os.O_WRONLY))
    lister = LocalLister(root)
    assert set(listing(lister.list())) == {"ok"}
    assert lister.malformed == 2


def test_lister_errors_name_the_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing"):
        list_local(tmp_path / "missing")  # raised at once, not at the first next()
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="f"):
        LocalLister(tmp_path / "f").list()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_lister_unreadable_directory_raises(root: Path) -> None:
    (root / "locked").mkdir()
    (root / "locked").chmod(0)
    try:
        with pytest.raises(PermissionError, match="locked"):
            list(list_local(root))
    finally:
        (root / "locked").chmod(0o755)


def test_lister_lists_every_file_of_many_folders(root: Path) -> None:
    # (its speed is measured by `make bench`'s backfill lines, not asserted here)
    for d in range(20):
        sub = root / f"d{d}"
        sub.mkdir()
        for i in range(100):
            (sub / f"f{i}").touch()
    paths = [p for b in list_local(root) for p in b.column("relative_path").to_pylist()]
    assert sorted(paths) == sorted(f"d{d}/f{i}" for d in range(20) for i in range(100))


# ---------------------------------------------------------------------------------- reader


def test_reader_reads_and_ranges(root: Path) -> None:
    (root / "d").mkdir()
    (root / "d" / "x y.bin").write_bytes(b"0123456789")
    reader = pickle.loads(pickle.dumps(LocalReader(root)))
    assert isinstance(reader, ObjectReader)
    with reader.open("d/x y.bin") as f:
        assert f.read() == b"0123456789"
    assert reader.read_range("d/x y.bin", 2, 3) == b"234"
    assert reader.read_range("d/x y.bin", 8, 10) == b"89"
    assert reader.read_range("d/x y.bin", 20, 1) == b""
    assert reader.url("d/x y.bin") == f"file://{root}/d/x y.bin"
    with pytest.raises(FileNotFoundError, match="nothing"):
        reader.open("nothing")


def test_reader_rejects_paths_leaving_the_root(root: Path, outside: Path) -> None:
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, root / "escape")
    reader = LocalReader(root)
    for bad in ("../staging/secret", "/etc/passwd", "a/../../b", "escape/secret", "d/"):
        with pytest.raises(InvalidPathError):
            reader.open(bad)
    with pytest.raises(ValueError):
        reader.read_range("x", -1, 2)


def test_file_url() -> None:
    assert file_url("/data/in") == "file:///data/in/"
    assert file_url(Path("/data/in/"), "a b/c+d é.txt") == "file:///data/in/a b/c+d é.txt"
    assert file_url("/", "x") == "file:///x"
    with pytest.raises(InvalidPathError):
        file_url("/data", "../x")
