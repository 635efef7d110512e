"""Full-listing reconcile (DESIGN §4.4): list a volume, diff the listing against the directory
table's current version, and turn the difference into events (as columns) to `apply`.

The diff is vectorised (no Python loop over the listing): one hash lookup of the listed paths
among the stored ones (`diff_listing`), on the driver, a group of buckets at a time
(`diff_by_buckets` for a listing in memory, `diff_refresh` for one spilled per bucket
partition by `_spill.Listing`), so neither the stored rows nor the listing of a huge volume
are ever all in memory; in Spark when the listing passes `spark_diff_threshold`. The rows that
differ become events in `batch.EVENT_SCHEMA` columns, one table per group, with no object per
row (paths are checked on the column, `valid_paths`). It heals missed events and backfills
files that existed before the volume had a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.events import valid_paths
from connectors.protocols import LISTING_SCHEMA
from directory_table.batch import EVENT_SCHEMA, bucket_column, bucket_count
from directory_table.layout import bucket_array
from directory_table.schema import TS
from volume_stream.volumes._spill import Listing, accepted_rows

__all__ = ["ROWS_PER_BUCKET_GROUP", "Listing", "Progress", "accepted_rows", "counted",
           "diff_by_buckets", "diff_listing", "diff_listing_spark", "diff_refresh",
           "group_size_for", "in_commits", "read_listing"]

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
    kept = [accepted_rows(b, accept, recursive) for b in batches]
    return pa.Table.from_batches([b for b in kept if b.num_rows], schema=LISTING_SCHEMA)


def counted(batches: Iterable[pa.RecordBatch], progress: Progress | None,
            ) -> Iterator[pa.RecordBatch]:
    """The lister's batches, reporting the running count of listed rows."""
    listed = 0
    for batch in batches:
        listed += batch.num_rows
        if progress is not None:
            progress("listing", listed, 0)
        yield batch


#: `diff(listing, stored, listed_at, store_times=...)`: `diff_listing` or a Spark diff
Diff = Callable[..., tuple[pa.Table, int]]


def diff_by_buckets(listing: pa.Table, read_stored: Callable[[list[int] | None], pa.Table],
                    buckets: int, listed_at: datetime, *, store_times: bool = True,
                    group_size: int = 16, progress: Progress | None = None,
                    diff: Diff | None = None, stored: pa.Table | None = None,
                    ) -> Iterator[tuple[pa.Table, int]]:
    """`diff_listing`, a group of `group_size` buckets at a time: the listing's rows of the
    group (by the table's bucket hash of their path) against `read_stored(group)`, the stored
    rows of those buckets only (`read_stored(None)`: all of them, when there is one group;
    `stored`: those rows, already read). Yields each group's (events, invalid paths); only
    one group's stored rows are held at once."""
    diff = diff or diff_listing
    if buckets <= 1 or group_size >= buckets:
        events, invalid = diff(listing, read_stored(None) if stored is None else stored,
                               listed_at, store_times=store_times)
        if progress is not None:
            progress("diffing", listing.num_rows, events.num_rows)
        yield events, invalid
        return
    column = bucket_column(buckets)
    if column in listing.column_names:
        of_path = listing[column]
    else:  # hashed once, and kept for the commit
        of_path = bucket_array(listing["relative_path"].to_pylist(), buckets)
        listing = listing.append_column(column, of_path)
    found = 0
    for start in range(0, buckets, group_size):
        stop = min(buckets, start + group_size)
        part = listing.filter(pc.and_(pc.greater_equal(of_path, start), pc.less(of_path, stop)))
        events, invalid = diff(part, read_stored(list(range(start, stop))), listed_at,
                               store_times=store_times)
        found += events.num_rows
        if progress is not None:
            progress("diffing", listing.num_rows, found)
        yield events, invalid


def diff_refresh(listing: Listing, read_stored: Callable[[list[int] | None], pa.Table],
                 stored_rows: int, listed_at: datetime, *, store_times: bool = True,
                 progress: Progress | None = None, diff: Diff | None = None,
                 stored: pa.Table | None = None) -> Iterator[tuple[pa.Table, int]]:
    """The diff of a whole listing (`Listing`, after `finish`) against the table holding
    `stored_rows` rows, a group of buckets at a time (each group's events and invalid paths
    yielded in turn): in memory by bucket groups (`diff_by_buckets`; `stored`: the stored
    rows when already read and one group will do), or, for a spilled listing, a group of
    partitions at a time, each read back from its spill files next to the stored rows of its
    buckets only."""
    diff = diff or diff_listing
    if listing.in_memory:
        table = listing.table()
        buckets = listing.buckets
        group_size = group_size_for(max(table.num_rows, stored_rows), buckets) \
            if buckets > 1 else 1
        if stored is not None and group_size < buckets:
            stored = None  # read a group at a time instead
        yield from diff_by_buckets(table, read_stored, buckets, listed_at,
                                   store_times=store_times, group_size=group_size,
                                   progress=progress, diff=diff, stored=stored)
        return
    found = 0
    for partitions in listing.groups(stored_rows):
        part = listing.read(partitions)
        events, invalid = diff(part, read_stored(listing.buckets_of(partitions)), listed_at,
                               store_times=store_times)
        found += events.num_rows
        if progress is not None:
            progress("diffing", listing.rows, found)
        yield events, invalid


def in_commits(diffs: Iterable[tuple[pa.Table, int]], rows: int,
               ) -> Iterator[tuple[pa.Table | None, int]]:
    """The events of `diffs` (`diff_refresh`'s groups) gathered into tables of at least `rows`
    events, the last one of what is left (None: nothing), each with the invalid paths
    counted since the one before: what one commit of a refresh applies."""
    held: list[pa.Table] = []
    held_rows = invalid = 0
    for events, bad in diffs:
        invalid += bad
        if events.num_rows:
            held.append(events)
            held_rows += events.num_rows
        if held_rows >= rows:
            yield pa.concat_tables(held), invalid
            held, held_rows, invalid = [], 0, 0
    yield (pa.concat_tables(held) if held else None), invalid


def diff_listing(listing: pa.Table, stored: pa.Table, listed_at: datetime, *,
                 store_times: bool = True) -> tuple[pa.Table, int]:
    """Events that make `stored` (relative_path, size, etag, last_modified_time, _sequencer,
    _event_time) equal to `listing`, joined in Arrow. Returns (events, invalid_paths).

    Apply them with `DirectoryTable.apply(events, listed_at_version=<the stored version>)`: they
    are ordered by versions, not by clocks.

    `store_times`: a created file's event time is its modification time, set by the store's
    clock as its events' times are (object stores). With False (local folders, whose mtimes
    anyone can set: `touch -d`, `cp -p`, archives) it is `listed_at`, the clock the local
    listener stamps its events with, so a later event is always newer (DESIGN §4.2).

    The join is one hash lookup of the listing's paths among the stored ones (`index_in`;
    paths are unique on both sides): the stored row of each listed path is taken beside it,
    the stored rows no listed path found are the removed files. No sort, no Python per row
    but for the rows that differ."""
    # the listing's bucket column (`batch.bucket_column`), if any, goes with its rows
    left = listing.select(_KEYS + [c for c in listing.column_names
                                   if bucket_count(c) is not None])
    stored = stored.select(_KEYS + _ORDER)
    paths = stored["relative_path"].combine_chunks() if stored.num_rows else \
        pa.array([], pa.string())
    index = pc.index_in(left["relative_path"], value_set=paths)
    right = stored.select(_KEYS[1:]).rename_columns(_STORED).take(index)
    joined = pa.Table.from_arrays([*left.columns, *right.columns],
                                  names=left.column_names + right.column_names)
    carried = left.column_names[len(_KEYS):]
    creates = joined.filter(pc.or_(pc.is_null(index), _changed(joined)))
    found = index.drop_null() if isinstance(index, pa.Array) else \
        pa.concat_arrays([c.drop_null() for c in index.chunks] or [pa.array([], pa.int32())])
    if len(found) == stored.num_rows:
        removes = stored.slice(0, 0)
    else:
        seen = np.zeros(stored.num_rows, dtype=bool)
        seen[found.to_numpy(zero_copy_only=False)] = True
        removes = stored.filter(pa.array(~seen))
    return _events(creates, removes, listed_at, store_times, carried)


def diff_listing_spark(spark, listing: pa.Table, stored: pa.Table, listed_at: datetime, *,
                       store_times: bool = True) -> tuple[pa.Table, int]:
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
    differing = differing.cast(_joined_schema(listing.schema, stored.schema))
    present = pc.is_valid(differing["size"])
    removes = differing.filter(pc.and_(pc.invert(present), pc.is_valid(differing["size_stored"])))
    return _events(differing.filter(present), removes, listed_at, store_times)


def _joined_schema(listing: pa.Schema, stored: pa.Schema) -> pa.Schema:
    fields = [listing.field(k) for k in _KEYS]
    return pa.schema(fields + [pa.field(f"{f.name}_stored", f.type) for f in fields[1:]]
                     + [stored.field(c) for c in _ORDER])


def _differs(left: pa.Table, col: str) -> pa.ChunkedArray:
    a, b = left[col], left[f"{col}_stored"]
    eq = pc.fill_null(pc.equal(a, b), False)
    return pc.invert(pc.or_(eq, pc.and_(pc.is_null(a), pc.is_null(b))))


def _changed(joined: pa.Table) -> pa.ChunkedArray:
    """Rows whose listed and stored images differ (both present). The etag (with the size)
    decides when both sides have one: object stores report LastModified at a coarser
    precision in listings than in events, so comparing times would turn every refresh into
    spurious updates. Without etags, the time decides."""
    no_etag = pc.or_(pc.is_null(joined["etag"]), pc.is_null(joined["etag_stored"]))
    return pc.fill_null(
        pc.or_(pc.or_(_differs(joined, "size"), _differs(joined, "etag")),
               pc.and_(no_etag, _differs(joined, "last_modified_time"))), False)


def _events(creates: pa.Table, removes: pa.Table, listed_at: datetime, store_times: bool,
            carried: list[str] = ()) -> tuple[pa.Table, int]:
    """The events (`EVENT_SCHEMA` columns, no object per row) that create the listed rows
    `creates` and remove the stored rows `removes` (relative_path, _sequencer, _event_time),
    and the count of listed rows left out for an unsafe path or no size. `carried`: the
    listing's bucket columns (`batch.bucket_column`), kept on the events (the removed rows'
    buckets hashed here)."""
    keep = valid_paths(creates["relative_path"]) & \
        pc.fill_null(pc.greater_equal(creates["size"], 0), False).to_numpy(zero_copy_only=False)
    invalid = int((~keep).sum())
    if invalid:
        creates = creates.filter(pa.array(keep))
    at = pa.scalar(listed_at, TS)
    n = creates.num_rows
    lmt = creates["last_modified_time"].cast(TS)
    made = pa.table({
        "relative_path": creates["relative_path"],
        "created": pa.repeat(pa.scalar(True), n),
        "size": creates["size"],
        "etag": creates["etag"],
        "last_modified_time": lmt,
        "_sequencer": pa.nulls(n, pa.string()),
        # an object's own time (the store's clock), so later events compare against it; a
        # local file's mtime is no clock: the listing's time is
        "_event_time": pc.fill_null(lmt, at) if store_times else pa.repeat(at, n),
    }, schema=EVENT_SCHEMA)
    m = removes.num_rows
    evt = removes["_event_time"].cast(TS)
    # gone when the listing began: any write older than that is gone too, even one whose
    # event (ms, from the queue) looks newer than the row a listing wrote (whole seconds)
    gone = pa.table({
        "relative_path": removes["relative_path"],
        "created": pa.repeat(pa.scalar(False), m),
        "size": pa.nulls(m, pa.int64()),
        "etag": pa.nulls(m, pa.string()),
        "last_modified_time": pa.nulls(m, TS),
        "_sequencer": removes["_sequencer"],
        "_event_time": pc.if_else(pc.fill_null(pc.greater(evt, at), False), evt, at),
    }, schema=EVENT_SCHEMA)
    for name in carried:
        made = made.append_column(name, creates[name])
        gone = gone.append_column(name, bucket_array(
            removes["relative_path"].to_pylist(), bucket_count(name)))
    return pa.concat_tables([made, gone]), invalid
