"""An independent client reads the shard API (issue 25 item 3): the AWS SDK for Java v2's
`DynamoDbStreamsClient` (its own JSON parser, SigV4 signer, HTTP client and enums; one JVM for
the module, tests/volume_stream/java_streams.py) lists, describes, iterates and reads a volume's
and a keyed table's change logs over signed HTTP, and what it reads is compared record by record
with what boto3 reads and with the change log itself; its async client on Netty reads the same."""

from __future__ import annotations

import base64
from datetime import UTC, date, datetime
from decimal import Decimal

import boto3
import pyarrow as pa
import pytest
from botocore.config import Config

from tests.volume_stream.java_streams import JavaStreams
from tests.volume_stream.shard_http import volume_catalog
from tests.volume_stream.shard_records import boto_drain, log_drain, of_boto, of_java, of_log
from volume_stream.serve import ShardApiServer

KEY, SECRET, REGION = "AKIDJAVA", "java-secret", "eu-central-1"
ITERATOR_TYPES = ("TRIM_HORIZON", "LATEST", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER")


@pytest.fixture(scope="module")
def java():
    with JavaStreams.start() as probe:
        yield probe


@pytest.fixture
def cat(tmp_path, data_dir):
    return volume_catalog(tmp_path, data_dir)


@pytest.fixture
def server(cat, java):
    with ShardApiServer(cat, "127.0.0.1", 0, keys={KEY: SECRET}, region=REGION) as s:
        java.client(s.url, REGION, KEY, SECRET)
        yield s


def boto(url, key=KEY, secret=SECRET):
    return boto3.client("dynamodbstreams", endpoint_url=url, region_name=REGION,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 1}))


def java_drain(java, arn, shard_id, kind="TRIM_HORIZON", seq=None, limit=1000):
    it = java.call("iterator", arn, shard_id, kind, seq)
    assert "iterator" in it, it
    page = java.call("drain", it["iterator"], limit)
    assert "records" in page, page
    return page["records"]


def same_everywhere(java, c, cat, name):
    """Every stream of `name`: Java's ListStreams/DescribeStream/GetRecords against boto3's and
    the change log's, record by record. Returns the records read, by stream label."""
    j_streams = java.call("list", name, 1)
    b_streams = c.list_streams(TableName=name)["Streams"]
    assert j_streams["streams"] == b_streams and j_streams["pages"] == len(b_streams)
    read = {}
    for stream in b_streams:
        arn, label = stream["StreamArn"], stream["StreamLabel"]
        log = cat.change_log(name, label=label, region=REGION)
        desc = java.call("describe", arn, 2)
        b_desc = c.describe_stream(StreamArn=arn)["StreamDescription"]
        for k in ("StreamArn", "StreamLabel", "StreamStatus", "StreamViewType", "TableName",
                  "KeySchema"):
            assert desc[k] == b_desc[k], k
        assert desc["CreationRequestDateTime"] == pytest.approx(
            b_desc["CreationRequestDateTime"].timestamp(), abs=1e-3)
        assert desc["pages"] == (len(b_desc["Shards"]) + 1) // 2
        want = [{"ShardId": s.shard_id, "ParentShardId": s.parent_shard_id,
                 "StartingSequenceNumber": s.starting_sequence_number,
                 "EndingSequenceNumber": s.ending_sequence_number} for s in log.shards()]
        assert desc["Shards"] == want
        records = []
        for shard in want:
            j = [of_java(r) for r in java_drain(java, arn, shard["ShardId"], limit=3)]
            b = [of_boto(r) for r in boto_drain(c, arn, shard["ShardId"])]
            assert j == b, shard["ShardId"]
            mine = [of_log(r, log.view_type) for r in log_drain(log, shard["ShardId"])]
            assert [(r["eventName"], {k: v for k, v in r["dynamodb"].items()
                                      if k != "SizeBytes"}) for r in j] == mine
            assert all(r["eventSource"] == "aws:dynamodb" and r["awsRegion"] == REGION
                       and r["dynamodb"]["SizeBytes"] > 0 for r in j)
            records += j
        assert len({r["eventID"] for r in records}) == len(records)
        read[label] = records
    return read


def test_java_sdk_reads_a_volume_as_boto3_and_the_change_log_do(cat, server, java, ev):
    apply = cat.directory_table("vol").apply
    apply([ev.put("a.txt", 3), ev.put("b c.txt", 4), ev.put('quo"te.txt', 5)])
    apply([ev.put("a.txt", 7), ev.put("caf\u00e9/\u00fcber \U0001f600.txt", 8)])
    cat.reshard("vol", 3)                      # lineage: 2 closed parents, 3 children
    apply([ev.rm("b c.txt"), ev.put("new.txt", 9)])
    apply([ev.put("new.txt", 10)])
    (records,) = same_everywhere(java, boto(server.url), cat, "vol").values()
    arn = cat.change_log("vol", region=REGION).arn
    netty = java.call("async", server.url, REGION, KEY, SECRET, arn)
    assert [of_java(r) for r in netty["records"]] == [of_java(r) for r in records]
    by_key = {}
    for r in records:
        by_key.setdefault(r["dynamodb"]["Keys"]["relative_path"]["S"], []).append(
            r["eventName"])
    assert by_key == {"a.txt": ["INSERT", "MODIFY"], "b c.txt": ["INSERT", "REMOVE"],
                      'quo"te.txt': ["INSERT"], "new.txt": ["INSERT", "MODIFY"],
                      "caf\u00e9/\u00fcber \U0001f600.txt": ["INSERT"]}
    desc = java.call("describe", arn, 100)
    parents = [s for s in desc["Shards"] if s["EndingSequenceNumber"]]
    assert len(parents) == 2 and desc["pages"] == 1
    children = java.call("children", desc["StreamArn"], parents[0]["ShardId"])["shards"]
    assert children and all(s["ParentShardId"] == parents[0]["ShardId"] for s in children)


def test_java_sdk_reads_a_keyed_table_of_every_column_type(cat, server, java):
    cat.sql("CREATE TABLE typed (a INT, b STRING, f FLOAT, d DOUBLE, n DECIMAL(10, 2), "
            "ok BOOLEAN, day DATE, at TIMESTAMP, raw BINARY, big BIGINT, PRIMARY KEY (a, b))")
    cat.sql("ALTER TABLE typed SET TBLPROPERTIES ('change_tracking' = 'true')")
    schema = pa.schema([("a", pa.int32()), ("b", pa.string()), ("f", pa.float32()),
                        ("d", pa.float64()), ("n", pa.decimal128(10, 2)), ("ok", pa.bool_()),
                        ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")),
                        ("raw", pa.binary()), ("big", pa.int64())])
    cat.tables.insert("typed", pa.table({
        "a": [1, 1, 2], "b": ["x", "y\u00e9\\", ""], "f": [1.5, None, -0.25],
        "d": [0.1, 1e300, -2.5e-10], "n": [Decimal("12.50"), Decimal("-0.01"), None],
        "ok": [True, False, None], "day": [date(2026, 1, 2), None, date(1970, 1, 1)],
        "at": [datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), None,
               datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC)],
        "raw": [b"\x00\xff\x10", b"", None], "big": [2**62, -(2**40), 0]}, schema=schema))
    cat.tables.update("typed", {"d": "d * 2", "ok": "NOT ok"}, where="a = 1")
    cat.tables.delete("typed", where="a = 2")
    (records,) = same_everywhere(java, boto(server.url), cat, "typed").values()
    assert [r["eventName"] for r in records].count("MODIFY") == 2
    first = next(r for r in records if r["dynamodb"]["Keys"] == {"a": {"N": "1"},
                                                                 "b": {"S": "x"}})
    assert first["dynamodb"]["NewImage"]["raw"] == {"B": base64.b64encode(b"\x00\xff\x10")
                                                    .decode()}
    assert first["dynamodb"]["NewImage"]["n"] == {"N": "12.50"}
    assert first["dynamodb"]["NewImage"]["big"] == {"N": str(2**62)}
    desc = java.call("describe", cat.change_log("typed", region=REGION).arn, 100)
    assert desc["KeySchema"] == [{"AttributeName": "a", "KeyType": "HASH"},
                                 {"AttributeName": "b", "KeyType": "RANGE"}]


def test_java_sdk_reads_every_view_type(cat, server, java, ev):
    apply = cat.directory_table("vol").apply
    for view in ("KEYS_ONLY", "NEW_IMAGE", "OLD_IMAGE", "NEW_AND_OLD_IMAGES"):
        cat.disable_change_log("vol")
        cat.enable_change_log("vol", view_type=view, shards=2)
        apply([ev.put(f"{view}.txt", 1)])
        apply([ev.put(f"{view}.txt", 2)])
        apply([ev.rm(f"{view}.txt")])
    read = same_everywhere(java, boto(server.url), cat, "vol")
    assert len(read) == 5                      # the volume's first stream and four more
    views = {}
    for records in read.values():
        for r in records:
            d = r["dynamodb"]
            views.setdefault(d["StreamViewType"], set()).add(
                (r["eventName"], "NewImage" in d, "OldImage" in d))
    assert views["KEYS_ONLY"] == {("INSERT", False, False), ("MODIFY", False, False),
                                  ("REMOVE", False, False)}
    assert views["NEW_IMAGE"] == {("INSERT", True, False), ("MODIFY", True, False),
                                  ("REMOVE", False, False)}
    assert views["OLD_IMAGE"] == {("INSERT", False, False), ("MODIFY", False, True),
                                  ("REMOVE", False, True)}
    assert views["NEW_AND_OLD_IMAGES"] == {("INSERT", True, False), ("MODIFY", True, True),
                                           ("REMOVE", False, True)}


def test_java_sdk_iterator_types_and_errors(cat, server, java, ev):
    apply = cat.directory_table("vol").apply
    cat.reshard("vol", 1)
    apply([ev.put(f"f{i}.txt", i + 1) for i in range(5)])
    arn = cat.change_log("vol", region=REGION).arn
    (shard,) = [s for s in java.call("describe", arn, 100)["Shards"]
                if not s["EndingSequenceNumber"]]
    sid = shard["ShardId"]
    latest = java.call("iterator", arn, sid, "LATEST", None)["iterator"]
    every = java_drain(java, arn, sid)
    seqs = [r["dynamodb"]["SequenceNumber"] for r in every]
    assert len(seqs) == 5 and seqs == sorted(seqs, key=int)
    at = java_drain(java, arn, sid, "AT_SEQUENCE_NUMBER", seqs[2])
    after = java_drain(java, arn, sid, "AFTER_SEQUENCE_NUMBER", seqs[2])
    assert [r["dynamodb"]["SequenceNumber"] for r in at] == seqs[2:]
    assert [r["dynamodb"]["SequenceNumber"] for r in after] == seqs[3:]
    assert java.call("records", latest, 100)["records"] == []
    apply([ev.put("later.txt", 1)])
    page = java.call("records", latest, 100)
    assert [r["dynamodb"]["Keys"]["relative_path"]["S"] for r in page["records"]] == \
        ["later.txt"] and page["next"]
    c = boto(server.url)
    for kind, seq in zip(ITERATOR_TYPES, (None, None, seqs[1], seqs[1]), strict=True):
        j = [of_java(r) for r in java_drain(java, arn, sid, kind, seq)]
        assert j == [of_boto(r) for r in boto_drain(c, arn, sid, kind, seq)], kind
    # errors: the SDK's own exception classes for the modelled ones, the code for the rest
    def error(*command):
        answer = java.call(*command)
        assert "error" in answer, answer
        return answer["error"]
    assert error("records", latest[:-4] + "AAAA", 10)["exception"] == "ExpiredIteratorException"
    assert error("describe", arn.replace("table/vol/", "table/nope/"), 10)["exception"] == \
        "ResourceNotFoundException"
    assert error("iterator", arn, "shardId-00000000000000000000-00000000", "LATEST", None
                 )["exception"] == "ResourceNotFoundException"
    bad = error("iterator", arn, sid, "AT_SEQUENCE_NUMBER", "1" * 21)
    assert (bad["code"], bad["status"]) == ("ValidationException", 400)
    assert error("records", latest, 1001)["code"] == "ValidationException"
    java.client(server.url, REGION, KEY, "wrong-secret")
    assert error("list", None, 10)["code"] == "InvalidSignatureException"
    java.client(server.url, REGION, "AKIDOTHER", SECRET)
    assert error("list", None, 10)["code"] == "UnrecognizedClientException"
    java.client(server.url, "us-west-2", KEY, SECRET)   # signed for another region
    assert error("list", None, 10)["code"] == "InvalidSignatureException"
