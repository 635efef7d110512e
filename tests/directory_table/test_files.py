"""The in-process file index (`directory_table.files`): advanced from the log, it always equals
the add actions of delta-rs's snapshot of the latest version, whoever committed what."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from directory_table import DirectoryTable
from directory_table.batch import event_table
from directory_table.commitfile import checkpoint
from directory_table.deltalog import replay
from directory_table.files import CommitLog, FileIndex, Stale
from directory_table.images import images
from directory_table.layout import Layout, for_layout
from directory_table.protocol import has_deletion_vectors
from tests.directory_table.test_rewrite import T0, put, rm

PATHS = [f"d{i % 4}/f{i:03d}" for i in range(60)]


def entries(index: FileIndex) -> set:
    return {(f.path, f.size, f.bucket, f.rows, f.low, f.high,
             f.dv.unique_id if f.dv else None) for f in index.files()}


def fresh_entries(fresh: DeltaTable, options: dict | None = None) -> set:
    """The files of `fresh`'s version as a new index sees them: from delta-rs's add actions,
    or for a table with deletion vectors (which those do not show) from our log replay, whose
    files must then be delta-rs's."""
    if not has_deletion_vectors(fresh):
        return entries(FileIndex.of(fresh))
    state = replay(fresh.table_uri, options, fresh.version())
    index = FileIndex.of_adds(state.version, state.adds())
    assert {f.path for f in index.files()} == {
        p.removeprefix(fresh.table_uri.rstrip("/") + "/")
        .removeprefix(fresh.table_uri.removeprefix("file://").rstrip("/") + "/")
        for p in fresh.file_uris()}
    return entries(index)


def assert_current(table: DirectoryTable) -> None:
    """The table's index, advanced from the log, equals a fresh snapshot's add actions."""
    _, index = table._write_state()
    fresh = DeltaTable(table.path)
    assert index.version == fresh.version()
    assert entries(index) == fresh_entries(fresh)


def other_append(table: DirectoryTable, paths: list[str], round_: int) -> None:
    """Another writer appends through delta-rs (its own commit format and statistics)."""
    other = DirectoryTable(table.root, table.base_url)
    other.rewrite_min_events = None
    other.apply([put(p, 100 + round_, T0 + timedelta(seconds=round_)) for p in paths])


OPS = st.lists(st.tuples(st.sampled_from(["ours", "other_merge", "other_raw", "compact",
                                          "checkpoint", "delete"]),
                         st.lists(st.sampled_from(PATHS), min_size=1, max_size=12)),
               min_size=1, max_size=7)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_index_equals_the_snapshot_after_any_commits(ops):
    with tempfile.TemporaryDirectory() as tmp:
        table = DirectoryTable.create(f"{tmp}/v", "file:///d/", buckets=3,
                                      target_file_size=64 * 40)  # ~40 rows per file
        table.apply([put(p, 1, T0) for p in PATHS[::2]])
        assert_current(table)
        for round_, (op, paths) in enumerate(ops, start=1):
            at = T0 + timedelta(seconds=round_)
            if op == "ours":
                table.apply([put(p, 10 + round_, at) for p in paths])
            elif op == "delete":
                table.apply([rm(p, at) for p in paths])
            elif op == "other_merge":
                other_append(table, paths, round_)
            elif op == "other_raw":  # a plain delta-rs append of new rows
                dt = DeltaTable(table.path)
                rows = images(event_table([put(f"raw{round_}/{p}", 5, at) for p in paths]),
                              table.base_url, dt.version() + 1, at)
                write_deltalake(dt, for_layout(rows, Layout.of(dt)), mode="append")
            elif op == "compact":
                DirectoryTable(table.root, table.base_url).optimize(max_files_per_bucket=1)
            else:
                checkpoint(DeltaTable(table.path), DeltaTable(table.path).version(), {})
            assert_current(table)
        # and the table's own reads see the newest version
        assert table.version() == DeltaTable(table.path).version()


def test_a_commit_with_other_actions_rebuilds_the_index(tmp_path: Path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=2)
    table.apply([put(p, 1, T0) for p in PATHS[:10]])
    _, index = table._write_state()
    DeltaTable(table.path).alter.set_table_properties({"delta.checkpointInterval": "50"})
    try:
        index.advance(CommitLog(table.path))
        raise AssertionError("a metaData action must make the index stale")
    except Stale:
        pass
    r = table.apply([put(PATHS[0], 2, T0 + timedelta(seconds=1)), put("new", 1, T0)])
    assert (r.version, r.updated, r.inserted) == (3, 1, 1)
    assert_current(table)


def test_a_checkpoint_past_missing_commits_rebuilds_the_index(tmp_path: Path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=2)
    table.apply([put(p, 1, T0) for p in PATHS[:10]])
    table._write_state()  # index at version 1
    other_append(table, PATHS[10:14], 2)
    other_append(table, PATHS[14:18], 3)
    DeltaTable(table.path).create_checkpoint()  # at version 3
    # log clean-up removed a commit the checkpoint covers (never the latest one)
    os.unlink(f"{table.path}/_delta_log/{2:020d}.json")
    r = table.apply([put(PATHS[0], 2, T0 + timedelta(seconds=5)), put(PATHS[12], 9,
                                                                       T0 + timedelta(seconds=5))])
    assert (r.version, r.updated) == (4, 2)
    assert_current(table)
    sizes = dict(zip(*(table.snapshot().to_pydict()[c] for c in ("relative_path", "size")),
                     strict=True))
    assert (sizes[PATHS[0]], sizes[PATHS[12]], sizes[PATHS[16]]) == (2, 9, 103)


def test_readers_see_the_commits_made_through_the_index(tmp_path: Path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=2)
    table.apply([put(p, 1, T0) for p in PATHS[:10]])
    for i in range(3):
        r = table.apply([put(PATHS[i], 5 + i, T0 + timedelta(seconds=1 + i))])
        assert r.version == 2 + i
        assert table.version() == r.version
        change = table.changes(r.version - 1, r.version).to_pydict()
        assert sorted(change["_change_type"]) == ["update_postimage", "update_preimage"]
        assert table.file_count() == 10


def test_the_index_on_s3_reads_new_commits_through_the_store(s3_bucket, s3_env):
    root = f"s3://{s3_bucket}/idx"
    table = DirectoryTable.create(root, "s3://data/", buckets=2, target_file_size=64 * 8)
    table.apply([put(p, 1, T0) for p in PATHS[:20]])
    other = DirectoryTable(root, "s3://data/")
    for i in range(3):
        at = T0 + timedelta(seconds=1 + i)
        r = table.apply([put(PATHS[i], 5 + i, at), put(f"new{i}", 1, at)])  # rewrite path
        assert (r.version, r.updated, r.inserted) == (2 + 2 * i, 1, 1)
        other.apply([put(PATHS[10 + i], 7, at)])  # another writer's commit, seen before planning
        _, index = table._write_state()
        fresh = DeltaTable(table.path, storage_options=table.storage_options)
        assert index.version == fresh.version() == 3 + 2 * i
        assert entries(index) == fresh_entries(fresh, table.storage_options)
    sizes = dict(zip(*(table.snapshot().to_pydict()[c] for c in ("relative_path", "size")),
                     strict=True))
    assert [sizes[PATHS[i]] for i in (0, 1, 2, 10, 11, 12)] == [5, 6, 7, 7, 7, 7]


def test_the_oldest_version_follows_clean_up_and_a_table_made_again(tmp_path: Path):
    """`oldest_version` keeps its last answer only while that commit is there and the one
    before it is not: commits removed by clean-up move it on, a table made again at the same
    place brings it back to 0."""
    table = DirectoryTable.create(str(tmp_path / "t"), "file:///d/")
    for k in range(4):
        table.apply([put(f"f{k}", 1, T0 + timedelta(seconds=k))])
    assert table.oldest_version() == 0 == table.oldest_version()
    for v in (0, 1):                                  # as log clean-up would
        os.remove(f"{table.path}/_delta_log/{v:020d}.json")
    assert table.oldest_version() == 2
    os.remove(f"{table.path}/_delta_log/{2:020d}.json")
    assert table.oldest_version() == 3
    for v in (0, 1, 2):                               # commits before it again: listed
        Path(f"{table.path}/_delta_log/{v:020d}.json").write_text("{}\n")
    assert table.oldest_version() == 0
