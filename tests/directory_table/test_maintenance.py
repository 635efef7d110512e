"""Compaction, checkpoints and the migration of pre-bucket tables, with real Delta tables:
none of them may change what a stream reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.events import FileEvent
from directory_table import DirectoryTable, Layout
from directory_table.layout import bucket_of
from directory_table.maintenance import files_per_bucket
from directory_table.schema import TABLE_SCHEMA, TOMBSTONE_SCHEMA

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEY = ["_commit_version", "relative_path", "_change_type"]


def t(s):
    return T0 + timedelta(seconds=s)


def put(path, size, at):
    return FileEvent.created(path, size=size, etag=f"e{size}", last_modified_time=at,
                             event_time=at)


def rm(path, at):
    return FileEvent.removed(path, event_time=at)


def records(cdf: pa.Table) -> list[dict]:
    """What a stream sees of a change feed: every column but delta-rs's commit timestamp."""
    cols = [c for c in cdf.column_names if c != "_commit_timestamp"]
    return cdf.select(cols).sort_by([(k, "ascending") for k in KEY]).to_pylist()


def create_legacy(root: Path, base_url: str = "file:///data/") -> DirectoryTable:
    """A table in the layout written before buckets existed: unpartitioned, no `_bucket`
    (what `DirectoryTable.create` did until the bucketed layout)."""
    table = DirectoryTable(str(root), base_url)
    retention = "interval 604800 seconds"
    config = {"delta.enableChangeDataFeed": "true", "delta.logRetentionDuration": retention,
              "delta.deletedFileRetentionDuration": retention}
    DeltaTable.create(table.path, schema=TABLE_SCHEMA, name="directory", configuration=config)
    DeltaTable.create(table.tombstones_path, schema=TOMBSTONE_SCHEMA,
                      configuration={k: v for k, v in config.items()
                                     if k != "delta.enableChangeDataFeed"})
    return table


def churn(table: DirectoryTable, start: int, commits: int) -> None:
    """`commits` one-event commits: new files, overwrites and deletes."""
    for i in range(start, start + commits):
        if i % 5 == 4:
            table.apply([rm(f"f{i - 3}", t(i))])
        elif i % 3 == 2:
            table.apply([put(f"f{i - 2}", i, t(i))])
        else:
            table.apply([put(f"f{i}", i, t(i))])


def test_optimize_compacts_busy_buckets_and_checkpoints(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=4)
    churn(table, 0, 60)
    before = files_per_bucket(table.delta())
    assert max(before.values()) > 4
    snapshot = table.snapshot().sort_by("relative_path")
    result = table.optimize(max_files_per_bucket=2)
    after = files_per_bucket(table.delta())
    assert result.buckets_compacted == sum(1 for n in before.values() if n > 2)
    assert max(after.values()) <= 2
    assert table.snapshot().sort_by("relative_path") == snapshot
    assert result.checkpoint_version == table.version()
    log = Path(table.path) / "_delta_log"
    assert (log / f"{result.checkpoint_version:020d}.checkpoint.parquet").exists()
    assert table.optimize(max_files_per_bucket=2).buckets_compacted == 0     # nothing to do


def test_optimize_commit_has_no_change_records(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=4)
    churn(table, 0, 30)
    v = table.version()
    table.optimize(max_files_per_bucket=1)
    assert table.version() == v + 1
    entry = table.history(1)[0]
    assert entry["operation"] == "OPTIMIZE"
    # delta-rs's own change feed over a range holding the optimize commit
    raw = pa.RecordBatchReader.from_stream(
        DeltaTable(table.path).load_cdf(starting_version=v - 2, ending_version=v + 1)).read_all()
    assert raw.num_rows > 0 and v + 1 not in raw["_commit_version"].to_pylist()
    assert table.changes(v, v + 1).num_rows == 0


def test_stream_read_across_compaction_gives_the_same_records(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=8)
    churn(table, 0, 40)
    # a consumer reads in increments, with compactions landing between its reads
    offset, consumed = 0, []
    for round_ in range(4):
        churn(table, 40 + 10 * round_, 10)
        if round_ % 2 == 0:
            table.optimize(max_files_per_bucket=1)
        latest = table.version()
        consumed += records(table.changes(offset, latest))
        offset = latest
    in_one_go = records(table.changes(0, offset))
    assert sorted(consumed, key=lambda r: [r[k] for k in KEY]) == in_one_go
    # the same events on a table never compacted give the same changes (versions aside)
    replay = DirectoryTable.create(str(tmp_path / "replay"), "file:///d/", buckets=8)
    churn(replay, 0, 80)
    assert _changes(replay) == _changes(table)


def _changes(table: DirectoryTable) -> list[tuple]:
    return sorted((r["relative_path"], r["_change_type"], r["size"], r["etag"])
                  for r in records(table.changes(0, table.version())))


def test_legacy_table_works_as_it_is(tmp_path):
    table = create_legacy(tmp_path / "old")
    assert table.layout() == Layout(buckets=1, bucketed=False)
    table.apply([put("a", 1, t(1)), put("b", 2, t(1))])
    table.apply([put("a", 3, t(2)), rm("b", t(2))])
    assert table.apply([put("b", 9, t(1))]).version is None      # tombstone holds
    assert table.snapshot(columns=["relative_path", "size"]).to_pylist() == [
        {"relative_path": "a", "size": 3}]
    assert set(table.changes(0, 2)["_bucket"].to_pylist()) == {0}
    assert table.snapshot(columns=["relative_path"], buckets=[0]).num_rows == 1
    assert table.snapshot(columns=["relative_path"], buckets=[1]).num_rows == 0
    table.optimize(max_files_per_bucket=1)                        # compacts, stays unbucketed
    assert not table.layout().bucketed
    assert len(DeltaTable(table.path).file_uris()) == 1


@pytest.mark.parametrize("via_optimize", [False, True])
def test_migrated_table_gives_the_same_change_records(tmp_path, via_optimize):
    table = create_legacy(tmp_path / "old")
    churn(table, 0, 25)
    table.apply([put(f"bulk{i}", i, t(100)) for i in range(50)])
    before_version = table.version()
    before = records(table.changes(0, before_version))
    snapshot = table.snapshot().sort_by("relative_path")
    if via_optimize:
        migrated = table.optimize(migrate=True, buckets=8).migrated_version
    else:
        migrated = table.migrate(buckets=8)
    assert migrated == before_version + 2                  # properties, then the rewrite
    assert table.layout() == Layout(buckets=8, bucketed=True, migrated_version=migrated)
    assert table.migrate(buckets=8) is None                 # once only
    assert table.snapshot().sort_by("relative_path") == snapshot
    assert table.changes(before_version, migrated).num_rows == 0
    # the old records, with the buckets their paths have in the new layout
    again = records(table.changes(0, migrated))
    assert all(r.pop("_bucket") == bucket_of(r["relative_path"], 8) for r in again)
    assert again == [{k: v for k, v in r.items() if k != "_bucket"} for r in before]
    # an offset taken before the migration stays valid; new changes come after it
    table.apply([put("bulk1", 77, t(200)), put("fresh", 1, t(200)), rm("bulk2", t(200))])
    after = records(table.changes(before_version, table.version()))
    assert {(r["relative_path"], r["_change_type"]) for r in after} == {
        ("bulk1", "update_preimage"), ("bulk1", "update_postimage"), ("fresh", "insert"),
        ("bulk2", "delete")}
    assert len(records(table.changes(0, table.version()))) == len(before) + 4
    # only some columns, across the migration (an unbucketed range reads the path for its bucket)
    part = table.changes(0, table.version(), columns=["url", "size"])
    assert part.column_names == ["url", "size", "_change_type", "_commit_version", "_bucket"]
    full = table.changes(0, table.version()).select(part.column_names)
    order = [(c, "ascending") for c in part.column_names]
    assert part.sort_by(order) == full.sort_by(order)
    with pytest.raises(ValueError, match="_sequencr"):
        table.changes(0, table.version(), columns=["_sequencr"])
    # tombstones came along: a late CREATED of a deleted path stays ignored
    assert table.apply([put("bulk2", 5, t(150))]).version is None
    assert Layout.of(DeltaTable(table.tombstones_path)).bucketed
