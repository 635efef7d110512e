"""GetRecords records as plain data, to compare what different clients of the shard API read
(boto3, aiobotocore, the AWS SDK for Java v2) with each other and with the change log itself,
record by record: binary values as base64 text, ApproximateCreationDateTime as seconds."""

from __future__ import annotations

import base64

from volume_stream.serve.records_json import typed


def _b64(value):
    """boto3's typed value with binary as base64 text (as the Java probe prints it)."""
    if isinstance(value, dict):
        return {k: _b64(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_b64(v) for v in value]
    return base64.b64encode(value).decode() if isinstance(value, bytes) else value


def comparable(record, *, when):
    """A GetRecords record as plain data; `when`: its ApproximateCreationDateTime in s."""
    d = record["dynamodb"]
    out = {k: record[k] for k in ("eventID", "eventName", "eventVersion", "eventSource",
                                  "awsRegion")}
    out["dynamodb"] = {k: _b64(d[k]) for k in ("Keys", "NewImage", "OldImage",
                                               "SequenceNumber", "SizeBytes",
                                               "StreamViewType") if k in d}
    out["dynamodb"]["ApproximateCreationDateTime"] = when
    return out


def of_java(record):
    return comparable(record, when=float(record["dynamodb"]["ApproximateCreationDateTime"]))


def of_boto(record):
    return comparable(record, when=record["dynamodb"]["ApproximateCreationDateTime"].timestamp())


def of_log(r, view_type):
    """What the change log's own record says, in GetRecords' terms."""
    def image(values):
        return {k: typed(v) for k, v in values.items() if v is not None}
    d = {"Keys": image(r.key), "SequenceNumber": r.sequence_number,
         "StreamViewType": view_type,
         "ApproximateCreationDateTime": float(int(r.commit_timestamp.timestamp()))}
    if r.new_image is not None:
        d["NewImage"] = image(r.new_image)
    if r.old_image is not None:
        d["OldImage"] = image(r.old_image)
    return r.event_name, d


def boto_drain(c, arn, shard_id, kind="TRIM_HORIZON", seq=None, limit=1000):
    kw = {"SequenceNumber": seq} if seq else {}
    it = c.get_shard_iterator(StreamArn=arn, ShardId=shard_id, ShardIteratorType=kind,
                              **kw)["ShardIterator"]
    out = []
    while it:
        page = c.get_records(ShardIterator=it, Limit=limit)
        out += page["Records"]
        it = page.get("NextShardIterator")
        if not page["Records"]:
            break
    return out


def log_drain(log, shard_id):
    it, out = log.iterator(shard_id, "TRIM_HORIZON"), []
    while it:
        page = log.get_records(it, 1000)
        out += page.records
        it = page.next_iterator
        if not page.records:
            break
    return out
