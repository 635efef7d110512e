"""Applying event batches to a real Delta directory table (DESIGN §4.1–4.3, §4.5)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.events import FileEvent, InvalidPathError, compare_sequencers
from directory_table import DirectoryTable

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def t(s):
    return T0 + timedelta(seconds=s)


def put(path, size, at, seq=None, etag=None):
    return FileEvent.created(path, size=size, etag=etag or f"e{size}", last_modified_time=at,
                             event_time=at, sequencer=seq)


def rm(path, at, seq=None):
    return FileEvent.removed(path, event_time=at, sequencer=seq)


@pytest.fixture
def table(tmp_path):
    return DirectoryTable.create(str(tmp_path / "vol"), "file:///data/")


def state(table):
    d = table.snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(d["relative_path"], d["size"], strict=True))


def test_one_commit_per_batch_and_cdf_enabled(table):
    r = table.apply([put("a", 1, t(1)), put("b", 2, t(1)), rm("zzz", t(1))])
    assert (r.version, r.inserted, r.ignored) == (1, 2, 1)
    assert table.version() == 1
    dt = DeltaTable(table.path)
    assert dt.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert state(table) == {"a": 1, "b": 2}


def test_noop_batch_makes_no_version(table):
    table.apply([put("a", 1, t(1))])
    assert table.apply([put("a", 1, t(1))]).version is None          # exact duplicate
    assert table.apply([rm("missing", t(5))]).version is None         # nothing to remove
    assert table.apply([put("dir/", 0, t(6))]).version is None        # folder marker
    assert table.apply([]).version is None
    assert table.version() == 1


def test_newest_event_per_path_wins_within_batch(table):
    r = table.apply([put("a", 1, t(1)), put("a", 3, t(3)), put("a", 2, t(2)),
                     put("b", 1, t(1)), rm("b", t(2))])
    assert r.version == 1 and state(table) == {"a": 3}


def test_events_older_than_stored_state_are_ignored(table):
    table.apply([put("a", 5, t(10))])
    r = table.apply([put("a", 4, t(9)), rm("a", t(8))])
    assert r.version is None and r.ignored == 2
    assert state(table) == {"a": 5}


def test_sequencers_order_events_as_aws_specifies(table):
    assert compare_sequencers("0055AED6DCD90281E5", "0055AED6DCD90281E6") < 0
    assert compare_sequencers("0055AED6DCD9028", "0055AED6DCD90281E5") < 0  # right-padded
    assert compare_sequencers("00A", "00a") == 0
    # event times say the opposite; sequencers win
    table.apply([put("k", 2, t(1), seq="0055AED6DCD90281E6")])
    assert table.apply([put("k", 1, t(9), seq="0055AED6DCD90281E5")]).version is None
    assert state(table) == {"k": 2}


def test_redelivered_old_create_does_not_resurrect_deleted_file(table):
    table.apply([put("k", 1, t(1), seq="01")])
    table.apply([rm("k", t(2), seq="02")])
    assert state(table) == {}
    assert table.apply([put("k", 1, t(1), seq="01")]).version is None
    assert state(table) == {}
    assert table.apply([put("k", 7, t(3), seq="03")]).version == 3
    assert state(table) == {"k": 7}


def test_update_and_delete_write_change_data(table):
    table.apply([put("a", 1, t(1)), put("b", 1, t(1))])
    table.apply([put("a", 2, t(2)), rm("b", t(2)), put("c", 1, t(2))])
    cdf = table.changes(1, 2).to_pydict()
    got = sorted(zip(cdf["relative_path"], cdf["_change_type"], cdf["_image_version"],
                     strict=True))
    assert got == [("a", "update_postimage", 2), ("a", "update_preimage", 1),
                   ("b", "delete", 1), ("c", "insert", 2)]
    # change-range reads touch only the range's files
    assert table.changes(2, 2).num_rows == 0


def test_invalid_paths_are_rejected_at_the_event():
    for bad in ["../etc/passwd", "a/../../b", "/abs", "a//b", "./a", "a\\b", "nul\x00"]:
        with pytest.raises(InvalidPathError):
            FileEvent.created(bad, size=1, last_modified_time=T0)
    for good in ["a b.txt", "a+b.txt", "ünï/cødé.txt", "..hidden", "a/.b", "x/"]:
        FileEvent.created(good, size=1, last_modified_time=T0)


def test_concurrent_writers_stay_correct(tmp_path):
    root = str(tmp_path / "vol")
    DirectoryTable.create(root, "file:///d/")
    errors = []

    def writer(prefix):
        tbl = DirectoryTable(root, "file:///d/")
        try:
            for i in range(8):
                tbl.apply([put(f"{prefix}{i}", i, t(i))])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in "xy"]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors
    tbl = DirectoryTable(root, "file:///d/")
    assert tbl.version() == 16
    snap = tbl.snapshot().to_pydict()
    assert len(snap["relative_path"]) == 16
    # each row records the version that wrote it, and that commit really did
    cdf = tbl.changes(0, 16).to_pydict()
    for path, v in zip(cdf["relative_path"], cdf["_commit_version"], strict=True):
        assert snap["_image_version"][snap["relative_path"].index(path)] == v


def test_version_at_and_history(table):
    table.apply([put("a", 1, t(1))])
    table.apply([put("b", 1, t(1))])
    hist = table.history()
    assert [h["version"] for h in hist] == [2, 1, 0]
    assert table.version_at(hist[1]["timestamp"]) == 1
    assert table.version_at(hist[0]["timestamp"] + timedelta(days=1)) == 2
    assert table.version_at(T0 - timedelta(days=3650)) is None


def test_time_travel_snapshot(table):
    table.apply([put("a", 1, t(1))])
    table.apply([put("a", 2, t(2))])
    assert table.snapshot(1, columns=["size"])["size"].to_pylist() == [1]
    assert isinstance(table.snapshot(2), pa.Table)


def test_listing_differences_are_ordered_by_version_not_clock(table):
    table.apply([put("a", 1, t(1)), put("b", 1, t(1)), put("c", 1, t(1))])
    base = table.version()
    # while a listing runs, newer events change a and delete b
    table.apply([put("a", 2, t(5)), rm("b", t(5))])
    # the listing (taken against `base`) still saw the old a, b; it missed c's delete and
    # found d. Its clock is far behind the store's: versions, not times, decide.
    listing_time = t(-1000)
    r = table.apply([put("a", 1, listing_time), put("b", 1, listing_time),
                     rm("c", listing_time), put("d", 4, listing_time)],
                    listed_at_version=base)
    assert (r.inserted, r.deleted, r.ignored) == (1, 1, 2)
    assert state(table) == {"a": 2, "d": 4}
