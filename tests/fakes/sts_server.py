"""A local fake of Alibaba Cloud STS `AssumeRole` (RPC style, API version 2015-04-01), for the
OSS/MNS role tests.

It answers `POST /` (parameters in the form body and/or the query string) as the documented API
does: it checks the common parameters (`Format`, `Version`, `SignatureMethod=HMAC-SHA1`,
`SignatureVersion=1.0`, a fresh `SignatureNonce`, a `Timestamp` within 15 minutes), the caller's
`AccessKeyId` (and its `SecurityToken` when its credentials are temporary) and the HMAC-SHA1
`Signature` over `POST&%2F&<percent-encoded sorted parameters>` keyed with `<secret>&` (its own
implementation, checked against aliyunsdkcore's in `test_fakes.py`), that the caller may assume
`RoleArn`, `RoleSessionName` and `DurationSeconds` (900..`max_duration`). It then issues
`STS.`-prefixed temporary credentials, registers them with the OSS and MNS fakes (which then
require their `x-oss-security-token` / `security-token`), and returns the documented JSON:

    {"RequestId": ..., "AssumedRoleUser": {"Arn": ..., "AssumedRoleId": ...},
     "Credentials": {"AccessKeyId": "STS.…", "AccessKeySecret": ..., "SecurityToken": ...,
                     "Expiration": "2026-01-01T00:00:00Z"}}

Errors are `{"RequestId", "HostId", "Code", "Message"}` with the documented codes
(`InvalidAccessKeyId.NotFound`, `SignatureDoesNotMatch`, `InvalidSecurityToken.Expired`,
`NoPermission`, `InvalidParameter.RoleArn`, `InvalidParameter.DurationSeconds`, ...).

    sts = FakeStsServer({"LTAI...": "secret"}, grants={ROLE: {"LTAI..."}},
                        issue_to=[oss_server.backend, mns_server.backend]).start()
    sts.expire(access_key_id)     # the OSS/MNS fakes forget the credentials: "expired"
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

from tests.fakes._http import FakeHTTPServer, FakeRequestHandler, new_request_id

__all__ = ["FakeStsServer", "rpc_signature"]

_SESSION = re.compile(r"^[\w.@-]{2,64}$")
_ARN = re.compile(r"^acs:ram::(\d+):role/([\w.@+=,/-]{1,64})$", re.IGNORECASE)


def rpc_signature(method: str, params: dict[str, str], secret: str) -> str:
    """Alibaba Cloud's RPC signature (the documented algorithm, written independently)."""
    def enc(text: str) -> str:
        return quote(text, safe="~").replace("%7E", "~")

    pairs = sorted((enc(k), enc(v)) for k, v in params.items() if k != "Signature")
    canonical = "&".join(f"{k}={v}" for k, v in pairs)
    string_to_sign = method + "&" + enc("/") + "&" + enc(canonical)
    mac = hmac.new((secret + "&").encode("utf-8"), string_to_sign.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


class StsError(Exception):
    def __init__(self, code: str, status: int, message: str):
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class _Handler(FakeRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        sts: FakeStsServer = self.server.state
        body = self.read_body()
        params = dict(parse_qsl(urlsplit(self.path).query, keep_blank_values=True))
        params.update(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        request_id = new_request_id()
        try:
            answer = sts.assume_role(params, self.command)
        except StsError as exc:
            payload = {"RequestId": request_id, "HostId": "sts.aliyuncs.com", "Code": exc.code,
                       "Message": exc.message}
            self.respond(exc.status, json.dumps(payload).encode(),
                         {"Content-Type": "application/json"})
            return
        answer["RequestId"] = request_id
        self.respond(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    do_GET = do_POST


class FakeStsServer:
    """See the module docstring. `issued` lists every access key id handed out, in order."""

    def __init__(self, credentials: dict[str, str], *, grants: dict[str, set[str]],
                 issue_to: list[Any] = (), max_duration: int = 3600) -> None:
        self.credentials: dict[str, tuple[str, str | None]] = {
            k: (v, None) for k, v in credentials.items()}
        self.grants = grants
        self.issue_to = list(issue_to)
        self.max_duration = max_duration
        self.issued: list[str] = []
        self.calls = 0
        self._nonces: set[str] = set()
        self._lock = threading.Lock()
        self.server = FakeHTTPServer("fake-sts", _Handler, self)

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> FakeStsServer:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def expire(self, access_key_id: str) -> None:
        """The temporary credentials `access_key_id` expire: OSS and MNS refuse them."""
        for backend in self.issue_to:
            backend.credentials.pop(access_key_id, None)

    def assume_role(self, params: dict[str, str], method: str) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            self._check_common(params, method)
            role = params.get("RoleArn", "")
            match = _ARN.match(role)
            if params.get("Action") != "AssumeRole":
                raise StsError("InvalidAction.NotFound", 404, "Specified api is not found")
            if not match:
                raise StsError("InvalidParameter.RoleArn", 400, "The parameter RoleArn is "
                               "wrongly formed.")
            if params["AccessKeyId"] not in self.grants.get(role, set()):
                raise StsError("NoPermission", 403, "You are not authorized to do this action. "
                               "You should be authorized by RAM.")
            session = params.get("RoleSessionName", "")
            if not _SESSION.match(session):
                raise StsError("InvalidParameter.RoleSessionName", 400,
                               "The parameter RoleSessionName is wrongly formed.")
            try:
                duration = int(params.get("DurationSeconds", "3600"))
            except ValueError:
                duration = -1
            if not 900 <= duration <= self.max_duration:
                raise StsError("InvalidParameter.DurationSeconds", 400,
                               f"The Min/Max value of DurationSeconds is 15min/"
                               f"{self.max_duration // 60}min.")
            key_id = "STS." + secrets.token_hex(12)
            secret, token = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
            expiry = datetime.now(UTC) + timedelta(seconds=duration)
            for backend in self.issue_to:
                backend.add_credentials(key_id, secret, token)
            self.credentials[key_id] = (secret, token)  # role chaining is allowed too
            self.issued.append(key_id)
            account, name = match.groups()
            return {"AssumedRoleUser": {"Arn": f"acs:ram::{account}:role/{name}/{session}",
                                        "AssumedRoleId": f"3{secrets.token_hex(8)}:{session}"},
                    "Credentials": {"AccessKeyId": key_id, "AccessKeySecret": secret,
                                    "SecurityToken": token,
                                    "Expiration": expiry.strftime("%Y-%m-%dT%H:%M:%SZ")}}

    def _check_common(self, params: dict[str, str], method: str) -> None:
        missing = [p for p in ("AccessKeyId", "Signature", "SignatureMethod", "SignatureVersion",
                               "SignatureNonce", "Timestamp", "Version") if not params.get(p)]
        if missing:
            raise StsError("MissingParameter", 400, f"The input parameter {missing[0]} that is "
                           f"mandatory for processing this request is not supplied.")
        if params["Version"] != "2015-04-01":
            raise StsError("InvalidVersion", 400, "Specified parameter Version is not valid.")
        if params.get("Format", "XML") != "JSON":
            raise StsError("InvalidParameter.Format", 400, "this fake answers JSON only")
        if params["SignatureMethod"] != "HMAC-SHA1" or params["SignatureVersion"] != "1.0":
            raise StsError("InvalidParameter.SignatureMethod", 400, "HMAC-SHA1 1.0 expected")
        try:
            when = datetime.strptime(params["Timestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=UTC)
        except ValueError:
            raise StsError("InvalidTimeStamp.Format", 400, "Specified time stamp or date "
                           "value is not well formatted.") from None
        if abs((datetime.now(UTC) - when).total_seconds()) > 900:
            raise StsError("InvalidTimeStamp.Expired", 400, "Specified time stamp or date "
                           "value is expired.")
        if params["SignatureNonce"] in self._nonces:
            raise StsError("SignatureNonceUsed", 400, "The request signature nonce has been "
                           "used.")
        known = self.credentials.get(params["AccessKeyId"])
        if known is None:
            raise StsError("InvalidAccessKeyId.NotFound", 404, "Specified access key is not "
                           "found.")
        secret, token = known
        if token is not None and params.get("SecurityToken") != token:
            raise StsError("InvalidSecurityToken.Expired", 403, "Specified SecurityToken is "
                           "expired or not valid.")
        if not hmac.compare_digest(rpc_signature(method, params, secret), params["Signature"]):
            raise StsError("SignatureDoesNotMatch", 400, "Specified signature is not matched "
                           "with our calculation.")
        self._nonces.add(params["SignatureNonce"])
