"""Faults on the wire (issue 16): a fault-injecting proxy (`tests/fakes/faulty_proxy.py`) between
the project's S3 and SQS clients and moto's server fails a share of requests with 500s, 503
SlowDown, connection resets, cut-off bodies and latency. An S3 + SQS volume watched and
refreshed through it still ends equal to the bucket: nothing lost, nothing duplicated."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import time

import boto3
import botocore.config
import pytest

import volume_stream as vs
from tests.aws_fixtures import aws_env, moto_server, rig  # noqa: F401
from tests.fakes.faulty_proxy import FAULTS, FaultyProxy


def test_the_proxy_injects_every_kind_of_fault_and_sdk_retries_absorb_them(aws_env, rig):
    with FaultyProxy(aws_env, rate=0.3, seed=3, latency_s=0.01) as proxy:
        s3 = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1",
                          config=botocore.config.Config(retries={"mode": "standard",
                                                                 "max_attempts": 10}))
        for i in range(20):
            s3.put_object(Bucket=rig.bucket, Key=f"k{i:02d}", Body=b"x" * i)
        for _ in range(20):  # listings have bodies to cut off
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=rig.bucket)["Contents"]]
            assert keys == [f"k{i:02d}" for i in range(20)]
    counts = proxy.counts
    assert set(FAULTS) <= set(counts), counts
    assert counts["forwarded"] >= 40


def test_the_proxy_keeps_the_length_of_a_head_answer(aws_env, rig):
    """HEAD has no body: the object's length is the upstream's Content-Length (a proxy that
    answered 0 made pyarrow's S3 report every Parquet file as 0 bytes)."""
    rig.put("k", b"x" * 1234)
    with FaultyProxy(aws_env, rate=0) as proxy:
        s3 = boto3.client("s3", endpoint_url=proxy.endpoint, region_name="us-east-1")
        assert s3.head_object(Bucket=rig.bucket, Key="k")["ContentLength"] == 1234


def _bucket(rig) -> dict[str, int]:
    pages = rig.s3.get_paginator("list_objects_v2").paginate(Bucket=rig.bucket, Prefix="in/")
    return {o["Key"][3:]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _table(cat) -> dict[str, int]:
    snap = cat.directory_table("vol").snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(snap["relative_path"], snap["size"], strict=True))


@pytest.mark.parametrize("rate", [0.1])
def test_s3_sqs_volume_under_faults_ends_equal_to_the_bucket(tmp_path, aws_env, rig, rate):
    with FaultyProxy(aws_env, rate=rate, seed=11, latency_s=0.05) as proxy:
        cat = vs.connect(tmp_path / "wh")
        note = vs.SqsNotification(rig.queue_url, wait_time_seconds=0)
        cat.create_volume("vol", f"s3://{rig.bucket}/in/", notification=note,
                          endpoint_url=proxy.endpoint)
        cat.create_stream("ao", "vol", mode="APPEND_ONLY")
        for i in range(30):
            rig.put(f"in/f{i:02d}.bin", b"x" * (i + 1))
        for i in range(5):
            rig.s3.delete_object(Bucket=rig.bucket, Key=f"in/f{i:02d}.bin")
        for i in range(5, 10):
            rig.put(f"in/f{i:02d}.bin", b"y" * 100)
        errors = []
        deadline = time.monotonic() + 120
        # a watch that fails (retries exhausted, a cut-off receive) is run again, as the daemon
        # would; messages whose receipt was lost come back after the visibility timeout
        while _table(cat) != _bucket(rig) and time.monotonic() < deadline:
            try:
                cat.watch("vol", until_idle=True, timeout=10)
            except vs.SourceError as exc:
                errors.append(exc)
        assert _table(cat) == _bucket(rig), (proxy.counts, errors)
        while True:  # a refresh through the faults heals whatever the queue could not
            try:
                m = cat.refresh("vol")
                break
            except vs.SourceError as exc:
                errors.append(exc)
        assert m.version is None  # the queue alone already made the table equal to the bucket
        inserted = [r["relative_path"] for r in cat.read_stream_arrow("ao").to_pylist()]
        # every file that is there appeared once; redelivered events duplicated nothing
        assert len(inserted) == len(set(inserted)) and set(inserted) >= set(_bucket(rig))
    counts = proxy.counts
    faulted = sum(v for k, v in counts.items() if k != "forwarded")
    assert faulted >= 1, counts
