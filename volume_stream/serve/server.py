"""The HTTP server of the DynamoDB Streams-compatible shard API (`volume-stream shard-api`).

    server = ShardApiServer(vs.connect("./warehouse"), "127.0.0.1", 8000,
                            keys={"AKID": "SECRET"})
    server.start()            # a background thread; .url is http://127.0.0.1:<port>
    boto3.client("dynamodbstreams", endpoint_url=server.url, ...)
    server.stop()

POST / with `X-Amz-Target: DynamoDBStreams_20120810.<Operation>` and a JSON 1.0 body. With
`keys` (access key id → secret), every request must carry a valid SigV4 signature by one of
them (checked with botocore's signer, `serve.sigv4`); without, requests are not checked. It
binds to 127.0.0.1 unless given another host. Every `auto_split_s` seconds (None: never) it
splits the hot shards of volumes that have an auto-split threshold (`cat.set_auto_split`).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connectors.secrets import Secret, reveal
from volume_stream.errors import InvalidInputError
from volume_stream.serve.dynamodb import TARGET_PREFIX, ApiError, StreamsApi
from volume_stream.serve.sigv4 import SignatureError, verify

__all__ = ["ShardApiServer", "parse_listen"]

log = logging.getLogger("volume_stream.shard_api")
_MAX_BODY = 1024 * 1024


def parse_listen(listen: str) -> tuple[str, int]:
    """("host", port) of `HOST:PORT` (or `:PORT`, meaning 127.0.0.1)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInputError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)



class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"
    #: a response goes out as soon as it is written: with Nagle's algorithm the tail of each
    #: response waited for the client's delayed ACK (~40 ms a request on loopback)
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, doc: dict[str, Any] | bytes) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", f"{threading.get_ident():x}")
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self._send(413, ApiError("ValidationException", "request body too large").document())
            return
        body = self.rfile.read(length)
        owner = self.server.owner
        if owner.keys:
            try:
                verify("POST", self.path, dict(self.headers.items()), body, owner.keys)
            except SignatureError as exc:
                self._send(400, ApiError(exc.code, str(exc)).document())
                return
        target = self.headers.get("X-Amz-Target", "")
        prefix, _, operation = target.partition(".")
        if prefix != TARGET_PREFIX:
            self._send(400, ApiError("UnknownOperationException",
                                     f"unknown target {target!r}").document())
            return
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            self._send(400, ApiError("SerializationException", "body is not JSON").document())
            return
        status, doc = owner.api.call_json(operation, request)
        self._send(status, doc)

    def do_GET(self) -> None:  # noqa: N802
        self._send(400, ApiError("UnknownOperationException", "use POST").document())


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ShardApiServer


class ShardApiServer:
    """The shard API over `catalog` on host:port (port 0: any free port)."""

    def __init__(self, catalog: Any, host: str = "127.0.0.1", port: int = 8000, *,
                 keys: dict[str, str] | None = None, region: str | None = None,
                 account_id: str | None = None, auto_split_s: float | None = 10.0):
        kw = {k: v for k, v in (("region", region), ("account_id", account_id)) if v}
        self.catalog = catalog
        self.api = StreamsApi(catalog, **kw)
        #: access key id -> secret, held as `Secret` (masked, never pickled)
        self.keys = {k: Secret(reveal(v)) for k, v in (keys or {}).items()}
        self.auto_split_s = auto_split_s
        self._http = _HttpServer((host, port), _Handler)
        self._http.owner = self
        self._thread: threading.Thread | None = None
        self._splitter: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def _split_loop(self) -> None:
        """Every `auto_split_s` seconds, split the hot shards of volumes with a threshold."""
        while not self._stop.wait(self.auto_split_s):
            try:
                for volume in [v["name"] for v in self.catalog.list_volumes()]:
                    for child in self.catalog.auto_split(volume):
                        log.info("volume %s: shard %s split (child %s)", volume,
                                 child.parent_shard_id, child.shard_id)
            except Exception:  # keep serving; the next round tries again
                log.exception("auto-split failed")

    def _start_splitter(self) -> None:
        if self.auto_split_s and self._splitter is None:
            self._splitter = threading.Thread(target=self._split_loop, daemon=True,
                                              name="volume-stream-shard-autosplit")
            self._splitter.start()

    def start(self) -> ShardApiServer:
        self._start_splitter()
        self._thread = threading.Thread(target=self._http.serve_forever,
                                        name="volume-stream-shard-api", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._start_splitter()
        self._http.serve_forever()

    def stop(self) -> None:
        self._stop.set()
        if self._splitter is not None:
            self._splitter.join(30)
            self._splitter = None
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ShardApiServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
