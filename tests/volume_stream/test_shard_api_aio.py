"""aiobotocore reads the shard API (issue 25 item 3): an asyncio client on aiohttp (botocore's
parser and signer, another HTTP stack) lists, describes and reads every shard of a volume's
change log concurrently over signed HTTP, and reads what boto3 reads, record by record."""

from __future__ import annotations

import asyncio

import boto3
import pytest
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import ClientError

import volume_stream as vs
from tests.volume_stream.shard_records import boto_drain, of_boto
from volume_stream.serve import ShardApiServer

KEY, SECRET, REGION = "AKIDAIO", "aio-secret", "ap-southeast-2"


@pytest.fixture
def cat(tmp_path, data_dir, ev):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data_dir, shards=3)
    apply = cat.directory_table("vol").apply
    apply([ev.put(f"f{i:02d}.txt", i + 1) for i in range(40)])
    apply([ev.put(f"f{i:02d}.txt", 100 + i) for i in range(0, 40, 3)])
    apply([ev.rm(f"f{i:02d}.txt") for i in range(1, 40, 5)])
    return cat


async def _read_all(url, secret=SECRET):
    """Every record of every shard, the shards read at once; and the stream's description."""
    config = Config(retries={"max_attempts": 1})
    async with get_session().create_client(
            "dynamodbstreams", endpoint_url=url, region_name=REGION, aws_access_key_id=KEY,
            aws_secret_access_key=secret, config=config) as c:
        (stream,) = (await c.list_streams(TableName="vol"))["Streams"]
        arn = stream["StreamArn"]
        desc = (await c.describe_stream(StreamArn=arn))["StreamDescription"]

        async def shard(shard_id):
            it = (await c.get_shard_iterator(StreamArn=arn, ShardId=shard_id,
                                             ShardIteratorType="TRIM_HORIZON"))["ShardIterator"]
            out = []
            while it:
                page = await c.get_records(ShardIterator=it, Limit=7)
                out += page["Records"]
                it = page.get("NextShardIterator")
                if not page["Records"]:
                    break
            return out

        pages = await asyncio.gather(*(shard(s["ShardId"]) for s in desc["Shards"]))
        return desc, dict(zip([s["ShardId"] for s in desc["Shards"]], pages, strict=True))


def test_aiobotocore_reads_what_boto3_reads(cat):
    with ShardApiServer(cat, "127.0.0.1", 0, keys={KEY: SECRET}, region=REGION) as server:
        desc, by_shard = asyncio.run(_read_all(server.url))
        c = boto3.client("dynamodbstreams", endpoint_url=server.url, region_name=REGION,
                         aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                         config=Config(retries={"max_attempts": 1}))
        b_desc = c.describe_stream(StreamArn=desc["StreamArn"])["StreamDescription"]
        assert desc == b_desc and len(desc["Shards"]) == 3
        total = 0
        for shard_id, records in by_shard.items():
            boto_records = boto_drain(c, desc["StreamArn"], shard_id)
            assert [of_boto(r) for r in records] == [of_boto(r) for r in boto_records]
            total += len(records)
        assert total == 40 + 14 + 8
        with pytest.raises(ClientError) as err:
            asyncio.run(_read_all(server.url, secret="wrong"))
        assert err.value.response["Error"]["Code"] == "InvalidSignatureException"
