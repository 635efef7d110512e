"""The columnar planner (`directory_table.batch`, `directory_table.planner`) against the
per-event planner it replaced (`reference_planner`, kept verbatim): the same random batches,
stored rows and tombstones give the same plan, event for event; and a real directory table fed
random batches ends in the state the reference planner gives a model of it."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.events import EventKind, FileEvent, is_newer
from directory_table import Batch, DirectoryTable, plan_changes
from directory_table import table as table_module
from directory_table.batch import newer
from directory_table.schema import TS
from tests.directory_table import reference_planner as ref

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMES = [T0 + timedelta(seconds=s) for s in range(4)]
#: unicode, spaces and '+', nested folders, a folder marker (dropped)
PATHS = ["a.txt", "dir/b.csv", "dir/c d+e.bin", "é/ß.txt", "日本/文件.txt", "emoji/😀.png",
         "x/y/z", "dir/"]
FILES = [p for p in PATHS if not p.endswith("/")]
#: none, empty (counts as none), hex of mixed case and length that compare equal padded
#: ("1a" = "1A0"), and non-ASCII ones (Python upper-cases 'ß' to 'SS' and 'é' to 'É', which
#: sort apart from their UTF-8 bytes: compared one by one)
SEQS = st.one_of(st.none(), st.sampled_from(["", "1", "1a", "1A", "1a0", "1A00", "2", "b", "B",
                                             "0F", "ß", "SS", "ST", "é", "É", "é1"]),
                 st.text("0129abcAF", min_size=1, max_size=4))
ROW_SCHEMA = pa.schema([("relative_path", pa.string()), ("size", pa.int64()),
                        ("etag", pa.string()), ("last_modified_time", TS),
                        ("_sequencer", pa.string()), ("_event_time", TS),
                        ("_image_version", pa.int64())])
TOMB_SCHEMA = pa.schema([("relative_path", pa.string()), ("_sequencer", pa.string()),
                         ("_event_time", TS), ("deleted_version", pa.int64())])


def events_of(times):
    """Events over `PATHS`: creates (size, etag, LastModified may repeat the stored image)
    and removes, with or without sequencers, event times drawn from `times`."""
    created = st.builds(
        lambda p, size, etag, lmt, seq, at: FileEvent(
            EventKind.CREATED, p, size=size, etag=etag, last_modified_time=lmt, sequencer=seq,
            event_time=at),
        st.sampled_from(PATHS), st.integers(0, 1), st.sampled_from([None, "e1", "e2"]),
        st.sampled_from([None, *TIMES[:2]]), SEQS, times)
    removed = st.builds(lambda p, seq, at: FileEvent.removed(p, sequencer=seq, event_time=at),
                        st.sampled_from(PATHS), SEQS, times)
    return st.lists(st.one_of(created, created, removed), max_size=30)


stored_rows = st.lists(st.tuples(
    st.sampled_from(FILES), st.one_of(st.none(), st.integers(0, 1)),
    st.sampled_from([None, "e1"]), st.sampled_from([None, *TIMES[:2]]), SEQS,
    st.sampled_from([None, *TIMES]), st.one_of(st.none(), st.integers(0, 4))), max_size=8)
tombstones = st.lists(st.tuples(
    st.sampled_from(FILES), SEQS, st.sampled_from([None, *TIMES]),
    st.one_of(st.none(), st.integers(0, 4))), max_size=6)


def reference(events, stored: pa.Table, tombs: pa.Table, base_version):
    latest, dropped = ref.newest_per_path(events)
    rows = ref.stored_rows(stored)
    missing = [p for p in latest if p not in rows]
    known = ref.stored_rows(tombs.filter(pc.is_in(tombs["relative_path"], pa.array(
        missing, pa.string())))) if missing else {}
    return latest, dropped, ref.plan_changes(latest, rows, known, base_version)


def columnar(events, stored: pa.Table, tombs: pa.Table, base_version):
    batch = Batch.of(events)
    asked = []

    def find(paths):
        asked.append(paths)
        return tombs.filter(pc.is_in(tombs["relative_path"], pa.array(paths, pa.string())))

    return batch, plan_changes(batch, batch.latest, stored, find, base_version), asked


def outcome(run):
    """(result, None) or (None, the exception's type)."""
    try:
        return run(), None
    except Exception as exc:
        return None, type(exc)


def check_same(events, stored, tombs, base_version):
    stored = pa.Table.from_pylist([dict(zip(ROW_SCHEMA.names, r, strict=True)) for r in stored],
                                  schema=ROW_SCHEMA)
    tombs = pa.Table.from_pylist([dict(zip(TOMB_SCHEMA.names, r, strict=True)) for r in tombs],
                                 schema=TOMB_SCHEMA)
    want, want_error = outcome(lambda: reference(events, stored, tombs, base_version))
    got, got_error = outcome(lambda: columnar(events, stored, tombs, base_version))
    assert got_error is want_error
    if want_error:
        return
    latest, dropped, plan = want
    batch, new, asked = got

    def ids(rows):  # the very events, in the same order
        return [id(events[i]) for i in rows]

    assert ids(batch.latest) == [id(e) for e in latest.values()]
    assert batch.dropped == dropped
    assert ids(new.inserts) == [id(e) for e in plan.inserts]
    assert ids(new.updates) == [id(e) for e in plan.updates]
    assert ids(new.deletes) == [id(e) for e in plan.deletes]
    assert ids(new.remembered) == [id(e) for e in plan.remembered]
    assert (new.ignored, new.unchanged, new.empty) == (plan.ignored, plan.unchanged, plan.empty)
    missing = [p for p in latest if p not in ref.stored_rows(stored)]
    assert asked == ([missing] if missing else [])


@settings(max_examples=400, deadline=None)
@given(events=events_of(st.sampled_from(TIMES)), stored=stored_rows, tombs=tombstones,
       base_version=st.one_of(st.none(), st.integers(0, 4)))
def test_columnar_plan_matches_per_event_plan(events, stored, tombs, base_version):
    """Duplicates, reordered and stale events, sequencers against times, deletes after
    creates, overwrites of the same or another size or etag, listings against versions."""
    check_same(events, stored, tombs, base_version)


@settings(max_examples=150, deadline=None)
@given(events=events_of(st.sampled_from([None, *TIMES])), stored=stored_rows, tombs=tombstones,
       base_version=st.one_of(st.none(), st.integers(0, 4)))
def test_events_without_a_time_fail_or_pass_as_before(events, stored, tombs, base_version):
    """An event built without a time cannot be ordered by time: where the per-event planner
    raised, the columnar one raises the same error; elsewhere they agree."""
    check_same(events, stored, tombs, base_version)


SEQ_VALUES = [None, "", "1", "1a", "1A", "1a0", "1A00", "2", "b", "B", "0F", "ß", "SS", "ST", "é",
              "É", "é1"]


def test_newer_orders_every_pair_as_is_newer():
    """Every pair of sequencers (none, empty, mixed case and length, non-ASCII) and of event
    times (none, equal, older, newer): `newer` on columns says what `is_newer` says, and
    raises where it raises."""
    times = [None, TIMES[0], TIMES[1]]
    pairs = [(a, ta, b, tb) for a in SEQ_VALUES for b in SEQ_VALUES for ta in times
             for tb in times]
    fine, failing = [], []
    for pair in pairs:
        (fine if outcome(lambda p=pair: is_newer(*p))[1] is None else failing).append(pair)
    assert failing  # an event without a time against a row with one, without sequencers

    def columns(rows):
        return [pa.array(list(c), t) for c, t in zip(
            zip(*rows, strict=True), (pa.string(), TS, pa.string(), TS), strict=True)]

    assert newer(*columns(fine), needed=np.ones(len(fine), dtype=bool)).tolist() == [
        is_newer(*p) for p in fine]
    for pair in failing:
        with pytest.raises(TypeError):
            newer(*columns([pair]), needed=np.ones(1, dtype=bool))
        # where the comparison is not needed nothing is compared, so nothing raises
        assert newer(*columns([pair]), needed=np.zeros(1, dtype=bool)).tolist() == [0]


def test_newest_of_two_or_three_events_of_a_path_as_before():
    """Two or three events of one path, of every pair of sequencers and times, in both
    orders: the same newest event as the per-event fold."""
    kinds = [(s, t) for s in SEQ_VALUES for t in TIMES[:2]]
    for (s1, t1), (s2, t2) in itertools.product(kinds, kinds):
        for extra in ([], [FileEvent.removed("p", sequencer=None, event_time=TIMES[1])]):
            events = [FileEvent.removed("p", sequencer=s1, event_time=t1),
                      FileEvent.created("p", size=1, last_modified_time=T0, sequencer=s2,
                                        event_time=t2), *extra]
            latest, dropped = ref.newest_per_path(events)
            batch = Batch.of(events)
            assert [events[i] for i in batch.latest] == [latest["p"]]
            assert batch.dropped == dropped


def test_a_path_of_undecodable_bytes_is_refused_before_anything_is_written(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "t"), "file:///d/")
    bad = FileEvent.created("d/bad-\udcff", size=1, last_modified_time=T0, event_time=T0)
    with pytest.raises(UnicodeEncodeError):
        table.apply([FileEvent.created("ok", size=1, last_modified_time=T0), bad])
    assert table.version() == 0


# ---------------------------------------------------------------- end states
class Model:
    """A directory table as plain dicts, moved by the reference planner."""

    def __init__(self):
        self.rows: dict[str, ref.StoredRow] = {}
        self.tombs: dict[str, ref.StoredRow] = {}
        self.version = 0

    def apply(self, events, listed_at_version):
        latest, dropped = ref.newest_per_path(events)
        missing = [p for p in latest if p not in self.rows]
        plan = ref.plan_changes(latest, self.rows,
                                {p: self.tombs[p] for p in missing if p in self.tombs},
                                listed_at_version)
        counts = (len(plan.inserts), len(plan.updates), len(plan.deletes),
                  plan.ignored + dropped, plan.unchanged)
        version = self.version if plan.empty else self.version + 1
        for e in plan.deletes + plan.remembered:
            self.tombs[e.relative_path] = ref.StoredRow(None, None, None, e.sequencer,
                                                        e.event_time, version)
        for e in plan.inserts + plan.updates:
            self.rows[e.relative_path] = ref.StoredRow(e.size, e.etag, e.last_modified_time,
                                                       e.sequencer, e.event_time, version)
        for e in plan.deletes:
            del self.rows[e.relative_path]
        self.version = version
        return (None if plan.empty else version, *counts)


def table_rows(table: DirectoryTable) -> dict:
    snap = table.snapshot()
    assert snap["url"].to_pylist() == ["file:///d/" + p for p in snap["relative_path"].to_pylist()]
    return ref.stored_rows(snap)


def tomb_rows(table: DirectoryTable) -> dict:
    return ref.stored_rows(DeltaTable(table.tombstones_path).to_pyarrow_table())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.tuples(events_of(st.sampled_from(TIMES)), st.booleans()),
                        min_size=1, max_size=5),
       merge=st.booleans(), group=st.sampled_from([200_000, 2]))
def test_table_ends_where_the_reference_planner_puts_it(tmp_path_factory, monkeypatch, batches,
                                                       merge, group):
    """Random batches into a real table (rewrite or merge write path; huge batches planned a
    group of buckets at a time, here groups of ~2 paths): after each batch, the same result,
    rows and tombstones as the reference planner gives a model."""
    monkeypatch.setattr(table_module, "_LOOKUP_GROUP", group)
    table = DirectoryTable.create(str(tmp_path_factory.mktemp("t")), "file:///d/", buckets=3)
    table.rewrite_min_events = None if merge else 1
    model = Model()
    for i, (events, listed) in enumerate(batches):
        base = max(0, model.version - i % 2) if listed else None
        r = table.apply(events, listed_at_version=base)
        assert (r.version, r.inserted, r.updated, r.deleted, r.ignored, r.unchanged) == \
            model.apply(events, base)
        assert table_rows(table) == model.rows
        assert tomb_rows(table) == model.tombs
