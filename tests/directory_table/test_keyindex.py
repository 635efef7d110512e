"""The key index (`directory_table.keyindex`, DESIGN §4.8): lookups agree with a dict model
over random sequences of applies, also after each reopen; a crash (a SIGKILLed writer, a
half-written file, an old manifest) yields the old consistent version or None, never a wrong
answer; `check` finds planted disagreements; a build from a real directory table's data files
(with deletion masks) agrees with the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.keyindex import LOOKUP_SCHEMA, KeyIndex, live_batches
from directory_table.keyindex_store import MANIFEST, VALUE_COLUMNS, write_run
from directory_table.layout import Layout, bucket_of

T0 = datetime(2025, 1, 1, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def entry(path: str, file: str, pos: int, n: int) -> dict:
    """A row as the model keeps it (deterministic in `n`)."""
    return {"relative_path": path, "file": file, "pos": pos, "size": n,
            "last_modified_time": T0 + timedelta(seconds=n), "etag": f"e{n}",
            "_sequencer": None if n % 3 else f"s{n:08d}", "_event_time": T0,
            "_image_version": n, "_image_timestamp": T0}


def rows_of(entries: list[dict], buckets: int | None = None) -> pa.Table:
    cols = {c: [e[c] for e in entries] for c in ("relative_path", "file", "pos", *VALUE_COLUMNS)}
    table = pa.Table.from_pydict(cols, schema=pa.schema(
        [f for f in LOOKUP_SCHEMA if f.name != "_bucket"]))
    if buckets is not None:
        table = table.append_column("_bucket", pa.array(
            [bucket_of(e["relative_path"], buckets) for e in entries], pa.int32()))
    return table


def as_model(table: pa.Table) -> dict[str, dict]:
    return {r["relative_path"]: {k: v for k, v in r.items() if k != "_bucket"}
            for r in table.to_pylist()}


def assert_agrees(index: KeyIndex, model: dict[str, dict], absent: list[str]) -> None:
    found = index.lookup([*model, *absent])
    assert found.schema == LOOKUP_SCHEMA
    assert found["relative_path"].to_pylist() == sorted(model)
    assert as_model(found) == model
    buckets = index.stats()["buckets"]
    assert found["_bucket"].to_pylist() == [bucket_of(p, buckets) for p in sorted(model)]


# ---------------------------------------------------------------- model-based property test
PATHS = [f"{d}/{f}" for d in ("a", "b/c", "zz") for f in range(40)]
batch = st.tuples(st.lists(st.sampled_from(PATHS), max_size=12),   # overwritten or created
                  st.lists(st.sampled_from(PATHS), max_size=8))    # deleted


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.lists(st.sampled_from(PATHS), max_size=60, unique=True),
       batches=st.lists(batch, min_size=1, max_size=8),
       buckets=st.sampled_from([1, 3]), max_delta=st.sampled_from([0, 5, 1000]),
       rows_hint=st.sampled_from([None, 12_000_000]))  # 2 splits of a bucket
def test_random_applies_agree_with_a_dict_model(initial, batches, buckets, max_delta,
                                                rows_hint):
    counter = iter(range(1, 10**6))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "index"
        model = {p: entry(p, "f0", i, next(counter)) for i, p in enumerate(initial)}
        index = KeyIndex.build(folder, "t1", buckets, 0, [rows_of(list(model.values()),
                                                                  buckets)],
                               rows_hint=rows_hint, max_delta=max_delta, sparse_stride=4,
                               durable=False)
        assert index.version == 0
        assert_agrees(index, model, ["nope", "a/999"])
        for version, (written, deleted) in enumerate(batches, start=1):
            file = f"f{version}"
            added = [entry(p, file, i, next(counter)) for i, p in enumerate(dict.fromkeys(written))]
            removed = [p for p in deleted if p not in written] + list(written)
            for p in removed:
                model.pop(p, None)
            model.update({e["relative_path"]: e for e in added})
            index.apply(version, removed, rows_of(added))
            assert index.version == version
            assert_agrees(index, model, ["nope", *deleted])
            assert index.check(rows_of(list(model.values()))) == []
            reopened = KeyIndex.open(folder, "t1", buckets, max_delta=max_delta,
                                     sparse_stride=4, durable=False)
            assert reopened is not None and reopened.version == version
            assert_agrees(reopened, model, ["nope", *deleted])
            index = reopened  # carry on from the reopened one: its state came from disk
        assert index.delta_size <= max(max_delta, 0) or max_delta >= 1000


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wanted=st.lists(st.sampled_from([*PATHS, "a/", "b/c/7x", "zzz"]), max_size=120))
def test_lookups_by_stretches_and_by_one_pass_find_the_same(wanted):
    """A few paths are searched stretch by stretch of the sparse index, many in one pass over
    the run (`RunFiles.find`): any number of paths, present or not, finds exactly those held."""
    model = {p: entry(p, f"f{i % 3}", i, i + 1) for i, p in enumerate(PATHS[::2])}
    with tempfile.TemporaryDirectory() as tmp:
        index = KeyIndex.build(Path(tmp), "t1", 1, 0, [rows_of(list(model.values()), 1)],
                               sparse_stride=4, durable=False)
        found = index.lookup(wanted)
    held = sorted({p for p in wanted if p in model})
    assert found["relative_path"].to_pylist() == held
    assert as_model(found) == {p: model[p] for p in held}


def test_merging_can_wait_for_maintain(tmp_path):
    index = KeyIndex.build(tmp_path, "t1", 2, 0, [], max_delta=3)
    model = {}
    for v in range(1, 4):
        added = [entry(f"m{v}-{i}", f"f{v}", i, v * 10 + i) for i in range(2)]
        model.update({e["relative_path"]: e for e in added})
        index.apply(v, [], rows_of(added), maintain=False)
    assert index.delta_size == 6
    assert index.maintain() >= 1
    assert index.delta_size <= 3
    assert_agrees(index, model, [])
    assert_agrees(KeyIndex.open(tmp_path, "t1", 2), model, [])


def test_a_quiet_partition_does_not_pin_old_delta_files(tmp_path):
    """A partition that changed once long ago (and so is never the biggest) must not keep
    every later apply's delta file and entries alive."""
    paths = [f"q/{i}" for i in range(400)]
    hot = [p for p in paths if bucket_of(p, 2) == 0]
    cold = next(p for p in paths if bucket_of(p, 2) == 1)
    index = KeyIndex.build(tmp_path, "t1", 2, 0, [], max_delta=20, durable=False)
    model = {cold: entry(cold, "f1", 0, 1)}
    index.apply(1, [], rows_of([model[cold]]))
    for v in range(2, 200):
        e = entry(hot[v % len(hot)], f"f{v}", 0, v)
        model[e["relative_path"]] = e
        index.apply(v, [], rows_of([e]))
    stats = index.stats()
    assert stats["delta_files"] <= 45 and stats["kept_entries"] <= 45, stats
    assert len([n for n in os.listdir(tmp_path) if n.startswith("delta-")]) <= 45
    assert_agrees(index, model, [])
    assert_agrees(KeyIndex.open(tmp_path, "t1", 2), model, [])


def test_apply_refuses_an_old_version(tmp_path):
    index = KeyIndex.build(tmp_path, "t1", 2, 5, [])
    with pytest.raises(ValueError, match="version 5"):
        index.apply(5, [], rows_of([]))
    assert index.lookup(["x"]).num_rows == 0


def test_a_build_with_two_live_rows_for_a_path_is_refused(tmp_path):
    rows = rows_of([entry("a", "f", 0, 1), entry("a", "g", 0, 2)], 1)
    with pytest.raises(ValueError, match="two live rows for 'a'"):
        KeyIndex.build(tmp_path, "t1", 1, 1, [rows])


def test_build_spills_and_splits_with_bounded_memory(tmp_path):
    entries = [entry(f"p/{i:05d}", f"f{i // 100}", i % 100, i) for i in range(2000)]
    batches = [rows_of(entries[s:s + 100], 4) for s in range(0, 2000, 100)]
    index = KeyIndex.build(tmp_path, "t1", 4, 3, batches, memory=1, rows_hint=10**8,
                           sparse_stride=16)
    assert index.stats()["splits"] > 1
    model = {e["relative_path"]: e for e in entries}
    assert_agrees(index, model, ["p/99999"])
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".build")]


# ---------------------------------------------------------------- crashes
def small_index(folder: Path) -> tuple[KeyIndex, dict]:
    model = {e["relative_path"]: e for e in (entry(f"k{i}", "f0", i, i) for i in range(50))}
    index = KeyIndex.build(folder, "t1", 2, 1, [rows_of(list(model.values()), 2)],
                           sparse_stride=8)
    return index, model


def test_an_apply_cut_off_before_its_manifest_leaves_the_old_version(tmp_path):
    index, model = small_index(tmp_path)
    old = (tmp_path / MANIFEST).read_bytes()
    index.apply(2, ["k1", "k2"], rows_of([entry("k1", "f2", 0, 99)]))
    # the crash: the delta file of version 2 was written, its manifest never replaced the old
    (tmp_path / MANIFEST).write_bytes(old)
    (tmp_path / ".manifest-x1y2").write_text('{"format": 1, "version": 2')  # a torn temp file
    reopened = KeyIndex.open(tmp_path, "t1", 2)
    assert reopened is not None and reopened.version == 1
    assert_agrees(reopened, model, [])
    # and it carries on from there: the orphans are not mistaken for state
    reopened.apply(2, ["k3"], rows_of([]))
    del model["k3"]
    assert_agrees(KeyIndex.open(tmp_path, "t1", 2), model, ["k3"])


def test_a_merge_cut_off_before_its_manifest_leaves_the_old_runs(tmp_path):
    index, model = small_index(tmp_path)
    index.apply(2, ["k1"], rows_of([entry("k1", "f2", 0, 99)]))
    model["k1"] = entry("k1", "f2", 0, 99)
    # the crash: a merge wrote a new (here: wrong) run of partition 0 but not the manifest
    write_run(tmp_path, 0, rows_of([entry("k1", "bad", 7, 7)]))
    reopened = KeyIndex.open(tmp_path, "t1", 2)
    assert reopened.version == 2
    assert_agrees(reopened, model, [])
    reopened.merge(0)
    reopened.merge(1)
    names = os.listdir(tmp_path)
    assert len([n for n in names if n.startswith("p")]) == 2, names
    assert_agrees(KeyIndex.open(tmp_path, "t1", 2), model, [])


@pytest.mark.parametrize("damage", ["manifest torn", "run missing", "delta torn", "run torn",
                                    "other table", "other buckets", "no folder"])
def test_a_damaged_or_foreign_index_is_not_opened(tmp_path, damage):
    index, _ = small_index(tmp_path)
    index.apply(2, ["k1"], rows_of([entry("k1", "f2", 0, 99)]))
    names = sorted(os.listdir(tmp_path))
    table_id, buckets, folder = "t1", 2, tmp_path
    if damage == "manifest torn":
        text = (tmp_path / MANIFEST).read_text()
        (tmp_path / MANIFEST).write_text(text[: len(text) // 2])
    elif damage == "run missing":
        os.unlink(tmp_path / next(n for n in names if n.startswith("p")))
    elif damage == "delta torn":
        delta = tmp_path / next(n for n in names if n.startswith("delta-"))
        delta.write_bytes(delta.read_bytes()[:100])
    elif damage == "run torn":
        run = tmp_path / next(n for n in names if n.startswith("p"))
        run.write_bytes(run.read_bytes()[:-100])
    elif damage == "other table":
        table_id = "t2"
    elif damage == "other buckets":
        buckets = 4
    else:
        folder = tmp_path / "missing"
    assert KeyIndex.open(folder, table_id, buckets) is None


WRITER = """
import sys
from pathlib import Path
from tests.directory_table.test_keyindex import KeyIndex, rows_of, version_changes
folder = Path(sys.argv[1])
index = KeyIndex.open(folder, "t1", 3, max_delta=40, sparse_stride=8)
while True:
    v = index.version + 1
    removed, added = version_changes(v)
    index.apply(v, removed, rows_of(added))
"""


def version_changes(version: int) -> tuple[list[str], list[dict]]:
    """What commit `version` changes (deterministic): 10 overwrites or new paths, 3 deletes."""
    rng = np.random.default_rng(version)
    paths = [f"w/{i:03d}" for i in rng.choice(300, 13, replace=False)]
    added = [entry(p, f"v{version}", i, version * 100 + i) for i, p in enumerate(paths[:10])]
    return paths, added


def model_at(version: int) -> dict[str, dict]:
    model = {}
    for v in range(1, version + 1):
        removed, added = version_changes(v)
        for p in removed:
            model.pop(p, None)
        model.update({e["relative_path"]: e for e in added})
    return model


def manifest_version(folder: Path) -> int:
    """The version the manifest names (read while a writer may be replacing it)."""
    return json.loads((folder / MANIFEST).read_text())["version"]


def test_a_writer_killed_mid_apply_leaves_a_consistent_version(tmp_path):
    KeyIndex.build(tmp_path, "t1", 3, 0, [])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=env)
        try:
            start = manifest_version(tmp_path)
            # wait until it has committed a few versions (and merged: max_delta=40), then kill
            while manifest_version(tmp_path) < start + 6:
                assert proc.poll() is None, "the writer died on its own"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        index = KeyIndex.open(tmp_path, "t1", 3)
        assert index is not None
        model = model_at(index.version)
        assert_agrees(index, model, [f"w/{i:03d}" for i in range(300)])
        assert index.check(rows_of(list(model.values()))) == []


# ---------------------------------------------------------------- check
def test_check_finds_planted_disagreements(tmp_path):
    index, model = small_index(tmp_path)
    index.apply(2, ["k1"], rows_of([entry("k1", "f2", 0, 99), entry("new", "f2", 1, 98)]))
    model["k1"], model["new"] = entry("k1", "f2", 0, 99), entry("new", "f2", 1, 98)
    assert index.check(rows_of(list(model.values()))) == []
    live = dict(model)
    live["k5"] = {**live["k5"], "etag": "other"}
    live["k7"] = {**live["k7"], "pos": 70}
    del live["k9"]
    live["extra"] = entry("extra", "f9", 0, 1)
    problems = index.check(rows_of([*live.values(), {**live["k2"], "file": "f7", "pos": 3}]))
    assert problems == [
        "extra: in the table, not in the index",
        "k2: index and table differ: file 'f0' != 'f7', pos 2 != 3",
        "k2: more than one live row in the table",
        "k5: index and table differ: etag 'e5' != 'other'",
        "k7: index and table differ: pos 7 != 70",
        "k9: in the index, not in the table",
    ]


# ---------------------------------------------------------------- from a real table
def test_built_from_a_directory_tables_files_with_deletion_masks(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "vol"), "file:///v/", buckets=4,
                                  deletion_vectors=False)  # the masks here are made by hand
    table.apply([FileEvent.created(f"d/{i:03d}.bin", size=i, last_modified_time=T0,
                                   etag=f"e{i}", event_time=T0) for i in range(200)])
    table.apply([FileEvent.created(f"d/{i:03d}.bin", size=1000 + i, last_modified_time=T0,
                                   etag=f"x{i}", event_time=T0 + timedelta(1))
                  for i in range(0, 200, 7)])
    dt = DeltaTable(table.path)
    actions = pa.table(dt.get_add_actions(flatten=True))
    files = list(zip(actions["path"].to_pylist(), actions["partition._bucket"].to_pylist(),
                     strict=True))

    def read(path):
        return pq.read_table(Path(table.path) / path)

    # a deletion vector of our own on the first file: its rows 1 and 3 (as a mask) and, on
    # the second, positions [0] (as positions) no longer count
    first, second = files[0][0], files[1][0]
    n_first = pq.read_metadata(Path(table.path) / first).num_rows
    mask = np.zeros(n_first, dtype=bool)
    mask[[1, 3]] = True
    dead = {first: mask, second: np.array([0])}
    index = KeyIndex.build(tmp_path / "index", dt.metadata().id, 4, dt.version(),
                           live_batches([(f, b, dead.get(f)) for f, b in files], read),
                           sparse_stride=16)
    snapshot = table.snapshot().to_pylist()
    gone = {read(first)["relative_path"][i].as_py() for i in (1, 3)}
    gone.add(read(second)["relative_path"][0].as_py())
    found = index.lookup([r["relative_path"] for r in snapshot])
    assert found.num_rows == len(snapshot) - len(gone)
    by_path = {r["relative_path"]: r for r in snapshot}
    layout = Layout.of(dt)
    for row in found.to_pylist():
        assert row["relative_path"] not in gone
        stored = read(row["file"]).slice(row["pos"], 1).to_pylist()[0]
        assert stored["relative_path"] == row["relative_path"]
        assert row["_bucket"] == layout.bucket_of(row["relative_path"])
        for c in VALUE_COLUMNS:
            assert row[c] == by_path[row["relative_path"]][c] == stored[c], c
    with pytest.raises(ValueError, match="deletion mask of 2 rows"):
        list(live_batches([(first, 0, np.zeros(2, dtype=bool))], read))

    # bucket by bucket (grouped): the same index, each bucket written as the next starts
    by_bucket = sorted(files, key=lambda fb: fb[1])
    grouped = KeyIndex.build(tmp_path / "grouped", dt.metadata().id, 4, dt.version(),
                             live_batches([(f, b, dead.get(f)) for f, b in by_bucket], read,
                                          group=2), grouped=True)
    assert grouped.lookup([r["relative_path"] for r in snapshot]).equals(found)
    assert grouped.check(pa.concat_tables(index.rows())) == []
    with pytest.raises(ValueError, match="came after other buckets"):
        KeyIndex.build(tmp_path / "mixed", "t", 4, 1, live_batches(
            [(f, b, None) for f, b in [*by_bucket, by_bucket[0]]], read), grouped=True)
