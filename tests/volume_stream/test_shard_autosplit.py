"""Shards that split on their own when their write rate stays above a threshold."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import volume_stream as vs
from volume_stream.errors import InvalidInputError
from volume_stream.serve import ShardApiServer
from volume_stream.shards.autosplit import auto_split


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def apply(cat, *events, volume="vol"):
    return cat.directory_table(volume).apply(events).version


def test_hot_shard_splits_cold_one_does_not(cat, data_dir, ev):
    cat.create_volume("vol", data_dir, shards=2)
    for i in range(4):
        apply(cat, *[ev.put(f"f{i}-{j}") for j in range(10)])
    times = {h["version"]: h["timestamp"] for h in cat.history("vol")}
    since = times[0] + (times[1] - times[0]) / 2          # both shards opened before it
    window = (times[4] - since).total_seconds() + 0.001
    now = since + timedelta(seconds=window)
    assert auto_split(cat, "vol", now=now) == []          # no threshold set: never splits
    cat.set_auto_split("vol", records_per_s=1e12, window_s=window)
    assert auto_split(cat, "vol", now=now) == []          # below the threshold
    log = cat.change_log("vol")
    per_shard = {s.shard_id: 0 for s in log.shards()}
    for s in log.shards():
        it = log.iterator(s.shard_id, "TRIM_HORIZON")
        per_shard[s.shard_id] = len(log.get_records(it).records)
    hot = max(per_shard, key=per_shard.get)
    threshold = (per_shard[hot] - 0.5) / window          # only the busier shard is above
    if min(per_shard.values()) == per_shard[hot]:
        threshold = (per_shard[hot] + 0.5) / window / 2    # equal: both split
    cat.set_auto_split("vol", records_per_s=threshold, window_s=window)
    children = auto_split(cat, "vol", now=now)
    assert children and all(c.parent_shard_id in per_shard for c in children)
    assert {c.parent_shard_id for c in children} == {
        sid for sid, n in per_shard.items() if n / window > threshold}
    parents = {s.shard_id: s for s in cat.change_log("vol").shards()}
    for c in children:
        p = parents[c.parent_shard_id]
        assert p.closed and c.bucket_hi - c.bucket_lo == (p.bucket_hi - p.bucket_lo) // 2
    apply(cat, ev.put("after"))
    keys = []
    log = cat.change_log("vol")
    for s in log.shards():                                 # creation order: parents first
        it = log.iterator(s.shard_id, "TRIM_HORIZON")
        keys += [r.key["relative_path"] for r in log.get_records(it).records]
    assert sorted(keys) == sorted([f"f{i}-{j}" for i in range(4) for j in range(10)]
                                  + ["after"])
    with pytest.raises(InvalidInputError):
        cat.set_auto_split("vol", records_per_s=0)


def test_server_splits_a_shard_under_sustained_writes(cat, data_dir, ev):
    cat.create_volume("vol", data_dir, shards=1)
    cat.set_auto_split("vol", records_per_s=2, window_s=0.5)
    opened = cat.history("vol")[-1]["timestamp"]
    with ShardApiServer(cat, "127.0.0.1", 0, auto_split_s=0.2):
        deadline, i = time.monotonic() + 90, 0
        while len(cat.change_log("vol").shards()) == 1 and time.monotonic() < deadline:
            apply(cat, *[ev.put(f"w{i}-{j}") for j in range(5)])   # ~dozens of records/s
            i += 1
        shards = cat.change_log("vol").shards()
    assert len(shards) == 3, "the shard was not split within 90 s"
    assert shards[1].parent_shard_id == shards[2].parent_shard_id == shards[0].shard_id
    assert cat.history("vol")[0]["timestamp"] - opened >= timedelta(seconds=0.5)
