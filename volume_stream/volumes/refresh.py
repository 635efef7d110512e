"""Full-listing reconcile (DESIGN §4.4): list a volume, diff the listing against the directory
table's current version, and turn the difference into events for one `apply`.

The diff is a vectorised join (no Python loop over the listing): Arrow on the driver for
ordinary volumes, Spark when the listing and the table together pass a threshold (millions of
rows), so the join's memory and CPU go to the executors. Only the rows that differ come back and
become `FileEvent`s. It heals missed events and backfills files that existed before the volume
had a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from connectors.base import LISTING_SCHEMA
from connectors.events import EventKind, FileEvent, InvalidPathError

__all__ = ["diff_listing", "diff_listing_spark", "read_listing"]

_KEYS = ["relative_path", "size", "etag", "last_modified_time"]
_STORED = ["size_stored", "etag_stored", "last_modified_time_stored"]
#: kept from the stored row for REMOVED events: a delete found by a listing inherits the
#: sequencer of the image it removes and the later of its time and the listing's, so only an
#: event newer than both can bring the path back
_ORDER = ["_sequencer", "_event_time"]


def read_listing(batches: Iterable[pa.RecordBatch], accept: Callable[[str], bool]) -> pa.Table:
    """Collect a lister's batches into one table, keeping only paths the volume accepts."""
    table = pa.Table.from_batches(list(batches), schema=LISTING_SCHEMA)
    if table.num_rows == 0:
        return table
    keep = pa.array([accept(p) for p in table["relative_path"].to_pylist()], pa.bool_())
    return table.filter(keep)


def _differs(left: pa.Table, col: str) -> pa.ChunkedArray:
    a, b = left[col], left[f"{col}_stored"]
    eq = pc.fill_null(pc.equal(a, b), False)
    return pc.invert(pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b))))


def diff_listing(listing: pa.Table, stored: pa.Table, listed_at: datetime, *,
                 store_times: bool = True) -> tuple[list[FileEvent], int]:
    """Events that make `stored` (relative_path, size, etag, last_modified_time, _sequencer,
    _event_time) equal to `listing`, joined in Arrow. Returns (events, invalid_paths).

    Apply them with `DirectoryTable.apply(events, listed_at_version=<the stored version>)`: they
    are ordered by versions, not by clocks.

    `store_times`: a created file's event time is its modification time, set by the store's
    clock as its events' times are (object stores). With False (local folders, whose mtimes
    anyone can set: `touch -d`, `cp -p`, archives) it is `listed_at`, the clock the local
    listener stamps its events with, so a later event is always newer (DESIGN §4.2)."""
    stored = stored.select(_KEYS + _ORDER).rename_columns(["relative_path"] + _STORED + _ORDER)
    joined = listing.select(_KEYS).join(stored, "relative_path", join_type="full outer")
    return _events(joined, listed_at, store_times)


def diff_listing_spark(spark, listing: pa.Table, stored: pa.Table, listed_at: datetime, *,
                       store_times: bool = True) -> tuple[list[FileEvent], int]:
    """`diff_listing` with the join in Spark; only differing rows return to the driver."""
    from pyspark.sql import functions as F

    left = spark.createDataFrame(listing.select(_KEYS))
    right = spark.createDataFrame(stored.select(_KEYS + _ORDER).rename_columns(
        ["relative_path"] + _STORED + _ORDER))
    joined = left.join(right, "relative_path", "full_outer")
    no_etag = F.col("etag").isNull() | F.col("etag_stored").isNull()
    same = (F.col("size").eqNullSafe(F.col("size_stored"))
            & F.col("etag").eqNullSafe(F.col("etag_stored"))
            & (~no_etag | F.col("last_modified_time").eqNullSafe(
                F.col("last_modified_time_stored"))))
    differing = joined.where(~same).select(*_KEYS, *_STORED, *_ORDER).toArrow()
    return _events(differing.cast(_joined_schema(listing.schema, stored.schema)), listed_at,
                   store_times)


def _joined_schema(listing: pa.Schema, stored: pa.Schema) -> pa.Schema:
    fields = [listing.field(k) for k in _KEYS]
    return pa.schema(fields + [pa.field(f"{f.name}_stored", f.type) for f in fields[1:]]
                     + [stored.field(c) for c in _ORDER])


def _events(joined: pa.Table, listed_at: datetime, store_times: bool,
            ) -> tuple[list[FileEvent], int]:
    present = pc.is_valid(joined["size"])
    was_stored = pc.is_valid(joined["size_stored"])
    # The etag (with the size) decides when both sides have one: object stores report
    # LastModified at a coarser precision in listings than in events, so comparing times
    # would turn every refresh into spurious updates. Without etags, the time decides.
    no_etag = pc.or_(pc.is_null(joined["etag"]), pc.is_null(joined["etag_stored"]))
    changed = pc.or_(pc.or_(_differs(joined, "size"), _differs(joined, "etag")),
                     pc.and_(no_etag, _differs(joined, "last_modified_time")))
    creates = joined.filter(pc.and_(present, pc.or_(pc.invert(was_stored), changed)))
    removes = joined.filter(pc.and_(pc.invert(present), was_stored))
    events: list[FileEvent] = []
    invalid = 0
    cols = creates.select(_KEYS).to_pydict()
    for path, size, etag, lmt in zip(cols["relative_path"], cols["size"], cols["etag"],
                                     cols["last_modified_time"], strict=True):
        try:
            # an object's own time (the store's clock), so later events compare against it;
            # a local file's mtime is no clock: the listing's time is
            when = (lmt or listed_at) if store_times else listed_at
            events.append(FileEvent(EventKind.CREATED, path, size=size, etag=etag,
                                    last_modified_time=lmt, event_time=when,
                                    source_id="refresh"))
        except InvalidPathError:
            invalid += 1
    gone = removes.select(["relative_path", *_ORDER]).to_pydict()
    for path, seq, evt in zip(gone["relative_path"], gone["_sequencer"], gone["_event_time"],
                              strict=True):
        # gone when the listing began: any write older than that is gone too, even one whose
        # event (ms, from the queue) looks newer than the row a listing wrote (whole seconds)
        events.append(FileEvent(EventKind.REMOVED, path, sequencer=seq,
                                event_time=max(evt, listed_at) if evt else listed_at,
                                source_id="refresh"))
    return events, invalid
