"""A fault-injecting HTTP proxy for tests: put it between the project's clients and moto's server
(or any HTTP service) and a configurable share of requests fail the way networks and services
fail: 500 InternalError, 503 SlowDown, a connection reset before any response, a response whose
body is cut off, or extra latency. Everything else is forwarded unchanged.

Two more ways an object store misbehaves, for the parts of multipart uploads (S3's UploadPart:
a PUT with an `uploadId`): `hold_uploads_s` holds each part's answer that long (a store slower
to answer than a client's read timeout), and `fail_uploads(n)` answers the next `n` parts 500
InternalError (more than a client's retries of one request).

    with FaultyProxy(upstream="http://127.0.0.1:5000", rate=0.1, seed=7) as proxy:
        boto3.client("s3", endpoint_url=proxy.endpoint, ...)     # 10% of calls fail
        proxy.counts   # {"forwarded": 412, "error500": 11, "slowdown503": 9, ...}

Faults are drawn from a seeded random generator, so a failing run can be replayed. The error
bodies follow the caller's protocol (XML for S3 and SQS query, JSON for the JSON protocols), as
the real services send them, so SDKs classify and retry them as they would in production.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlparse

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler, new_request_id

__all__ = ["CONTROL_PATH", "COUNTS_PATH", "FAULTS", "FaultyProxy", "main"]

#: the proxy's own paths (answered by it, never forwarded): `.../counts` answers its counts as
#: JSON; `.../pause` and `.../resume` stop and restart the faults (answering the counts too)
CONTROL_PATH = "/__faulty_proxy__/"
COUNTS_PATH = CONTROL_PATH + "counts"

#: the kinds of fault, drawn with equal weight unless `faults` says otherwise
FAULTS = ("error500", "slowdown503", "reset", "truncate", "latency")

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "content-length"}


class _State:
    def __init__(self, upstream: str, rate: float, faults: tuple[str, ...], seed: int,
                 latency_s: float, hold_uploads_s: float = 0.0):
        url = urlparse(upstream)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.rate, self.faults, self.latency_s = rate, faults, latency_s
        self.hold_uploads_s = hold_uploads_s
        self.failing_uploads = 0
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.enabled = True

    def draw(self) -> str | None:
        with self.lock:
            if not self.enabled or self.random.random() >= self.rate:
                return None
            return self.random.choice(self.faults)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def fail_upload(self) -> bool:
        """Whether this part upload is one of the `fail_uploads` still to fail."""
        with self.lock:
            if self.failing_uploads <= 0:
                return False
            self.failing_uploads -= 1
            self.counts["upload_failed"] += 1
            return True


class _Handler(FakeRequestHandler):
    server: FakeHTTPServer

    def _any(self) -> None:
        state: _State = self.server.state
        body = self.read_body()
        if self.path.startswith(CONTROL_PATH):  # the proxy's own, never forwarded nor faulted
            if self.path.endswith("/pause"):
                state.enabled = False
            elif self.path.endswith("/resume"):
                state.enabled = True
            elif "/fail_uploads/" in self.path:
                with state.lock:
                    state.failing_uploads = int(self.path.rsplit("/", 1)[1])
            with state.lock:
                payload = json.dumps(dict(state.counts)).encode()
            self.respond(200, payload, {"Content-Type": "application/json"})
            return
        upload = self.command == "PUT" and "uploadId=" in self.path  # a multipart upload's part
        if upload and state.fail_upload():
            self._error(500, "InternalError")
            return
        fault = state.draw()
        if fault == "reset":
            state.count(fault)
            # RST instead of FIN: the client sees "connection reset by peer"
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        if fault in ("error500", "slowdown503"):
            state.count(fault)
            self._error(500 if fault == "error500" else 503,
                        "InternalError" if fault == "error500" else "SlowDown")
            return
        if fault == "latency":
            state.count(fault)
            time.sleep(state.latency_s)
        status, headers, payload = self._forward(state, body)
        if upload and state.hold_uploads_s:
            time.sleep(state.hold_uploads_s)  # done upstream; its answer comes late
        if fault == "truncate" and len(payload) > 1 and self.command != "HEAD":
            state.count(fault)
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        state.count("forwarded")
        self.respond(status, payload, dict(headers), head=self.command == "HEAD")

    def _forward(self, state: _State, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(state.host, state.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            # a HEAD's Content-Length is the object's size, not that of the (empty) body
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP
                    or (k.lower() == "content-length" and self.command == "HEAD")]
            return response.status, kept, payload
        finally:
            conn.close()

    def _error(self, status: int, code: str) -> None:
        request_id = new_request_id()
        message = "We encountered an internal error. Please try again." if status == 500 \
            else "Please reduce your request rate."
        if "json" in self.headers.get("Content-Type", ""):
            payload = (f'{{"__type": "{code}", "message": "{message}"}}').encode()
            ctype = "application/x-amz-json-1.0"
        else:
            payload = (f"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>"
                       f"<Message>{message}</Message><RequestId>{request_id}</RequestId>"
                       f"</Error>").encode()
            ctype = "application/xml"
        self.respond(status, payload, {"Content-Type": ctype, "x-amz-request-id": request_id})

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _any


class FaultyProxy:
    """A loopback HTTP proxy to `upstream` that fails a `rate` share of requests.

    Args:
        upstream: The real service, e.g. moto's endpoint URL.
        rate: Share of requests that get a fault (0..1).
        faults: The kinds to draw from (`FAULTS`).
        seed: Seed of the fault generator.
        latency_s: Delay added by a "latency" fault.
        hold_uploads_s: How long every part upload's answer is held.
    """

    def __init__(self, upstream: str, *, rate: float = 0.1, faults: tuple[str, ...] = FAULTS,
                 seed: int = 0, latency_s: float = 0.2, hold_uploads_s: float = 0.0):
        unknown = set(faults) - set(FAULTS)
        if unknown or not 0 <= rate <= 1:
            raise ValueError(f"faults must be among {FAULTS} and rate in 0..1")
        self._state = _State(upstream, rate, tuple(faults), seed, latency_s, hold_uploads_s)
        self._server = FakeHTTPServer("fake-faulty-proxy", _Handler, self._state)

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    @property
    def counts(self) -> Counter[str]:
        with self._state.lock:
            return Counter(self._state.counts)

    def pause(self) -> None:
        """Forward everything (no faults) until `resume`."""
        self._state.enabled = False

    def resume(self) -> None:
        self._state.enabled = True

    def fail_uploads(self, n: int) -> None:
        """Answer the next `n` part uploads 500 InternalError."""
        with self._state.lock:
            self._state.failing_uploads = n

    def start(self) -> FaultyProxy:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FaultyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.fakes.faulty_proxy UPSTREAM --rate 0.1 --seed 7`: the proxy in its own
    process (so that a test process busy in delta-rs never stalls it); prints its endpoint on
    one line, serves its counts at `COUNTS_PATH`, and stops on SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream")
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--hold-uploads", type=float, default=0.0,
                        help="seconds every part upload's answer is held")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated kinds among {', '.join(FAULTS)}")
    args = parser.parse_args(argv)
    proxy = FaultyProxy(args.upstream, rate=args.rate, seed=args.seed, latency_s=args.latency,
                        faults=tuple(args.faults.split(",")),
                        hold_uploads_s=args.hold_uploads).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(proxy.endpoint, flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    proxy.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
