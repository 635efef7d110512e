"""The HTTP plumbing the MNS and OSS fakes share: a threaded loopback server and a handler base.

Both fakes sit at the wire so tests drive them with the real SDK clients (STYLE: "fakes sit at
the wire"). This module knows nothing about either protocol: it reads request bodies
(Content-Length or chunked), writes HTTP/1.1 responses that always carry an explicit
Content-Length (the MNS SDK keeps its connection alive and needs it, 204s included), names
every thread it starts `fake-...` and makes them daemon threads, and on `stop()` closes the
kept-alive client connections so no handler thread outlives the server.

    server = FakeHTTPServer("fake-mns", MyHandler)
    server.start()          # binds 127.0.0.1 on a free port
    ...                     # server.endpoint == "http://127.0.0.1:PORT"
    server.stop()
"""

from __future__ import annotations

import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeHTTPServer", "FakeRequestHandler", "new_request_id"]


def new_request_id() -> str:
    """A request id shaped like the services' (24 upper-case hex characters)."""
    return uuid.uuid4().hex[:24].upper()


class FakeHTTPServer(ThreadingHTTPServer):
    """A loopback `ThreadingHTTPServer` whose threads are daemon threads named `fake-*`."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, name: str, handler: type[BaseHTTPRequestHandler], state: Any = None):
        super().__init__(("127.0.0.1", 0), handler)
        self.name = name
        #: whatever the handler needs (the protocol backend); handlers reach it as server.state
        self.state = state
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._conn_counter = 0

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeHTTPServer:
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05},
            name=f"{self.name}-accept", daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeHTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # socketserver hooks: same as ThreadingMixIn, but with named threads and tracked sockets
    def process_request(self, request, client_address):  # noqa: D401 - socketserver API
        with self._connections_lock:
            self._connections.add(request)
            self._conn_counter += 1
            number = self._conn_counter
        thread = threading.Thread(
            target=self.process_request_thread, args=(request, client_address),
            name=f"{self.name}-conn-{number}", daemon=True,
        )
        thread.start()

    def handle_error(self, request, client_address):
        # a client closing its kept-alive connection (or stop() shutting it) is not an error
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def shutdown_request(self, request):
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)


class FakeRequestHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler base: body reading and response writing, no logging."""

    protocol_version = "HTTP/1.1"
    server: FakeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size_line = self.rfile.readline().split(b";", 1)[0].strip()
                size = int(size_line or b"0", 16)
                if size == 0:
                    # trailers end with an empty line
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def respond(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                *, head: bool = False) -> None:
        """Send a complete response; `head=True` sends the headers of `body` but not the body."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if not any(name.lower() == "content-length" for name in (headers or {})):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head and self.command != "HEAD":
            self.wfile.write(body)
