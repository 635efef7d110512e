"""Alibaba Cloud credentials and SDK error conversion shared by the MNS and OSS connectors.

Credentials come from explicit options or, when none are given, from the standard environment
variables ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET and the optional
ALIBABA_CLOUD_SECURITY_TOKEN (STS). They are resolved when a client is made, so an object
reader pickled to a Spark executor without explicit options reads the executor's environment.
`AliCloudOptions.__repr__` never shows a secret. `translate_mns_errors` / `translate_oss_errors`
turn aliyun-mns-sdk and oss2 exceptions into `connectors.errors` at the edge (`raise ... from`).

    >>> opts = AliCloudOptions(access_key_id="id", access_key_secret="s3cr3t")
    >>> "s3cr3t" in repr(opts)
    False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from connectors.errors import (
    ConnectorError,
    CredentialsError,
    ObjectChangedError,
    ObjectNotFoundError,
    TransientError,
    is_transient,
    register_transient,
)
from connectors.secrets import hide, reveal

__all__ = [
    "ENV_ACCESS_KEY_ID", "ENV_ACCESS_KEY_SECRET", "ENV_SECURITY_TOKEN", "AliCloudCredentials",
    "AliCloudOptions", "is_transient", "translate_mns_errors",
    "translate_oss_errors",
]

ENV_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"

#: Codes by which a service says the credentials themselves are wrong or expired.
_REJECTED_CREDENTIAL_CODES = frozenset({
    "SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidSecurityToken",
    "SecurityTokenExpired", "SecurityTokenMalformed", "InvalidAccessKeyId.NotFound",
    "TimeExpired", "RequestTimeTooSkewed",
})

#: Codes worth retrying with backoff (throttling and server-side trouble).
_TRANSIENT_CODES = frozenset({
    "InternalError", "InternalServerError", "ServiceUnavailable", "Throttling", "SlowDown",
    "QpsLimitExceeded", "TooManyRequests", "RequestTimeout", "ServerBusy",
})


@dataclass(frozen=True)
class AliCloudCredentials:
    """Resolved credentials; `repr` shows none of them."""

    access_key_id: str = field(repr=False)
    access_key_secret: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"AliCloudCredentials(access_key_id='***', sts={self.security_token is not None})"


@dataclass(frozen=True)
class AliCloudOptions:
    """Explicit credential options; all None means "read the environment when needed".

    Attributes:
        access_key_id: AccessKey ID; needs `access_key_secret`.
        access_key_secret: AccessKey secret.
        security_token: STS token for temporary credentials.
    """

    access_key_id: str | None = field(default=None, repr=False)
    access_key_secret: str | None = field(default=None, repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # held as Secret (masked, never pickled); unwrapped by credentials(), for the SDK
        for name, value in hide({"access_key_id": self.access_key_id,
                                 "access_key_secret": self.access_key_secret,
                                 "security_token": self.security_token}).items():
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        given = [name for name in ("access_key_id", "access_key_secret", "security_token")
                 if getattr(self, name)]
        shown = ", ".join(f"{name}='***'" for name in given) or "credentials from environment"
        return f"AliCloudOptions({shown})"

    def credentials(self) -> AliCloudCredentials:
        """Explicit options if any were given, else the environment variables.

        Raises:
            CredentialsError: nothing usable; the message names what was looked at.
        """
        if self.access_key_id or self.access_key_secret:
            if not (self.access_key_id and self.access_key_secret):
                raise CredentialsError("explicit Alibaba Cloud credentials need both "
                                       "access_key_id and access_key_secret")
            return AliCloudCredentials(reveal(self.access_key_id),
                                       reveal(self.access_key_secret),
                                       reveal(self.security_token) or None)
        key_id = os.environ.get(ENV_ACCESS_KEY_ID, "")
        secret = os.environ.get(ENV_ACCESS_KEY_SECRET, "")
        if not (key_id and secret):
            missing = [name for name, value in ((ENV_ACCESS_KEY_ID, key_id),
                                                (ENV_ACCESS_KEY_SECRET, secret)) if not value]
            raise CredentialsError(
                f"no Alibaba Cloud credentials: set {ENV_ACCESS_KEY_ID} and "
                f"{ENV_ACCESS_KEY_SECRET} (optionally {ENV_SECURITY_TOKEN} for STS), or pass "
                f"access_key_id/access_key_secret; missing: {', '.join(missing)}")
        return AliCloudCredentials(key_id, secret, os.environ.get(ENV_SECURITY_TOKEN) or None)


def _mns_code(exc: BaseException) -> str:
    return str(getattr(exc, "type", "") or "")


def _mns_transient(exc: BaseException) -> bool:
    """aliyun-mns-sdk's share of `is_transient`: network trouble, throttling, server errors."""
    from mns.mns_exception import MNSClientNetworkException, MNSServerException

    if isinstance(exc, MNSClientNetworkException):
        return True
    return isinstance(exc, MNSServerException) and _mns_code(exc) in _TRANSIENT_CODES


def _oss_transient(exc: BaseException) -> bool:
    """oss2's share of `is_transient`: network trouble (also a body cut off mid-read, which
    requests raises), 5xx, 429 and throttling codes."""
    import oss2.exceptions as oe
    import requests

    if isinstance(exc, oe.RequestError | requests.exceptions.RequestException):
        return True
    if isinstance(exc, oe.OssError) and not isinstance(exc, oe.ClientError):
        return exc.status >= 500 or exc.status == 429 or exc.code in _TRANSIENT_CODES
    return False


register_transient(_mns_transient)
register_transient(_oss_transient)


@contextlib.contextmanager
def translate_mns_errors(action: str) -> Iterator[None]:
    """Convert aliyun-mns-sdk exceptions raised inside the block into `connectors.errors`."""
    from mns.mns_exception import MNSExceptionBase, MNSServerException

    try:
        yield
    except ConnectorError:
        raise
    except MNSServerException as exc:
        code = _mns_code(exc)
        if code in _REJECTED_CREDENTIAL_CODES:
            raise CredentialsError(f"MNS rejected the credentials ({action}): {code}: "
                                   f"{exc.message}") from exc
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"MNS {action} failed: {code}: {exc.message} "
                   f"(request {exc.request_id})") from exc
    except MNSExceptionBase as exc:
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"MNS {action} failed: {_mns_code(exc)}: {exc.message}") from exc


@contextlib.contextmanager
def translate_oss_errors(action: str, url: str) -> Iterator[None]:
    """Convert oss2 exceptions raised inside the block into `connectors.errors`.

    A missing object (`NoSuchKey`, or a bare 404 on HEAD) becomes `ObjectNotFoundError`; a
    missing bucket (`NoSuchBucket`) stays a plain `ConnectorError`.
    """
    import oss2.exceptions as oe

    try:
        yield
    except ConnectorError:
        raise
    except oe.OssError as exc:
        code = getattr(exc, "code", "") or ""
        kind = TransientError if is_transient(exc) else ConnectorError
        if isinstance(exc, oe.PreconditionFailed):  # If-Match failed while resuming a read
            raise ObjectChangedError(f"{url} changed while it was being read") from exc
        if isinstance(exc, oe.NoSuchKey) or (isinstance(exc, oe.NotFound) and not code):
            raise ObjectNotFoundError(f"{url} does not exist") from exc
        if code in _REJECTED_CREDENTIAL_CODES:
            raise CredentialsError(f"OSS rejected the credentials ({action} {url}): {code}: "
                                   f"{exc.message}") from exc
        if isinstance(exc, oe.RequestError):
            raise kind(f"OSS {action} {url} failed: network error: {exc.body!r:.200}") from exc
        raise kind(f"OSS {action} {url} failed: {exc.status} {code}: {exc.message} "
                   f"(request {exc.request_id})") from exc
