"""The order of a shard's records within a version: by (bucket, path) in a volume's streams
(`Shard.order == BY_BUCKET`), by path in streams made before. `shards.order` takes a
bucket's rows in the order the change data feed gives them when they are in order already,
merges runs of them and sorts only the groups it cannot merge; these tests hand it feeds in
every kind of order (sorted, split into runs that come back shuffled, shuffled row by row)
and compare with a plain sort."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from directory_table.layout import Layout, bucket_of
from directory_table.table import _CDF_SCHEMA
from volume_stream.shards import order, reader
from volume_stream.shards.model import BY_BUCKET, Shard
from volume_stream.shards.pages import window_records

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUCKETS = 4
PATHS = [f"d{k % 3}/f{k:03d}" for k in range(24)] + ["é", "z", "a b"]


def _row(path: str, size: int, kind: str, version: int) -> dict:
    return {"relative_path": path, "url": f"file:///d/{path}", "size": size,
            "last_modified_time": T0, "etag": f"e{size}", "_sequencer": None,
            "_event_time": T0, "_image_version": version, "_image_timestamp": T0,
            "_change_type": kind, "_commit_version": version,
            "_bucket": bucket_of(path, BUCKETS)}


class _Table:
    """A directory table that only has a change data feed (what `shard_window` reads)."""

    def __init__(self, rows: list[dict]):
        self.cdf = pa.Table.from_pylist(rows, _CDF_SCHEMA)

    def changes(self, after, up_to, buckets=None, columns=None):
        return self.cdf

    def layout(self):
        return Layout(buckets=BUCKETS, bucketed=True)


#: per version, what happens to each path: insert, delete, update (old + new), no-op rewrite
changes = st.lists(st.dictionaries(st.sampled_from(PATHS),
                                   st.sampled_from(["insert", "delete", "update", "noop"]),
                                   min_size=1), min_size=1, max_size=3)


def _feed(versions: list[dict[str, str]]) -> list[dict]:
    rows = []
    for v, commit in enumerate(versions, start=1):
        for path, what in sorted(commit.items()):
            if what == "insert":
                rows.append(_row(path, v, "insert", v))
            elif what == "delete":
                rows.append(_row(path, 0, "delete", v))
            elif what == "update":
                rows += [_row(path, 0, "update_preimage", v), _row(path, v, "update_postimage", v)]
            else:  # rewritten unchanged: delete + insert of the same image
                rows += [_row(path, 9, "delete", v), _row(path, 9, "insert", v)]
    return rows


def _expected(versions: list[dict[str, str]], by_bucket: bool) -> list[tuple]:
    names = {"insert": "INSERT", "delete": "REMOVE", "update": "MODIFY"}
    out = []
    for v, commit in enumerate(versions, start=1):
        kept = sorted((p for p, what in commit.items() if what != "noop"), key=lambda p: (
            bucket_of(p, BUCKETS) if by_bucket else 0, p.encode()))
        out += [(v, row, p, names[commit[p]]) for row, p in enumerate(kept)]
    return out


def _arranged(rows: list[dict], how: str, rnd: random.Random) -> list[dict]:
    """The feed's rows as a reader may get them: sorted by (version, bucket, path, phase),
    as runs of that order shuffled (several files or batches of one bucket), or shuffled."""
    phase = {"delete": 0, "update_preimage": 0, "insert": 1, "update_postimage": 1}
    rows = sorted(rows, key=lambda r: (r["_commit_version"], r["_bucket"],
                                       r["relative_path"].encode(), phase[r["_change_type"]]))
    if how == "runs":
        cuts = sorted(rnd.sample(range(1, len(rows)), min(len(rows) - 1, 3))) \
            if len(rows) > 1 else []
        runs = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
        rnd.shuffle(runs)
        rows = [r for run in runs for r in run]
    elif how == "shuffled":
        rnd.shuffle(rows)
    return rows


@settings(max_examples=200, deadline=None)
@given(versions=changes, how=st.sampled_from(["sorted", "runs", "shuffled"]),
       seed=st.integers(0, 2**16), by_bucket=st.booleans(),
       fallback=st.sampled_from([None, "at once", "no merge"]))
def test_records_come_in_the_shards_order_whatever_the_feeds(versions, how, seed, by_bucket,
                                                             fallback):
    """`fallback`: the groups out of order sorted in one Arrow sort rather than apart, or
    each sorted rather than merged run by run."""
    rows = _arranged(_feed(versions), how, random.Random(seed))
    shard = Shard("shardId-0", None, None, "1", None, bucket_lo=0, bucket_hi=BUCKETS,
                  hash_buckets=BUCKETS, order=BY_BUCKET if by_bucket else "key")
    few, pieces = order.FEW_RUNS, order._MERGED_PIECES
    order.FEW_RUNS = 0 if fallback == "at once" else few
    order._MERGED_PIECES = 0 if fallback == "no merge" else pieces
    try:
        window = reader.shard_window(_Table(rows), shard, 0, len(versions))
    finally:
        order.FEW_RUNS, order._MERGED_PIECES = few, pieces
    records = window_records(window, 0, len(window), shard, "NEW_AND_OLD_IMAGES", lambda v: T0)
    got = [(r.commit_version, int(r.sequence_number[-10:]), r.key["relative_path"],
            r.event_name) for r in records]
    assert got == _expected(versions, by_bucket)
    for r in records:  # each image is its own path's (slices or takes of the right rows)
        for image in (r.old_image, r.new_image):
            assert image is None or image["relative_path"] == r.key["relative_path"]
        if r.event_name == "MODIFY":
            assert (r.old_image["size"], r.new_image["size"]) == (0, r.commit_version)


def test_shard_ranges_split_the_feed_and_keep_the_order():
    """Two shards of one read (`shard_windows`): each its buckets' records, by bucket."""
    versions = [{p: "insert" for p in PATHS}]
    rows = _arranged(_feed(versions), "runs", random.Random(7))
    shards = [Shard(f"shardId-{k}", None, None, "1", None, bucket_lo=lo, bucket_hi=hi,
                    hash_buckets=BUCKETS, order=BY_BUCKET) for k, (lo, hi) in
              enumerate([(0, 2), (2, BUCKETS)])]
    source = reader.VolumeSource(_Table(rows))
    got = []
    for shard, window in zip(shards, reader.shard_windows(source, shards, 0, 1), strict=True):
        recs = window_records(window, 0, len(window), shard, "NEW_IMAGE", lambda v: T0)
        paths = [r.key["relative_path"] for r in recs]
        assert all(shard.bucket_lo <= bucket_of(p, BUCKETS) < shard.bucket_hi for p in paths)
        assert paths == sorted(paths, key=lambda p: (bucket_of(p, BUCKETS), p.encode()))
        got += paths
    assert sorted(got) == sorted(PATHS)


@pytest.mark.parametrize("order", [BY_BUCKET, "key"])
def test_a_table_s_shards_go_by_key_whatever_they_say(order):
    """Only a volume's records go by bucket: a source of another kind keeps (version, key)."""
    rows = _feed([{p: "insert" for p in PATHS}])

    class Other(reader.VolumeSource):
        kind = "table"

    shard = Shard("shardId-0", None, None, "1", None, bucket_lo=0, bucket_hi=BUCKETS,
                  hash_buckets=BUCKETS, order=order)
    window = reader.shard_window(Other(_Table(rows)), shard, 0, 1)
    recs = window_records(window, 0, len(window), shard, "KEYS_ONLY", lambda v: T0)
    assert [r.key["relative_path"] for r in recs] == sorted(PATHS, key=str.encode)
