"""Malformed requests get DynamoDB's 400 error JSON, not a dropped connection (issue 22, item 6),
clients that go away leave no traceback, and an open (keyless) endpoint stays on loopback
unless told otherwise. Requests are written byte by byte (tests/volume_stream/shard_http.py)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.volume_stream.shard_http import (
    TARGET,
    address,
    call,
    daemon_toml,
    no_handlers_running,
    send,
    volume_catalog,
)
from volume_stream.errors import ConfigError
from volume_stream.serve import ShardApiServer

CLI = str(Path(sys.executable).parent / "volume-stream")


@pytest.fixture
def cat(tmp_path, data_dir):
    return volume_catalog(tmp_path, data_dir)


@pytest.fixture
def server(cat):
    with ShardApiServer(cat, "127.0.0.1", 0, client_timeout_s=2) as s:
        yield s


def alive(server):
    answer = call(server.url, "ListStreams", {})
    assert answer.status == 200 and answer.doc["Streams"][0]["TableName"] == "vol"
    return answer.doc["Streams"][0]["StreamArn"]


def wait_for(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_json_nested_200k_deep(server):
    for deep in (b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 150_000 + b"1" + b"}" * 150_000):
        answer = call(server.url, "ListStreams", deep)
        assert answer.status == 400 and answer.error == "SerializationException"
    alive(server)


@pytest.mark.parametrize(("operation", "body", "member"), [
    ("ListStreams", {"TableName": {}}, "TableName"),
    ("ListStreams", {"TableName": []}, "TableName"),
    ("ListStreams", {"TableName": 5}, "TableName"),
    ("ListStreams", {"Limit": "5"}, "Limit"),
    ("ListStreams", {"Limit": 2.5}, "Limit"),
    ("ListStreams", {"ExclusiveStartStreamArn": {"x": 1}}, "ExclusiveStartStreamArn"),
    ("DescribeStream", {"StreamArn": [], "ShardFilter": "x"}, "StreamArn"),
    ("DescribeStream", {"StreamArn": "ARN", "ShardFilter": "x"}, "ShardFilter"),
    ("DescribeStream", {"StreamArn": "ARN", "ShardFilter": []}, "ShardFilter"),
    ("DescribeStream", {"StreamArn": "ARN", "ShardFilter": {"Type": 1}}, "Type"),
    ("DescribeStream", {"StreamArn": "ARN", "ExclusiveStartShardId": []},
     "ExclusiveStartShardId"),
    ("GetShardIterator", {"StreamArn": "ARN", "ShardId": {}, "ShardIteratorType": "LATEST"},
     "ShardId"),
    ("GetShardIterator", {"StreamArn": "ARN", "ShardId": "s", "ShardIteratorType": "LATEST",
                          "SequenceNumber": 12}, "SequenceNumber"),
    ("GetRecords", {"ShardIterator": ["a"]}, "ShardIterator"),
    ("GetRecords", {"ShardIterator": "a", "Limit": True}, "Limit"),
])
def test_members_of_the_wrong_json_type(server, operation, body, member):
    arn = alive(server)
    body = json.loads(json.dumps(body).replace('"ARN"', json.dumps(arn)))
    answer = call(server.url, operation, body)
    assert answer.status == 400 and answer.error == "SerializationException", answer.doc
    assert member in answer.doc["message"]


@pytest.mark.parametrize("body", [b"[]", b'"x"', b"12", b"null", b"{", b"\xff\xfe", b"{}x"])
def test_bodies_that_are_not_a_json_object(server, body):
    answer = call(server.url, "ListStreams", body)
    assert answer.status == 400 and answer.error == "SerializationException"


@pytest.mark.parametrize("length", ["abc", "-1", "1 2", "0x10", "", "99999999999999999999"])
def test_bad_content_length(server, length):
    answer = call(server.url, "ListStreams", b"{}", content_length=length)
    assert answer.status in (400, 413) and answer.error in ("ValidationException",
                                                            "SerializationException")
    assert "Content-Length" in answer.doc["message"]
    assert answer.headers.get("connection") == "close"
    alive(server)


def test_body_size_is_bounded(server):
    big = b'{"TableName": "' + b"x" * (1024 * 1024) + b'"}'
    answer = call(server.url, "ListStreams", big)
    assert answer.status == 413 and answer.error == "ValidationException"
    assert "1048576" in answer.doc["message"]
    # the announced size alone is enough: the server does not wait for the body
    answer = call(server.url, "ListStreams", b"", content_length=str(50 * 1024 * 1024))
    assert answer.status == 413 and answer.headers.get("connection") == "close"
    alive(server)


def test_chunked_and_short_bodies(server):
    head = (f"POST / HTTP/1.1\r\nX-Amz-Target: {TARGET}ListStreams\r\n"
            "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode()
    answer = send(server.url, None, raw=head)
    assert answer.status == 400 and "Content-Length" in answer.doc["message"]
    answer = call(server.url, "ListStreams", b"{}", content_length="10")  # then EOF
    assert answer.status == 400 and answer.error == "SerializationException"
    # a client that stalls mid-body is answered after the server's client timeout
    with socket.create_connection(address(server.url), timeout=30) as sock:
        sock.sendall(f"POST / HTTP/1.1\r\nX-Amz-Target: {TARGET}ListStreams\r\n"
                     "Content-Length: 10\r\n\r\n{}".encode())
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"timed out" in body
    alive(server)


def test_not_post_and_garbage_request_lines(server):
    for raw in (b"PUT / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n",
                b"BREW / HTTP/1.1\r\n\r\n", b"\x00\x01garbage\r\n\r\n",
                b"POST / HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n",
                b"POST / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
                + b"\r\n"):
        answer = send(server.url, None, raw=raw)
        assert 400 <= answer.status < 500 and answer.error, raw[:20]
        assert answer.headers["content-type"] == "application/x-amz-json-1.0"
    alive(server)


def test_clients_that_go_away_leave_no_traceback(server, capfd):
    for n in range(1, 4):
        # mid-body (the server is reading) and after a whole request (it is answering)
        call(server.url, "ListStreams", b"{}", content_length="100", reset=True)
        call(server.url, "ListStreams", b"{}", reset=True)
        wait_for(lambda n=n: server.disconnects >= n, "the disconnects to be seen")
    alive(server)
    no_handlers_running()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionReset" not in err and "BrokenPipe" not in err


def test_open_endpoint_stays_on_loopback(cat):
    with pytest.raises(ConfigError, match="0.0.0.0.*allow_anonymous"):
        ShardApiServer(cat, "0.0.0.0", 0)
    with ShardApiServer(cat, "0.0.0.0", 0, allow_anonymous=True) as s:
        assert alive(s)
    with ShardApiServer(cat, "0.0.0.0", 0, keys={"AKID": "s"}) as s:
        assert s.url.startswith("http://0.0.0.0:")
    for host in ("localhost", "127.0.0.2"):
        with ShardApiServer(cat, host, 0):
            pass


def _as_from_a_terminal() -> None:
    """A shell starts a foreground command with SIGINT at its default and unblocked; a child of
    a test worker inherits whatever the worker's libraries left (an ignored or blocked SIGINT
    is kept across exec), and then Ctrl-C would not reach it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_cli_refuses_an_open_public_listen(cat):
    run = subprocess.run([CLI, "shard-api", "--warehouse", str(cat.warehouse.root),
                          "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "without authentication" in run.stderr and "--allow-anonymous" in run.stderr
    proc = subprocess.Popen([CLI, "shard-api", "--warehouse", str(cat.warehouse.root),
                             "--listen", "0.0.0.0:0", "--allow-anonymous"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            preexec_fn=_as_from_a_terminal)
    rest: list[str] = []  # its stderr after the first line, drained so it can never block
    try:
        line, deadline = "", time.monotonic() + 120
        while "shard API on" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "shard-api exited early"
        drain = threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True)
        drain.start()
        assert "no authentication" in line
        port = re.search(r"http://0\.0\.0\.0:(\d+)", line).group(1)
        answer = call(f"http://127.0.0.1:{port}", "ListStreams", {"TableName": {}})
        assert answer.status == 400 and answer.error == "SerializationException"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(rest)
        drain.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in "".join(rest)


def test_daemon_refuses_an_open_public_listen(tmp_path, data_dir):
    from volume_stream.config.daemon import DaemonConfig
    from volume_stream.daemon import Daemon

    toml = daemon_toml(tmp_path / "vs.toml", tmp_path / "wh", data_dir, listen="0.0.0.0:0")
    with pytest.raises(ConfigError, match="allow_anonymous"):
        Daemon(DaemonConfig.load(toml)).start()
    toml.write_text(toml.read_text().replace("[shard_api]", "[shard_api]\nallow_anonymous = true"))
    with Daemon(DaemonConfig.load(toml)) as daemon:
        port = daemon.shard_api.url.rsplit(":", 1)[1]
        assert call(f"http://127.0.0.1:{port}", "ListStreams", {}).status == 200
