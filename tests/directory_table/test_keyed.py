"""The key index in the merge-on-read write path (`directory_table.keyed`, DESIGN §4.8): batches
planned from the index and batches planned by scanning the files end in the same table and
the same change feed, the index agrees with the table after every commit (ours, another
writer's, a compaction's), and a damaged or lost index is rebuilt."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.filestore import Store
from directory_table.keyed import KeyCache, key_root
from directory_table.keyindex import live_batches
from directory_table.mor import marked_rows

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PATHS = [f"d{i % 5}/f{i:03d}" for i in range(120)]
COLUMNS = ["relative_path", "size", "etag", "_image_version"]


def cache_of(table: DirectoryTable) -> KeyCache:
    return KeyCache.of(table.delta().table_uri, table.storage_options,
                       key_root(table.root, table.key_index_root))


def live(table: DirectoryTable) -> pa.Table:
    """The table's live rows with their data file and position, from the files themselves."""
    _, files = table._write_state()
    store = Store(table.path, {})
    entries = sorted(files.files(), key=lambda e: e.path)
    items = [(e.path, e.bucket, marked_rows(e, store) if e.dv else None) for e in entries]
    parts = list(live_batches(items, store.read))
    return pa.concat_tables(parts).drop_columns(["_bucket"])


def assert_true_to(table: DirectoryTable) -> None:
    """The index, caught up to the table's latest version (a batch catches it up over the
    commits since the last one, its own included), agrees with the table's files."""
    cache = cache_of(table)
    dt, files = table._write_state()
    with cache.lock:
        if cache.at(dt, files, table.changes) is None:  # being built: wait, then catch up
            cache.wait()
            cache.at(dt, files, table.changes)
    assert cache.index is not None and cache.index.version == table.version()
    assert cache.check(live(table)) == []


def make(path: Path, indexed: bool) -> DirectoryTable:
    table = DirectoryTable.create(str(path), "file:///d/", buckets=3,
                                  target_file_size=64 * 40)  # files of 40 rows
    table.key_index_root = str(path / "keys") if indexed else None
    if not indexed:  # another process holds this table's index: scan
        KeyCache.of(table.delta().table_uri, table.storage_options,
                    str(path / "none")).disabled = True
        table.key_index_root = str(path / "none")
    return table


BATCHES = st.lists(st.lists(st.tuples(st.sampled_from(PATHS), st.booleans()), min_size=1,
                            max_size=30), min_size=1, max_size=6)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BATCHES)
def test_the_index_and_a_scan_plan_the_same_commits(tmp_path_factory, batches):
    root = tmp_path_factory.mktemp("keyed")
    tables = [make(root / "indexed", True), make(root / "scanned", False)]
    for table in tables:
        table.apply([FileEvent.created(p, size=1, etag="e0", last_modified_time=T0)
                     for p in PATHS[::2]])
    cache_of(tables[0]).wait()  # the index of the first version, built meanwhile
    for k, batch in enumerate(batches, start=1):
        at = T0 + timedelta(seconds=k)
        events = [FileEvent.created(p, size=k, etag=f"e{k}", last_modified_time=at,
                                    event_time=at) if put else
                  FileEvent.removed(p, event_time=at) for p, put in batch]
        results = [table.apply(events) for table in tables]
        assert [(r.version, r.inserted, r.updated, r.deleted) for r in results[:1]] == \
            [(r.version, r.inserted, r.updated, r.deleted) for r in results[1:]]
        assert_true_to(tables[0])
    indexed, scanned = tables
    assert cache_of(scanned).index is None and cache_of(scanned).lookups == 0
    # the first batch scans while the index is built on a thread; the rest look it up
    assert cache_of(indexed).scans == 1 and cache_of(indexed).lookups == len(batches)
    rows = [sorted(t.snapshot(columns=COLUMNS).to_pylist(), key=repr) for t in tables]
    assert rows[0] == rows[1]
    feeds = [sorted(t.changes(0, t.version(), columns=COLUMNS).drop_columns(
        ["_commit_version"]).to_pylist(), key=repr) for t in tables]
    assert feeds[0] == feeds[1]


def test_the_index_follows_other_writers_and_compaction(tmp_path):
    table = make(tmp_path / "t", True)
    table.apply([FileEvent.created(p, size=1, last_modified_time=T0) for p in PATHS])
    table.apply([FileEvent.created(PATHS[0], size=2, last_modified_time=T0)])
    assert_true_to(table)
    other = DirectoryTable(table.root, table.base_url)  # another process: no index of its own
    other.key_index_root = str(tmp_path / "other")
    KeyCache.of(other.delta().table_uri, other.storage_options,
                other.key_index_root).disabled = True
    at = T0 + timedelta(seconds=5)
    other.apply([FileEvent.created(p, size=5, last_modified_time=at) for p in PATHS[::7]]
                + [FileEvent.removed(p, event_time=at) for p in PATHS[3::11]])
    table.optimize(max_files_per_bucket=1)
    table.apply([FileEvent.created("new", size=1, last_modified_time=at)])
    assert_true_to(table)  # caught up over the other writer's commit and the compaction


def test_a_lost_or_damaged_index_is_rebuilt(tmp_path):
    table = make(tmp_path / "t", True)
    table.apply([FileEvent.created(p, size=1, last_modified_time=T0) for p in PATHS])
    table.apply([FileEvent.created(PATHS[1], size=2, last_modified_time=T0)])
    assert_true_to(table)  # built (on a thread) and caught up before the damage
    cache = cache_of(table)
    folder = cache._folder
    assert folder is not None and folder.exists()
    for damage in ("gone", "garbled"):
        cache.index = None
        if damage == "gone":
            shutil.rmtree(folder)
            folder.mkdir()
        else:
            (folder / "manifest.json").write_text("{not json")
        at = T0 + timedelta(seconds=3)
        table.apply([FileEvent.removed(PATHS[2], event_time=at)])
        assert_true_to(table)


def test_a_table_restored_from_a_copy_does_not_reuse_a_later_index(tmp_path):
    """A restored copy reuses the table's id, location and version numbers: the index of the
    lineage it replaced must not be taken for it (its commit's fingerprint differs)."""
    table = make(tmp_path / "t", True)
    table.key_index_root = str(tmp_path / "keys")  # outside the table's folder: it stays
    table.apply([FileEvent.created(p, size=1, last_modified_time=T0) for p in PATHS])
    shutil.copytree(table.root, tmp_path / "backup")
    for k in range(1, 3):
        table.apply([FileEvent.created(p, size=10 + k, last_modified_time=T0)
                     for p in PATHS[k::5]])
    assert_true_to(table)
    cache_of(table).close()  # a new process: the old one let go of the index
    KeyCache._caches.clear()
    shutil.rmtree(table.root)
    shutil.copytree(tmp_path / "backup", table.root)
    restored = DirectoryTable(table.root, table.base_url)
    restored.key_index_root = table.key_index_root
    for k in range(3, 5):  # the same version numbers again, other rows
        restored.apply([FileEvent.created(p, size=100 + k, last_modified_time=T0)
                         for p in PATHS[k::7]])
    assert_true_to(restored)


def test_small_files_are_folded_after_batches_and_no_row_changes(tmp_path):
    """Auto-compaction (`compaction.fold_after`): a bucket's small per-batch files are folded
    once it holds `fold_min_files`; the rows, the change feed (a fold records no change) and
    the key index stay what they are without folds, and small files stay bounded."""
    folded, plain = make(tmp_path / "folded", True), make(tmp_path / "plain", True)
    folded.fold_min_files, plain.fold_min_files = 4, None
    for table in (folded, plain):
        table.apply([FileEvent.created(p, size=1, etag="e0", last_modified_time=T0,
                                       event_time=T0) for p in PATHS])
    for k in range(1, 31):
        at = T0 + timedelta(seconds=k)
        events = [FileEvent.created(PATHS[(k * 7 + j * 13) % len(PATHS)], size=k, etag=f"e{k}",
                                    last_modified_time=at, event_time=at) for j in range(3)]
        events.append(FileEvent.removed(PATHS[(k * 11) % len(PATHS)], event_time=at))
        for table in (folded, plain):
            assert table.apply(events).version is not None
        assert_true_to(folded)
    ops = [e["operation"] for e in folded.history()]
    assert ops.count("OPTIMIZE") >= 3 and "OPTIMIZE" not in [e["operation"]
                                                             for e in plain.history()]
    same = COLUMNS[:3]  # (versions differ: the folds take some)
    rows = [sorted(t.snapshot(columns=same).to_pylist(), key=repr) for t in (folded, plain)]
    assert rows[0] == rows[1]
    feeds = [sorted(t.changes(0, t.version(), columns=same).drop_columns(
        ["_commit_version"]).to_pylist(), key=repr) for t in (folded, plain)]
    assert feeds[0] == feeds[1]
    small = [[e for e in files.values() if e.live_rows < 20]
             for files in folded._write_state()[1].by_bucket.values()]
    assert max(len(s) for s in small) < 4 + 3  # folded at 4; at most a few batches since
    assert sum(len(s) for s in small) < sum(
        1 for files in plain._write_state()[1].by_bucket.values() for e in files.values()
        if e.live_rows < 20)


def test_a_batch_with_many_candidate_files_waits_for_the_build(tmp_path):
    """While the index is built on a thread, a batch of a few candidate files scans them, and
    a batch with more than `WAIT_FILES` candidates waits for the build and looks it up."""
    from directory_table import keyed

    table = make(tmp_path / "t", True)  # files of 40 rows: 4,000 paths make ~100 files
    many = [f"m/{i:05d}" for i in range(4_000)]
    table.apply([FileEvent.created(p, size=1, last_modified_time=T0, event_time=T0)
                 for p in many])
    assert_true_to(table)  # built (on a thread) and caught up
    cache = cache_of(table)
    cache.index = None  # lost: the next batch starts a build
    shutil.rmtree(cache._folder)
    cache._folder.mkdir()
    at = T0 + timedelta(seconds=1)
    scans = cache.scans
    table.apply([FileEvent.created(many[7], size=2, last_modified_time=at, event_time=at)])
    assert cache.scans == scans + 1  # one candidate file: scanned beside the build
    lookups = cache.lookups
    table.apply([FileEvent.created(p, size=3, last_modified_time=at, event_time=at)
                 for p in many[::30]])  # spread: candidates in every file
    assert len(table._write_state()[1].files()) > keyed.WAIT_FILES
    assert cache.lookups == lookups + 1 and cache.scans == scans + 1
    assert_true_to(table)
