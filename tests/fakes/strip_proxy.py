"""An HTTP proxy in front of an S3 server that misbehaves on purpose, for the refusal tests.

* `strip=("If-None-Match",)`: drops conditional-write headers, so the server overwrites
  objects it should refuse to (a store without conditional writes);
* `allowed_key="AKIA..."`: answers 403 `InvalidAccessKeyId` to requests signed with any other
  access key id (moto does not check credentials); `allowed_key_prefix="ASIA"` accepts only
  temporary (STS) keys. STS AssumeRole calls themselves are let through.

    proxy = StripProxy(moto_endpoint, strip=("If-None-Match",)).start()
    ...   # talk to proxy.endpoint
    proxy.stop()
"""

from __future__ import annotations

import http.client
import re
from urllib.parse import urlparse

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler

__all__ = ["StripProxy"]

_KEY = re.compile(r"Credential=([^/]+)/")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "host"}


class _Handler(FakeRequestHandler):
    def _forward(self) -> None:
        proxy: StripProxy = self.server.state
        body = self.read_body()
        if (proxy.allowed_key or proxy.allowed_key_prefix) and b"Action=AssumeRole" not in body:
            found = _KEY.search(self.headers.get("Authorization", ""))
            key = found.group(1) if found else ""
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
