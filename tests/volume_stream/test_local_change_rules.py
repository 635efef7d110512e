"""What counts as a change of a local file, for the listener and refresh alike (issue 16:
defects 2 and 3). Local events are ordered by the directory table's versions and by arrival,
never by a file's own modification time against the clock. No Spark: the Arrow read path."""

from __future__ import annotations

import os
import time

import pytest

import volume_stream as vs

HOUR = 3600


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return d


def files(cat, volume="v"):
    snap = cat.directory_table(volume).snapshot(columns=["relative_path", "size"])
    return dict(zip(snap["relative_path"].to_pylist(), snap["size"].to_pylist(), strict=True))


def changes(cat, stream="s"):
    d = cat.read_stream_arrow(stream).to_pydict()
    return sorted(zip(d["__change_type"], d["relative_path"], strict=True))


def watch_until(watcher, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watcher.step(0.2)
        if predicate():
            return True
    return False


def set_mtime(path, offset_s):
    t = time.time() + offset_s
    os.utime(path, (t, t))


@pytest.mark.parametrize("offset_s", [HOUR, -HOUR])
def test_listener_sees_changes_of_files_dated_ahead_or_behind(cat, data, offset_s):
    for name in ("gone.txt", "over.txt", "kept.txt"):
        (data / name).write_text("v1")
        set_mtime(data / name, offset_s)
    cat.create_volume("v", data)
    cat.refresh("v")
    cat.create_stream("s", "v")
    watcher = cat.watcher("v")
    with watcher.listener:
        (data / "gone.txt").unlink()
        (data / "over.txt").write_text("version 2")  # its mtime is now the clock's
        expected = [("DELETE", "gone.txt"), ("UPDATE_AFTER", "over.txt"),
                    ("UPDATE_BEFORE", "over.txt")]
        assert watch_until(watcher, lambda: changes(cat) == expected), changes(cat)
        # and again with the new image dated ahead/behind: the next change still counts
        (data / "over.txt").write_text("version three")
        set_mtime(data / "over.txt", offset_s)
        assert watch_until(watcher, lambda: files(cat).get("over.txt") == 13), files(cat)
        (data / "over.txt").unlink()
        assert watch_until(watcher, lambda: "over.txt" not in files(cat)), files(cat)
    assert files(cat) == {"kept.txt": 2}
    assert cat.refresh("v").version is None  # the listener and a listing agree


def test_touch_is_a_change_for_the_listener_and_for_refresh(cat, data):
    (data / "a.txt").write_text("a")
    cat.create_volume("v", data)
    cat.refresh("v")
    cat.create_stream("s", "v")
    watcher = cat.watcher("v")
    with watcher.listener:
        set_mtime(data / "a.txt", 10)  # what `touch` does to an existing file
        want = [("UPDATE_AFTER", "a.txt"), ("UPDATE_BEFORE", "a.txt")]
        assert watch_until(watcher, lambda: changes(cat) == want), changes(cat)
    assert cat.refresh("v").version is None
    set_mtime(data / "a.txt", 20)  # unseen by a listener: refresh finds the same change
    m = cat.refresh("v")
    assert (m.inserted, m.updated, m.deleted) == (0, 1, 0)


def test_chmod_alone_is_not_a_change(cat, data):
    (data / "a.txt").write_text("a")
    cat.create_volume("v", data)
    cat.refresh("v")
    cat.create_stream("s", "v")
    watcher = cat.watcher("v")
    with watcher.listener:
        os.chmod(data / "a.txt", 0o600)
        (data / "b.txt").write_text("b")  # a marker: once b is seen, a's event was handled
        assert watch_until(watcher, lambda: "b.txt" in files(cat))
    assert changes(cat) == [("INSERT", "b.txt")]


def test_content_hash_sees_a_same_size_rewrite_with_restored_mtime(cat, data):
    path = data / "a.txt"
    path.write_text("aaaa")
    st = os.stat(path)
    cat.create_volume("plain", data)
    cat.create_volume("v", data, content_hash=True)
    for volume in ("plain", "v"):
        cat.refresh(volume)
    cat.create_stream("s", "v")
    path.write_text("bbbb")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, mtime restored
    assert cat.refresh("plain").version is None  # documented: invisible without a hash
    m = cat.refresh("v")
    assert m.updated == 1
    set_mtime(path, 30)  # with a hash, a touch changes nothing
    assert cat.refresh("v").version is None
    etag = etags(cat)["a.txt"]
    watcher = cat.watcher("v")
    with watcher.listener:
        path.write_text("cccc")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert watch_until(watcher, lambda: etags(cat)["a.txt"] != etag)
    assert changes(cat) == [("UPDATE_AFTER", "a.txt"), ("UPDATE_BEFORE", "a.txt")]
    assert cat.refresh("v").version is None


def etags(cat, volume="v"):
    snap = cat.directory_table(volume).snapshot(columns=["relative_path", "etag"])
    return dict(zip(snap["relative_path"].to_pylist(), snap["etag"].to_pylist(), strict=True))
