"""The rewrite write path (`directory_table.rewrite`) against the delta-rs merge path: the same
events give the same table, the same results and the same change records."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.events import FileEvent
from directory_table import DirectoryTable

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PATHS = [f"p{i:02d}" if i % 3 else f"dir{i % 2}/f{i:02d}.csv" for i in range(14)]


def create_cow(*args, **kwargs) -> DirectoryTable:
    """A copy-on-write table: this module tests the rewrite path (DESIGN §4.7)."""
    return DirectoryTable.create(*args, deletion_vectors=False, **kwargs)


def put(path, size, at, seq=None):
    return FileEvent.created(path, size=size, etag=f"e{size}", last_modified_time=at,
                             event_time=at, sequencer=seq)


def rm(path, at, seq=None):
    return FileEvent.removed(path, event_time=at, sequencer=seq)


def pair(tmp_path: Path, buckets: int, target: int = 256 * 1024):
    merge = create_cow(str(tmp_path / "merge"), "file:///d/", buckets=buckets,
                                  target_file_size=target)
    merge.rewrite_min_events = None
    rewrite = create_cow(str(tmp_path / "rewrite"), "file:///d/", buckets=buckets,
                                    target_file_size=target)
    rewrite.rewrite_min_events = 1
    return merge, rewrite


def rows(table: pa.Table, drop=("_image_timestamp", "_commit_timestamp")) -> list[tuple]:
    """Rows as sorted tuples, without the columns holding wall-clock times of the commit."""
    keep = [c for c in table.column_names if c not in drop]
    d = table.select(keep).to_pydict()
    return sorted(zip(*(d[c] for c in keep), strict=True), key=repr)


def same(merge: DirectoryTable, rewrite: DirectoryTable, version: int | None) -> None:
    assert merge.version() == rewrite.version()
    assert rows(merge.snapshot()) == rows(rewrite.snapshot())
    if version is not None:
        assert rows(merge.changes(version - 1, version)) == rows(
            rewrite.changes(version - 1, version))


def log_actions(table: DirectoryTable, version: int) -> list[dict]:
    text = (Path(table.path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line]


event = st.tuples(st.sampled_from(["put", "put", "rm"]), st.sampled_from(PATHS),
                  st.integers(0, 30), st.integers(0, 3), st.booleans())
batch = st.tuples(st.lists(event, min_size=1, max_size=25), st.booleans())


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(batch, min_size=1, max_size=6), buckets=st.sampled_from([1, 3, 16]))
def test_rewrite_path_matches_merge_path(tmp_path_factory, batches, buckets):
    """Random histories (overwrites, deletes, duplicates, reordered and stale events, listings
    diffed against a version): both paths give the same results, tables and change records."""
    merge, rewrite = pair(tmp_path_factory.mktemp("h"), buckets)
    for i, (events, listed) in enumerate(batches):
        batch_events = [
            (put(p, size, T0 + timedelta(seconds=at), f"{at:04X}" if seq else None) if kind == "put"
             else rm(p, T0 + timedelta(seconds=at), f"{at:04X}" if seq else None))
            for kind, p, at, size, seq in events
        ]
        base = merge.version() - (i % 2) if listed else None
        a = merge.apply(batch_events, listed_at_version=base)
        b = rewrite.apply(batch_events, listed_at_version=base)
        assert (a.version, a.inserted, a.updated, a.deleted, a.ignored, a.unchanged) == (
            b.version, b.inserted, b.updated, b.deleted, b.ignored, b.unchanged)
        same(merge, rewrite, a.version)


def test_carried_rows_report_no_changes(tmp_path, rewrite_path):
    """A rewrite carries the unchanged rows of a file over: the change feed of the version has
    exactly the changed paths (from `changes()` and from delta-rs's own CDF reader)."""
    merge, table = pair(tmp_path, buckets=1)
    table.apply([put(f"f{i:03d}", 1, T0) for i in range(200)])
    r = table.apply([put("f010", 2, T0 + timedelta(seconds=1)), rm("f020", T0 + timedelta(seconds=1)),
                     put("new", 5, T0 + timedelta(seconds=1))])
    assert (r.version, r.inserted, r.updated, r.deleted) == (2, 1, 1, 1)
    got = sorted(zip(*(table.changes(1, 2).to_pydict()[c] for c in ("relative_path",
                                                                      "_change_type")),
                     strict=True))
    assert got == [("f010", "update_postimage"), ("f010", "update_preimage"), ("f020", "delete"),
                   ("new", "insert")]
    raw = pa.RecordBatchReader.from_stream(DeltaTable(table.path).load_cdf(
        starting_version=2, ending_version=2)).read_all()
    assert raw.num_rows == 4
    kinds = [next(iter(a)) for a in log_actions(table, 2)]
    assert kinds.count("remove") == 1 and kinds.count("cdc") == 1 and kinds[0] == "commitInfo"
    assert table.file_count() == 200
    pre = table.changes(1, 2).filter(pa.compute.equal(
        table.changes(1, 2)["_change_type"], "update_preimage")).to_pydict()
    assert pre["_image_version"] == [1] and pre["size"] == [1]


def test_rewritten_files_stay_sorted_and_split(tmp_path, rewrite_path):
    table = create_cow(str(tmp_path / "t"), "file:///d/", buckets=2,
                                  target_file_size=100 * 64)  # 100 rows per file
    table.rewrite_min_events = 1
    table.apply([put(f"f{i:04d}", 1, T0) for i in range(3000)])
    table.apply([put(f"f{i:04d}", 2, T0 + timedelta(seconds=1)) for i in range(0, 3000, 7)])
    assert_files_sorted(table)
    assert table.file_count() == 3000
    assert sorted(table.snapshot(columns=["relative_path"])["relative_path"].to_pylist()) == [
        f"f{i:04d}" for i in range(3000)]


def test_racing_rewrites_commit_at_consecutive_versions(tmp_path, rewrite_path):
    root = str(tmp_path / "vol")
    create_cow(root, "file:///d/", buckets=4)
    seed = DirectoryTable(root, "file:///d/")
    seed.apply([put(f"f{i:03d}", 1, T0) for i in range(100)])
    errors = []

    def writer(k):
        tbl = DirectoryTable(root, "file:///d/")
        tbl.rewrite_min_events = 1
        try:
            for i in range(5):
                at = T0 + timedelta(seconds=1 + i)
                tbl.apply([put(f"f{j:03d}", 10 * k + i, at) for j in range(k, 100, 2)])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors
    tbl = DirectoryTable(root, "file:///d/")
    assert tbl.version() == 11
    snap = tbl.snapshot().to_pydict()
    assert sorted(snap["size"]) == sorted([4] * 50 + [14] * 50)
    cdf = tbl.changes(1, 11)
    assert cdf.num_rows == 2 * 5 * 100  # a pre- and a post-image per update, nothing else
    assert set(cdf["_commit_version"].to_pylist()) == set(range(2, 12))


@pytest.mark.parametrize("kind", ["put", "rm"])
def test_tombstones_and_recreate_through_rewrite(tmp_path, kind, rewrite_path):
    merge, table = pair(tmp_path, buckets=3)
    for t in (merge, table):
        t.apply([put(p, 1, T0) for p in PATHS])
        t.apply([rm(p, T0 + timedelta(seconds=5)) for p in PATHS[:6]])
        # a redelivered older create does not resurrect; a newer one does
        late = [put(p, 3, T0 + timedelta(seconds=2)) for p in PATHS[:3]]
        newer = [put(p, 4, T0 + timedelta(seconds=9)) for p in PATHS[3:6]]
        t.apply(late + newer if kind == "put" else late + newer + [rm(PATHS[7], T0 + timedelta(seconds=9))])
    same(merge, table, table.version())
    assert sorted(table.snapshot(columns=["relative_path"])["relative_path"].to_pylist()) == sorted(
        PATHS[3:] if kind == "put" else [p for p in PATHS[3:] if p != PATHS[7]])


def test_rewrite_commits_write_checkpoints_at_the_interval(tmp_path):
    table = create_cow(str(tmp_path / "t"), "file:///d/", buckets=2)
    table.delta().alter.set_table_properties({"delta.checkpointInterval": "5"})
    table.rewrite_min_events = 1
    for i in range(8):  # version 2 inserts (delta-rs append), 3..9 update (rewrites)
        table.apply([put("a", i, T0 + timedelta(seconds=i))])
    table.apply([put("a", 99, T0 + timedelta(seconds=99))])  # version 10: a rewrite
    log = Path(table.path) / "_delta_log"
    assert table.version() == 10
    assert (log / f"{10:020d}.checkpoint.parquet").exists()
    assert DeltaTable(table.path).version() == 10


def test_batches_touching_many_rows_are_streamed(tmp_path, monkeypatch, threads):
    """Past `max_rows` rows in the touched files, `load` keeps only the rows of the batch's
    paths of the other files and the commit reads them again: same table and change records
    as a merge."""
    from directory_table import rewrite as rewrite_module

    merge, table = pair(tmp_path, buckets=2, target=50 * 64)  # 50 rows per file
    for t in (merge, table):
        t.apply([put(f"f{i:03d}", 1, T0) for i in range(300)])
    loaded = []
    real_load = rewrite_module.load

    def small_load(*args, **kwargs):
        loaded.append(real_load(*args, **{**kwargs, "max_rows": 160}))
        return loaded[-1]

    monkeypatch.setattr(rewrite_module, "load", small_load)
    at = T0 + timedelta(seconds=1)
    events = ([put(f"f{i:03d}", 2, at) for i in range(0, 300, 3)]
              + [rm(f"f{i:03d}", at) for i in range(1, 300, 9)]
              + [put(f"f{i:03d}x", 3, at) for i in range(0, 300, 10)])
    for t in (merge, table):
        r = t.apply(events)
        assert (r.updated, r.deleted, r.inserted) == (100, 34, 30)
    same(merge, table, table.version())
    # the first files' rows are kept up to 160 rows in all, the others read again at commit
    last = loaded[-1]
    kept = [t is not None for t in last.tables]
    running = [sum(last.counts[:i + 1]) for i in range(len(last.counts))]
    assert kept == [n <= 160 for n in running] and any(kept) and not all(kept)
    assert table.history(1)[0]["operation"] == "WRITE"


def test_new_paths_join_the_rewritten_file_of_their_range(tmp_path, threads, monkeypatch):
    """A new path inside a rewritten file's range is sorted into it (split in equal parts
    when the file outgrows its size); one past every range goes into a new file (the streamed
    path; the in-memory one sorts a bucket's rewritten rows and new paths together)."""
    from directory_table import rewrite as rewrite_module

    monkeypatch.setattr(rewrite_module, "MAX_LOADED_ROWS", 0)
    table = create_cow(str(tmp_path / "t"), "file:///d/", buckets=1,
                                  target_file_size=40 * 64)  # 40 rows per file
    table.apply([put(f"f{i:03d}", 1, T0) for i in range(0, 200, 2)])  # 100 rows, one file
    at = T0 + timedelta(seconds=1)
    events = ([put("f010", 2, at)] + [put(f"f{i:03d}", 3, at) for i in range(1, 40, 2)]
              + [put("g000", 4, at)] + [rm(f"f{i:03d}", at) for i in range(120, 200, 2)])
    r = table.apply(events)
    assert (r.updated, r.inserted, r.deleted) == (1, 21, 40)
    assert_files_sorted(table, max_rows=40)
    assert ["g000"] in _file_rows(table)
    assert table.file_count() == 100 + 21 - 40
    sizes = sorted(len(rows) for rows in _file_rows(table))   # how the 100 rows were first
    assert sizes[0] == 1 and sum(sizes) == 81 and max(sizes) <= 40  # split depends on the writer
    kinds = sorted(table.changes(1, 2)["_change_type"].to_pylist())
    assert kinds == sorted(["delete"] * 40 + ["insert"] * 21
                           + ["update_preimage", "update_postimage"])


def assert_files_sorted(table: DirectoryTable, max_rows: int | None = None) -> None:
    """Every data file is sorted by path, its log statistics (min, max, rows) are its own,
    and it holds at most `max_rows` rows."""
    actions = pa.table(table.delta().get_add_actions(flatten=True)).to_pydict()
    for path, lo, hi, n in zip(actions["path"], actions["min.relative_path"],
                               actions["max.relative_path"], actions["num_records"],
                               strict=True):
        data = pa.parquet.read_table(Path(table.path) / path)["relative_path"].to_pylist()
        assert data == sorted(data) and (data[0], data[-1], len(data)) == (lo, hi, n)
        assert max_rows is None or n <= max_rows


def _file_rows(table: DirectoryTable) -> list[list[str]]:
    return [pa.parquet.read_table(Path(table.path) / p)["relative_path"].to_pylist()
            for p in pa.table(table.delta().get_add_actions(flatten=True))["path"].to_pylist()]


def test_files_with_many_edits_match_the_merge(tmp_path, threads, rewrite_path):
    """A file with more edits than the slicing limit is rebuilt with one `take`: same table
    and change records as a merge."""
    from directory_table.streamed import _MAX_SLICED_EDITS

    merge, table = pair(tmp_path, buckets=1)
    for t in (merge, table):
        t.apply([put(f"f{i:03d}", 1, T0) for i in range(300)])
    at = T0 + timedelta(seconds=1)
    events = ([put(f"f{i:03d}", 2, at) for i in range(0, 300, 2)]
              + [rm(f"f{i:03d}", at) for i in range(1, 300, 10)] + [put("f100x", 3, at)])
    assert len(events) > _MAX_SLICED_EDITS
    for t in (merge, table):
        r = t.apply(events)
        assert (r.updated, r.deleted, r.inserted) == (150, 30, 1)
    same(merge, table, table.version())
    data = _file_rows(table)
    assert all(rows == sorted(rows) for rows in data) and sum(map(len, data)) == 271


def test_new_paths_are_merged_into_a_rewritten_file_in_path_order():
    """`_merged` places new paths by a search in the file's sorted paths (one `take`, no
    sort); a file not written sorted by path is sorted after all."""
    import numpy as np

    from directory_table.schema import TABLE_SCHEMA
    from directory_table.streamed import _edited, _merged

    def rows(paths, size):
        return pa.table({f.name: (pa.array(paths, f.type) if f.name == "relative_path"
                                  else pa.array([size] * len(paths), f.type) if f.name == "size"
                                  else pa.nulls(len(paths), f.type)) for f in TABLE_SCHEMA})

    edits, at = np.array([0, 3, 5]), np.array([1, -1, 0])      # update, delete, update
    for stored in (["b", "d", "f", "h", "j", "l"], ["d", "b", "f", "h", "j", "l"]):
        table, images = rows(stored, 1), rows([stored[5], stored[0]], 2)
        new = rows(["a", "c", "e", "m", "n"], 3)
        got = _merged(table, edits, at, images, new)
        want = pa.concat_tables([_edited(table, edits, at, images), new]).sort_by("relative_path")
        assert got.to_pylist() == want.to_pylist()
        assert got["relative_path"].to_pylist() == sorted(set(stored + ["a", "c", "e", "m", "n"])
                                                          - {stored[3]})


def test_spread_batches_keep_the_file_count_of_the_streamed_table(tmp_path, monkeypatch):
    """The streamed path rewrites a bucket's consecutive rewritten files as one run split
    again into files of the table's size: batches spread over every file, each growing every
    file a little, keep files near the size (they were each split into two half files, the
    file count doubling with such a batch), sorted, and the table as a merge makes it."""
    from directory_table import rewrite as rewrite_module
    from directory_table import streamed

    monkeypatch.setattr(rewrite_module, "MAX_LOADED_ROWS", 0)
    monkeypatch.setattr(streamed, "_RUN_FILES", 3)             # several runs a bucket
    merge, table = pair(tmp_path, buckets=2, target=40 * 64)   # 40 rows per file
    for t in (merge, table):
        for start in range(0, 400, 40):                        # sorted appends: full files
            t.apply([put(f"f{i:04d}", 1, T0) for i in range(start, start + 40)])
        t.optimize(max_files_per_bucket=1)
    before = len(table.delta().file_uris())
    for round_ in range(1, 4):
        at = T0 + timedelta(seconds=round_)
        events = ([put(f"f{i:04d}", 1 + round_, at) for i in range(round_, 400, 7)]
                  + [put(f"f{i:04d}x{round_}", 1, at) for i in range(round_, 400, 9)]
                  + [rm(f"f{i:04d}", at) for i in range(3 + round_, 400, 31)])
        for t in (merge, table):
            t.apply(events)
        same(merge, table, table.version())
        assert_files_sorted(table, max_rows=40)
    rows_now = table.file_count()
    assert len(table.delta().file_uris()) <= -(-rows_now // 40) + 2 * 4  # near full files
    assert len(table.delta().file_uris()) < 2 * before


def test_files_apart_are_not_rewritten_together(tmp_path, monkeypatch):
    """Only files next to each other in their bucket (no other file's path range between
    them) are rewritten as one run: two files apart stay apart, and every file's range stays
    clear of the others'."""
    from directory_table import rewrite as rewrite_module

    monkeypatch.setattr(rewrite_module, "MAX_LOADED_ROWS", 0)
    table = create_cow(str(tmp_path / "t"), "file:///d/", buckets=1,
                                  target_file_size=40 * 64)      # 40 rows per file
    for start in range(0, 400, 40):
        table.apply([put(f"f{i:04d}", 1, T0) for i in range(start, start + 40)])
    at = T0 + timedelta(seconds=1)
    # files 1, 2 and 6 of 10: each gains new paths and outgrows the size
    touched = [*range(45, 115, 2), *range(245, 275, 2)]
    table.apply([put(f"f{i:04d}", 2, at) for i in touched]
                + [put(f"f{i:04d}x", 1, at) for i in touched])
    assert_files_sorted(table, max_rows=40)
    ranges = sorted((rows[0], rows[-1]) for rows in _file_rows(table))
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    untouched = [rows for rows in _file_rows(table) if rows[0] in ("f0120", "f0160", "f0200")]
    assert sorted(len(rows) for rows in untouched) == [40, 40, 40]
