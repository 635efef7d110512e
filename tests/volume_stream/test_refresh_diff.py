"""The refresh diff on Arrow tables (no I/O): which listing rows become which events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.events import InvalidPathError, valid_paths, validate_relative_path
from connectors.protocols import LISTING_SCHEMA
from volume_stream.volumes.refresh import diff_listing

T = datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)


def table(rows):
    return pa.Table.from_pylist(
        [dict(zip(["relative_path", "size", "last_modified_time", "etag"], r, strict=True))
         for r in rows], schema=LISTING_SCHEMA)


def kinds(events: pa.Table) -> list[tuple[str, str]]:
    """(kind, path) of a diff's events, sorted."""
    return sorted(("CREATED" if e["created"] else "REMOVED", e["relative_path"])
                  for e in events.to_pylist())


def with_order(stored):
    n = stored.num_rows
    return (stored.append_column("_sequencer", pa.array(["0A"] * n, pa.string()))
            .append_column("_event_time", pa.array([T - timedelta(hours=1)] * n,
                                                   pa.timestamp("us", tz="UTC"))))


def test_diff_kinds():
    stored = with_order(table([("same", 1, T, "a"), ("gone", 1, T, "b"), ("resized", 1, T, "c"),
                               ("retagged", 1, T, "d"), ("coarse_time", 1, T, "e"),
                               ("untagged", 1, T, None)]))
    listing = table([("same", 1, T, "a"), ("resized", 2, T, "c"), ("retagged", 1, T, "D"),
                     # object stores list LastModified in whole seconds: same etag, no change
                     ("coarse_time", 1, T.replace(microsecond=0), "e"),
                     # without an etag the time is all we have
                     ("untagged", 1, T + timedelta(seconds=1), None),
                     ("new", 5, T, "n")])
    events, invalid = diff_listing(listing, stored, T + timedelta(minutes=5))
    assert kinds(events) == [("CREATED", "new"), ("CREATED", "resized"), ("CREATED", "retagged"),
                             ("CREATED", "untagged"), ("REMOVED", "gone")]
    assert invalid == 0
    # a CREATED carries the object's own time; a REMOVED the sequencer of the image it removes
    # and the listing's time (the file was gone when the listing began), so only an event newer
    # than both can bring the path back
    by_path = {e["relative_path"]: e for e in events.to_pylist()}
    gone = by_path["gone"]
    assert (gone["_sequencer"], gone["_event_time"]) == ("0A", T + timedelta(minutes=5))
    assert gone["size"] is None and not gone["created"]
    assert by_path["untagged"]["_event_time"] == T + timedelta(seconds=1)
    assert by_path["new"]["size"] == 5 and by_path["new"]["_sequencer"] is None


def test_a_late_event_of_an_image_a_refresh_removed_does_not_bring_it_back(tmp_path):
    """A listing reports LastModified in whole seconds, the queue's event of the same write
    carries milliseconds: a file inserted by one refresh and found gone by the next must not
    come back when the queue (re)delivers that write's event late (after a crash, say). Found
    by the fault scenario: APPEND_ONLY showed such images twice."""
    from connectors.events import FileEvent
    from directory_table import DirectoryTable

    dt = DirectoryTable.create(str(tmp_path / "vol"), "s3://b/", buckets=4)
    written = T.replace(microsecond=0)  # the listing's LastModified of the write at T
    listing = table([("f", 1, written, "e1")])
    events, _ = diff_listing(listing, dt.snapshot(), T + timedelta(seconds=5))
    assert dt.apply(events, listed_at_version=0).version == 1
    stored = dt.snapshot(columns=["relative_path", "size", "last_modified_time", "etag",
                                  "_sequencer", "_event_time"])
    events, _ = diff_listing(table([]), stored, T + timedelta(minutes=1))  # deleted meanwhile
    assert dt.apply(events, listed_at_version=1).version == 2
    late = FileEvent.created("f", size=1, etag="e1", last_modified_time=T, event_time=T)
    assert dt.apply([late]).version is None  # the write the listing already saw gone
    newer = FileEvent.created("f", size=2, etag="e2", last_modified_time=T,
                              event_time=T + timedelta(minutes=2))
    assert dt.apply([newer]).version == 3  # written after the listing: back


_paths = st.sampled_from([f"p{i}" for i in range(12)] + ["d/x", "d/y", "é/ü"])
_row = st.tuples(st.integers(0, 3), st.sampled_from(["a", "b", None]), st.integers(0, 2))


@settings(max_examples=150, deadline=None)
@given(stored=st.dictionaries(_paths, _row, max_size=12),
       listed=st.dictionaries(_paths, _row, max_size=12), chunks=st.integers(1, 3))
def test_diff_is_the_plain_rule_on_any_listing(stored, listed, chunks):
    """The hash-lookup diff against a dict oracle of the rule: a listed path is CREATED when
    not stored or changed (size, etag, or the time when an etag is missing); a stored path
    not listed is REMOVED."""
    def rows(d):
        return [(p, size, T + timedelta(seconds=s), etag) for p, (size, etag, s) in d.items()]

    listing = table(rows(listed))
    if chunks > 1 and listing.num_rows:  # listings arrive in batches
        step = max(1, listing.num_rows // chunks)
        listing = pa.concat_tables([listing.slice(i, step)
                                    for i in range(0, listing.num_rows, step)])
    events, _ = diff_listing(listing, with_order(table(rows(stored))), T)
    got = kinds(events)
    want = []
    for p, (size, etag, s) in listed.items():
        old = stored.get(p)
        if old is None or old[0] != size or old[1] != etag or (
                (etag is None or old[1] is None) and old[2] != s):
            want.append(("CREATED", p))
    want += [("REMOVED", p) for p in stored if p not in listed]
    assert got == sorted(want)


_path_chars = st.sampled_from(["a", "é", "/", ".", "\\", "\x00", "\x1f", "\x7f", " ", "+", "\n"])


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(st.text(_path_chars, max_size=8), max_size=20))
def test_paths_are_checked_on_the_column_as_one_by_one(paths):
    """`valid_paths` (a regex over the column, the few suspects checked one by one) takes
    exactly the paths `validate_relative_path` takes."""
    def one(path: str) -> bool:
        try:
            validate_relative_path(path)
            return True
        except InvalidPathError:
            return False

    assert valid_paths(pa.array(paths, pa.string())).tolist() == [one(p) for p in paths]


def test_unsafe_paths_and_sizes_are_counted_not_listed():
    listing = table([("ok", 1, T, "a"), ("a/../b", 1, T, "b"), ("c\\d", 1, T, "c"),
                     ("neg", -1, T, "d"), ("d/", 0, T, None)])
    events, invalid = diff_listing(listing, with_order(table([])), T)
    assert kinds(events) == [("CREATED", "d/"), ("CREATED", "ok")] and invalid == 3
