"""An HTTP proxy in front of an S3 server that misbehaves on purpose, for the refusal tests.

* `strip=("If-None-Match",)`: drops conditional-write headers, so the server overwrites
  objects it should refuse to (a store without conditional writes);
* `allowed_key="AKIA..."`: answers 403 `InvalidAccessKeyId` to requests signed with any other
  access key id (moto does not check credentials); `allowed_key_prefix="ASIA"` accepts only
  temporary (STS) keys. STS AssumeRole calls themselves are let through;
* `refused_keys`: a set of access key ids answered 403 `ExpiredToken` (credentials that have
  expired); tests add to it while the proxy runs;
* `seen`: every (access key id, user agent's first word) of the requests it forwarded.

delta-rs holds the GIL in some calls while it waits on HTTP (`is_deltatable`, `load_cdf`), so a
test that sends delta-rs through the proxy runs it in its own process:
`python -m tests.fakes.strip_proxy UPSTREAM [--allowed-key-prefix ASIA]` prints its endpoint and
takes `PUT /_proxy/refuse/<key>` and `GET /_proxy/seen` (JSON) from the test (`RemoteProxy`).

    proxy = StripProxy(moto_endpoint, strip=("If-None-Match",)).start()
    ...   # talk to proxy.endpoint
    proxy.stop()
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlparse

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler

__all__ = ["StripProxy"]

_KEY = re.compile(r"Credential=([^/]+)/")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "host"}


class _Handler(FakeRequestHandler):
    def _forward(self) -> None:
        proxy: StripProxy = self.server.state
        body = self.read_body()
        if self.path.startswith("/_proxy/"):
            self._control(proxy)
            return
        found = _KEY.search(self.headers.get("Authorization", ""))
        key = found.group(1) if found else ""
        proxy.log.append((self.command, self.path[:80], key[-6:]))
        if key in proxy.refused_keys:
            xml = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ExpiredToken</Code>"
                   b"<Message>The provided token has expired.</Message></Error>")
            if b"Action=" in body:  # STS (query protocol) wraps its errors
                xml = (b"<ErrorResponse><Error><Type>Sender</Type><Code>ExpiredToken</Code>"
                       b"<Message>The security token included in the request is expired"
                       b"</Message></Error></ErrorResponse>")
            self.respond(400, xml, {"Content-Type": "application/xml"})
            return
        proxy.seen.append((key, (self.headers.get("User-Agent") or "").split("/")[0]))
        if (proxy.allowed_key or proxy.allowed_key_prefix) and b"Action=AssumeRole" not in body:
            if (proxy.allowed_key and key != proxy.allowed_key) or \
                    (proxy.allowed_key_prefix and not key.startswith(proxy.allowed_key_prefix)):
                xml = (b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InvalidAccessKeyId"
                       b"</Code><Message>The AWS Access Key Id you provided does not exist in "
                       b"our records.</Message></Error>")
                self.respond(403, xml, {"Content-Type": "application/xml"})
                return
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in _HOP and k.lower() not in proxy.strip}
        conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port,
                                          timeout=60)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            head = self.command == "HEAD"  # keep the object's length, send no body
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP
                   and (head or k.lower() != "content-length")}
            self.respond(resp.status, data, out, head=head)
        finally:
            conn.close()

    def _control(self, proxy: StripProxy) -> None:
        if self.command == "PUT" and self.path.startswith("/_proxy/refuse/"):
            proxy.refused_keys.add(self.path[len("/_proxy/refuse/"):])
            self.respond(200, b"{}", {"Content-Type": "application/json"})
        else:
            self.respond(200, json.dumps({"seen": proxy.seen, "log": proxy.log}).encode(),
                         {"Content-Type": "application/json"})

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


class StripProxy:
    """A proxy to `upstream` (see the module docstring)."""

    def __init__(self, upstream: str, *, strip: tuple[str, ...] = (),
                 allowed_key: str | None = None, allowed_key_prefix: str | None = None,
                 ) -> None:
        self.upstream = urlparse(upstream)
        self.strip = {h.lower() for h in strip}
        self.allowed_key = allowed_key
        self.allowed_key_prefix = allowed_key_prefix
        self.keys_seen: list[str] = []
        self.refused_keys: set[str] = set()
        self.seen: list[tuple[str, str]] = []
        self.log: list[tuple[str, str, str]] = []
        self.server = FakeHTTPServer("fake-s3-proxy", _Handler, self)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> StripProxy:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> StripProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RemoteProxy:
    """A `StripProxy` in its own process (see the module docstring); a context manager."""

    def __init__(self, upstream: str, *, allowed_key_prefix: str | None = None) -> None:
        args = [sys.executable, "-m", "tests.fakes.strip_proxy", upstream]
        if allowed_key_prefix:
            args += ["--allowed-key-prefix", allowed_key_prefix]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        self.endpoint = self.proc.stdout.readline().strip()
        if not self.endpoint.startswith("http://"):
            self.stop()
            raise RuntimeError("the proxy process did not start")

    def refuse(self, key: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/_proxy/refuse/{key}", method="PUT",
                                     data=b"")
        urllib.request.urlopen(req, timeout=10).read()

    def seen(self) -> list[tuple[str, str]]:
        with urllib.request.urlopen(f"{self.endpoint}/_proxy/seen", timeout=10) as resp:
            return [tuple(pair) for pair in json.loads(resp.read())["seen"]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> RemoteProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("upstream")
    parser.add_argument("--allowed-key-prefix")
    args = parser.parse_args()
    proxy = StripProxy(args.upstream, allowed_key_prefix=args.allowed_key_prefix).start()
    print(proxy.endpoint, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
