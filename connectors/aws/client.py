"""boto3 clients for the AWS connectors, built the same way everywhere, and SDK error conversion.

With no options a client uses boto3's standard configuration: environment variables (including
`AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_SQS`, `AWS_PROFILE`, `AWS_DEFAULT_REGION`), the shared
config and credentials files, SSO / web identity, container and instance roles. Options given
explicitly (`endpoint_url`, `region_name`, `aws_access_key_id`, ...) override that. Options are
a plain frozen dataclass so readers can be pickled to Spark executors; credentials are held as
`connectors.secrets.Secret`: hidden from `repr`, dropped from pickles (an executor takes its
own from its environment or role), unwrapped only where a boto3 client is made. `translate_errors` turns botocore exceptions into `connectors.errors` at the edge.

    >>> opts = ClientOptions.of(endpoint_url="http://127.0.0.1:5000", aws_secret_access_key="s")
    >>> "s'" in repr(opts)
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions as bce
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.credentials import RefreshableCredentials

from connectors.errors import (
    ConnectorError,
    CredentialsError,
    TransientError,
    is_transient,
    register_transient,
)
from connectors.secrets import hide, is_secret, reveal

__all__ = ["ClientOptions", "is_transient", "region_from_queue_url", "translate_errors"]

_LOADER = botocore.loaders.create_loader()


#: Error codes worth retrying with backoff (throttling and server-side trouble).
_TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "BandwidthLimitExceeded", "SlowDown",
    "RequestThrottled", "PriorRequestNotComplete", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable",
    "ServiceUnavailableException", "KMS.ThrottlingException",
})

#: Error codes by which a service says the credentials themselves are wrong or expired.
_REJECTED_CREDENTIAL_CODES = frozenset({
    "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch",
    "InvalidAccessKeyId", "ExpiredToken", "ExpiredTokenException", "InvalidToken",
    "InvalidSecurity", "AuthFailure", "IncompleteSignature",
})

_CREDENTIAL_ERRORS = (
    bce.NoCredentialsError, bce.PartialCredentialsError, bce.ProfileNotFound,
    bce.CredentialRetrievalError, bce.TokenRetrievalError, bce.SSOError,
)


@dataclass(frozen=True)
class ClientOptions:
    """How to build a boto3 client; every field is optional and overrides boto3's defaults.

    Attributes:
        endpoint_url: A custom endpoint (moto, LocalStack, MinIO); else boto3's resolution.
        region_name: The region; else boto3's (for SQS, also derived from the queue URL).
        aws_access_key_id: Explicit credentials; hidden from `repr`. Prefer the default chain.
        aws_secret_access_key: See `aws_access_key_id`.
        aws_session_token: See `aws_access_key_id`.
        profile_name: A profile of the shared config files.
        max_pool_connections: HTTP connections per client (parallel receivers need several).
        connect_timeout: Seconds to connect.
        read_timeout: Seconds to wait for a response; must exceed SQS long-poll waits (20 s).
        retry_mode: botocore retry mode, "standard" or "adaptive".
        max_attempts: botocore attempts per request, retries included.
        s3_addressing_style: "path", "virtual" or "auto" (S3 only).
        role_arn: A role to assume (STS AssumeRole) with the credentials found as above;
            the temporary credentials refresh themselves before they expire.
        role_session_name: The assumed role's session name (default "volume-stream").
        external_id: The ExternalId the role's trust policy asks for, if any.
    """

    endpoint_url: str | None = None
    region_name: str | None = None
    aws_access_key_id: str | None = field(default=None, repr=False)
    aws_secret_access_key: str | None = field(default=None, repr=False)
    aws_session_token: str | None = field(default=None, repr=False)
    profile_name: str | None = None
    max_pool_connections: int = 10
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    retry_mode: str = "standard"
    max_attempts: int = 5
    s3_addressing_style: str | None = None
    role_arn: str | None = None
    role_session_name: str = "volume-stream"
    external_id: str | None = field(default=None, repr=False)
    role_duration_s: int = 3600

    def __post_init__(self) -> None:
        for name, value in hide({n: getattr(self, n) for n in _secret_fields()}).items():
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, **options: Any) -> ClientOptions:
        """Build from keyword options, naming any unknown option in the error.

        Example:
            >>> ClientOptions.of(region_name="eu-west-1").region_name
            'eu-west-1'
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown AWS client option(s) {unknown}; known: {sorted(known)}")
        if options.get("retry_mode", "standard") not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"retry_mode must be 'standard' or 'adaptive': {options['retry_mode']!r}")
        return cls(**options)

    def replace(self, **changes: Any) -> ClientOptions:
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.repr and getattr(self, f.name) != f.default]
        shown += [f"{name}='***'" for name in _secret_fields() if getattr(self, name)]
        return f"ClientOptions({', '.join(shown)})"

    def session(self) -> boto3.session.Session:
        """A new boto3 session (sessions are not thread-safe; the clients they make are)."""
        core = botocore.session.get_session()
        # the service models (JSON) are loaded once per process, not once per client
        core.register_component("data_loader", _LOADER)
        session = boto3.session.Session(botocore_session=core, profile_name=self.profile_name,
                                        region_name=self.region_name)
        if self.role_arn:
            core._credentials = self._assumed(session)  # botocore's documented hook
        return session

    def _assumed(self, base: boto3.session.Session) -> RefreshableCredentials:
        """Credentials of `role_arn`, assumed with `base`'s (or the explicit) credentials and
        refreshed by botocore before they expire (RefreshableCredentials)."""
        sts = base.client("sts", endpoint_url=self.endpoint_url,
                          aws_access_key_id=reveal(self.aws_access_key_id),
                          aws_secret_access_key=reveal(self.aws_secret_access_key),
                          aws_session_token=reveal(self.aws_session_token))

        def fetch() -> dict[str, str]:
            kwargs: dict[str, Any] = {"RoleArn": self.role_arn,
                                      "RoleSessionName": self.role_session_name,
                                      "DurationSeconds": self.role_duration_s}
            if self.external_id:
                kwargs["ExternalId"] = self.external_id
            with translate_errors("sts", f"assume role {self.role_arn}", self):
                creds = sts.assume_role(**kwargs)["Credentials"]
            return {"access_key": creds["AccessKeyId"], "secret_key": creds["SecretAccessKey"],
                    "token": creds["SessionToken"], "expiry_time": creds["Expiration"].isoformat()}

        return RefreshableCredentials.create_from_metadata(
            metadata=fetch(), refresh_using=fetch, method="sts-assume-role")

    def client(self, service: str, *, session: boto3.session.Session | None = None) -> Any:
        """Make a thread-safe boto3 client for `service` ("s3", "sqs").

        Example:
            >>> sqs = ClientOptions.of(region_name="us-east-1").client("sqs")  # doctest: +SKIP
        """
        config = Config(
            retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
            max_pool_connections=self.max_pool_connections,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            s3={"addressing_style": self.s3_addressing_style} if self.s3_addressing_style else None,
        )
        with translate_errors(service, "create client", self):
            session = session or self.session()
            explicit = {} if self.role_arn else {  # an assumed role's come from the session
                "aws_access_key_id": reveal(self.aws_access_key_id),
                "aws_secret_access_key": reveal(self.aws_secret_access_key),
                "aws_session_token": reveal(self.aws_session_token)}
            return session.client(service, endpoint_url=self.endpoint_url, config=config,
                                  **explicit)

    def credential_sources(self) -> str:
        """Say, without any secret, where credentials were looked for."""
        if self.aws_access_key_id or self.aws_secret_access_key or self.aws_session_token:
            given = [name for name in _secret_fields() if getattr(self, name)]
            return f"explicit options {given} (a key id needs its secret access key)"
        profile = repr(self.profile_name) if self.profile_name else "AWS_PROFILE or 'default'"
        return ("no explicit options; environment variables AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY; shared config/credentials files "
                f"(profile {profile}) incl. SSO, web identity and credential_process; "
                "container credentials; EC2 instance metadata")


def region_from_queue_url(queue_url: str) -> str | None:
    """The region in an AWS SQS queue URL, or None for custom endpoints.

    Example:
        >>> region_from_queue_url("https://sqs.eu-west-1.amazonaws.com/123456789012/q")
        'eu-west-1'
    """
    match = re.match(r"^https?://(?:sqs[.-]([a-z0-9-]+)|([a-z0-9-]+)\.queue)\.amazonaws\.com",
                     queue_url)
    if not match:
        return None
    return match.group(1) or match.group(2)


def _botocore_transient(exc: BaseException) -> bool:
    """botocore's share of `connectors.errors.is_transient`: throttling, 5xx, dropped
    connections, cut-off bodies."""
    if isinstance(exc, bce.ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in _TRANSIENT_CODES or status >= 500 or status == 429
    return isinstance(exc, (bce.ConnectionError, bce.HTTPClientError, bce.IncompleteReadError))


register_transient(_botocore_transient)


def error_code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def translate_errors(service: str, action: str, options: ClientOptions) -> Iterator[None]:
    """Convert botocore exceptions raised inside the block into `connectors.errors`.

    Errors already converted (any `ConnectorError`) pass through unchanged.
    """
    try:
        yield
    except ConnectorError:
        raise
    except _CREDENTIAL_ERRORS as exc:
        raise CredentialsError(
            f"no usable AWS credentials for {service} ({action}): {exc}; tried "
            f"{options.credential_sources()}"
        ) from exc
    except bce.NoRegionError as exc:
        raise ConnectorError(
            f"no AWS region for {service} ({action}): pass region_name=... or set "
            "AWS_DEFAULT_REGION / a profile region"
        ) from exc
    except bce.ClientError as exc:
        code = error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        if code in _REJECTED_CREDENTIAL_CODES:
            raise CredentialsError(
                f"AWS rejected the credentials for {service} ({action}): {code}: {message}; "
                f"looked in {options.credential_sources()}"
            ) from exc
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"{service} {action} failed: {code}: {message}") from exc
    except bce.BotoCoreError as exc:
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"{service} {action} failed: {exc}") from exc


def _secret_fields() -> tuple[str, ...]:
    """The credential fields of `ClientOptions`, by the one secrets rule (`connectors.secrets`)."""
    return tuple(f.name for f in dataclasses.fields(ClientOptions) if is_secret(f.name))
