"""A local folder volume end to end: refresh and the inotify listener on real files."""

from __future__ import annotations

import os
import time

from tests.volume_stream.conftest import rows


def _changes(catalog, stream):
    return [(c, p) for c, p, *_ in rows(catalog.read_stream_arrow(stream))]


def test_refresh_backfills_and_heals(catalog, data_dir):
    (data_dir / "sub").mkdir()
    (data_dir / "a b+c ü.txt").write_text("x")
    (data_dir / "sub" / "deep.txt").write_text("yy")
    (data_dir / "sub" / "marker").mkdir()  # an empty folder is not a file
    catalog.create_volume("vol", data_dir)
    catalog.create_stream("s", "vol")
    m = catalog.refresh("vol")
    assert (m.listed, m.inserted, m.version) == (2, 2, 1)
    assert catalog.refresh("vol").version is None  # nothing changed: no version
    (data_dir / "sub" / "deep.txt").unlink()       # deleted without anyone watching
    (data_dir / "a b+c ü.txt").write_text("longer")
    m = catalog.refresh("vol")
    assert (m.deleted, m.updated, m.version) == (1, 1, 2)
    assert _changes(catalog, "s") == [("INSERT", "a b+c ü.txt")]


def test_recursive_false_and_globs(catalog, data_dir):
    (data_dir / "sub").mkdir()
    for name in ["top.jpg", "top.txt", "sub/deep.jpg"]:
        (data_dir / name).write_text("x")
    catalog.create_volume("flat", data_dir, recursive=False)
    catalog.create_volume("jpgs", data_dir, include=["*.jpg"])
    catalog.refresh("flat")
    catalog.refresh("jpgs")
    flat = catalog.directory_table("flat").snapshot()["relative_path"].to_pylist()
    jpgs = catalog.directory_table("jpgs").snapshot()["relative_path"].to_pylist()
    assert sorted(flat) == ["top.jpg", "top.txt"]
    assert sorted(jpgs) == ["sub/deep.jpg", "top.jpg"]


def _watch_until(watcher, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watcher.step(0.2)
        if predicate():
            return True
    return False


def test_watcher_sees_create_overwrite_delete_rename(catalog, data_dir, tmp_path):
    (data_dir / "old.txt").write_text("old")
    (data_dir / "keep.txt").write_text("keep")
    catalog.create_volume("vol", data_dir)
    catalog.refresh("vol")
    catalog.create_stream("s", "vol")
    watcher = catalog.watcher("vol")
    with watcher.listener:
        (data_dir / "new file+1.txt").write_text("new")
        (data_dir / "keep.txt").write_text("kept but longer")
        (data_dir / "old.txt").unlink()
        staged = tmp_path / "staged.part"
        staged.write_text("moved in")
        os.rename(staged, data_dir / "moved.txt")
        expected = [("DELETE", "old.txt"), ("INSERT", "moved.txt"),
                    ("INSERT", "new file+1.txt"), ("UPDATE_AFTER", "keep.txt"),
                    ("UPDATE_BEFORE", "keep.txt")]
        assert _watch_until(watcher, lambda: _changes(catalog, "s") == expected), \
            _changes(catalog, "s")
    # what the listener built equals a fresh listing: refresh finds nothing to do
    assert catalog.refresh("vol").version is None


def test_half_written_file_never_appears(catalog, data_dir):
    catalog.create_volume("vol", data_dir)
    catalog.create_stream("s", "vol")
    watcher = catalog.watcher("vol")
    with watcher.listener:
        with open(data_dir / "big.bin", "wb") as fh:
            fh.write(b"x" * 1000)
            fh.flush()
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                watcher.step(0.2)
            assert catalog.read_stream_arrow("s").num_rows == 0
            fh.write(b"y" * 1000)
        assert _watch_until(watcher, lambda: catalog.read_stream_arrow("s").num_rows == 1)
    (rec,) = catalog.read_stream_arrow("s").to_pylist()
    assert rec["size"] == 2000


def test_watch_until_idle_returns(catalog, data_dir):
    catalog.create_volume("vol", data_dir)
    started = time.monotonic()
    metrics = catalog.watch("vol", until_idle=True, timeout=30)
    assert time.monotonic() - started < 10
    assert metrics.applied == 0


def test_large_listings_diff_in_spark_same_result(catalog, data_dir):
    for i in range(30):
        (data_dir / f"f{i:02d}.txt").write_text("x" * i)
    catalog.create_volume("arrow", data_dir)
    catalog.create_volume("spark", data_dir, spark_diff_threshold=10)
    catalog.create_stream("sa", "arrow")
    catalog.create_stream("ss", "spark")
    a, s = catalog.refresh("arrow"), catalog.refresh("spark")
    assert (a.inserted, a.updated, a.deleted) == (s.inserted, s.updated, s.deleted) == (30, 0, 0)
    (data_dir / "f03.txt").unlink()
    (data_dir / "f04.txt").write_text("changed")
    (data_dir / "new.txt").write_text("n")
    a, s = catalog.refresh("arrow"), catalog.refresh("spark")
    assert (a.inserted, a.updated, a.deleted) == (s.inserted, s.updated, s.deleted) == (1, 1, 1)
    assert _changes(catalog, "sa") == _changes(catalog, "ss")
    assert len(_changes(catalog, "ss")) == 30
