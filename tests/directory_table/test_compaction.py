"""Sorted compaction (`directory_table.compaction`): small files merged with the files they
overlap, sorted and split; no change records; stream reads across it unchanged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.maintenance import files_per_bucket

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def put(path, size, at):
    return FileEvent.created(path, size=size, etag=f"e{size}", last_modified_time=at,
                             event_time=at)


def files(table):
    return pa.table(table.delta().get_add_actions(flatten=True)).to_pydict()


def test_sorted_compaction_keeps_rows_records_and_untouched_files(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "t"), "file:///d/", buckets=2,
                                  target_file_size=64 * 100,  # 100 rows per file
                                  deletion_vectors=False)
    table.apply([put(f"f{i:04d}", 1, T0) for i in range(1000)])
    # an update of every 10th path rewrites them all as sorted files of 100 rows
    table.apply([put(f"f{i:04d}", 3, T0 + timedelta(seconds=1)) for i in range(0, 1000, 10)])
    assert all(n >= 50 for n in files(table)["num_records"])
    full_before = set(files(table)["path"])
    for i in range(12):                                               # small files
        table.apply([put(f"f{i * 3:04d}x", 2, T0 + timedelta(seconds=i))])
    before = table.version()
    snapshot = sorted(table.snapshot().to_pylist(), key=lambda r: r["relative_path"])
    records = sorted(table.changes(1, before).to_pylist(), key=repr)
    result = table.optimize(max_files_per_bucket=4)
    assert result.buckets_compacted >= 1
    after = files(table)
    # the small files are gone; full files far from them were left alone
    assert all(n >= 50 for n in after["num_records"])
    assert full_before & set(after["path"])
    assert max(files_per_bucket(table.delta()).values()) <= 10
    # every file sorted, its statistics exact, ranges of a bucket's files disjoint
    by_bucket: dict[int, list[tuple[str, str]]] = {}
    for path, lo, hi, n, b in zip(after["path"], after["min.relative_path"],
                                  after["max.relative_path"], after["num_records"],
                                  after["partition._bucket"], strict=True):
        data = pq.read_table(Path(table.path) / path)["relative_path"].to_pylist()
        assert data == sorted(data) and (data[0], data[-1], len(data)) == (lo, hi, n)
        by_bucket.setdefault(b, []).append((lo, hi))
    for ranges in by_bucket.values():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    # no rows changed; the compaction version has no change records; reads across it agree
    assert sorted(table.snapshot().to_pylist(), key=lambda r: r["relative_path"]) == snapshot
    v = table.version()
    assert v > before and table.changes(before, v).num_rows == 0
    assert sorted(table.changes(1, v).to_pylist(), key=repr) == records
    entry = table.history(1)[0]
    assert entry["operation"] == "OPTIMIZE"
    # writes keep working on the compacted table
    r = table.apply([put("f0003x", 9, T0 + timedelta(seconds=99)), put("zz", 1, T0)])
    assert (r.updated, r.inserted) == (1, 1)


def test_compaction_purges_marked_rows_and_folds_image_files(tmp_path):
    """Merge-on-read (DESIGN §4.8): spread batches leave files with deletion vectors and small
    image files; compaction rewrites them sorted, without the marked rows, and no DV is left in
    the buckets it compacted. Rows, change records and reads across it are unchanged."""
    from directory_table.deltalog import replay

    table = DirectoryTable.create(str(tmp_path / "t"), "file:///d/", buckets=2,
                                  target_file_size=64 * 100)  # 100 rows per file
    table.apply([put(f"f{i:04d}", 1, T0) for i in range(1000)])
    for k in range(1, 6):  # each overwrites every 7th path and deletes every 11th
        at = T0 + timedelta(seconds=k)
        table.apply([put(f"f{i:04d}", 1 + k, at) for i in range(k, 1000, 7)]
                    + [FileEvent.removed(f"f{i:04d}", event_time=at)
                       for i in range(k, 1000, 11)])
    state = replay(table.path, None, table.version())
    assert state.deletion_vectors()  # rows are marked, not rewritten
    physical = sum(state.files["num_records"].to_pylist())
    before = table.version()
    snapshot = sorted(table.snapshot().to_pylist(), key=lambda r: r["relative_path"])
    records = sorted(table.changes(1, before).to_pylist(), key=repr)
    result = table.optimize(max_files_per_bucket=4)
    assert result.buckets_compacted == 2
    state = replay(table.path, None, table.version())
    assert not state.deletion_vectors()
    assert sum(state.files["num_records"].to_pylist()) == len(snapshot) < physical
    for path, lo, hi, n in zip(*(state.files[c].to_pylist()
                                 for c in ("path", "min_path", "max_path", "num_records")),
                               strict=True):
        data = pq.read_table(Path(table.path) / path)["relative_path"].to_pylist()
        assert data == sorted(data) and (data[0], data[-1], len(data)) == (lo, hi, n)
    assert sorted(table.snapshot().to_pylist(), key=lambda r: r["relative_path"]) == snapshot
    assert table.changes(before, table.version()).num_rows == 0
    assert sorted(table.changes(1, before).to_pylist(), key=repr) == records
