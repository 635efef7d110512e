"""The DynamoDB Streams-compatible endpoint, driven by unmodified boto3 over HTTP."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

import volume_stream as vs
from tests.volume_stream.shard_http import call, daemon_toml, volume_catalog
from volume_stream.serve import ShardApiServer


@pytest.fixture
def cat(tmp_path, data_dir):
    return volume_catalog(tmp_path, data_dir)


def apply(cat, *events, volume="vol"):
    return cat.directory_table(volume).apply(events).version


def client(url, key="AKIDEXAMPLE", secret="secret-1"):
    return boto3.client("dynamodbstreams", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": 1}))


@pytest.fixture
def server(cat):
    with ShardApiServer(cat, "127.0.0.1", 0) as s:
        yield s


def code(exc_info):
    return exc_info.value.response["Error"]["Code"]


def test_list_describe_iterate_and_read(cat, server, ev):
    apply(cat, ev.put("a.txt", 3), ev.put("b c.txt", 4))
    apply(cat, ev.put("a.txt", 7))
    apply(cat, ev.rm("b c.txt"))
    c = client(server.url)
    streams = c.list_streams(TableName="vol")["Streams"]
    assert len(streams) == 1 and streams[0]["TableName"] == "vol"
    arn = streams[0]["StreamArn"]
    assert arn == cat.change_log("vol").arn
    desc = c.describe_stream(StreamArn=arn)["StreamDescription"]
    assert desc["StreamStatus"] == "ENABLED" and desc["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert desc["KeySchema"] == [{"AttributeName": "relative_path", "KeyType": "HASH"}]
    assert len(desc["Shards"]) == 2 and "LastEvaluatedShardId" not in desc
    records = []
    for shard in desc["Shards"]:
        assert "EndingSequenceNumber" not in shard["SequenceNumberRange"]
        it = c.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        page = c.get_records(ShardIterator=it, Limit=1000)
        assert page["NextShardIterator"]          # open shard
        records += page["Records"]
    by_key = {}
    for r in records:
        by_key.setdefault(r["dynamodb"]["Keys"]["relative_path"]["S"], []).append(r)
    a = [r["eventName"] for r in by_key["a.txt"]]
    b = [r["eventName"] for r in by_key["b c.txt"]]
    assert a == ["INSERT", "MODIFY"] and b == ["INSERT", "REMOVE"]
    mod = by_key["a.txt"][1]
    assert mod["eventSource"] == "aws:dynamodb" and mod["awsRegion"] == "us-east-1"
    assert mod["dynamodb"]["OldImage"]["size"] == {"N": "3"}
    assert mod["dynamodb"]["NewImage"]["size"] == {"N": "7"}
    assert mod["dynamodb"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert mod["dynamodb"]["SizeBytes"] > 0 and len(mod["eventID"]) == 32
    assert mod["dynamodb"]["ApproximateCreationDateTime"].year >= 2026
    rem = by_key["b c.txt"][1]["dynamodb"]
    assert "NewImage" not in rem and rem["OldImage"]["relative_path"] == {"S": "b c.txt"}
    assert len({r["eventID"] for r in records}) == 4


def test_paging_shards_and_records(cat, server, ev):
    cat.reshard("vol", 4)
    cat.reshard("vol", 8)
    apply(cat, *[ev.put(f"f{i:02d}") for i in range(30)])
    c = client(server.url)
    arn = c.list_streams()["Streams"][0]["StreamArn"]
    seen, start = [], None
    while True:
        kw = {"ExclusiveStartShardId": start} if start else {}
        desc = c.describe_stream(StreamArn=arn, Limit=3, **kw)["StreamDescription"]
        seen += desc["Shards"]
        start = desc.get("LastEvaluatedShardId")
        if not start:
            break
    assert len(seen) == 2 + 4 + 8 and len({s["ShardId"] for s in seen}) == 14
    ids = {s["ShardId"] for s in seen}
    assert all(s.get("ParentShardId") in ids for s in seen[2:])
    closed = [s for s in seen if "EndingSequenceNumber" in s["SequenceNumberRange"]]
    assert len(closed) == 6
    children = c.describe_stream(StreamArn=arn, ShardFilter={
        "Type": "CHILD_SHARDS", "ShardId": seen[0]["ShardId"]})["StreamDescription"]["Shards"]
    assert len(children) == 2
    keys = []
    for s in seen[6:]:
        it = c.get_shard_iterator(StreamArn=arn, ShardId=s["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while True:
            page = c.get_records(ShardIterator=it, Limit=2)
            keys += [r["dynamodb"]["Keys"]["relative_path"]["S"] for r in page["Records"]]
            if not page["Records"]:
                break
            it = page["NextShardIterator"]
    assert sorted(keys) == [f"f{i:02d}" for i in range(30)]
    # a closed shard is drained: no NextShardIterator
    it = c.get_shard_iterator(StreamArn=arn, ShardId=closed[0]["ShardId"],
                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    assert "NextShardIterator" not in c.get_records(ShardIterator=it)


def test_errors_as_dynamodb_sends_them(cat, server, ev, tmp_path):
    apply(cat, ev.put("a.txt"))
    c = client(server.url)
    arn = c.list_streams()["Streams"][0]["StreamArn"]
    with pytest.raises(ClientError) as err:
        c.list_streams(TableName="nope")
    assert code(err) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as err:
        c.describe_stream(StreamArn=arn.replace("table/vol", "table/zzz"))
    assert code(err) == "ResourceNotFoundException"
    sid = c.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    with pytest.raises(ClientError) as err:
        c.get_shard_iterator(StreamArn=arn, ShardId="shardId-00000000000000000000-00000000",
                             ShardIteratorType="LATEST")
    assert code(err) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as err:
        c.get_shard_iterator(StreamArn=arn, ShardId=sid, ShardIteratorType="AT_SEQUENCE_NUMBER",
                             SequenceNumber="1" * 21)
    assert code(err) == "ValidationException"
    it = c.get_shard_iterator(StreamArn=arn, ShardId=sid,
                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    with pytest.raises(ClientError) as err:
        c.get_records(ShardIterator=it[:-3] + "AAA")
    assert code(err) == "ExpiredIteratorException"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as err:
        c.get_records(ShardIterator=it, Limit=1001)
    assert code(err) == "ValidationException"
    # raw wire: the error document has __type and message, the answer DynamoDB's x-amz-crc32
    raw = call(server.url, "DescribeStream", {"StreamArn": "x"})
    assert raw.status == 400 and raw.error == "ResourceNotFoundException"


def test_trimmed_data_access(tmp_path, data_dir, ev):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("short", data_dir, data_retention_days=0)
    with ShardApiServer(cat, "127.0.0.1", 0) as server:
        c = client(server.url)
        arn = c.list_streams(TableName="short")["Streams"][0]["StreamArn"]
        sid = c.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
        apply(cat, ev.put("a"), volume="short")
        it = c.get_shard_iterator(StreamArn=arn, ShardId=sid,
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        seq = c.get_records(ShardIterator=it)["Records"][0]["dynamodb"]["SequenceNumber"]
        for i in range(3):
            apply(cat, ev.put(f"b{i}"), volume="short")
        cat.apply_retention("short")
        with pytest.raises(ClientError) as err:
            c.get_records(ShardIterator=it)
        assert code(err) == "TrimmedDataAccessException"
        with pytest.raises(ClientError) as err:
            c.get_shard_iterator(StreamArn=arn, ShardId=sid, SequenceNumber=seq,
                                 ShardIteratorType="AFTER_SEQUENCE_NUMBER")
        assert code(err) == "TrimmedDataAccessException"


def test_signatures_checked_with_keys(cat, ev):
    apply(cat, ev.put("a.txt"))
    with ShardApiServer(cat, "127.0.0.1", 0, keys={"AKIDEXAMPLE": "secret-1"}) as server:
        assert server.url.startswith("http://127.0.0.1:")
        good = client(server.url)
        assert good.list_streams()["Streams"]
        with pytest.raises(ClientError) as err:
            client(server.url, secret="wrong").list_streams()
        assert code(err) == "InvalidSignatureException"
        with pytest.raises(ClientError) as err:
            client(server.url, key="AKIDOTHER").list_streams()
        assert code(err) == "UnrecognizedClientException"
        raw = call(server.url, "ListStreams", {})       # unsigned
        assert raw.status == 400 and raw.error == "MissingAuthenticationTokenException"


def test_cli_serves_signed_requests_until_interrupted(cat, ev, tmp_path):
    import re
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    apply(cat, ev.put("a.txt"))
    cli = str(Path(sys.executable).parent / "volume-stream")
    env = {**__import__("os").environ, "VOLUME_STREAM_SHARD_API_SECRET": "s3cret"}
    proc = subprocess.Popen([cli, "shard-api", "--warehouse", str(cat.warehouse.root),
                             "--listen", "127.0.0.1:0", "--access-key-id", "AKIDCLI"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line, deadline = "", time.monotonic() + 60
        while "shard API on" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "shard-api exited early"
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        streams = client(url, key="AKIDCLI", secret="s3cret").list_streams()["Streams"]
        assert [s["TableName"] for s in streams] == ["vol"]
        with pytest.raises(ClientError) as err:
            client(url, key="AKIDCLI", secret="nope").list_streams()
        assert code(err) == "InvalidSignatureException"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    bad = subprocess.run([cli, "shard-api", "--warehouse", str(cat.warehouse.root),
                          "--listen", "nowhere"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "--listen must be HOST:PORT" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_daemon_serves_shard_api_from_toml(tmp_path, data_dir, ev, monkeypatch):
    from volume_stream.config.daemon import DaemonConfig
    from volume_stream.daemon import Daemon
    from volume_stream.errors import ConfigError

    toml = daemon_toml(tmp_path / "vs.toml", tmp_path / "wh", data_dir, listen="127.0.0.1:0",
                       require_signature=True, region="eu-west-1", account_id="123456789012")
    cfg = DaemonConfig.load(toml)
    assert cfg.shard_api.enabled and cfg.shard_api.listen == "127.0.0.1:0"
    with pytest.raises(ConfigError, match="VOLUME_STREAM_SHARD_API_SECRET"):
        Daemon(cfg).start()
    monkeypatch.setenv("VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID", "AKIDD")
    monkeypatch.setenv("VOLUME_STREAM_SHARD_API_SECRET", "daemon-secret")
    daemon = Daemon(DaemonConfig.load(toml))
    with daemon:
        url = daemon.shard_api.url
        c = boto3.client("dynamodbstreams", endpoint_url=url, region_name="eu-west-1",
                         aws_access_key_id="AKIDD", aws_secret_access_key="daemon-secret")
        (stream,) = c.list_streams()["Streams"]
        assert stream["StreamArn"].startswith("arn:aws:dynamodb:eu-west-1:123456789012:"
                                              "table/landing/stream/")
    assert daemon.shard_api is None
    toml.write_text(toml.read_text().replace('require_signature = true',
                                             'access_key_id = "AKIDD"'))
    with pytest.raises(ConfigError):          # credentials never come from the file
        DaemonConfig.load(toml)


def test_list_streams_paging_and_disabled_stream(cat, server, data_dir, ev):
    cat.create_volume("other", data_dir)
    cat.disable_change_log("vol")
    cat.enable_change_log("vol", view_type="KEYS_ONLY")
    c = client(server.url)
    seen, start = [], None
    while True:
        page = c.list_streams(Limit=1, **({"ExclusiveStartStreamArn": start} if start else {}))
        seen += page["Streams"]
        start = page.get("LastEvaluatedStreamArn")
        if not start:
            break
    assert sorted(s["TableName"] for s in seen) == ["other", "vol", "vol"]
    assert len({s["StreamArn"] for s in seen}) == 3
    old, new = [s for s in seen if s["TableName"] == "vol"]
    desc = c.describe_stream(StreamArn=old["StreamArn"])["StreamDescription"]
    assert desc["StreamStatus"] == "DISABLED"
    assert all("EndingSequenceNumber" in s["SequenceNumberRange"] for s in desc["Shards"])
    desc = c.describe_stream(StreamArn=new["StreamArn"])["StreamDescription"]
    assert desc["StreamStatus"] == "ENABLED" and desc["StreamViewType"] == "KEYS_ONLY"
    apply(cat, ev.put("k.txt"))
    recs = []
    for s in desc["Shards"]:
        it = c.get_shard_iterator(StreamArn=new["StreamArn"], ShardId=s["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        recs += c.get_records(ShardIterator=it)["Records"]
    (r,) = recs
    assert r["dynamodb"]["Keys"] == {"relative_path": {"S": "k.txt"}}
    assert "NewImage" not in r["dynamodb"] and r["dynamodb"]["StreamViewType"] == "KEYS_ONLY"


def test_recreated_volume_is_a_new_table(cat, server, data_dir, ev):
    c = client(server.url)
    old_arn = c.list_streams(TableName="vol")["Streams"][0]["StreamArn"]
    sid = c.describe_stream(StreamArn=old_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    it = c.get_shard_iterator(StreamArn=old_arn, ShardId=sid,
                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    cat.create_volume("vol", data_dir, replace=True)
    apply(cat, ev.put("fresh.txt"))
    with pytest.raises(ClientError) as err:
        c.get_records(ShardIterator=it)
    assert code(err) == "ExpiredIteratorException"
    arn = c.list_streams(TableName="vol")["Streams"][0]["StreamArn"]
    (shard,) = c.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]
    it = c.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    (r,) = c.get_records(ShardIterator=it)["Records"]
    assert r["dynamodb"]["Keys"]["relative_path"]["S"] == "fresh.txt"
