"""Differential tests of a volume's change log pages: random change sets, read through
`get_records_arrow` and `get_records` at several limits, against a straightforward reference
made from the plain change data feed (per shard: pair each version's old and new image of a
path, drop no-op rewrites, order by (version, crc32 bucket, path), or by (version, path) in a
stream made before that order, number the rows of each version)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import volume_stream as vs
from directory_table import commitfile
from directory_table.layout import bucket_of
from directory_table.schema import PUBLIC_COLUMNS, TABLE_SCHEMA
from tests.volume_stream.conftest import Events
from volume_stream.shards import pages
from volume_stream.shards.log import MAX_BYTES
from volume_stream.shards.meta import CHANGE_LOG
from volume_stream.shards.model import BY_BUCKET, sequence_number
from volume_stream.shards.pages import row_numbers, sequence_numbers
from volume_stream.shards.sources import text_bytes

_OLD = ("delete", "update_preimage")
PATHS = ["a", "b/1", "b/2", "c/ünï", "d/x y", "e", "f/g/h", "z"]

commits = st.lists(st.dictionaries(st.sampled_from(PATHS),
                                   st.one_of(st.none(), st.integers(1, 3)), min_size=1),
                   min_size=1, max_size=4)


def _size(image):
    """DynamoDB's approximate bytes of an image (`sources.row_sizes`), value by value: names,
    strings their UTF-8 bytes (DynamoDB's count), timestamps 32, other values 8."""
    if image is None:
        return 0
    total = 0
    for name, value in image.items():
        kind = TABLE_SCHEMA.field(name).type
        total += len(name) + (len((value or "").encode()) if pa.types.is_string(kind) else
                              32 if pa.types.is_timestamp(kind) else 8)
    return total


def reference(table, shard, latest):
    """The records of `shard` as dicts, made from the plain CDF row by row."""
    cdf = table.changes(0, latest).to_pylist()
    when = {h["version"]: h["timestamp"] for h in table.history()}
    by_key: dict[tuple[int, str], dict] = {}
    for row in cdf:
        if not shard.bucket_lo <= row["_bucket"] < shard.bucket_hi:
            continue
        if not shard.start_version < row["_commit_version"] <= (
                shard.end_version if shard.closed else latest):
            continue
        side = "old" if row["_change_type"] in _OLD else "new"
        image = {c: row[c] for c in PUBLIC_COLUMNS}
        by_key.setdefault((row["_commit_version"], row["relative_path"]), {})[side] = image
    out, row_of = [], {}
    # a version's records by path, or by (bucket, path) in a shard that says so
    by_bucket = shard.order == BY_BUCKET
    for (version, path), sides in sorted(by_key.items(), key=lambda kv: (
            kv[0][0], bucket_of(kv[0][1], shard.hash_buckets) if by_bucket else 0,
            kv[0][1].encode())):
        old, new = sides.get("old"), sides.get("new")
        if old is not None and new is not None and old == new:
            continue
        row = row_of[version] = row_of.get(version, -1) + 1
        out.append({"sequence_number": sequence_number(version, row),
                    "event_name": "MODIFY" if old and new else "INSERT" if new else "REMOVE",
                    "keys": {"relative_path": path}, "old_image": old, "new_image": new,
                    "shard_id": shard.shard_id, "commit_version": version,
                    "commit_timestamp": when[version], "size_bytes": _size({"relative_path": path}) + _size(old) + _size(new)})
    return out


def drain(log, shard_id, limit, max_bytes=MAX_BYTES, pages=None):
    arrow, records, it = [], [], log.iterator(shard_id, "TRIM_HORIZON")
    while it:
        page, nxt = log.get_records_arrow(it, limit, max_bytes=max_bytes)
        same = log.get_records(it, limit, max_bytes=max_bytes)
        assert page.num_rows <= limit and page.num_rows == len(same.records)
        if pages is not None and page.num_rows:
            pages.append(page.num_rows)
        assert (nxt is None) == (same.next_iterator is None)
        arrow += page.to_pylist()
        records += [{"sequence_number": r.sequence_number, "event_name": r.event_name,
                     "keys": r.key, "old_image": r.old_image, "new_image": r.new_image,
                     "shard_id": r.shard_id, "commit_version": r.commit_version,
                     "commit_timestamp": r.commit_timestamp, "size_bytes": r.size_bytes}
                    for r in same.records]
        if not page.num_rows:
            break
        it = nxt
    return arrow, records


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commits=commits, shards=st.integers(1, 4), limit=st.sampled_from([1, 2, 3, 1000]),
       reshard=st.one_of(st.none(), st.integers(1, 3)),
       max_bytes=st.sampled_from([MAX_BYTES, 1, 200, 450]),
       block=st.sampled_from([pages.TABLE_BLOCK, 1, 3]), by_key=st.booleans(),
       file_rows=st.sampled_from([commitfile.MAX_ROWS_PER_FILE, 1, 2]))
def test_pages_are_the_reference_records(commits, shards, limit, reshard, max_bytes, block,
                                         by_key, file_rows):
    """`block`: page tables made in blocks of that many records (the window-wide columns
    sliced at each block's start; pages within and across blocks). `by_key`: a stream made
    before records went by bucket (its metadata has no order). `file_rows`: the most rows
    of a data file the directory table writes (a bucket's rows of one commit in several
    files, each a range of paths, read back in any order)."""
    assume(reshard is None or shards <= 2 * reshard)  # a child has at most two parents
    default, pages.TABLE_BLOCK = pages.TABLE_BLOCK, block
    most, commitfile.MAX_ROWS_PER_FILE = commitfile.MAX_ROWS_PER_FILE, file_rows
    try:
        _check_pages(commits, shards, limit, reshard, max_bytes, by_key)
    finally:
        pages.TABLE_BLOCK, commitfile.MAX_ROWS_PER_FILE = default, most


def _forget_order(state):
    """The change log of volume "v" as a stream made before orders existed left it."""
    for stream in state[(CHANGE_LOG, "v")]["streams"]:
        for m in [stream, *stream["shards"]]:
            m.pop("order", None)


def _check_pages(commits, shards, limit, reshard, max_bytes, by_key=False):
    with tempfile.TemporaryDirectory() as tmp:
        cat = vs.connect(Path(tmp) / "wh")
        data = Path(tmp) / "data"
        data.mkdir()
        cat.create_volume("v", data, shards=shards)
        if by_key:
            cat.warehouse.mutate(_forget_order)
        table, ev = cat.directory_table("v"), Events()
        for k, commit in enumerate(commits):
            if reshard is not None and k == len(commits) // 2:
                cat.reshard("v", reshard)
            table.apply([ev.rm(p) if size is None else ev.put(p, size)
                         for p, size in commit.items()])
        latest = table.version()
        log = cat.change_log("v")
        for shard in log.shards():
            assert shard.order == ("key" if by_key else BY_BUCKET)  # a reshard's children too
            pages = []
            arrow, records = drain(log, shard.shard_id, limit, max_bytes, pages)
            want = reference(table, shard, latest)
            got = [{k: r[k] for k in want[0]} for r in arrow] if want else arrow
            assert got == want
            assert records == want
            # each page: the records up to the first whose running size passes max_bytes
            # (at least one), at most `limit`
            at = 0
            for n in pages:
                sizes = [r["size_bytes"] for r in want[at:at + limit + 1]]
                fit = next((k for k in range(len(sizes)) if sum(sizes[:k + 1]) > max_bytes),
                           len(sizes))
                assert n == min(limit, len(sizes), max(1, fit))
                at += n


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 10**10 - 1)), max_size=50))
def test_sequence_numbers_written_by_numpy_are_the_formatted_ones(positions):
    version = np.array([v for v, _ in positions], np.int64)
    row = np.array([r for _, r in positions], np.int64)
    made = sequence_numbers(version, row)
    assert made.type == pa.string() and made.validate(full=True) is None
    assert made.to_pylist() == [sequence_number(v, r) for v, r in positions]


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 40), st.integers(0, 3000)),
                max_size=8))
def test_sequence_numbers_of_runs_numbered_on(runs):
    """Runs of one version whose rows count on by one (a window's, written run by run)."""
    positions = [(v, first + k) for v, count, first in runs for k in range(count)]
    version = np.array([v for v, _ in positions], np.int64)
    row = np.array([r for _, r in positions], np.int64)
    made = sequence_numbers(version, row)
    assert made.validate(full=True) is None
    assert made.to_pylist() == [sequence_number(v, r) for v, r in positions]


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**32 - 1)), max_size=40),
       st.integers(0, 40), st.integers(0, 40))
def test_rows_read_back_from_sequence_numbers(positions, a, b):
    version = np.array([v for v, _ in positions], np.int64)
    row = np.array([r for _, r in positions], np.int64)
    made = sequence_numbers(version, row)
    lo, hi = min(a, b, len(made)), min(max(a, b), len(made))
    parts = pa.chunked_array([made.slice(lo, hi - lo), made.slice(0, lo),
                              pa.array([sequence_number(v, r) for v, r in positions],
                                       pa.string())],
                             pa.string())
    want = [*row[lo:hi].tolist(), *row[:lo].tolist(), *row.tolist()]
    assert row_numbers(parts).tolist() == want
    assert row_numbers(made.slice(lo, hi - lo)).tolist() == row[lo:hi].tolist()
    odd = pa.array(["1" + "0" * 19 + "7", *(sequence_number(v, r) for v, r in positions)])
    assert row_numbers(odd.slice(1)).tolist() == row.tolist()
    assert row_numbers(odd).tolist() == [7, *row.tolist()]  # not all 30 bytes: a cast


texts = st.lists(st.one_of(st.none(), st.text(st.characters(exclude_categories=("Cs",)),
                                              max_size=6)), max_size=30)


@given(texts, texts, st.integers(0, 30), st.integers(0, 30))
def test_text_bytes_are_utf8_bytes(a, b, lo, n):
    """Chunks of ASCII and of other text, nulls 0, sliced chunks, large strings."""
    ascii_only = [None if t is None else t.encode("ascii", "replace").decode() for t in a]
    col = pa.chunked_array([pa.array(ascii_only, pa.string()), pa.array(b, pa.string()),
                            pa.array(b, pa.string()).slice(min(lo, len(b)), n)], pa.string())
    want = [len(t.encode()) if t is not None else 0 for chunk in col.chunks
            for t in chunk.to_pylist()]
    assert text_bytes(col).tolist() == want
    assert text_bytes(col.chunk(2)).tolist() == want[len(a) + len(b):]
    assert text_bytes(col.cast(pa.large_string())).tolist() == want


def test_text_bytes_of_a_null_whose_slot_has_bytes_is_zero():
    """Arrow allows a null slot to span bytes (offsets 0-3 below): it counts 0."""
    validity = pa.py_buffer(np.packbits([0, 1], bitorder="little").tobytes())
    offsets = pa.py_buffer(np.array([0, 3, 5], np.int32).tobytes())
    col = pa.StringArray.from_buffers(2, offsets, pa.py_buffer(b"abcde"), validity, 1)
    assert col.to_pylist() == [None, "de"]
    assert text_bytes(col).tolist() == [0, 2]
