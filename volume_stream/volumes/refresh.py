"""Full-listing reconcile (DESIGN §4.4): list a volume, diff the listing against the directory
table's current version, and turn the difference into events for one `apply`.

The diff is a vectorised join (no Python loop over the listing): Arrow on the driver for
ordinary volumes, bucket group by bucket group (`diff_by_buckets`: a bucketed directory table
is read a group of buckets at a time, so the stored rows are never all in memory next to the
listing), Spark when the listing passes a threshold (millions of rows), so the join's memory
and CPU go to the executors. Only the rows that differ come back and
become `FileEvent`s. It heals missed events and backfills files that existed before the volume
had a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from connectors.base import LISTING_SCHEMA
from connectors.events import EventKind, FileEvent, InvalidPathError
from directory_table.layout import bucket_array

__all__ = ["ROWS_PER_BUCKET_GROUP", "Progress", "counted", "diff_by_buckets", "diff_listing",
           "diff_listing_spark", "group_size_for", "read_listing"]

#: `progress(stage, listed, changed)`: stage is "listing", "diffing" or "committing"
Progress = Callable[[str, int, int], None]

_KEYS = ["relative_path", "size", "etag", "last_modified_time"]
_STORED = ["size_stored", "etag_stored", "last_modified_time_stored"]
#: kept from the stored row for REMOVED events: a delete found by a listing inherits the
#: sequencer of the image it removes and the later of its time and the listing's, so only an
#: event newer than both can bring the path back
_ORDER = ["_sequencer", "_event_time"]


#: a refresh diffs bucket groups holding about this many rows each (`group_size_for`)
ROWS_PER_BUCKET_GROUP = 1_000_000


def group_size_for(rows: int, buckets: int) -> int:
    """Buckets per group so that a group holds about `ROWS_PER_BUCKET_GROUP` of `rows`."""
    groups = max(1, -(-rows // ROWS_PER_BUCKET_GROUP))
    return max(1, -(-buckets // groups))


def read_listing(batches: Iterable[pa.RecordBatch], accept: Callable[[str], bool] | None,
                 *, recursive: bool = True) -> pa.Table:
    """Collect a lister's batches into one table, keeping only paths the volume accepts:
    `accept(path)` per path, or, with `accept=None` (a volume without include/exclude globs),
    the same rule vectorised (no folder markers; no nested paths unless `recursive`)."""
    table = pa.Table.from_batches(list(batches), schema=LISTING_SCHEMA)
    if table.num_rows == 0:
        return table
    paths = table["relative_path"]
    if accept is None:
        drop = pc.ends_with(paths, "/")
        if not recursive:
            drop = pc.or_(drop, pc.match_substring(paths, "/"))
        return table.filter(pc.invert(drop))
    keep = pa.array([accept(p) for p in paths.to_pylist()], pa.bool_())
    return table.filter(keep)


def counted(batches: Iterable[pa.RecordBatch], progress: Progress | None,
            ) -> Iterator[pa.RecordBatch]:
    """The lister's batches, reporting the running count of listed rows."""
    listed = 0
    for batch in batches:
        listed += batch.num_rows
        if progress is not None:
            progress("listing", listed, 0)
        yield batch


def diff_by_buckets(listing: pa.Table, read_stored: Callable[[list[int] | None], pa.Table],
                    buckets: int, listed_at: datetime, *, store_times: bool = True,
                    group_size: int = 16, progress: Progress | None = None,
                    ) -> tuple[list[FileEvent], int]:
    """`diff_listing`, a group of `group_size` buckets at a time: the listing's rows of the
    group (by the table's bucket hash of their path) against `read_stored(group)`, the stored
    rows of those buckets only (`read_stored(None)`: all of them, when there is one group).
    The events are those of one whole diff; only one group's stored rows are held at once."""
    events: list[FileEvent] = []
    invalid = 0
    if buckets <= 1 or group_size >= buckets:
        events, invalid = diff_listing(listing, read_stored(None), listed_at,
                                       store_times=store_times)
        if progress is not None:
            progress("diffing", listing.num_rows, len(events))
        return events, invalid
    of_path = bucket_array(listing["relative_path"].to_pylist(), buckets)
    for start in range(0, buckets, group_size):
        stop = min(buckets, start + group_size)
        part = listing.filter(pc.and_(pc.greater_equal(of_path, start), pc.less(of_path, stop)))
        found, bad = diff_listing(part, read_stored(list(range(start, stop))), listed_at,
                                  store_times=store_times)
        events.extend(found)
        invalid += bad
        if progress is not None:
            progress("diffing", listing.num_rows, len(events))
    return events, invalid


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
    left = listing.select(_KEYS)
    joined = _same_paths(left, stored)
    if joined is None:
        joined = left.join(stored, "relative_path", join_type="full outer")
    return _events(joined, listed_at, store_times)


def _same_paths(left: pa.Table, stored: pa.Table) -> pa.Table | None:
    """The join when both sides hold the same paths (a refresh of a volume with no file added
    or removed, the usual case): both sorted by path, side by side. A sort of each side costs
    less than a hash join of millions of rows. None when the paths differ."""
    if left.num_rows != stored.num_rows or left.num_rows == 0:
        return None
    left = left.take(pc.sort_indices(left["relative_path"]))
    right = stored.take(pc.sort_indices(stored["relative_path"]))
    if not pc.all(pc.equal(left["relative_path"], right["relative_path"])).as_py():
        return None
    return pa.Table.from_arrays(
        [*left.columns, *(right[c] for c in right.column_names[1:])],
        names=left.column_names + right.column_names[1:])


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
