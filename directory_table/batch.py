"""A batch of `FileEvent`s as Arrow columns, and the newest event of each of its paths
(DESIGN §4.2), decided on columns rather than event by event.

The ordering rule is `connectors.events.is_newer`: two events that both carry a sequencer are
ordered by it (hex, case-insensitive, the shorter right-padded with zeros); otherwise by event
time; ties go to the later arrival. On columns a sequencer becomes a sort key (upper-cased and
padded to the longest sequencer in play, which orders every pair as padding the pair would),
so a whole batch is ordered by one stable sort. Where the rule is not a plain order — a path
whose events mix sequencers and none, a sequencer that is not ASCII (Python's upper-casing may
change its length), an event without a time — those few paths or rows are decided by
`is_newer` itself, event by event as before, so the result is always the same.

    batch = Batch.of(events)
    batch.paths()       # the paths, each once, in order of first arrival
    batch.latest        # row of each path's newest event in `batch.table`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.events import EventKind, FileEvent, is_newer
from directory_table.layout import buckets_of
from directory_table.schema import TS

__all__ = ["EVENT_SCHEMA", "Batch", "bucket_column", "bucket_count", "event_table", "newer",
           "sequencer_keys"]

#: a batch's events as columns, in arrival order (column names as the table's where shared)
EVENT_SCHEMA = pa.schema([
    pa.field("relative_path", pa.string()),
    pa.field("created", pa.bool_()),
    pa.field("size", pa.int64()),
    pa.field("etag", pa.string()),
    pa.field("last_modified_time", TS),
    pa.field("_sequencer", pa.string()),
    pa.field("_event_time", TS),
])


def bucket_column(count: int) -> str:
    """The name of an event table's optional column holding each row's bucket in a table of
    `count` buckets (`layout.bucket_of`), when the caller hashed the paths already (a refresh
    partitions its listing by bucket): `Batch.of` takes it instead of hashing again."""
    return f"{_BUCKET_PREFIX}{count}"


def bucket_count(name: str) -> int | None:
    """The bucket count of a `bucket_column` name (None: not one)."""
    return int(name[len(_BUCKET_PREFIX):]) if name.startswith(_BUCKET_PREFIX) else None


_BUCKET_PREFIX = "_bucket_of_"


def event_table(events: Sequence[FileEvent]) -> pa.Table:
    """`events` as columns (`EVENT_SCHEMA`), in their order. A path that is not valid UTF-8
    (a surrogate standing for an undecodable byte) raises `UnicodeEncodeError`."""
    return pa.table({
        "relative_path": pa.array([e.relative_path for e in events], pa.string()),
        "created": pa.array([e.kind is EventKind.CREATED for e in events], pa.bool_()),
        "size": pa.array([e.size for e in events], pa.int64()),
        "etag": pa.array([e.etag for e in events], pa.string()),
        "last_modified_time": pa.array([e.last_modified_time for e in events], TS),
        "_sequencer": pa.array([e.sequencer for e in events], pa.string()),
        "_event_time": pa.array([e.event_time for e in events], TS),
    }, schema=EVENT_SCHEMA)


class _RowEvents(Sequence[FileEvent]):
    """The rows of an event table as `FileEvent`s, each made when asked for."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __len__(self) -> int:
        return self._table.num_rows

    def __getitem__(self, i: int) -> FileEvent:  # type: ignore[override]
        row = {k: v[0] for k, v in self._table.slice(i, 1).to_pydict().items()}
        return FileEvent(EventKind.CREATED if row["created"] else EventKind.REMOVED,
                         row["relative_path"], size=row["size"], etag=row["etag"],
                         last_modified_time=row["last_modified_time"],
                         sequencer=row["_sequencer"], event_time=row["_event_time"])


def _np(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _has_sequencer(seq: pa.Array) -> np.ndarray:
    """True where a sequencer takes part in ordering (`is_newer`: not None, not empty)."""
    if seq.null_count == len(seq):
        return np.zeros(len(seq), dtype=bool)
    return _np(pc.fill_null(pc.greater(pc.binary_length(seq), 0), False))


def _ascii(seq: pa.Array) -> np.ndarray:
    return _np(pc.fill_null(pc.string_is_ascii(seq), True))


def _null(array: pa.Array) -> np.ndarray:
    if not array.null_count:
        return np.zeros(len(array), dtype=bool)
    return _np(pc.is_null(array))


def sequencer_keys(*arrays: pa.Array) -> list[pa.Array]:
    """Sort keys of the sequencers of `arrays`: upper-cased and right-padded with zeros to the
    longest of all of them, so that comparing two keys compares the sequencers as AWS
    specifies (`compare_sequencers`). Exact for ASCII sequencers only."""
    width = max((pc.max(pc.utf8_length(a)).as_py() or 0) for a in arrays) if arrays else 0
    return [pc.utf8_rpad(pc.ascii_upper(a), width=width, padding="0") for a in arrays]


def _cmp(a: pa.Array, b: pa.Array) -> np.ndarray:
    gt = _np(pc.fill_null(pc.greater(a, b), False))
    lt = _np(pc.fill_null(pc.less(a, b), False))
    return gt.astype(np.int8) - lt.astype(np.int8)


def newer(seq: pa.Array, time: pa.Array, than_seq: pa.Array, than_time: pa.Array,
          needed: np.ndarray) -> np.ndarray:
    """`is_newer` row by row, on columns: -1 older, 0 same, 1 newer (0 where not `needed`).

    Rows the columns cannot decide exactly (a non-ASCII sequencer on both sides, an event
    without a time against a row with one) are handed to `is_newer` itself, and only where
    `needed`, so what raised before raises now and nothing else does."""
    out = np.zeros(len(needed), dtype=np.int8)
    if not needed.any():
        return out
    both = needed & _has_sequencer(seq) & _has_sequencer(than_seq)
    by_time = needed & ~both
    odd = np.zeros(len(needed), dtype=bool)
    if both.any():
        key, than_key = sequencer_keys(seq, than_seq)
        out[both] = _cmp(key, than_key)[both]
        odd |= both & ~(_ascii(seq) & _ascii(than_seq))
    if by_time.any():
        no_time = _null(than_time)
        out[by_time] = np.where(no_time, 1, _cmp(time, than_time))[by_time]
        odd |= by_time & ~no_time & _null(time)
    for i in np.flatnonzero(odd).tolist():
        out[i] = is_newer(seq[i].as_py(), time[i].as_py(), than_seq[i].as_py(),
                          than_time[i].as_py())
    return out


@dataclass
class Batch:
    """One batch of events as columns, with the newest event of each path."""

    events: Sequence[FileEvent]
    #: `events` as columns (`EVENT_SCHEMA`), in arrival order
    table: pa.Table
    #: rows of `table` holding the newest event of each path, paths in order of first arrival
    #: (folder markers left out)
    latest: np.ndarray
    #: `buckets` and `by_bucket` per bucket count, computed once a batch (a path's hash costs
    #: ~0.5 us, and the lookup, the rewrite and the new files all need it)
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, events: Sequence[FileEvent] | pa.Table) -> Batch:
        """The batch of `events`: `FileEvent`s, or their columns already (`EVENT_SCHEMA`, a
        refresh's differences: no object per row, unless the newest event of a path must be
        decided event by event; with a `bucket_column`, its paths are not hashed again)."""
        known = {}
        if isinstance(events, pa.Table):
            known = {bucket_count(name): events[name] for name in events.column_names
                     if bucket_count(name) is not None}
            table = events.select(EVENT_SCHEMA.names).cast(EVENT_SCHEMA)
            events = _RowEvents(table)
        else:
            table = event_table(events)
        batch = cls(events, table, _newest(table, events))
        for count, column in known.items():  # the buckets the caller hashed already
            out = np.full(table.num_rows, -1, dtype=np.int32)
            out[batch.latest] = _np(column)[batch.latest]
            batch._cache["rows", count] = out
        return batch

    @property
    def dropped(self) -> int:
        """Events that count for nothing: folder markers, and events superseded in the batch."""
        return self.table.num_rows - len(self.latest)

    def paths(self, rows: np.ndarray | None = None) -> list[str]:
        """The paths of `rows` (default: `latest`)."""
        rows = self.latest if rows is None else rows
        return self.table["relative_path"].take(pa.array(rows, pa.int64())).to_pylist()

    def take(self, rows: np.ndarray) -> pa.Table:
        """The events at `rows`, as columns."""
        return self.table.take(pa.array(rows, pa.int64()))

    def buckets(self, count: int) -> np.ndarray:
        """Per row of `table`, the bucket of its path in a table of `count` buckets
        (`layout.bucket_of`), for the rows in `latest`; -1 for the others."""
        if ("rows", count) not in self._cache:
            out = np.full(self.table.num_rows, -1, dtype=np.int32)
            out[self.latest] = buckets_of(self.paths(), count)
            self._cache["rows", count] = out
        return self._cache["rows", count]

    def by_bucket(self, count: int) -> dict[int, list[str]]:
        """The paths (`latest`) of each bucket of a table of `count` buckets, sorted."""
        if ("paths", count) not in self._cache:
            keys = pa.table({"b": self.buckets(count)[self.latest],
                             "p": self.table["relative_path"].take(pa.array(self.latest))})
            order = _np(pc.sort_indices(keys, [("b", "ascending"), ("p", "ascending")]))
            rank = np.full(self.table.num_rows, -1, dtype=np.int64)
            rank[self.latest[order]] = np.arange(len(order))
            self._cache["rank", count] = rank
            keys = keys.take(pa.array(order))
            bucket = keys["b"].to_numpy()
            cuts = [0, *(np.flatnonzero(bucket[1:] != bucket[:-1]) + 1).tolist(), len(bucket)]
            self._cache["paths", count] = {
                int(bucket[a]): keys["p"].slice(a, b - a).to_pylist()
                for a, b in zip(cuts, cuts[1:], strict=False) if b > a}
        return self._cache["paths", count]

    def laid_out(self, count: int, rows: np.ndarray) -> np.ndarray:
        """The order of `rows` (of `latest`) by bucket of a table of `count` buckets, then
        path: `layout.for_layout`'s sort, from the one `by_bucket` made."""
        self.by_bucket(count)
        return np.argsort(self._cache["rank", count][rows], kind="stable")


def _newest(table: pa.Table, events: Sequence[FileEvent]) -> np.ndarray:
    """Rows of the newest event of each path (`newest_per_path`'s rule, see the module
    docstring), ordered by the path's first arrival."""
    paths = table["relative_path"]
    rows = np.flatnonzero(~_np(pc.ends_with(paths, "/")))  # folder markers count for nothing
    kept = paths.take(pa.array(rows, pa.int64()))
    unique = pc.unique(kept)
    if len(rows) == len(unique):
        return rows  # every path once: nothing to decide
    # a path of one event is decided; only the rows of repeated paths are sorted (a few
    # percent of a batch of random overwrites: sorting them all cost seconds at 1M events)
    code = _np(pc.index_in(kept, value_set=unique)).astype(np.int64)
    repeated = np.bincount(code, minlength=len(unique))[code] > 1
    code_of = np.zeros(table.num_rows, dtype=np.int64)
    code_of[rows] = code
    winners = np.zeros(len(unique), dtype=np.int64)
    winners[code[~repeated]] = rows[~repeated]
    decided = _newest_of(table, events, rows[repeated])
    winners[code_of[decided]] = decided
    first = np.full(len(unique), len(code), dtype=np.int64)
    np.minimum.at(first, code, np.arange(len(code)))
    return winners[np.argsort(first, kind="stable")]


def _newest_of(table: pa.Table, events: Sequence[FileEvent], rows: np.ndarray) -> np.ndarray:
    """Rows of the newest event of each path of `rows`, ordered by first arrival."""
    sub = table.take(pa.array(rows, pa.int64()))
    # a stable sort by path: each path's events form one run, in arrival order
    order = _np(pc.sort_indices(sub["relative_path"]))
    ordered = sub.take(pa.array(order, pa.int64()))
    keys = ordered["relative_path"].combine_chunks()
    starts = np.flatnonzero(np.concatenate(
        [[True], _np(pc.not_equal(keys[1:], keys[:-1]))])) if len(keys) else np.array([], int)
    counts = np.diff(np.append(starts, len(keys)))
    seq = ordered["_sequencer"].combine_chunks()
    has_seq = _has_sequencer(seq)
    with_seq = np.add.reduceat(has_seq.astype(np.int64), starts)
    all_seq, no_seq = with_seq == counts, with_seq == 0
    odd_seq = np.add.reduceat((has_seq & ~_ascii(seq)).astype(np.int64), starts) > 0
    no_time = np.add.reduceat(_null(ordered["_event_time"]).astype(np.int64), starts) > 0
    # runs the one sort cannot order: the rule is no plain order there
    by_hand = (counts > 1) & ((~all_seq & ~no_seq) | (all_seq & odd_seq) | (no_seq & no_time))
    run = np.repeat(np.arange(len(starts)), counts)
    (key,) = sequencer_keys(seq)
    ranked = pa.table({
        "run": run,
        "seq": pc.if_else(pa.array(all_seq[run]), key, pa.nulls(len(run), pa.string())),
        "time": pc.if_else(pa.array(no_seq[run]), ordered["_event_time"].combine_chunks(),
                           pa.nulls(len(run), TS)),
    })
    # stable: equal keys stay in arrival order, so a run's last row is its newest event
    within = _np(pc.sort_indices(ranked, [("run", "ascending"), ("seq", "ascending"),
                                          ("time", "ascending")]))
    winners = order[within[np.append(starts[1:], len(keys)) - 1]]
    for r in np.flatnonzero(by_hand).tolist():
        winners[r] = order[starts[r] + _fold(
            [events[i] for i in rows[order[starts[r]:starts[r] + counts[r]]].tolist()])]
    first = order[starts]  # a run's first row in path order is its earliest arrival
    return rows[winners[np.argsort(first, kind="stable")]]


def _fold(events: list[FileEvent]) -> int:
    """Index of the newest of one path's events in arrival order, compared one by one."""
    best = 0
    for i in range(1, len(events)):
        current, event = events[best], events[i]
        if is_newer(event.sequencer, event.event_time, current.sequencer,
                    current.event_time) >= 0:
            best = i
    return best
