"""Change logs of change-tracked SQL tables (issue 15 item 1): shards over crc32(key) buckets,
keyed by the hidden row id (or a key column), images of the table's visible columns, the same
iterators, reshards and stream settings as volumes, and the DynamoDB Streams endpoint listing
and serving them to boto3."""

from __future__ import annotations

import zlib

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config

import volume_stream as vs
from volume_stream.errors import InvalidInputError, NotFoundError
from volume_stream.serve import ShardApiServer
from volume_stream.shards.sources import TABLE_BUCKETS
from volume_stream.tables import Column


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def people(cat, name="people", track=True):
    """A table with 3 rows inserted before change tracking (not in the log) and, once it is
    on, 4 inserted, one updated, one deleted."""
    store = cat.tables
    store.create(name, [Column("id", "BIGINT"), Column("name", "STRING"),
                        Column("score", "DOUBLE")])
    store.insert(name, pa.table({"id": [100, 101, 102], "name": ["x", "y", "z"],
                                 "score": [0.0, 0.0, 0.0]}))
    if track:
        store.set_properties(name, {"change_tracking": "true"})
    store.insert(name, pa.table({"id": [1, 2, 3, 4], "name": ["a", "b", "c", "d"],
                                 "score": [1.5, 2.5, 3.5, 4.5]}))
    store.update(name, {"name": "'B'"}, where="id = 2")
    store.delete(name, where="id = 3")
    return store


def read_all(log):
    """Every record of every shard, parents before children."""
    out, done = [], set()
    shards = log.shards()
    while len(done) < len(shards):
        for s in shards:
            if s.shard_id in done or any(p and p not in done for p in
                                         (s.parent_shard_id, s.parent_sibling_shard_id)):
                continue
            it = log.iterator(s.shard_id, "TRIM_HORIZON")
            while it:
                page = log.get_records(it, limit=2)
                out += page.records
                if not page.records and not s.closed:
                    break
                it = page.next_iterator
            done.add(s.shard_id)
    return out


def test_a_tables_change_log_has_its_rows_as_records(cat):
    people(cat)
    log = cat.change_log("people")
    assert log.arn.split(":table/")[1].startswith("people/stream/")
    recs = read_all(log)
    by_event = {}
    for r in recs:
        by_event.setdefault(r.event_name, []).append(r)
    assert sorted(r.new_image["id"] for r in by_event["INSERT"]) == [1, 2, 3, 4]
    (mod,) = by_event["MODIFY"]
    assert mod.old_image == {"id": 2, "name": "b", "score": 2.5}
    assert mod.new_image == {"id": 2, "name": "B", "score": 2.5}    # no hidden columns
    (rem,) = by_event["REMOVE"]
    assert rem.old_image["id"] == 3 and rem.new_image is None
    assert set(mod.key) == {"_vs_row_id"} and isinstance(mod.key["_vs_row_id"], int)
    # one key (row id) keeps its records in commit order, the row inserted before change
    # tracking was turned on is not in the log
    row2 = [r for r in recs if r.key == mod.key]
    assert [r.event_name for r in row2] == ["INSERT", "MODIFY"]
    assert all((r.new_image or r.old_image)["id"] < 100 for r in recs)
    seqs = [int(r.sequence_number) for r in recs]
    assert seqs == sorted(seqs)


def test_reshard_buckets_by_crc32_of_the_key_and_reads_parents_first(cat):
    store = people(cat)
    log = cat.change_log("people")
    children = cat.reshard("people", 4)
    assert all(c.parent_shard_id == log.shards()[0].shard_id for c in children)
    store.insert("people", pa.table({"id": list(range(10, 40)), "name": ["n"] * 30,
                                     "score": [1.0] * 30}))
    store.update("people", {"score": "score + 1"}, where="id >= 10 AND id < 40")
    log = cat.change_log("people")
    recs = read_all(log)
    shard_of = {s.shard_id: s for s in log.shards()}
    for r in recs:
        s = shard_of[r.shard_id]
        bucket = zlib.crc32(str(r.key["_vs_row_id"]).encode()) % TABLE_BUCKETS
        assert s.bucket_lo <= bucket < s.bucket_hi
    history = {}
    for r in recs:
        history.setdefault(r.key["_vs_row_id"], []).append(r.event_name)
    assert len(history) == 34
    assert all(h in (["INSERT"], ["INSERT", "MODIFY"], ["INSERT", "REMOVE"])
               for h in history.values())
    assert sum(h == ["INSERT", "MODIFY"] for h in history.values()) == 31


def test_enable_with_a_key_column_and_view_type_disable_and_errors(cat):
    store = people(cat)
    first = cat.change_log("people").label
    cat.disable_change_log("people")
    assert not cat.change_log("people", label=first).enabled
    log = cat.enable_change_log("people", view_type="KEYS_ONLY", key="id")
    assert log.label != first and log.view_type == "KEYS_ONLY"
    store.update("people", {"score": "0"}, where="id = 1")
    (rec,) = read_all(cat.change_log("people"))
    assert (rec.event_name, rec.key, rec.old_image, rec.new_image) == (
        "MODIFY", {"id": 1}, None, None)
    people(cat, "untracked", track=False)
    with pytest.raises(InvalidInputError, match="'untracked'.*change tracking"):
        cat.change_log("untracked")
    cat.disable_change_log("people")
    with pytest.raises(InvalidInputError, match="no column 'nope'"):
        cat.enable_change_log("people", key="nope")
    with pytest.raises(NotFoundError):
        cat.change_log("no_such_thing")


def test_boto3_lists_describes_and_reads_a_tables_stream(cat, data_dir):
    people(cat)
    cat.create_volume("vol", data_dir)
    with ShardApiServer(cat, "127.0.0.1", 0) as server:
        c = boto3.client("dynamodbstreams", endpoint_url=server.url, region_name="us-east-1",
                         aws_access_key_id="k", aws_secret_access_key="s",
                         config=Config(retries={"max_attempts": 1}))
        tables = {s["TableName"] for s in c.list_streams()["Streams"]}
        assert tables == {"people", "vol"}
        (stream,) = c.list_streams(TableName="people")["Streams"]
        desc = c.describe_stream(StreamArn=stream["StreamArn"])["StreamDescription"]
        assert desc["TableName"] == "people" and desc["StreamStatus"] == "ENABLED"
        assert desc["KeySchema"] == [{"AttributeName": "_vs_row_id", "KeyType": "HASH"}]
        records = []
        for shard in desc["Shards"]:
            it = c.get_shard_iterator(StreamArn=stream["StreamArn"], ShardId=shard["ShardId"],
                                      ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            page = c.get_records(ShardIterator=it, Limit=1000)
            records += page["Records"]
    assert sorted(r["eventName"] for r in records) == ["INSERT"] * 4 + ["MODIFY", "REMOVE"]
    mod = next(r for r in records if r["eventName"] == "MODIFY")["dynamodb"]
    assert mod["NewImage"] == {"id": {"N": "2"}, "name": {"S": "B"}, "score": {"N": "2.5"}}
    assert mod["OldImage"]["name"] == {"S": "b"}
    assert set(mod["Keys"]) == {"_vs_row_id"} and mod["Keys"]["_vs_row_id"]["N"].isdigit()
