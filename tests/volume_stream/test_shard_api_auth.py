"""SigV4 on the shard API binds the request (issue 22, item 5): what was signed is what runs.
Every request here is written byte by byte (tests/volume_stream/shard_http.py); boto3, the
legitimate client, must still get through."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config

import volume_stream as vs
from tests.volume_stream.shard_http import send, sha256, signed
from volume_stream.serve import ShardApiServer

KEYS = {"AKIDEXAMPLE": "secret-1"}


@pytest.fixture
def server(tmp_path, data_dir):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data_dir, shards=2)
    cat.create_volume("secret", data_dir)
    with ShardApiServer(cat, "127.0.0.1", 0, keys=KEYS, region="eu-west-1") as s:
        yield s


def tables(answer):
    assert answer.status == 200, answer.body
    return [s["TableName"] for s in answer.doc["Streams"]]


def test_a_signed_raw_request_and_boto3_get_through(server):
    body = json.dumps({"TableName": "vol"}).encode()
    assert tables(send(server.url, signed(server.url, "ListStreams", body,
                                          region="eu-west-1"), body)) == ["vol"]
    # with the body's own hash in x-amz-content-sha256, signed or not
    for unsigned in ((), ("x-amz-content-sha256",)):
        headers = signed(server.url, "ListStreams", body, region="eu-west-1",
                         extra={"X-Amz-Content-SHA256": sha256(body)}, unsigned=unsigned)
        assert tables(send(server.url, headers, body)) == ["vol"]
    c = boto3.client("dynamodbstreams", endpoint_url=server.url, region_name="eu-west-1",
                     aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret-1",
                     config=Config(retries={"max_attempts": 1}))
    assert sorted(s["TableName"] for s in c.list_streams()["Streams"]) == ["secret", "vol"]


def test_two_targets_are_refused(server):
    """Signed for ListStreams; a second X-Amz-Target before it must not be what runs."""
    body = json.dumps({"StreamArn": "arn:aws:dynamodb:eu-west-1:000000000000:table/vol/"
                                    "stream/x"}).encode()
    headers = signed(server.url, "ListStreams", body, region="eu-west-1")
    target = [v for k, v in headers if k == "X-Amz-Target"][0]
    for first in ("DynamoDBStreams_20120810.DescribeStream", target):
        answer = send(server.url, [("X-Amz-Target", first)] + headers, body)
        assert answer.status == 400 and answer.error == "ValidationException"
        assert "X-Amz-Target" in answer.doc["message"]
        assert "more than once" in answer.doc["message"]


def test_any_repeated_header_is_refused(server):
    body = b"{}"
    headers = signed(server.url, "ListStreams", body, region="eu-west-1")
    for name, value in [h for h in headers if h[0] in ("Host", "X-Amz-Date", "Authorization")
                        ] + [("x-custom", "a")]:
        repeated = headers + [(name.upper(), value)] + ([(name, "b")] if name == "x-custom"
                                                          else [])
        answer = send(server.url, repeated, body)
        assert answer.status == 400 and answer.error == "ValidationException", name
    # also without keys: a duplicated header is never read one way and run another
    with ShardApiServer(server.catalog, "127.0.0.1", 0) as open_server:
        answer = send(open_server.url, [("X-Amz-Target", "DynamoDBStreams_20120810.ListStreams"),
                                        ("X-Amz-Target", "DynamoDBStreams_20120810.GetRecords")],
                      body)
        assert answer.status == 400 and answer.error == "ValidationException"


@pytest.mark.parametrize("unsigned", ["x-amz-target", "x-amz-date", "host"])
def test_target_date_and_host_must_be_signed(server, unsigned):
    body = json.dumps({"TableName": "secret"}).encode()
    headers = signed(server.url, "ListStreams", body, region="eu-west-1", unsigned=(unsigned,))
    answer = send(server.url, headers, body)
    assert answer.status == 400 and answer.error == "InvalidSignatureException"
    assert unsigned in answer.doc["message"]


@pytest.mark.parametrize(("service", "region", "word"), [
    ("s3", "eu-west-1", "service"), ("dynamodb", "us-east-1", "region"),
    ("execute-api", "ap-south-1", "service")])
def test_credential_scope_is_checked(server, service, region, word):
    body = b"{}"
    answer = send(server.url, signed(server.url, "ListStreams", body, region=region,
                                     service=service), body)
    assert answer.status == 400 and answer.error == "InvalidSignatureException"
    assert word in answer.doc["message"]


def test_region_defaults_to_us_east_1(tmp_path, data_dir):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data_dir)
    with ShardApiServer(cat, "127.0.0.1", 0, keys=KEYS) as s:
        assert tables(send(s.url, signed(s.url, "ListStreams", b"{}"), b"{}")) == ["vol"]
        answer = send(s.url, signed(s.url, "ListStreams", b"{}", region="eu-west-1"), b"{}")
        assert answer.status == 400 and "us-east-1" in answer.doc["message"]


def test_the_body_is_hashed_not_taken_on_trust(server):
    """A signature over one body does not carry another (x-amz-content-sha256 is checked)."""
    signed_body = json.dumps({"TableName": "vol"}).encode()
    swapped = json.dumps({"TableName": "secret"}).encode()
    for claimed in ("UNSIGNED-PAYLOAD", sha256(signed_body),
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"):
        headers = signed(server.url, "ListStreams", signed_body, region="eu-west-1",
                         extra={"X-Amz-Content-SHA256": claimed})
        answer = send(server.url, headers, swapped)
        assert answer.status == 400 and answer.error == "InvalidSignatureException", claimed
        assert "x-amz-content-sha256" in answer.doc["message"]
    # without the header, the body's own hash is what the signature covers
    headers = signed(server.url, "ListStreams", signed_body, region="eu-west-1")
    answer = send(server.url, headers, swapped)
    assert answer.status == 400 and answer.error == "InvalidSignatureException"
