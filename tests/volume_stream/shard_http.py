"""Raw HTTP against the shard API (tests/volume_stream/test_shard_api_*.py): requests written
byte by byte on a socket, so a test can send what no SDK would (two X-Amz-Target headers, an
unsigned target, a body other than the one signed, `Content-Length: abc`), and a SigV4 signer
from botocore that can leave headers out of the signature. Also the set-up those tests share:
a catalog with a sharded volume, and a daemon configuration serving the shard API."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

import volume_stream as vs

TARGET = "DynamoDBStreams_20120810."
ERROR_NS = "com.amazonaws.dynamodb.v20120810#"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> dict:
        return json.loads(self.body)

    @property
    def error(self) -> str:
        """The DynamoDB error type (`ValidationException`, ...) of a well-formed error answer."""
        doc = self.doc
        assert set(doc) == {"__type", "message"}, doc
        assert doc["__type"].startswith(ERROR_NS) and doc["message"], doc
        assert self.headers["x-amz-crc32"] == str(zlib.crc32(self.body)), self.headers
        return doc["__type"][len(ERROR_NS):]


def volume_catalog(root: Path, data_dir: Path, shards: int = 2) -> vs.Catalog:
    """A catalog at `root`/wh (no Spark) with volume "vol" on `data_dir`, its change log in
    `shards` shards."""
    cat = vs.connect(root / "wh")
    cat.create_volume("vol", data_dir, shards=shards)
    return cat


def daemon_toml(path: Path, warehouse: Path, location: Path, **shard_api: str | bool) -> Path:
    """A daemon configuration at `path`: the warehouse, no metrics, volume "landing" on
    `location`, and `[shard_api]` enabled with the given settings (in this order)."""
    lines = [f'warehouse = "{warehouse}"', "[metrics]", "enabled = false", "[shard_api]",
             "enabled = true"]
    for name, value in shard_api.items():
        text = ("true" if value else "false") if isinstance(value, bool) else f'"{value}"'
        lines.append(f"{name} = {text}")
    lines += ["[volumes.landing]", f'location = "{location}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def call(url: str, operation: str, body: dict | bytes, **kw) -> Answer | None:
    """`send` a request for `operation` (only its X-Amz-Target header: unsigned) with `body`
    (a dict is sent as JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return send(url, [("X-Amz-Target", TARGET + operation)], data, **kw)


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def send(url: str, headers: list[tuple[str, str]] | None, body: bytes = b"", *,
         method: str = "POST", content_length: str | None = None, raw: bytes | None = None,
         reset: bool = False, timeout: float = 30) -> Answer | None:
    """Write one request (or `raw` bytes) and read the answer. Headers go out as given, in
    order, duplicates included; Content-Length is the body's unless `content_length` says
    otherwise. The write side is then shut, so a server waiting for more body sees its end.
    `reset`: abort the connection (RST) right after writing instead, and return None."""
    if raw is None:
        lines = [f"{method} / HTTP/1.1"]
        lines += [f"{k}: {v}" for k, v in headers or []]
        lines.append(f"Content-Length: "
                     f"{len(body) if content_length is None else content_length}")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    sock = socket.create_connection(address(url), timeout=timeout)
    try:
        sock.sendall(raw)
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return None
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first: its answer is still there to read
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()  # RemoteDisconnected if the server dropped the connection
        data = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        sock.close()


class _Signer(SigV4Auth):
    """botocore's SigV4 signer, leaving the headers in `unsigned` out of the signature."""

    def __init__(self, credentials, service, region, unsigned=()):
        super().__init__(credentials, service, region)
        self.unsigned = unsigned

    def headers_to_sign(self, request):
        headers = super().headers_to_sign(request)
        for name in self.unsigned:
            del headers[name]
        return headers


def signed(url: str, operation: str, body: bytes, *, key: str = "AKIDEXAMPLE",
           secret: str = "secret-1", region: str = "us-east-1", service: str = "dynamodb",
           extra: dict[str, str] | None = None, unsigned: tuple[str, ...] = ()
           ) -> list[tuple[str, str]]:
    """The headers of a request for `operation` with `body`, SigV4-signed as boto3 signs them
    (plus the `extra` headers, signed too), the ones in `unsigned` left out of the signature."""
    request = AWSRequest(method="POST", url=url.rstrip("/") + "/", data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": TARGET + operation,
        **(extra or {})})
    _Signer(Credentials(key, secret), service, region, unsigned).add_auth(request)
    host = urlsplit(url).netloc
    return [("Host", host)] + [(k, v) for k, v in request.headers.items()
                               if k.lower() != "host"]


def sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def no_handlers_running(timeout: float = 60.0) -> None:
    """Wait until no server thread is handling a connection (http.server names them)."""
    deadline = time.monotonic() + timeout
    while any("process_request_thread" in t.name for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a request handler is still running"
        time.sleep(0.02)
