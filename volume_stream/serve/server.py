"""The HTTP server of the DynamoDB Streams-compatible shard API (`volume-stream shard-api`).

    server = ShardApiServer(vs.connect("./warehouse"), "127.0.0.1", 8000,
                            keys={"AKID": "SECRET"})
    server.start()            # a background thread; .url is http://127.0.0.1:<port>
    boto3.client("dynamodbstreams", endpoint_url=server.url, ...)
    server.stop()

POST / with `X-Amz-Target: DynamoDBStreams_20120810.<Operation>` and a JSON 1.0 body. With
`keys` (access key id → secret), every request must carry a valid SigV4 signature by one of
them for the service `dynamodb` in the server's `region` (default us-east-1), over its host,
date, target and body (`serve.sigv4`); without, requests are not checked. A header sent twice
is refused. It binds to 127.0.0.1 unless given another host, and refuses a host other than a
loopback one without keys unless `allow_anonymous`. Malformed requests (not JSON, nested too
deep, members of the wrong type, a bad Content-Length, a body over 1 MiB) get DynamoDB's 400
error JSON; a client that goes away or stalls past `client_timeout_s` is one log line. Every
`auto_split_s` seconds (None: never) it splits the hot shards of volumes that have an
auto-split threshold (`cat.set_auto_split`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import sys
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from connectors.secrets import Secret, reveal
from volume_stream.errors import ConfigError, InvalidInputError
from volume_stream.serve.dynamodb import TARGET_PREFIX, ApiError, StreamsApi
from volume_stream.serve.sigv4 import SignatureError, verify

__all__ = ["ShardApiServer", "is_loopback", "parse_listen"]

log = logging.getLogger("volume_stream.shard_api")
_MAX_BODY = 1024 * 1024
_JSON = "application/x-amz-json-1.0"
_DIGITS = re.compile(r"[0-9]{1,15}")


def parse_listen(listen: str) -> tuple[str, int]:
    """("host", port) of `HOST:PORT` (or `:PORT`, meaning 127.0.0.1)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidInputError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1): only this
    machine can reach a server bound there."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback
                               for info in infos)


def _repeated(names: list[str]) -> str | None:
    """The first header name sent more than once (any case), if any: a signature checked
    over one copy must not let the other be the one read."""
    seen: set[str] = set()
    for name in names:
        if name.lower() in seen:
            return name
        seen.add(name.lower())
    return None


class _Refused(Exception):
    """A request answered with a DynamoDB error; `close`: and its connection closed (its body
    was not read, so the next request's start is unknown)."""

    def __init__(self, status: int, code: str, message: str, *, close: bool = False):
        super().__init__(message)
        self.status, self.code, self.close = status, code, close


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"
    #: a request line without a version is answered in HTTP/1.0, never in HTTP/0.9's bare body
    default_request_version = "HTTP/1.0"
    #: a response goes out as soon as it is written: with Nagle's algorithm the tail of each
    #: response waited for the client's delayed ACK (~40 ms a request on loopback)
    disable_nagle_algorithm = True

    def setup(self) -> None:
        self.timeout = self.server.owner.client_timeout_s  # a stalled client's read times out
        super().setup()

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, doc: dict[str, Any] | bytes, *, close: bool = False) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(data)))
        # DynamoDB's checksum of the body, on every answer; the SDKs check it when it is there
        # (the Go SDK v2 logs a mismatch for every answer without it)
        self.send_header("x-amz-crc32", str(zlib.crc32(data)))
        self.send_header("x-amzn-RequestId", f"{threading.get_ident():x}")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, too long or too many headers, a
        method other than POST) in DynamoDB's error shape, as a 400 (never a 5xx: the request
        is at fault), closing the connection."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            error = ApiError("UnknownOperationException",
                             f"the shard API takes POST requests, not {self.command!r}")
        else:
            error = ApiError("ValidationException", f"malformed HTTP request: "
                             f"{message or HTTPStatus(code).phrase}")
        self._send(code if 400 <= code < 500 else 400, error.document(), close=True)

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        try:
            status, doc = self._answer()
        except _Refused as exc:
            self._send(exc.status, ApiError(exc.code, str(exc)).document(), close=exc.close)
            return
        except ConnectionError:
            raise  # the client went away: _HttpServer.handle_error notes it
        except Exception as exc:  # a bug: answer it, and keep the connection usable
            log.exception("shard API: %s failed", self.headers.get("X-Amz-Target"))
            status, doc = 500, ApiError("InternalServerError", f"internal error: "
                                        f"{type(exc).__name__}", 500).document()
        self._send(status, doc)

    def _answer(self) -> tuple[int, bytes]:
        repeated = _repeated(self.headers.keys())
        if repeated:
            raise _Refused(400, "ValidationException", f"header {repeated} appears more than "
                           f"once; send each header once", close=True)
        body = self._body()
        owner = self.server.owner
        if owner.keys:
            try:
                verify("POST", self.path, dict(self.headers.items()), body, owner.keys,
                       region=owner.api.region)
            except SignatureError as exc:
                raise _Refused(400, exc.code, str(exc)) from exc
        target = self.headers.get("X-Amz-Target", "")
        prefix, _, operation = target.partition(".")
        if prefix != TARGET_PREFIX:
            raise _Refused(400, "UnknownOperationException", f"unknown target {target!r}")
        try:
            request = json.loads(body or b"{}")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            kind = "nested too deep" if isinstance(exc, RecursionError) else "not JSON"
            raise _Refused(400, "SerializationException", f"the request body is {kind}"
                           ) from exc
        return owner.api.call_json(operation, request)

    def _body(self) -> bytes:
        """The request body, of its Content-Length (at most 1 MiB)."""
        if "Transfer-Encoding" in self.headers:
            raise _Refused(400, "ValidationException", "send the body with a Content-Length "
                           "(Transfer-Encoding is not supported)", close=True)
        text = self.headers.get("Content-Length")
        if text is None:
            return b""
        if not _DIGITS.fullmatch(text.strip()):
            raise _Refused(400, "ValidationException", f"Content-Length {text[:40]!r} is not "
                           f"a number of bytes", close=True)
        length = int(text.strip())
        if length > _MAX_BODY:
            raise _Refused(413, "ValidationException", f"the request body ({length} bytes, "
                           f"by its Content-Length) is over the limit of {_MAX_BODY} bytes "
                           f"(1 MiB)", close=True)
        try:
            body = self.rfile.read(length)
        except TimeoutError as exc:
            raise _Refused(400, "SerializationException", f"timed out after "
                           f"{self.timeout:g} s waiting for the request body "
                           f"({length} bytes by its Content-Length)", close=True) from exc
        if len(body) < length:
            raise _Refused(400, "SerializationException", f"the request body ended after "
                           f"{len(body)} of its {length} bytes (Content-Length)", close=True)
        return body


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: ShardApiServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, broken pipe, timed out) is one log line, never a
        traceback on stderr; anything else is logged with its traceback."""
        exc = sys.exception()
        if isinstance(exc, ConnectionError | TimeoutError):
            self.owner._went_away(client_address, exc)
        else:
            log.error("shard API: request from %s failed", client_address, exc_info=exc)


class ShardApiServer:
    """The shard API over `catalog` on host:port (port 0: any free port)."""

    def __init__(self, catalog: Any, host: str = "127.0.0.1", port: int = 8000, *,
                 keys: dict[str, str] | None = None, region: str | None = None,
                 account_id: str | None = None, auto_split_s: float | None = 10.0,
                 allow_anonymous: bool = False, client_timeout_s: float = 60.0):
        #: access key id -> secret, held as `Secret` (masked, never pickled)
        self.keys = {k: Secret(reveal(v)) for k, v in (keys or {}).items()}
        if not self.keys and not allow_anonymous and not is_loopback(host):
            raise ConfigError.advised(
                f"the shard API would serve {host}:{port}, not a loopback address, without "
                f"authentication",
                python="pass keys={access key id: secret}, or allow_anonymous=True to serve "
                       "it to anyone who can reach it",
                cli="give --access-key-id and --secret-access-key (or "
                    "$VOLUME_STREAM_SHARD_API_SECRET), or --allow-anonymous to serve it to "
                    "anyone who can reach it",
                sql="pass keys, or allow_anonymous=True")
        kw = {k: v for k, v in (("region", region), ("account_id", account_id)) if v}
        self.catalog = catalog
        self.api = StreamsApi(catalog, **kw)
        self.auto_split_s = auto_split_s
        self.client_timeout_s = client_timeout_s
        #: connections whose client went away (reset, broken pipe, stalled past the timeout)
        self.disconnects = 0
        self._count = threading.Lock()
        self._http = _HttpServer((host, port), _Handler)
        self._http.owner = self
        self._thread: threading.Thread | None = None
        self._splitter: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def _went_away(self, client: Any, exc: BaseException) -> None:
        with self._count:
            self.disconnects += 1
        log.info("shard API: client %s went away (%s)", client[0] if client else "?",
                 type(exc).__name__)

    def _split_loop(self) -> None:
        """Every `auto_split_s` seconds, split the hot shards of volumes with a threshold."""
        while not self._stop.wait(self.auto_split_s):
            try:
                for volume in [v["name"] for v in self.catalog.list_volumes()]:
                    if self._stop.is_set():  # stopping: the rest of the round waits for no one
                        break
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
