"""Azure Storage clients for the Azure connectors, built the same way everywhere, and SDK error
conversion.

Where a client's account, endpoints and credential come from, first found wins:

1. explicit options: `connection_string`, `account_key`, `sas_token` (secrets), `account_name`,
   `blob_endpoint` / `queue_endpoint` (an emulator's, a sovereign cloud's), `use_emulator`
   (Azurite's well-known account and ports on 127.0.0.1);
2. the environment: `AZURE_STORAGE_CONNECTION_STRING`, then `AZURE_STORAGE_ACCOUNT_KEY` /
   `AZURE_STORAGE_KEY` or `AZURE_STORAGE_SAS_TOKEN` with `AZURE_STORAGE_ACCOUNT_NAME` /
   `AZURE_STORAGE_ACCOUNT` (the names object_store / delta-rs and the az CLI read);
3. `azure.identity.DefaultAzureCredential`: workload identity, managed identity, the az CLI
   login... (RBAC: Storage Blob Data Reader, Storage Queue Data Message Processor).

A connection string is split when the options are made: its account and endpoints are plain
fields, its key or SAS a `Secret`. Options are a frozen dataclass so readers can be pickled to
Spark executors; secrets are dropped from pickles (an executor takes its own from its
environment or identity) and never shown by `repr`. `translate_errors` turns azure-core and
azure-identity exceptions into `connectors.errors` at the edge.

    >>> opts = AzureOptions.of(account_name="acct", account_key="c2VjcmV0")
    >>> "c2VjcmV0" in repr(opts), opts.endpoint("blob")
    (False, 'https://acct.blob.core.windows.net')
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from connectors.errors import (
    ConnectorError,
    CredentialsError,
    TransientError,
    is_transient,
    register_transient,
)
from connectors.secrets import Secret, reveal

__all__ = ["EMULATOR_ACCOUNT", "AzureOptions", "parse_connection_string", "translate_errors"]

#: Azurite's (and the old storage emulator's) published development account and key
EMULATOR_ACCOUNT = "devstoreaccount1"
_EMULATOR_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
                 "KBHBeksoGMGw==")
_EMULATOR_PORTS = {"blob": 10000, "queue": 10001}

ENV_CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
_ENV_ACCOUNT = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT")
_ENV_KEY = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY")
_ENV_SAS = ("AZURE_STORAGE_SAS_TOKEN",)

#: error codes by which the service says the credentials are wrong, expired or not allowed
_REJECTED_CODES = frozenset({
    "AuthenticationFailed", "AuthorizationFailure", "AuthorizationPermissionMismatch",
    "InvalidAuthenticationInfo", "AuthorizationResourceTypeMismatch",
    "AuthorizationServiceMismatch", "AuthorizationProtocolMismatch",
    "AuthorizationSourceIPMismatch", "KeyBasedAuthenticationNotPermitted",
})
_TRANSIENT_CODES = frozenset({"ServerBusy", "InternalError", "OperationTimedOut"})


def parse_connection_string(text: str) -> dict[str, str]:
    """The `Key=Value;...` pairs of an Azure Storage connection string (keys as written).

    Example:
        >>> parse_connection_string("AccountName=a;AccountKey=k==;BlobEndpoint=http://h/a")
        {'AccountName': 'a', 'AccountKey': 'k==', 'BlobEndpoint': 'http://h/a'}
    """
    pairs: dict[str, str] = {}
    for part in text.strip().strip(";").split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError("an Azure Storage connection string is Key=Value pairs separated "
                             "by ';' (the pair without '=' is not shown: it may be a secret)")
        pairs[key.strip()] = value.strip()
    return pairs


@dataclass(frozen=True)
class AzureOptions:
    """How to build an Azure Storage client; every field is optional (module docstring).

    Attributes:
        account_name: The storage account; else the location's, the connection string's or
            the environment's.
        blob_endpoint: The Blob service URL; default `https://<account>.blob.<suffix>`.
        queue_endpoint: The Queue service URL; default `https://<account>.queue.<suffix>`.
        endpoint_suffix: "core.windows.net" unless a sovereign cloud's.
        connection_string: A whole connection string (secret); split when given.
        account_key: The account's shared key (secret).
        sas_token: A shared access signature (secret), with or without its leading '?'.
        use_emulator: Azurite's development account on 127.0.0.1 (ports 10000 / 10001 unless
            endpoints are given).
        managed_identity_client_id: A user-assigned identity for DefaultAzureCredential.
        connection_timeout: Seconds to connect.
        read_timeout: Seconds to wait for a response.
    """

    account_name: str | None = None
    blob_endpoint: str | None = None
    queue_endpoint: str | None = None
    endpoint_suffix: str = "core.windows.net"
    connection_string: Any = field(default=None, repr=False)
    account_key: Any = field(default=None, repr=False)
    sas_token: Any = field(default=None, repr=False)
    use_emulator: bool = False
    managed_identity_client_id: str | None = None
    connection_timeout: float = 20.0
    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        for name in _SECRETS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Secret(value))
        if self.connection_string is not None:
            self._absorb(parse_connection_string(reveal(self.connection_string)))
        if isinstance(self.use_emulator, str):
            object.__setattr__(self, "use_emulator", self.use_emulator.lower() == "true")

    def _absorb(self, pairs: dict[str, str]) -> None:
        """Fill the plain fields (and the key or SAS, as secrets) a connection string gives."""
        if pairs.get("UseDevelopmentStorage", "").lower() == "true":
            object.__setattr__(self, "use_emulator", True)
        fill = {"account_name": pairs.get("AccountName"),
                "blob_endpoint": pairs.get("BlobEndpoint"),
                "queue_endpoint": pairs.get("QueueEndpoint")}
        if pairs.get("EndpointSuffix"):
            fill["endpoint_suffix"] = pairs["EndpointSuffix"]
        for name, value in fill.items():
            if value and getattr(self, name) in (None, "core.windows.net"):
                object.__setattr__(self, name, value)
        if pairs.get("AccountKey") and self.account_key is None:
            object.__setattr__(self, "account_key", Secret(pairs["AccountKey"]))
        if pairs.get("SharedAccessSignature") and self.sas_token is None:
            object.__setattr__(self, "sas_token", Secret(pairs["SharedAccessSignature"]))
        if pairs.get("DefaultEndpointsProtocol") == "http":
            object.__setattr__(self, "_http", True)

    @classmethod
    def of(cls, **options: Any) -> AzureOptions:
        """Build from keyword options, naming any unknown option in the error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown Azure client option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)

    def with_environment(self) -> AzureOptions:
        """These options completed from the environment (step 2 of the module docstring):
        what a process (an executor too) fills in from its own variables."""
        if self.account_key is not None or self.sas_token is not None:
            return self
        changes: dict[str, Any] = {}
        text = os.environ.get(ENV_CONNECTION_STRING)
        if text and self.connection_string is None:
            return dataclasses.replace(self, connection_string=text)
        key = _env(_ENV_KEY)
        sas = _env(_ENV_SAS)
        if key:
            changes["account_key"] = key
        elif sas:
            changes["sas_token"] = sas
        if self.account_name is None and _env(_ENV_ACCOUNT):
            changes["account_name"] = _env(_ENV_ACCOUNT)
        return dataclasses.replace(self, **changes) if changes else self

    def account(self) -> str | None:
        if self.account_name:
            return self.account_name
        return EMULATOR_ACCOUNT if self.use_emulator else None

    def endpoint(self, service: str) -> str:
        """The URL of the "blob" or "queue" service of the account.

        Raises:
            CredentialsError: no account is known (no option, location or environment).
        """
        given = self.blob_endpoint if service == "blob" else self.queue_endpoint
        if given:
            return given.rstrip("/")
        account = self.account()
        if self.use_emulator:
            return f"http://127.0.0.1:{_EMULATOR_PORTS[service]}/{account}"
        if not account:
            raise CredentialsError(
                f"no Azure storage account for the {service} service: give account_name=..., "
                "an abfss://container@ACCOUNT.dfs.core.windows.net/ location, a connection "
                f"string or {_ENV_ACCOUNT[0]}")
        scheme = "http" if getattr(self, "_http", False) else "https"
        return f"{scheme}://{account}.{service}.{self.endpoint_suffix}"

    def credential(self) -> Any:
        """The SDK credential: a named key, a SAS, or DefaultAzureCredential."""
        if self.account_key is not None:
            return AzureNamedKeyCredential(self.account() or "", reveal(self.account_key))
        if self.sas_token is not None:
            return AzureSasCredential(reveal(self.sas_token).lstrip("?"))
        if self.use_emulator:
            return AzureNamedKeyCredential(self.account() or EMULATOR_ACCOUNT, _EMULATOR_KEY)
        from azure.identity import DefaultAzureCredential  # only where no key is given

        kwargs = ({"managed_identity_client_id": self.managed_identity_client_id}
                  if self.managed_identity_client_id else {})
        return DefaultAzureCredential(**kwargs)

    def client_kwargs(self) -> dict[str, Any]:
        return {"connection_timeout": self.connection_timeout,
                "read_timeout": self.read_timeout}

    def credential_sources(self) -> str:
        """Say, without any secret, where credentials were looked for."""
        if self.account_key is not None:
            return "the account key given"
        if self.sas_token is not None:
            return "the SAS token given"
        return (f"no key or SAS in the options nor in {ENV_CONNECTION_STRING}, {_ENV_KEY}, "
                f"{_ENV_SAS}; DefaultAzureCredential (environment, workload identity, managed "
                "identity, az CLI login)")

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.repr and getattr(self, f.name) != f.default]
        shown += [f"{name}='***'" for name in _SECRETS if getattr(self, name) is not None]
        return f"AzureOptions({', '.join(shown)})"


_SECRETS = ("connection_string", "account_key", "sas_token")


def _env(names: tuple[str, ...]) -> str | None:
    return next((os.environ[n] for n in names if os.environ.get(n)), None)


def error_code(exc: BaseException) -> str:
    """The service's error code ("PopReceiptMismatch"), whether the SDK gave a string or
    one of its `StorageErrorCode` enums."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def _azure_transient(exc: BaseException) -> bool:
    """azure-core's share of `connectors.errors.is_transient`: throttling, 5xx, dropped links."""
    if isinstance(exc, ServiceRequestError | ServiceResponseError):
        return True
    if isinstance(exc, HttpResponseError):
        status = exc.status_code or 0
        return status >= 500 or status in (408, 429) or error_code(exc) in _TRANSIENT_CODES
    return False


register_transient(_azure_transient)


@contextlib.contextmanager
def translate_errors(service: str, action: str, options: AzureOptions) -> Iterator[None]:
    """Convert azure-core / azure-identity exceptions raised inside the block into
    `connectors.errors`; errors already converted pass through unchanged."""
    try:
        yield
    except ConnectorError:
        raise
    except ClientAuthenticationError as exc:  # CredentialUnavailableError is one too
        raise CredentialsError(f"no usable Azure credentials for {service} ({action}): "
                               f"{_first_line(exc)}; tried {options.credential_sources()}") \
            from exc
    except HttpResponseError as exc:
        code = error_code(exc)
        if code in _REJECTED_CODES or exc.status_code == 403:
            raise CredentialsError(f"Azure rejected the credentials for {service} ({action}): "
                                   f"{code or exc.status_code}; looked in "
                                   f"{options.credential_sources()}") from exc
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"{service} {action} failed: {code or exc.status_code}: "
                   f"{_first_line(exc)}") from exc
    except AzureError as exc:
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"{service} {action} failed: {type(exc).__name__}: {_first_line(exc)}") \
            from exc


def _first_line(exc: BaseException) -> str:
    """The first line of an SDK message (its later lines repeat the request's headers)."""
    text = str(getattr(exc, "message", None) or exc)
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
