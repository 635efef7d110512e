"""S3Reader and S3Lister against moto's server over HTTP, plus a tiny fault-injecting S3 endpoint
(real boto3 over HTTP) for bodies cut off mid-read and throttled responses."""

# ruff: noqa: F811  (pytest fixtures imported from tests.aws_fixtures are used as parameters)

from __future__ import annotations

import http.server
import logging
import pickle
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from connectors.aws.listener import SqsListener
from connectors.aws.store import S3Lister, S3Reader
from connectors.errors import ConnectorError, CredentialsError, ObjectNotFoundError
from connectors.protocols import LISTING_SCHEMA, Lister, ObjectReader
from tests.aws_fixtures import (  # noqa: F401
    AwsRig,
    aws_env,
    make_rig,
    moto_server,
    notified_bucket,
)

CREDS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
         "aws_secret_access_key": "testing-secret"}


@pytest.fixture
def bucket(moto_server) -> AwsRig:
    return make_rig(moto_server, notify=False)


def reader(rig: AwsRig, prefix: str = "", **kw) -> S3Reader:
    return S3Reader(rig.bucket, prefix, endpoint_url=rig.endpoint, **CREDS, **kw)


def lister(rig: AwsRig, prefix: str = "", **kw) -> S3Lister:
    return S3Lister(rig.bucket, prefix, endpoint_url=rig.endpoint, **CREDS, **kw)


def rows(lst: S3Lister) -> list[dict]:
    batches = list(lst.list())
    assert all(b.schema.equals(LISTING_SCHEMA) for b in batches)
    return pa.Table.from_batches(batches, schema=LISTING_SCHEMA).to_pylist()


BLOB = bytes(range(256)) * 12_000  # ~3 MB, larger than the 1 MiB read buffer


def test_open_streams_and_seeks(bucket):
    bucket.put("vol/dir/blob.bin", BLOB)
    r = reader(bucket, "vol")
    assert isinstance(r, ObjectReader)
    with r.open("dir/blob.bin") as f:
        assert f.name == f"s3://{bucket.bucket}/vol/dir/blob.bin"
        assert f.read(10) == BLOB[:10]
        chunks = [f.read(100_000) for _ in range(5)]
        assert b"".join(chunks) == BLOB[10:500_010]
        f.seek(-5, 2)
        assert f.tell() == len(BLOB) - 5 and f.read() == BLOB[-5:] and f.read(1) == b""
        f.seek(1_234_567)
        assert f.read(3) == BLOB[1_234_567:1_234_570]
        f.seek(0)
        assert f.read() == BLOB
    assert f.closed


def test_read_range(bucket):
    bucket.put("vol/a b+c/日本.txt", b"0123456789")
    r = reader(bucket, "vol/")
    assert r.read_range("a b+c/日本.txt", 2, 3) == b"234"
    assert r.read_range("a b+c/日本.txt", 8, 100) == b"89"
    assert r.read_range("a b+c/日本.txt", 10, 5) == b""
    assert r.read_range("a b+c/日本.txt", 0, 0) == b""
    with pytest.raises(ValueError):
        r.read_range("a b+c/日本.txt", -1, 2)


def test_zero_byte_and_missing_objects(bucket):
    bucket.put("empty", b"")
    r = reader(bucket)
    with r.open("empty") as f:
        assert f.read() == b""
    assert r.read_range("empty", 0, 10) == b""
    with pytest.raises(ObjectNotFoundError, match="does not exist") as info:
        r.open("missing.txt")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ObjectNotFoundError):
        r.read_range("missing.txt", 0, 1)


def test_reader_pickles_without_its_client_and_hides_secrets(bucket, monkeypatch):
    bucket.put("p/x.txt", b"hello")
    r = reader(bucket, "p", aws_session_token="session-token-secret")
    r.read_range("x.txt", 0, 1)  # the client now exists
    text = repr(r) + str(r)
    assert "testing-secret" not in text and "session-token-secret" not in text
    # explicit credentials stay in this process: the clone takes its own from its environment
    assert b"testing-secret" not in pickle.dumps(r) and b"session-token" not in pickle.dumps(r)
    clone = pickle.loads(pickle.dumps(r))
    assert clone._client is None and clone._options.aws_secret_access_key is None
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret")
    with clone.open("x.txt") as f:
        assert f.read() == b"hello"
    with pytest.raises(ValueError):
        r.open("../escape.txt")


def test_reader_uses_the_standard_environment(aws_env, bucket, monkeypatch):
    bucket.put("k", b"env")
    assert S3Reader(bucket.bucket).read_range("k", 0, 3) == b"env"
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(CredentialsError, match="no usable AWS credentials"):
        S3Reader(bucket.bucket).read_range("k", 0, 3)


def test_listing_is_paginated_filtered_and_relative(bucket):
    keys = [f"vol/f{i:02}.csv" for i in range(23)] + [
        "vol/sub/deep/g.csv", "vol/sub/h.json", "vol/sub/", "vol/", "volume/x.csv",
        "other/y.csv", "vol/a b+c é.csv"]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: bucket.put(k, b"" if k.endswith("/") else b"abc"), keys))
    lst = lister(bucket, "vol", page_size=7)
    assert isinstance(lst, Lister)
    batches = list(lst.list())
    assert len(batches) >= 4 and max(b.num_rows for b in batches) <= 7
    listed = rows(lst)
    expected = sorted(k[4:] for k in keys if k.startswith("vol/") and not k.endswith("/"))
    assert sorted(r["relative_path"] for r in listed) == expected
    row = listed[0]
    assert row["size"] == 3 and row["etag"] == "900150983cd24fb0d6963f7d28e17f72"
    assert abs(row["last_modified_time"] - datetime.now(UTC)) < timedelta(minutes=5)
    assert row["last_modified_time"].tzinfo is not None

    direct = rows(lister(bucket, "vol/", recursive=False, page_size=5))
    assert sorted(r["relative_path"] for r in direct) == sorted(
        k[4:] for k in keys if k.startswith("vol/") and k.count("/") == 1 and k != "vol/")
    only_json = rows(lister(bucket, "vol", suffix=".json"))
    assert [r["relative_path"] for r in only_json] == ["sub/h.json"]
    assert rows(lister(bucket, "nothing-here/")) == []
    whole = rows(lister(bucket, ""))
    assert len(whole) == len([k for k in keys if not k.endswith("/")])


def test_listing_skips_unsafe_keys_with_a_warning(bucket, caplog):
    for key in ("v/ok.txt", "v/a/../b.txt", "v//x.txt"):
        bucket.put(key)
    caplog.set_level(logging.WARNING, logger="connectors.s3")
    assert [r["relative_path"] for r in rows(lister(bucket, "v"))] == ["ok.txt"]
    assert sum("skipping" in r.getMessage() for r in caplog.records) == 2


def test_listing_a_missing_bucket_raises(moto_server):
    lst = S3Lister("no-such-bucket-vs", endpoint_url=moto_server, **CREDS)
    with pytest.raises(ConnectorError, match="NoSuchBucket"):
        list(lst.list())
    with pytest.raises(ValueError):
        S3Lister("b", page_size=0)


def test_event_and_listing_agree_on_etag_size_and_path(notified_bucket):
    rig = notified_bucket
    rig.put("in/x y.txt", b"hello")
    upload = rig.s3.create_multipart_upload(Bucket=rig.bucket, Key="in/mp.bin")["UploadId"]
    etag = rig.s3.upload_part(Bucket=rig.bucket, Key="in/mp.bin", UploadId=upload,
                              PartNumber=1, Body=b"p")["ETag"]
    rig.s3.complete_multipart_upload(Bucket=rig.bucket, Key="in/mp.bin", UploadId=upload,
                                     MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    with SqsListener(rig.queue_url, bucket=rig.bucket, prefix="in", endpoint_url=rig.endpoint,
                     **CREDS) as listener:
        batch = listener.receive(timeout=1)
        listener.ack(batch.handles)
    from_events = {e.relative_path: (e.size, e.etag) for e in batch.events}
    listed = {r["relative_path"]: (r["size"], r["etag"]) for r in rows(lister(rig, "in"))}
    assert from_events == listed and listed["mp.bin"][1].endswith("-1")
    assert not listed["x y.txt"][1].startswith('"')


# ---- faults: a minimal S3 GET endpoint that misbehaves on purpose ------------------------

class _FaultyS3(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b"".join(bytes([i % 251]) for i in range(300_000))
    etag = '"0123456789abcdef0123456789abcdef"'
    plan: list[str] = []      # what to do with each GET: "cut", "slowdown", "changed", "ok"
    seen: list[dict] = []

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        action = self.plan.pop(0) if self.plan else "ok"
        self.seen.append({"range": self.headers.get("Range"),
                          "if_match": self.headers.get("If-Match"), "action": action})
        if action == "slowdown":
            return self._error(503, "SlowDown")
        if action == "changed" and self.headers.get("If-Match"):
            return self._error(412, "PreconditionFailed")
        start, end = 0, len(self.body) - 1
        match = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2)) if match.group(2) else end, end)
        data = self.body[start:end + 1]
        self.send_response(206 if match else 200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", self.etag)
        if match:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(self.body)}")
        self.end_headers()
        if action == "cut":  # promise everything, send a third, hang up
            self.wfile.write(data[: len(data) // 3])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data)

    def _error(self, status: int, code: str):
        payload = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def faulty_s3():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FaultyS3)
    thread = threading.Thread(target=server.serve_forever, name="faulty-s3", daemon=True)
    thread.start()
    _FaultyS3.plan, _FaultyS3.seen = [], []
    # max_attempts=1: botocore does not retry, so every retry seen here is ours
    yield S3Reader("bkt", "p", endpoint_url=f"http://127.0.0.1:{server.server_port}",
                   max_attempts=1, s3_addressing_style="path", **CREDS)
    server.shutdown()
    server.server_close()
    thread.join()


def test_a_body_cut_off_mid_read_resumes_at_the_same_byte(faulty_s3):
    _FaultyS3.plan = ["cut", "cut", "ok"]
    with faulty_s3.open("obj.bin") as f:
        assert f.read() == _FaultyS3.body
    first, second, third = _FaultyS3.seen
    assert first["range"] is None and second["range"] == "bytes=100000-"
    assert second["if_match"] == _FaultyS3.etag
    assert third["range"] == f"bytes={100_000 + 200_000 // 3}-"


def test_an_object_changed_while_resuming_fails_loudly(faulty_s3):
    _FaultyS3.plan = ["cut", "changed"]
    with faulty_s3.open("obj.bin") as f, pytest.raises(ConnectorError, match="changed while"):
        f.read()


def test_throttled_range_reads_are_retried(faulty_s3):
    _FaultyS3.plan = ["slowdown", "slowdown", "ok"]
    assert faulty_s3.read_range("obj.bin", 5, 4) == _FaultyS3.body[5:9]
    assert [s["action"] for s in _FaultyS3.seen] == ["slowdown", "slowdown", "ok"]
    _FaultyS3.plan = ["slowdown"] * 5
    with pytest.raises(ConnectorError, match="SlowDown"):
        faulty_s3.read_range("obj.bin", 0, 1)
