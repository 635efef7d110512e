"""The daemon on an S3 + SQS volume over moto's server: malformed and poison messages never stop
it; they end on the dead-letter queue by its redrive policy, while good files commit once."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
from collections import Counter

import boto3

import volume_stream as vs
from tests.aws_fixtures import aws_env, make_rig, moto_server, queue_counts  # noqa: F401
from tests.volume_stream.test_daemon import config, metric, wait_for
from volume_stream.daemon import Daemon


def s3_event(bucket: str, key: str, size: float) -> str:
    return json.dumps({"Records": [{
        "eventVersion": "2.1", "eventSource": "aws:s3", "eventTime": "2026-01-01T00:00:00.000Z",
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": bucket},
               "object": {"key": key, "size": size, "eTag": "abc", "sequencer": "0A"}}}]})


def test_malformed_and_poison_messages_go_to_the_dlq_and_never_stop_it(tmp_path, aws_env):
    from volume_stream.volumes import SqsNotification

    sqs = boto3.client("sqs")
    dlq_url = sqs.create_queue(QueueName=f"dlq-{tmp_path.name[-20:]}")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"]
                                       )["Attributes"]["QueueArn"]
    rig = make_rig(aws_env, queue_attributes={
        "VisibilityTimeout": "1",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"})})
    try:
        cat = vs.connect(tmp_path / "wh")
        cat.create_volume("vol", f"s3://{rig.bucket}/in/",
                          notification=SqsNotification(rig.queue_url, wait_time_seconds=1))
        cat.create_stream("inserts", "vol", mode="APPEND_ONLY")
        cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0.2, "poll_s": 0.5}},
                     poison_after=1)
        poison = s3_event(rig.bucket, "in/huge.bin", 1e20)  # parses, but cannot be stored
        with Daemon(cfg, catalog=cat) as daemon:
            wait_for(lambda: daemon.readiness()[0])
            rig.send_raw("this is not JSON")
            rig.send_raw(poison)
            rig.put("in/a.txt", b"a")
            rig.put("in/sub/b.txt", b"bb")
            table = cat.directory_table("vol")
            wait_for(lambda: table.file_count() == 2, timeout=60)

            def dead_lettered():
                got = sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10,
                                          VisibilityTimeout=60).get("Messages", [])
                bodies.extend(m["Body"] for m in got)
                return {"this is not JSON", poison} <= set(bodies)

            bodies: list[str] = []
            wait_for(dead_lettered, timeout=60, interval=0.5)
            wait_for(lambda: queue_counts(rig) == (0, 0), timeout=60)
            assert daemon.health()[0]
            wait_for(lambda: daemon.readiness()[0], timeout=30)
        assert metric(daemon, "volume_stream_messages_malformed_total", volume="vol") >= 1
        # dead-lettered (batched with good messages) or released (alone): counted either way
        assert metric(daemon, "volume_stream_events_poison_total", volume="vol") + metric(
            daemon, "volume_stream_errors_total", volume="vol", stage="apply") >= 1
        paths = sorted(table.snapshot(columns=["relative_path"])["relative_path"].to_pylist())
        assert paths == ["a.txt", "sub/b.txt"]
        inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("inserts").to_pylist())
        assert inserts == Counter({"a.txt": 1, "sub/b.txt": 1})
    finally:
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)
        sqs.delete_queue(QueueUrl=dlq_url)
