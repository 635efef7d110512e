"""The refresh diff on Arrow tables (no I/O): which listing rows become which events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa

from connectors.base import LISTING_SCHEMA
from connectors.events import EventKind
from volume_stream.refresh import diff_listing

T = datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=UTC)


def table(rows):
    return pa.Table.from_pylist(
        [dict(zip(["relative_path", "size", "last_modified_time", "etag"], r, strict=True))
         for r in rows], schema=LISTING_SCHEMA)


def test_diff_kinds():
    stored = table([("same", 1, T, "a"), ("gone", 1, T, "b"), ("resized", 1, T, "c"),
                    ("retagged", 1, T, "d"), ("coarse_time", 1, T, "e"),
                    ("untagged", 1, T, None)])
    listing = table([("same", 1, T, "a"), ("resized", 2, T, "c"), ("retagged", 1, T, "D"),
                     # object stores list LastModified in whole seconds: same etag, no change
                     ("coarse_time", 1, T.replace(microsecond=0), "e"),
                     # without an etag the time is all we have
                     ("untagged", 1, T + timedelta(seconds=1), None),
                     ("new", 5, T, "n")])
    events, invalid = diff_listing(listing, stored, T)
    got = sorted((e.kind.value, e.relative_path) for e in events)
    assert got == [("CREATED", "new"), ("CREATED", "resized"), ("CREATED", "retagged"),
                   ("CREATED", "untagged"), ("REMOVED", "gone")]
    assert invalid == 0
    assert all(e.event_time == T and e.source_id == "refresh" for e in events)
    assert next(e for e in events if e.kind is EventKind.CREATED and
                e.relative_path == "new").size == 5
