"""Alibaba Cloud STS `AssumeRole` for the OSS and MNS connectors: temporary credentials of a RAM
role, assumed with the process's own credentials and refreshed before they expire.

The call is Alibaba Cloud's RPC style (API version 2015-04-01): a `POST` to the STS endpoint
(`https://sts.aliyuncs.com` unless `sts_endpoint` says otherwise) whose form parameters are
`Action=AssumeRole`, `RoleArn`, `RoleSessionName`, `DurationSeconds` (900..43200) and the common
ones (`Format=JSON`, `Version`, `AccessKeyId`, `SignatureMethod=HMAC-SHA1`,
`SignatureVersion=1.0`, `SignatureNonce`, `Timestamp`, `SecurityToken` when the caller's own
credentials are temporary), signed with HMAC-SHA1 over
`POST&%2F&<percent-encoded sorted parameters>` with the key `<AccessKeySecret>&`. The answer's
`Credentials` hold `AccessKeyId`, `AccessKeySecret`, `SecurityToken` and `Expiration`.

    role = AliRole("acs:ram::1234567890123456:role/reader", base=AliCloudOptions())
    creds = role.credentials()    # AliCloudCredentials with a security token; cached until
                                  # `refresh_seconds` before expiry, then assumed again
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from connectors.alicloud.client import AliCloudCredentials, AliCloudOptions
from connectors.errors import ConnectorError, CredentialsError, TransientError

__all__ = ["DEFAULT_STS_ENDPOINT", "ROLE_OPTIONS", "AliRole", "sign_rpc"]

DEFAULT_STS_ENDPOINT = "https://sts.aliyuncs.com"
_VERSION = "2015-04-01"
_ARN = re.compile(r"^acs:ram::\d+:role/[\w.@+=,/-]{1,64}$", re.IGNORECASE)
#: the connector options that configure a role (`AliRole.of`)
ROLE_OPTIONS = ("role_arn", "role_session_name", "role_duration_seconds", "role_refresh_seconds",
                "sts_endpoint")
#: STS codes that mean the caller's credentials (or its right to the role) were refused
_REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidSecurityToken",
            "NoPermission", "Forbidden", "EntityNotExist.Role", "AccessDenied")


def _encode(text: str) -> str:
    """RFC 3986 percent-encoding as Alibaba Cloud's signatures use it."""
    return quote(str(text), safe="-_.~")


def sign_rpc(method: str, params: dict[str, str], secret: str) -> str:
    """The RPC-style signature of `params` (without `Signature`)."""
    canonical = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(params.items()))
    to_sign = f"{method}&{_encode('/')}&{_encode(canonical)}"
    digest = hmac.new(f"{secret}&".encode(), to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


@dataclass
class AliRole:
    """A RAM role to assume (see the module docstring); thread-safe, picklable (only the role's
    settings and the base options travel: the credentials are assumed again where used)."""

    role_arn: str
    base: AliCloudOptions = field(default_factory=AliCloudOptions)
    session_name: str = "volume-stream"
    duration_seconds: int = 3600
    refresh_seconds: float = 600
    sts_endpoint: str = DEFAULT_STS_ENDPOINT
    _cached: AliCloudCredentials | None = field(default=None, repr=False, compare=False)
    _expiry: datetime | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _ARN.match(self.role_arn or ""):
            raise ConnectorError(f"role_arn {self.role_arn!r} is not a RAM role ARN (expected "
                                 f"acs:ram::<account id>:role/<name>)")
        if not 900 <= int(self.duration_seconds) <= 43200:
            raise ConnectorError(f"role {self.role_arn}: role_duration_seconds must be between "
                                 f"900 and 43200, not {self.duration_seconds}")
        if not self.sts_endpoint.startswith(("http://", "https://")):
            self.sts_endpoint = f"https://{self.sts_endpoint}"
        self._lock = threading.Lock()
        #: how many times the role was assumed (tests and logs watch it move)
        self.assumed = 0

    @classmethod
    def of(cls, base: AliCloudOptions, role_arn: str | None = None, *,
           role_session_name: str | None = None, role_duration_seconds: int | str | None = None,
           role_refresh_seconds: float | str | None = None,
           sts_endpoint: str | None = None) -> AliRole | None:
        """The role the connector options name (None without `role_arn`)."""
        if not role_arn:
            return None
        try:
            return cls(role_arn, base, role_session_name or "volume-stream",
                       int(role_duration_seconds or 3600), float(role_refresh_seconds or 600),
                       sts_endpoint or DEFAULT_STS_ENDPOINT)
        except ValueError:
            raise ConnectorError(f"role {role_arn}: role_duration_seconds and "
                                 f"role_refresh_seconds must be numbers") from None

    def __repr__(self) -> str:
        return f"AliRole({self.role_arn!r}, sts_endpoint={self.sts_endpoint!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_cached=None, _expiry=None, assumed=0)
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def needs_refresh(self, now: datetime | None = None) -> bool:
        if self._cached is None or self._expiry is None:
            return True
        return self._expiry - (now or datetime.now(UTC)) <= timedelta(seconds=self.refresh_seconds)

    def credentials(self) -> AliCloudCredentials:
        """The role's current credentials, assumed again when within `refresh_seconds` of
        expiry.

        Raises:
            CredentialsError: STS refused (unknown key, bad signature, no permission on the
                role); the message names the role and the code, never a secret.
            TransientError / ConnectorError: STS could not be reached or answered oddly.
        """
        with self._lock:
            if self.needs_refresh():
                self._cached, self._expiry = self._assume()
                self.assumed += 1
            return self._cached

    def _assume(self) -> tuple[AliCloudCredentials, datetime]:
        import requests

        base = self.base.credentials()
        params = {
            "Action": "AssumeRole", "Version": _VERSION, "Format": "JSON",
            "RoleArn": self.role_arn, "RoleSessionName": self.session_name,
            "DurationSeconds": str(int(self.duration_seconds)),
            "AccessKeyId": base.access_key_id, "SignatureMethod": "HMAC-SHA1",
            "SignatureVersion": "1.0", "SignatureNonce": uuid.uuid4().hex,
            "Timestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if base.security_token:
            params["SecurityToken"] = base.security_token
        params["Signature"] = sign_rpc("POST", params, base.access_key_secret)
        what = f"STS AssumeRole {self.role_arn} at {self.sts_endpoint}"
        try:
            resp = requests.post(self.sts_endpoint.rstrip("/") + "/", data=params, timeout=30)
        except requests.RequestException as exc:
            raise TransientError(f"{what} failed: {type(exc).__name__}") from exc
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if resp.status_code != 200 or "Credentials" not in body:
            code = str(body.get("Code", resp.status_code))
            message = str(body.get("Message", ""))[:300]
            if resp.status_code >= 500 or code in ("Throttling", "ServiceUnavailable"):
                raise TransientError(f"{what} failed: {code}: {message}")
            kind = CredentialsError if code.startswith(_REFUSED) or \
                resp.status_code in (401, 403) else ConnectorError
            raise kind(f"{what} was refused: {code}: {message}")
        creds = body["Credentials"]
        expiry = datetime.strptime(creds["Expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        return (AliCloudCredentials(creds["AccessKeyId"], creds["AccessKeySecret"],
                                    creds["SecurityToken"]), expiry)
