"""Change logs of SQL tables keyed by the table's declared key (issue 25 item 2): PRIMARY KEY in
CREATE TABLE or ALTER TABLE ... SET TBLPROPERTIES ('key' = 'a,b'), several key columns in
`enable_change_log(key=[...])`, MODIFY pairing by that key (a DELETE + INSERT of one key in one
commit too), shards by the key's hash, Keys in DynamoDB's format on the endpoint; a table
without a key keeps row-id keys."""

from __future__ import annotations

import math
import time
import zlib

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.config import Config

import volume_stream as vs
from volume_stream.errors import InvalidInputError
from volume_stream.serve import ShardApiServer
from volume_stream.shards.sources import TABLE_BUCKETS
from volume_stream.tables.keys import KEY_PROPERTY


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def rows(a, b, c):
    return pa.table({"a": pa.array(a, pa.int32()), "b": b, "c": pa.array(c, pa.int32())})


def read_all(log, limit=1000):
    out = []
    for s in log.shards():
        it = log.iterator(s.shard_id, "TRIM_HORIZON")
        while it:
            page = log.get_records(it, limit=limit)
            out += page.records
            if not page.records:
                break
            it = page.next_iterator
    return out


def keyed(cat, name="t", how="create"):
    """Table t (a INT, b STRING, c INT) keyed by (a, b), change tracking on, 4 rows."""
    if how == "create":
        cat.sql(f"CREATE TABLE {name} (a INT, b STRING, c INT, PRIMARY KEY (a, b))")
    else:
        cat.sql(f"CREATE TABLE {name} (a INT, b STRING, c INT)")
        cat.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('key' = 'A, b')")  # names as stored
    cat.sql(f"ALTER TABLE {name} SET TBLPROPERTIES ('change_tracking' = 'true')")
    cat.tables.insert(name, rows([1, 1, 2, 3], ["x", "y", "x", "x"], [10, 20, 30, 40]))
    return cat.tables


@pytest.mark.parametrize("how", ["create", "alter"])
def test_a_declared_key_keys_the_records_and_pairs_modify_by_key(cat, how):
    store = keyed(cat, how=how)
    assert store.key("t") == ("a", "b")
    assert store.describe("t")["properties"][KEY_PROPERTY] == "a,b"
    store.update("t", {"c": "c + 1"}, where="a = 1")
    store.delete("t", where="a = 3")
    # one commit deleting key (2, 'x') and inserting it again: MODIFY by key (its row id changed)
    store.insert("t", rows([1, 1, 2], ["x", "y", "x"], [11, 21, 99]), overwrite=True)
    recs = read_all(cat.change_log("t"))
    got = [(r.event_name, r.key, (r.old_image or {}).get("c"), (r.new_image or {}).get("c"))
           for r in recs]
    assert got == [
        ("INSERT", {"a": 1, "b": "x"}, None, 10), ("INSERT", {"a": 1, "b": "y"}, None, 20),
        ("INSERT", {"a": 2, "b": "x"}, None, 30), ("INSERT", {"a": 3, "b": "x"}, None, 40),
        ("MODIFY", {"a": 1, "b": "x"}, 10, 11), ("MODIFY", {"a": 1, "b": "y"}, 20, 21),
        ("REMOVE", {"a": 3, "b": "x"}, 40, None),
        ("MODIFY", {"a": 2, "b": "x"}, 30, 99)]   # (1, x) and (1, y) rewritten unchanged
    assert recs[-1].new_image == {"a": 2, "b": "x", "c": 99}


def test_shards_split_by_the_hash_of_the_key(cat):
    store = keyed(cat)
    cat.reshard("t", 4)
    store.insert("t", rows(list(range(10, 50)), [f"k{i}" for i in range(40)], [0] * 40))
    store.update("t", {"c": "7"}, where="a >= 10")
    log = cat.change_log("t")
    shard_of = {s.shard_id: s for s in log.shards()}
    recs = [r for r in read_all(log, limit=7) if r.commit_version > 2]
    assert len(recs) == 80
    for r in recs:
        text = f"{r.key['a']}\x1f{r.key['b']}"
        bucket = zlib.crc32(text.encode()) % TABLE_BUCKETS
        s = shard_of[r.shard_id]
        assert s.bucket_lo <= bucket < s.bucket_hi
    assert len({r.shard_id for r in recs}) == 4
    by_key = {}
    for r in recs:
        by_key.setdefault((r.key["a"], r.key["b"]), []).append(r.event_name)
    assert set(map(tuple, by_key.values())) == {("INSERT", "MODIFY")}


def test_enable_change_log_with_several_key_columns_and_a_string(cat):
    cat.sql("CREATE TABLE plain (a INT, b STRING, c INT)")
    cat.sql("ALTER TABLE plain SET TBLPROPERTIES ('change_tracking' = 'true')")
    store = cat.tables
    store.insert("plain", rows([1, 2], ["x", "y"], [1, 2]))
    # without a declared key: row-id keys, as before
    first = read_all(cat.change_log("plain"))
    assert [set(r.key) for r in first] == [{"_vs_row_id"}] * 2
    cat.disable_change_log("plain")
    log = cat.enable_change_log("plain", key=["b", "a"])
    store.update("plain", {"c": "c * 10"}, where="a = 1")
    (rec,) = read_all(log)
    assert rec.event_name == "MODIFY" and rec.key == {"b": "x", "a": 1}
    assert list(rec.key) == ["b", "a"]
    cat.disable_change_log("plain")
    log = cat.enable_change_log("plain", key="a")                 # a string still works
    store.update("plain", {"c": "0"}, where="a = 2")
    (rec,) = read_all(log)
    assert rec.key == {"a": 2}
    assert cat.change_log("plain").source.key == "a"
    cat.disable_change_log("plain")
    with pytest.raises(InvalidInputError, match="no column 'nope'"):
        cat.enable_change_log("plain", key=["a", "nope"])
    with pytest.raises(InvalidInputError, match="column name or a list"):
        cat.enable_change_log("plain", key=["a", 3])


def test_a_key_declared_later_keys_the_next_stream(cat):
    cat.sql("CREATE TABLE later (a INT, b STRING, c INT)")
    cat.sql("ALTER TABLE later SET TBLPROPERTIES ('change_tracking' = 'true')")
    store = cat.tables
    store.insert("later", rows([1], ["x"], [1]))
    assert set(read_all(cat.change_log("later"))[0].key) == {"_vs_row_id"}
    cat.sql("ALTER TABLE later SET TBLPROPERTIES ('key' = 'a,b')")
    assert set(cat.change_log("later").shards()[0].shard_id) and \
        cat.change_log("later").source.key == "_vs_row_id"   # the open stream keeps its key
    cat.disable_change_log("later")
    log = cat.enable_change_log("later")                      # the declared key by default
    store.update("later", {"c": "2"})
    (rec,) = read_all(log)
    assert rec.key == {"a": 1, "b": "x"}


def test_bad_key_declarations_are_refused_naming_the_table(cat):
    with pytest.raises(InvalidInputError, match="'bad' has no column 'z'"):
        cat.sql("CREATE TABLE bad (a INT, PRIMARY KEY (a, z))")
    assert not cat.tables.exists("bad")
    cat.sql("CREATE TABLE ok (a INT PRIMARY KEY, b STRING)")
    assert cat.tables.key("ok") == ("a",)
    with pytest.raises(InvalidInputError, match="'ok'.*named twice"):
        cat.sql("ALTER TABLE ok SET TBLPROPERTIES ('key' = 'a,A')")
    with pytest.raises(InvalidInputError, match="one PRIMARY KEY"):
        cat.sql("CREATE TABLE two (a INT PRIMARY KEY, b STRING, PRIMARY KEY (b))")


def test_boto3_reads_keys_in_attribute_value_format(cat):
    keyed(cat, "items")
    cat.tables.update("items", {"c": "0"}, where="b = 'y'")
    with ShardApiServer(cat, "127.0.0.1", 0) as server:
        c = boto3.client("dynamodbstreams", endpoint_url=server.url, region_name="us-east-1",
                         aws_access_key_id="k", aws_secret_access_key="s",
                         config=Config(retries={"max_attempts": 1}))
        (stream,) = c.list_streams(TableName="items")["Streams"]
        desc = c.describe_stream(StreamArn=stream["StreamArn"])["StreamDescription"]
        assert desc["KeySchema"] == [{"AttributeName": "a", "KeyType": "HASH"},
                                     {"AttributeName": "b", "KeyType": "RANGE"}]
        (shard,) = desc["Shards"]
        it = c.get_shard_iterator(StreamArn=stream["StreamArn"], ShardId=shard["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records = c.get_records(ShardIterator=it)["Records"]
    assert [r["eventName"] for r in records] == ["INSERT"] * 4 + ["MODIFY"]
    mod = records[-1]["dynamodb"]
    assert mod["Keys"] == {"a": {"N": "1"}, "b": {"S": "y"}}
    assert mod["OldImage"]["c"] == {"N": "20"} and mod["NewImage"]["c"] == {"N": "0"}


def test_export_rows_start_with_the_key_columns(cat, tmp_path):
    keyed(cat, "ex")
    cat.tables.delete("ex", where="a = 3")
    end = int(time.time() * 1000) + 1
    while time.time() * 1000 <= end:  # the range has ended
        time.sleep(0.001)
    res = cat.export_changes("ex", start_ms=0, end_ms=end, out=tmp_path / "out",
                             safety_lag_ms=0)
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "out").glob(
        "part-*.parquet")))
    assert table.column_names[:3] == ["a", "b", "column_name"]
    assert res.records == 5 and set(table["column_name"].drop_null().to_pylist()) == {"c"}
    assert ("DR", 3, "x") in zip(table["op_type"].to_pylist(), table["a"].to_pylist(),
                                 table["b"].to_pylist(), strict=True)


def _nan_safe(value):
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def test_keys_holding_null_or_nan_pair_into_modify(cat, tmp_path):
    """Issue 34 item 6: keys are paired NULL-safe (NULL with NULL, NaN with NaN): an UPDATE of a
    row whose key holds a NULL or NaN is one MODIFY, a no-op rewrite no record, and the DataX
    export shows no `DR` row for a delete that never happened."""
    cat.sql("CREATE TABLE n (k DOUBLE, j STRING, v INT, PRIMARY KEY (k, j))")
    cat.sql("ALTER TABLE n SET TBLPROPERTIES ('change_tracking' = 'true')")
    cat.tables.insert("n", pa.table({"k": pa.array([1.0, None, math.nan, None, math.nan]),
                                     "j": ["x", None, "y", "z", None],
                                     "v": pa.array([1, 2, 3, 4, 5], pa.int32())}))
    cat.sql("UPDATE n SET v = v")             # changes nothing: no record
    cat.sql("UPDATE n SET v = v + 10 WHERE v >= 2")
    got = [(r.event_name, tuple(_nan_safe(r.key[c]) for c in ("k", "j")),
            (r.old_image or {}).get("v"), (r.new_image or {}).get("v"))
           for r in read_all(cat.change_log("n"))]
    inserts = [e for e in got if e[0] == "INSERT"]
    assert len(inserts) == 5 and len(got) == 9, got
    assert sorted(got[5:], key=repr) == sorted([
        ("MODIFY", (None, None), 2, 12), ("MODIFY", ("NaN", "y"), 3, 13),
        ("MODIFY", (None, "z"), 4, 14), ("MODIFY", ("NaN", None), 5, 15)], key=repr)
    end = int(time.time() * 1000) + 1
    while time.time() * 1000 <= end:  # the range has ended
        time.sleep(0.001)
    res = cat.export_changes("n", start_ms=0, end_ms=end, out=tmp_path / "out",
                             safety_lag_ms=0)
    table = pa.concat_tables(pq.read_table(f) for f in sorted((tmp_path / "out").glob(
        "part-*.parquet")))
    assert res.records == 9
    ops = table["op_type"].to_pylist()
    assert ops.count("DR") == 4       # one per MODIFY, none for the no-op rewrite
    assert ops.count("U") == 5 + 4    # a U row per record's new image (one value column)
