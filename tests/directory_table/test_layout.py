"""The bucketed layout at small scale: many buckets and one, same results as an oracle
(a plain dict replayed event by event), and the change feed keeps each change's bucket."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from connectors.events import FileEvent
from directory_table import DirectoryTable, Layout
from directory_table.layout import bucket_of, touched_files

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def t(s):
    return T0 + timedelta(seconds=s)


def put(path, size, at, seq=None):
    return FileEvent.created(path, size=size, etag=f"e{size}", last_modified_time=at,
                             event_time=at, sequencer=seq)


def rm(path, at, seq=None):
    return FileEvent.removed(path, event_time=at, sequencer=seq)


def state(table):
    d = table.snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(d["relative_path"], d["size"], strict=True))


@pytest.fixture(params=[1, 16], ids=["one-bucket", "16-buckets"])
def table(request, tmp_path):
    return DirectoryTable.create(str(tmp_path / "vol"), "file:///data/", buckets=request.param)


def test_bucket_count_is_recorded_and_rows_are_partitioned(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=16)
    table.apply([put(f"f{i}", i, t(1)) for i in range(50)])
    dt = DeltaTable(table.path)
    assert dt.metadata().partition_columns == ["_bucket"]
    assert Layout.of(dt) == Layout(buckets=16, bucketed=True)
    snap = table.snapshot(columns=["relative_path", "_bucket"]).to_pydict()
    assert all(b == bucket_of(p, 16) for p, b in zip(snap["relative_path"], snap["_bucket"],
                                                     strict=True))
    assert len(set(snap["_bucket"])) > 8
    # the public snapshot has no _bucket column
    assert "_bucket" not in table.snapshot().column_names


def test_overwrites_deletes_duplicates_reordered_events_match_an_oracle(table):
    rng = random.Random(7)
    oracle: dict[str, tuple[int, datetime]] = {}     # path -> (size, time) of newest event
    removed: dict[str, datetime] = {}
    paths = [f"dir{i % 5}/file-{i:03d}.bin" for i in range(60)]
    clock = 0
    for _batch in range(12):
        events = []
        for _ in range(rng.randint(1, 25)):
            clock += 1
            path = rng.choice(paths)
            at = t(clock - rng.randint(0, 30))         # reordered: some events are late
            if rng.random() < 0.3:
                events.append(rm(path, at))
            else:
                events.append(put(path, rng.randint(1, 1000), at))
        events += rng.sample(events, k=min(3, len(events)))          # duplicates
        table.apply(events)
        for e in sorted(events, key=lambda e: e.event_time):         # stable: arrival order
            current = oracle.get(e.relative_path)
            gone = removed.get(e.relative_path)
            if e.kind.name == "CREATED":
                if (current and e.event_time <= current[1]) or (gone and e.event_time <= gone):
                    continue
                oracle[e.relative_path] = (e.size, e.event_time)
                removed.pop(e.relative_path, None)
            elif current and e.event_time > current[1]:
                del oracle[e.relative_path]
                removed[e.relative_path] = e.event_time
            elif not current and (gone is None or e.event_time > gone):
                removed[e.relative_path] = e.event_time  # a delete is remembered either way
    assert state(table) == {p: v[0] for p, v in oracle.items()}


def test_a_delete_that_arrives_before_its_create_is_remembered(table):
    """A queue redelivers out of order: the REMOVED of a file arrives (and is committed) before
    the CREATED it followed. The delete leaves a tombstone although the table never held the
    file, so the late, older CREATED does not bring back a file that is gone (found by the
    fault scenario: a SIGKILLed daemon's unacknowledged CREATED came back after the delete)."""
    r = table.apply([rm("gone.txt", t(5))])
    assert r.version is None                                          # nothing to delete yet
    r = table.apply([put("gone.txt", 1, t(3))])                       # the late create
    assert (r.version, r.ignored) == (None, 1)
    assert state(table) == {}
    seq = table.apply([rm("s.txt", t(1), seq="00B0")])                 # S3 sequencers
    assert seq.version is None
    assert table.apply([put("s.txt", 1, t(9), seq="00A0")]).version is None
    assert table.apply([put("s.txt", 2, t(0), seq="00C0")]).version == 1   # newer: it is back
    assert state(table) == {"s.txt": 2}


def test_tombstones_across_buckets_block_late_creates(table):
    paths = [f"p{i}" for i in range(20)]
    table.apply([put(p, 1, t(1)) for p in paths])
    table.apply([rm(p, t(5)) for p in paths])
    assert state(table) == {}
    tomb = DeltaTable(table.tombstones_path)
    if Layout.of(DeltaTable(table.path)).buckets > 1:
        assert len({a["partition._bucket"] for a in
                    pa.table(tomb.get_add_actions(flatten=True)).to_pylist()}) > 1
    r = table.apply([put(p, 2, t(3)) for p in paths])                 # older than the deletes
    assert (r.version, r.ignored) == (None, 20)
    r = table.apply([put(p, 3, t(9)) for p in paths[:7]])             # newer: back again
    assert r.inserted == 7
    assert state(table) == {p: 3 for p in paths[:7]}


def test_changes_keep_the_bucket_and_filter_by_bucket(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=8)
    table.apply([put(f"f{i}", 1, t(1)) for i in range(40)])
    table.apply([put(f"f{i}", 2, t(2)) for i in range(0, 40, 3)] + [rm("f1", t(2))])
    cdf = table.changes(0, 2)
    assert cdf.column_names[-1] == "_bucket"
    assert all(b == bucket_of(p, 8) for p, b in zip(cdf["relative_path"].to_pylist(),
                                                    cdf["_bucket"].to_pylist(), strict=True))
    some = sorted(set(cdf["_bucket"].to_pylist()))[:3]
    part = table.changes(0, 2, buckets=some)
    expected = cdf.filter(pa.compute.is_in(cdf["_bucket"], value_set=pa.array(some, pa.int32())))
    key = ["relative_path", "_commit_version", "_change_type"]
    assert part.select(key).sort_by([(k, "ascending") for k in key]) == \
        expected.select(key).sort_by([(k, "ascending") for k in key])
    assert table.changes(0, 2, buckets=[]).num_rows == 0


def test_lookup_reads_only_the_touched_buckets_files(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=32)
    for start in range(0, 3000, 500):        # sorted appends: disjoint path ranges per file
        table.apply([put(f"f{i:05d}", 1, t(1)) for i in range(start, start + 500)])
    dt = DeltaTable(table.path)
    total = len(dt.file_uris())
    files = touched_files(dt, Layout.of(dt), ["f00042", "f02999"])
    assert 1 <= len(files) <= 2 < total
    r = table.apply([put("f00042", 9, t(2)), put("f02999", 9, t(2)), put("new", 1, t(2))])
    assert (r.updated, r.inserted) == (2, 1)
    assert state(table)["f00042"] == 9


def test_huge_batch_is_planned_in_bucket_groups(tmp_path, monkeypatch):
    import directory_table.table as table_module

    monkeypatch.setattr(table_module, "_LOOKUP_GROUP", 50)    # many groups at a small scale
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=8)
    table.apply([put(f"f{i}", 1, t(1)) for i in range(300)])
    base = table.version()
    table.apply([put("f5", 7, t(3))])                        # changed after the listing
    listed = [put(f"f{i}", 2, t(2)) for i in range(0, 300, 2)] + \
        [FileEvent.removed(f"f{i}", event_time=t(2)) for i in range(1, 300, 4)] + \
        [put(f"g{i}", 1, t(2)) for i in range(100)]
    r = table.apply(listed, listed_at_version=base)
    # f5's removal is left out: the table changed it after the listing's version
    assert (r.updated, r.deleted, r.inserted, r.ignored) == (150, 74, 100, 1)
    s = state(table)
    assert s["f5"] == 7 and s["f2"] == 2 and "f1" not in s and s["g99"] == 1
    assert len(s) == 300 - 74 + 100


def test_a_batch_past_the_lookup_group_takes_the_rewrite_path(tmp_path, monkeypatch):
    """The lookup group bounds a merge's stored rows; the rewrite path holds a batch's stored
    rows anyway, so a huge batch is rewritten too (a 600k-event batch's merge into 10M rows
    took minutes), in one commit with the same result."""
    import directory_table.table as table_module

    monkeypatch.setattr(table_module, "_LOOKUP_GROUP", 50)
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=4,
                                  deletion_vectors=False)
    table.apply([put(f"f{i:03d}", 1, t(1)) for i in range(300)])
    r = table.apply([put(f"f{i:03d}", 2, t(2)) for i in range(0, 300, 3)]
                    + [put(f"g{i:03d}", 1, t(2)) for i in range(120)])
    assert (r.updated, r.inserted) == (100, 120)
    assert DeltaTable(table.path).history(1)[0]["operationParameters"].get("rewrite") \
        == "volume-stream"
    s = state(table)
    assert len(s) == 420 and s["f003"] == 2 and s["f004"] == 1 and s["g119"] == 1


def test_a_batch_knows_the_buckets_of_its_paths():
    from directory_table.batch import Batch

    events = [put(f"p{i % 70}/{i}", 1, t(i % 3)) for i in range(200)] + [put("p0/0", 2, t(9))]
    batch = Batch.of(events)
    paths = batch.paths()
    paths_of = dict(zip(batch.latest.tolist(), paths, strict=True))
    for count in (1, 16):
        buckets = batch.buckets(count)
        assert buckets[batch.latest].tolist() == [bucket_of(p, count) for p in paths]
        assert (buckets >= 0).sum() == len(paths) == 200       # the repeated path once
        by_bucket = batch.by_bucket(count)
        assert sorted(p for ps in by_bucket.values() for p in ps) == sorted(paths)
        assert all(ps == sorted(ps) and {bucket_of(p, count) for p in ps} == {b}
                   for b, ps in by_bucket.items())
        some = batch.latest[::3][::-1]
        ordered = [paths_of[r] for r in some[batch.laid_out(count, some)]]
        assert ordered == sorted(ordered, key=lambda p: (bucket_of(p, count), p))


def test_snapshot_of_some_buckets(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=8)
    table.apply([put(f"f{i}", i, t(1)) for i in range(100)])
    some = [1, 5]
    part = table.snapshot(columns=["relative_path"], buckets=some)["relative_path"].to_pylist()
    assert sorted(part) == sorted(f"f{i}" for i in range(100) if bucket_of(f"f{i}", 8) in some)
    assert 0 < len(part) < 100


def test_paths_with_quotes_and_long_shared_prefixes(table):
    prefix = "a/very/long/shared/prefix/that/outlasts/statistics/truncation/"
    paths = [prefix + "it's.txt", prefix + "plain.txt", "o'hara/x.bin", prefix + "z" * 40]
    table.apply([put(p, 1, t(1)) for p in paths])
    r = table.apply([put(paths[0], 2, t(2)), rm(paths[2], t(2)), put(paths[3], 5, t(2))])
    assert (r.updated, r.deleted) == (2, 1)
    assert state(table) == {paths[0]: 2, paths[1]: 1, paths[3]: 5}
    assert table.apply([put(paths[2], 9, t(1))]).version is None    # tombstone holds


def test_truncated_max_statistics_still_bracket_longer_paths():
    from directory_table.layout import _brackets

    stats_max = "p" * 32                       # delta-rs may cut a long max to a prefix
    assert _brackets(["p" * 40], "a", stats_max)
    assert not _brackets(["q"], "a", stats_max)
    assert not _brackets(["p" * 40], "a", "p" * 10)     # short max: exact
    assert _brackets(["b"], None, None) and not _brackets([], None, None)


def test_folder_batches_rewrite_only_the_files_holding_their_paths(tmp_path):
    """Path locality (DESIGN §4.7): the hash scatters a folder over the buckets, but inside a
    bucket its paths are one run of rows, so overwriting a whole folder, or adding a new one,
    rewrites about one file per bucket, whatever the table's size."""
    import json
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///d/", buckets=4,
                                  deletion_vectors=False,
                                  target_file_size=64 * 64)     # files of ~64 rows
    table.apply([put(f"d{i // 100:03d}/f{i:05d}", 1, t(1)) for i in range(6000)])
    table.optimize()                                            # sorted files of the target size
    files_before = len(DeltaTable(table.path).file_uris())
    assert files_before >= 60

    def rewritten(version):
        entry = tmp_path / "vol" / "directory" / "_delta_log" / f"{version:020d}.json"
        actions = [json.loads(line) for line in entry.read_text().splitlines()]
        return [unquote(a["remove"]["path"]) for a in actions if "remove" in a]

    folder = [put(f"d017/f{i:05d}", 2, t(2)) for i in range(1700, 1800)]     # a folder again
    fresh = [put(f"e{i // 100:03d}/g{i:05d}", 3, t(2)) for i in range(200)]  # 2 new folders
    r = table.apply(folder + fresh)
    assert (r.updated, r.inserted) == (100, 200)
    removed = rewritten(r.version)
    assert len(removed) <= 3 * 4, removed     # per bucket: 1-2 for the folder, 1 for the new
    rows = sum(pq.read_metadata(tmp_path / "vol" / "directory" / f).num_rows for f in removed)
    assert rows <= 3 * 4 * 64 + 200           # not the table's 6,000
    assert state(table)["d017/f01750"] == 2 and state(table)["e001/g00150"] == 3
