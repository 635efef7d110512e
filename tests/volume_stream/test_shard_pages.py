"""The fast paths of GetRecords (issue 15 throughput): one change-data read shared by sibling
shards, records as views over a page's columns, timestamps converted through float seconds,
and the endpoint's JSON written straight from the records."""

from __future__ import annotations

import copy
import json
import pickle
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import volume_stream as vs
from directory_table import DirectoryTable
from directory_table.layout import bucket_of
from volume_stream.serve.records_json import records_json, typed
from volume_stream.shards import log as log_module
from volume_stream.shards.model import Record, sequence_number
from volume_stream.shards.reader import _pylist


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


@pytest.fixture
def reads(monkeypatch):
    """Counts the change-data reads of directory tables (the real method runs)."""
    calls: list[tuple[int, int, object]] = []
    real = DirectoryTable.changes

    def counted(self, after, up_to, **kw):
        calls.append((after, up_to, kw.get("buckets")))
        return real(self, after, up_to, **kw)

    monkeypatch.setattr(DirectoryTable, "changes", counted)
    return calls


def put(cat, volume, ev, *paths, size=1):
    return cat.directory_table(volume).apply([ev.put(p, size) for p in paths]).version


def drain(log, shard_id):
    it, out = log.iterator(shard_id, "TRIM_HORIZON"), []
    while it:
        page = log.get_records(it, limit=7)
        out += page.records
        if not page.records:
            break
        it = page.next_iterator
    return out


def _in_shard(records, shard, buckets):
    return all(shard.bucket_lo <= bucket_of(r.key["relative_path"], buckets) < shard.bucket_hi
               for r in records)


def test_siblings_share_one_read_and_keep_their_own_keys(cat, data_dir, ev, reads):
    cat.create_volume("wide", data_dir, shards=4)
    paths = [f"d/{i}.bin" for i in range(80)]
    put(cat, "wide", ev, *paths)
    log = cat.change_log("wide")
    buckets = cat.directory_table("wide").layout().buckets
    reads.clear()
    per_shard = {s.shard_id: drain(log, s.shard_id) for s in log.shards()}
    assert len(reads) == 1 and reads[0][2] is None          # every bucket, read once
    for shard in log.shards():
        records = per_shard[shard.shard_id]
        assert records and _in_shard(records, shard, buckets)
        assert all(r.shard_id == shard.shard_id for r in records)
        assert all(r.sequence_number == sequence_number(r.commit_version, r.row)
                   for r in records)
        seqs = [r.sequence_number for r in records]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert sorted(r.key["relative_path"] for rs in per_shard.values() for r in rs) == sorted(paths)
    # the same as a reader that reads each shard on its own
    for shard in log.shards():
        alone = cat.change_log("wide")
        alone._share = False
        assert drain(alone, shard.shard_id) == per_shard[shard.shard_id]


def test_read_ahead_is_not_served_after_a_commit_or_past_a_reshard(cat, data_dir, ev):
    cat.create_volume("busy", data_dir, shards=2)
    first = [f"a/{i}" for i in range(30)]
    put(cat, "busy", ev, *first)
    log = cat.change_log("busy")
    a, b = log.shards()
    got_a = drain(log, a.shard_id)                 # reads ahead for b: versions (0, 1]
    later = [f"b/{i}" for i in range(30)]
    put(cat, "busy", ev, *later)                   # b's reader now sees version 2 too
    got_b = drain(log, b.shard_id)
    assert {r.commit_version for r in got_b} == {1, 2}
    got_a += drain(log, a.shard_id)[len(got_a):]   # a again from the start: version 2 too
    keys = sorted(r.key["relative_path"] for r in got_a + got_b)
    assert keys == sorted(first + later)

    log2 = cat.change_log("busy")
    drain(log2, a.shard_id)                        # read ahead for b up to version 2
    children = cat.reshard("busy", 3)              # closes a and b at version 2
    put(cat, "busy", ev, "c/late")
    parent_b = drain(log2, b.shard_id)
    assert sorted(r.key["relative_path"] for r in parent_b) == sorted(
        r.key["relative_path"] for r in got_b)
    page = log2.get_records(log2.iterator(b.shard_id, "TRIM_HORIZON"))
    assert page.next_iterator is None or not log2.get_records(page.next_iterator).records
    from_children = [r for c in children for r in drain(log2, c.shard_id)]
    assert [r.key["relative_path"] for r in from_children] == ["c/late"]


def test_read_ahead_stops_once_left_unused(cat, data_dir, ev, reads, monkeypatch):
    monkeypatch.setattr(log_module, "WINDOW", 1)   # one version a window
    cat.create_volume("long", data_dir, shards=2)
    for v in range(4):
        put(cat, "long", ev, *[f"v{v}/{i}" for i in range(12)], size=v + 1)
    log = cat.change_log("long")
    a, b = log.shards()
    reads.clear()
    got_a = drain(log, a.shard_id)                 # window 1 with b's; then a alone
    assert not log._share
    assert [r[2] for r in reads].count(None) == 1  # one shared read, then by bucket
    got_b = drain(log, b.shard_id)
    fresh = cat.change_log("long")
    fresh._share = False
    assert got_a == drain(fresh, a.shard_id) and got_b == drain(fresh, b.shard_id)
    assert len(got_a) + len(got_b) == 48
    copied = pickle.loads(pickle.dumps(got_a))     # views pickle as stand-alone records
    assert copied == got_a and copied[0].new_image == got_a[0].new_image


_MIN_US = int((datetime(1, 1, 2, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC))
              / timedelta(microseconds=1))
_MAX_US = int((datetime(9999, 12, 30, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC))
              / timedelta(microseconds=1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.integers(-4_000_000_000_000_000, 4_000_000_000_000_000),
    st.integers(_MIN_US, _MAX_US),
    st.sampled_from([0, -1, 1, 999_999, -999_999, 1_735_689_600_123_457])), max_size=40),
    st.booleans())
def test_timestamps_convert_exactly(values, with_null):
    data = values + ([None] if with_null else [])
    for tz in ("UTC", None):
        col = pa.chunked_array([pa.array(data, pa.timestamp("us", tz=tz))])
        expected = [None if v is None else
                    datetime(1970, 1, 1, tzinfo=UTC if tz else None) + timedelta(microseconds=v)
                    for v in data]
        got = _pylist(col)
        assert got == expected
        assert all(g is None or (g.tzinfo is not None) == (tz is not None) for g in got)


def test_endpoint_json_is_the_typed_document():
    when = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    image = {"relative_path": "dir/ü \"quoted\"\n.bin", "size": 12, "ratio": 0.25,
             "flag": True, "when": when, "none": None, "amount": Decimal("1.50"),
             "raw": b"\x00\xff", "tags": ["a", None, 3], "meta": {"k": "v", "n": None}}
    records = [
        Record.of("1" + "7".zfill(19) + "3".zfill(10), "MODIFY", {"relative_path": "x"},
                  {"relative_path": "x", "size": 1}, image, 7, when, "shardId-1", 120),
        Record.of("1" + "8".zfill(19) + "0".zfill(10), "REMOVE", {"relative_path": "y"},
                  {"relative_path": "y"}, None, 8, when, "shardId-1", 0),
    ]
    doc = json.loads(records_json(records, "NEW_AND_OLD_IMAGES", "eu-west-1", "tok.en"))
    assert doc["NextShardIterator"] == "tok.en"
    first, second = doc["Records"]
    assert first["eventName"] == "MODIFY" and first["awsRegion"] == "eu-west-1"
    assert first["eventSource"] == "aws:dynamodb" and len(first["eventID"]) == 32
    ddb = first["dynamodb"]
    assert ddb["NewImage"] == {k: typed(v) for k, v in image.items() if v is not None}
    assert ddb["OldImage"] == {"relative_path": {"S": "x"}, "size": {"N": "1"}}
    assert ddb["Keys"] == {"relative_path": {"S": "x"}}
    assert ddb["ApproximateCreationDateTime"] == int(when.timestamp())
    assert ddb["SequenceNumber"] == records[0].sequence_number and ddb["SizeBytes"] == 120
    assert "NewImage" not in second["dynamodb"] and second["dynamodb"]["SizeBytes"] == 1
    assert first["eventID"] != second["eventID"]
    for r in records:                              # stand-alone copies, equal
        assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
    assert "NextShardIterator" not in json.loads(records_json([], "KEYS_ONLY", "r", None))
