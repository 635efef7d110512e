"""A page of change records as an Arrow table, and the `Record` views over it.

`arrow_page(slices, shard, view_type, commit_time)` builds the table of `ChangeLog.
get_records_arrow` from slices of windows (`shards.reader.Window`) column-wise (Arrow takes
and compute functions, numpy), as slices of blocks of `TABLE_BLOCK` records of a window made
at once and kept with it: one row per record, columns `RECORD_SCHEMA` names:

    sequence_number   string      "1" + version (19 digits) + row (10 digits)
    event_name        string      INSERT | MODIFY | REMOVE
    keys              struct      the change log's key columns (relative_path, or a table's)
    old_image         struct      the image before (null for INSERT or when the view type
    new_image         struct      keeps none); the image after (null for REMOVE ...)
    shard_id          string
    commit_version    int64
    commit_timestamp  timestamp[us, UTC]
    size_bytes        int64       approximate, as DynamoDB counts (key and kept images)

`ArrowPage` is the `PageColumns` the Python API's `Record`s are views over: the plain
columns are turned into lists once for the page, keys and images when a record first asks
(each look makes a new dict; no dict per record is kept). DESIGN §10.1.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import groupby, repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from volume_stream.shards.model import PageColumns, Record, Shard
from volume_stream.shards.order import one_chunk
from volume_stream.shards.reader import Window, pylist

__all__ = ["RECORD_COLUMNS", "TABLE_BLOCK", "ArrowPage", "Images", "arrow_page", "image_class",
           "page_records", "prepare", "row_numbers", "sequence_numbers", "struct_images",
           "window_records"]

RECORD_COLUMNS = ("sequence_number", "event_name", "keys", "old_image", "new_image",
                  "shard_id", "commit_version", "commit_timestamp", "size_bytes")
#: the event names (six bytes each)
_EVENTS = np.array([b"INSERT", b"MODIFY", b"REMOVE"], "V6")
_TS = pa.timestamp("us", tz="UTC")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: the digits of 0 to 99 and of 0 to 9999, as byte strings; a sequence number's bytes
_DIGITS2 = np.frombuffer("".join(f"{k:02d}" for k in range(100)).encode(), "V2")
_DIGITS4 = np.frombuffer("".join(f"{k:04d}" for k in range(10_000)).encode(), "V4")
_SEQ = np.dtype([("version", "V20"), ("row", "V10")])
_ROW = np.dtype([("hi", "V2"), ("mid", "V4"), ("lo", "V4")])
#: at most this many runs of one version are written run by run
_RUNS = 4096
#: records of a window made into its page table at once (a page is a slice of one or two)
TABLE_BLOCK = 16384
_BLOCKS_KEPT = 4
#: an image column of fewer runs of consecutive rows than this per `TABLE_BLOCK` records is
#: made of slices of them (a run of ~1,000 rows and more costs less as a slice than taken)
_SLICED_RUNS = 16


class Images:
    """Images (or keys) of a page: `images[k]` is a new dict of record k's values (None when
    it has none) made from the page's column values, so no dict per record is kept for the
    page's life; `image_class` makes a subclass per column set whose `__getitem__` is one
    dict display."""

    __slots__ = ("cols", "pos")

    def __init__(self, pos: list[int], lists: list[list[Any]]):
        self.pos, self.cols = pos, lists

    def __len__(self) -> int:
        return len(self.pos)


_IMAGE_CLASSES: dict[tuple[str, ...], type[Images]] = {}


def image_class(columns: tuple[str, ...]) -> type[Images]:
    """The `Images` subclass of `columns` (their names enter the code only as `repr`s)."""
    cls = _IMAGE_CLASSES.get(columns)
    if cls is None:
        if len(columns) > 200:
            def getitem(self: Images, k: int) -> dict[str, Any] | None:
                p = self.pos[k]
                return None if p < 0 else {c: v[p] for c, v in zip(columns, self.cols,
                                                                   strict=True)}
        else:
            names = [f"_{i}" for i in range(len(columns))]
            body = ", ".join(f"{c!r}: {n}[p]" for c, n in zip(columns, names, strict=True))
            code = (f"def getitem(self, k):\n"
                    f"    p = self.pos[k]\n"
                    f"    if p < 0:\n"
                    f"        return None\n"
                    f"    {', '.join(names)}, = self.cols\n"
                    f"    return {{{body}}}\n")
            scope: dict[str, Any] = {}
            exec(code, scope)  # noqa: S102 (column names are repr literals)
            getitem = scope["getitem"]
        cls = type("Images", (Images,), {"__slots__": (), "__getitem__": getitem})
        _IMAGE_CLASSES[columns] = cls
    return cls


def struct_images(col: pa.ChunkedArray | pa.Array) -> Images | list[None]:
    """The `Images` of a struct column (None where the struct is null)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    if arr.null_count == n:
        return [None] * n
    names = tuple(f.name for f in arr.type)
    valid = np.ones(n, bool) if arr.null_count == 0 else \
        pc.is_valid(arr).to_numpy(zero_copy_only=False)
    pos = np.where(valid, np.arange(n), -1).tolist()
    return image_class(names)(pos, [pylist(c) for c in arr.flatten()])


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values, each value's index in them); by runs when sorted (a window's
    versions are)."""
    if len(values) and (values[1:] >= values[:-1]).all():
        change = np.r_[True, values[1:] != values[:-1]]
        return values[change], np.cumsum(change) - 1
    distinct, where = np.unique(values, return_inverse=True)
    return distinct, where.reshape(-1)


def _fixed_width(items: np.ndarray, width: int) -> pa.Array:
    """A string array of `items`, byte strings of `width` bytes each."""
    offsets = np.arange(0, width * len(items) + 1, width, dtype=np.int32)
    return pa.StringArray.from_buffers(len(items), pa.py_buffer(offsets), pa.py_buffer(items))


def _events(old: np.ndarray, new: np.ndarray) -> pa.Array:
    """INSERT (a new image only), MODIFY (both) or REMOVE (the old one only) per record."""
    kind = (old >= 0).view(np.int8)
    kind[new < 0] = 2
    runs = np.flatnonzero(kind[1:] != kind[:-1]) + 1
    if len(kind) and not len(runs):  # a window of inserts, say
        return pa.repeat(pa.scalar(_EVENTS[kind[0]].tobytes().decode(), pa.string()),
                         len(kind))
    if len(runs) > _RUNS or not len(kind):
        return _fixed_width(_EVENTS[kind], 6)
    text = np.empty(len(kind), _EVENTS.dtype)  # run by run: a fill each
    for a, b in zip([0, *runs.tolist()], [*runs.tolist(), len(kind)], strict=True):
        text[a:b] = _EVENTS[kind[a]]
    return _fixed_width(text, 6)


def _row_texts(top: int) -> np.ndarray:
    """The 10-digit texts of rows 0 to `top` - 1 (V10), from tables of two and four digits."""
    r = np.arange(top, dtype=np.int64)
    text = np.empty(top, _ROW)
    text["hi"] = _DIGITS2[r // 100_000_000 % 100]
    text["mid"] = _DIGITS4[r // 10_000 % 10_000]
    text["lo"] = _DIGITS4[r % 10_000]
    return text.view("V10")


def sequence_numbers(version: np.ndarray, row: np.ndarray) -> pa.Array:
    """The sequence numbers ("1" + version in 19 digits + row in 10) of records, written as
    bytes by numpy (a cast and a pad per record cost ~10x as much): each run of one version
    gets its 20 bytes as one fill, and rows numbered on from the run's first (as a window's
    are: 0, 1, 2 ... in each version) a slice of one table of row texts; other rows are
    gathered from tables of two and four digits."""
    n = len(version)
    text = np.empty(n, _SEQ)
    bounds = np.flatnonzero(np.r_[True, version[1:] != version[:-1], True]) if n else \
        np.zeros(1, np.int64)
    starts, ends = bounds[:-1], bounds[1:]
    rest = row.astype(np.int64, copy=False)
    first = np.zeros(n, bool)
    first[starts[starts < n]] = True
    # every row not a run's first is the one before it + 1
    numbered = 0 < len(starts) <= _RUNS and bool(((np.diff(rest) == 1) | first[1:]).all())
    top = int((rest[ends - 1] + 1).max()) if n else 0
    if n and numbered and rest[starts].min() >= 0 and top <= max(2 * n, 1024):
        rows = _row_texts(top)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            text["version"][a:b] = np.frombuffer(f"1{int(version[a]):019d}".encode(), "V20")[0]
            r0 = int(rest[a])
            text["row"][a:b] = rows[r0:r0 + b - a]
        return _fixed_width(text, 30)
    distinct, where = _distinct(version)
    prefix = np.frombuffer("".join(f"1{x:019d}" for x in distinct.tolist()).encode(), "V20")
    text["version"] = prefix[where]
    parts = text["row"].view(_ROW) if n else np.empty(0, _ROW)
    parts["hi"] = _DIGITS2[rest // 100_000_000 % 100]
    parts["mid"] = _DIGITS4[rest // 10_000 % 10_000]
    parts["lo"] = _DIGITS4[rest % 10_000]
    return _fixed_width(text, 30)


def _micros(when: datetime) -> int:
    """Microseconds from the epoch (a naive time read as UTC, as Arrow reads it)."""
    return ((when if when.tzinfo else when.replace(tzinfo=UTC)) - _EPOCH) // _US


def _run_starts(idx: np.ndarray) -> np.ndarray | None:
    """Where each run of consecutive rows after the first starts in `idx` (all valid), when
    the runs are long enough to slice (fewer than `_SLICED_RUNS` per `TABLE_BLOCK` records);
    None when a take costs less."""
    starts = np.flatnonzero(np.diff(idx) != 1) + 1
    return starts if len(starts) < max(_SLICED_RUNS, len(idx) * _SLICED_RUNS // TABLE_BLOCK) \
        else None


def _struct(rows: pa.Table, columns: tuple[str, ...], idx: np.ndarray
            ) -> pa.Array | pa.ChunkedArray:
    """Rows `idx` of `columns` as a struct column, null where idx is -1. Runs of consecutive
    rows (a window ordered as the read came, `Shard.order`) are slices of the rows, not
    copies: a chunk each when they are long (`_SLICED_RUNS`)."""
    valid = idx >= 0
    if len(idx) and not valid.any():
        return _null_struct(rows, columns, len(idx))
    fields = [rows.schema.field(c) for c in columns]
    starts = _run_starts(idx) if len(idx) and valid.all() else None
    if starts is not None:
        bounds = [0, *starts.tolist(), len(idx)]
        chunks = [pa.StructArray.from_arrays(
            [one_chunk(rows[c]).slice(int(idx[a]), e - a) for c in columns], fields=fields)
            for a, e in zip(bounds[:-1], bounds[1:], strict=True)]
        return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks)
    take = pa.array(np.maximum(idx, 0))
    children = [one_chunk(rows[c]).take(take) for c in columns]
    mask = None if valid.all() else pa.array(~valid)
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _null_struct(rows: pa.Table, columns: tuple[str, ...], n: int) -> pa.Array:
    return pa.nulls(n, pa.struct([rows.schema.field(c) for c in columns]))


def _whole(window: Window, commit_time: Callable[[int], datetime]) -> dict[str, pa.Array]:
    """The columns of all the window's records that depend on neither shard nor view type
    (sequence numbers, event names, versions, commit times), made once for its blocks to
    slice: per record, numpy's work over the whole window costs less than per block."""
    made = window.made.get("whole")
    if made is None:
        v, old, new = window.version, window.old, window.new
        starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]]) if len(v) else \
            np.zeros(0, np.int64)                      # runs of one version
        when = np.array([_micros(commit_time(int(v[a]))) for a in starts.tolist()], np.int64)
        made = window.made["whole"] = {
            "sequence_number": sequence_numbers(v, window.row),
            "event_name": _events(old, new),
            "commit_version": pa.array(v, pa.int64()),
            "commit_timestamp": pa.array(np.repeat(when, np.diff(np.r_[starts, len(v)]))
                                         ).view(_TS)}
    return made


def prepare(window: Window, shard: Shard, view_type: str,
            commit_time: Callable[[int], datetime]) -> None:
    """Make at once what the shard's pages of the window slice (on the thread that made the
    window: `shard_windows`): the window-wide columns, the record sizes of `view_type`, and
    the blocks whose images are slices of the read (`_sliced`), kept while the window is
    (they copy no image)."""
    _whole(window, commit_time)
    keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
    window.running_sizes(keep_old, view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE"))
    kept = window.tables.setdefault((shard.shard_id, view_type, "sliced"), {})
    n, step = len(window), TABLE_BLOCK
    k = 0
    for sliced, stretch in groupby(_sliced(window, a, min(n, a + step), keep_old)
                                   for a in range(0, n, step)):
        m = k + sum(1 for _ in stretch)  # blocks k to m - 1, made as one table, then cut
        if sliced:
            table = _slice_table(window, k * step, min(n, m * step), shard, view_type,
                                 commit_time)
            kept.update((j, table.slice((j - k) * step, step)) for j in range(k, m))
        k = m


def _sliced(window: Window, a: int, e: int, keep_old: bool) -> bool:
    """Whether records a to e have their images by slicing alone (`_struct`): each has a new
    image, they are few runs of consecutive rows, and old images are not kept or none."""
    new = window.new[a:e]
    return bool(len(new) and new.min() >= 0 and not (keep_old and window.old[a:e].max() >= 0)
                and _run_starts(new) is not None)


def _repeated(window: Window, key: Any, n: int, make: Callable[[int], pa.Array]) -> pa.Array:
    """`make(m)` for a block-sized m, kept with the window, sliced to n (no array per block
    of a shard id or of null images)."""
    made = window.made.get(key)
    if made is None or len(made) < n:
        made = window.made[key] = make(max(n, min(len(window), TABLE_BLOCK)))
    return made.slice(0, n)


def _slice_table(window: Window, i: int, j: int, shard: Shard, view_type: str,
                 commit_time: Callable[[int], datetime]) -> pa.Table:
    old, new = window.old[i:j], window.new[i:j]
    keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
    keep_new = view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
    n = j - i
    whole = _whole(window, commit_time)
    rows, cols = window.rows, window.columns
    images = ("images", cols)

    def no_images(m: int) -> pa.Array:
        return _null_struct(rows, cols, m)

    new_image = _struct(rows, cols, new) if keep_new else _repeated(window, images, n, no_images)
    keys = window.key_columns
    if keep_new and n and new.min() >= 0 and set(keys) <= set(cols) and \
            isinstance(new_image, pa.StructArray):
        # every record has a new image: the keys are its key columns (no second take)
        keys_col = pa.StructArray.from_arrays([new_image.field(k) for k in keys],
                                              fields=[rows.schema.field(k) for k in keys])
    else:
        keys_col = _struct(rows, keys, np.where(new >= 0, new, old))
    old_image = _struct(rows, cols, old) if keep_old and n and old.max() >= 0 else \
        _repeated(window, images, n, no_images)
    shard_id = _repeated(window, ("shard", shard.shard_id), n, lambda m: pa.repeat(
        pa.scalar(shard.shard_id, pa.string()), m))
    return pa.table({
        "sequence_number": whole["sequence_number"].slice(i, n),
        "event_name": whole["event_name"].slice(i, n), "keys": keys_col,
        "old_image": old_image, "new_image": new_image, "shard_id": shard_id,
        "commit_version": whole["commit_version"].slice(i, n),
        "commit_timestamp": whole["commit_timestamp"].slice(i, n),
        "size_bytes": pa.array(window.record_sizes(keep_old, keep_new)[i:j], pa.int64())})


def _block(window: Window, k: int, shard: Shard, view_type: str,
           commit_time: Callable[[int], datetime]) -> pa.Table:
    """Block k (records k * TABLE_BLOCK on) of the window's page table, made once and kept
    (the last `_BLOCKS_KEPT` per shard and view type, and those `prepare` made) while the
    window is."""
    sliced = window.tables.get((shard.shard_id, view_type, "sliced"))
    if sliced and k in sliced:
        return sliced[k]
    made = window.tables.get((shard.shard_id, view_type))
    if made is None:
        made = window.tables[shard.shard_id, view_type] = OrderedDict()
    table = made.get(k)
    if table is None:
        a = k * TABLE_BLOCK
        table = _slice_table(window, a, min(len(window), a + TABLE_BLOCK), shard, view_type,
                             commit_time)
        while len(made) >= _BLOCKS_KEPT:
            made.popitem(last=False)
        made[k] = table
    else:
        made.move_to_end(k)  # the most recent last
    return table


def arrow_page(slices: list[tuple[Window, int, int]], shard: Shard, view_type: str,
               commit_time: Callable[[int], datetime], empty: Window | None = None
               ) -> pa.Table:
    """The records i to j of each (window, i, j), in order, as one table (`RECORD_COLUMNS`):
    slices of the windows' blocks; `empty` gives the schema when there are none."""
    if len(slices) == 1:  # a page within one block of one window, mostly
        w, i, j = slices[0]
        k = i // TABLE_BLOCK
        if j > i and (j - 1) // TABLE_BLOCK == k:
            return _block(w, k, shard, view_type, commit_time).slice(i - k * TABLE_BLOCK, j - i)
    parts = []
    for w, i, j in slices:
        for k in range(i // TABLE_BLOCK, (j - 1) // TABLE_BLOCK + 1) if j > i else ():
            a = k * TABLE_BLOCK
            lo, hi = max(i, a) - a, min(j, a + TABLE_BLOCK) - a
            parts.append(_block(w, k, shard, view_type, commit_time).slice(lo, hi - lo))
    if not parts:
        base = empty if empty is not None else (slices[0][0] if slices else None)
        if base is None:
            return pa.table({c: [] for c in RECORD_COLUMNS})
        return _slice_table(base, 0, 0, shard, view_type, commit_time)
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="default")


_ROW_WEIGHTS = 10 ** np.arange(9, -1, -1, dtype=np.int64)


def row_numbers(seqs: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The rows of sequence numbers (their last 10 digits): read from the bytes of chunks of
    30-byte strings (as `sequence_numbers` writes them), else through an Arrow cast."""
    chunks = seqs.chunks if isinstance(seqs, pa.ChunkedArray) else [seqs]
    out = []
    for chunk in chunks:
        n = len(chunk)
        offsets = np.frombuffer(chunk.buffers()[1], np.int32)[
            chunk.offset:chunk.offset + n + 1] if n and chunk.null_count == 0 else None
        if offsets is not None and (np.diff(offsets) == 30).all():
            text = np.frombuffer(chunk.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
            out.append((text.reshape(n, 30)[:, 20:] - ord("0")).astype(np.int64)
                       @ _ROW_WEIGHTS)
        else:
            out.append(pc.cast(pc.utf8_slice_codeunits(chunk, 20), pa.int64()).to_numpy(
                zero_copy_only=False))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class ArrowPage(PageColumns):
    """The `PageColumns` of a page table (`arrow_page`): plain columns as lists at once, keys
    and images from the struct columns when a record first asks."""

    __slots__ = ("table",)

    def __init__(self, table: pa.Table):
        self.table = table
        versions = table["commit_version"].to_pylist()
        seqs = table["sequence_number"].to_pylist()
        rows = row_numbers(table["sequence_number"]).tolist()
        times = pylist(table["commit_timestamp"])
        shard_id = table["shard_id"][0].as_py() if table.num_rows else ""
        super().__init__(seqs, table["event_name"].to_pylist(), versions, rows, times,
                         shard_id, table["size_bytes"].to_pylist())

    def records(self) -> list[Record]:
        n = len(self.sequence_numbers)
        return list(map(Record, repeat(self, n), range(n)))

    def make_keys(self) -> Images | list[None]:
        if self.keys is None:
            self.keys = struct_images(self.table["keys"])
        return self.keys

    def make_old_images(self) -> Images | list[None]:
        if self.old_images is None:
            self.old_images = struct_images(self.table["old_image"])
        return self.old_images

    def make_new_images(self) -> Images | list[None]:
        if self.new_images is None:
            self.new_images = struct_images(self.table["new_image"])
        return self.new_images


def page_records(table: pa.Table) -> list[Record]:
    """The `Record` views over a page table."""
    return ArrowPage(table).records() if table.num_rows else []


def window_records(window: Window, i: int, j: int, shard: Shard, view_type: str,
                   commit_time: Callable[[int], datetime]) -> list[Record]:
    """Records i to j of a window."""
    return page_records(arrow_page([(window, i, min(j, len(window)))], shard, view_type,
                                   commit_time, window))

