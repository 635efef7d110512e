"""Google Cloud clients for the GCS connectors, built the same way everywhere, and SDK error
conversion.

With no options a client uses Application Default Credentials (ADC: `GOOGLE_APPLICATION_CREDENTIALS`,
gcloud's user credentials, workload identity / the metadata server) and the real endpoints.
`credentials_file` names a service-account key file instead. The emulators are reached with
`storage_endpoint` / `pubsub_endpoint` (or the SDKs' own `STORAGE_EMULATOR_HOST` /
`PUBSUB_EMULATOR_HOST`): then no credentials are needed and none are sent.

Options are a frozen dataclass so readers can be pickled to Spark executors; the key file's
path is held as a `connectors.secrets.Secret`: hidden from `repr`, dropped from pickles (an
executor takes ADC from its own environment), unwrapped only where a client is made.
`translate_errors` turns google-api-core / google-auth errors into `connectors.errors`.

    >>> opts = GcpOptions.of(storage_endpoint="http://127.0.0.1:4443", credentials_file="/k.json")
    >>> "k.json" in repr(opts)
    False
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import google.api_core.exceptions as gexc
import google.auth
import google.auth.exceptions as auth_exc
import requests
from google.auth.credentials import AnonymousCredentials

from connectors.errors import (
    ConnectorError,
    CredentialsError,
    TransientError,
    is_transient,
    register_transient,
)
from connectors.secrets import hide, reveal

__all__ = ["GcpOptions", "translate_errors"]

_SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

_TRANSIENT = (gexc.TooManyRequests, gexc.InternalServerError, gexc.BadGateway,
              gexc.ServiceUnavailable, gexc.GatewayTimeout, gexc.DeadlineExceeded,
              gexc.Aborted, gexc.Cancelled, gexc.ResourceExhausted, gexc.Unknown, auth_exc.TransportError,
              requests.exceptions.ConnectionError, requests.exceptions.Timeout,
              requests.exceptions.ChunkedEncodingError)


@dataclass(frozen=True)
class GcpOptions:
    """How to build the GCS and Pub/Sub clients; every field is optional.

    Attributes:
        project: The project billed for the calls; else the credentials' project.
        credentials_file: A service-account key file (JSON); else ADC. Hidden from `repr`.
        storage_endpoint: A GCS endpoint (fake-gcs-server: "http://127.0.0.1:4443"); else
            `STORAGE_EMULATOR_HOST`, else the real one.
        pubsub_endpoint: A Pub/Sub emulator's "host:port" (plain gRPC, no credentials); else
            `PUBSUB_EMULATOR_HOST`, else the real service.
        timeout: Seconds a storage call may take.
    """

    project: str | None = None
    credentials_file: str | None = field(default=None, repr=False)
    storage_endpoint: str | None = None
    pubsub_endpoint: str | None = None
    timeout: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "credentials_file",
                           hide({"credentials_file": self.credentials_file})["credentials_file"])

    @classmethod
    def of(cls, **options: Any) -> GcpOptions:
        """Build from keyword options, naming any unknown option in the error.

        Example:
            >>> GcpOptions.of(project="p").project
            'p'
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown GCP client option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)

    def __repr__(self) -> str:
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                 if f.repr and getattr(self, f.name) != f.default]
        if self.credentials_file:
            shown.append("credentials_file='***'")
        return f"GcpOptions({', '.join(shown)})"

    # -- endpoints and credentials ------------------------------------------------------------
    def storage_emulator(self) -> str | None:
        endpoint = self.storage_endpoint or os.environ.get("STORAGE_EMULATOR_HOST")
        if endpoint and "://" not in endpoint:
            endpoint = "http://" + endpoint
        return endpoint or None

    def pubsub_emulator(self) -> str | None:
        endpoint = self.pubsub_endpoint or os.environ.get("PUBSUB_EMULATOR_HOST")
        return endpoint.split("://")[-1] if endpoint else None

    def credentials(self, *, emulator: bool) -> tuple[Any, str | None]:
        """(credentials, project): the key file's, none for an emulator, else ADC's."""
        path = reveal(self.credentials_file)
        with translate_errors("google-auth", "load credentials", self):
            if path:
                from google.oauth2 import service_account

                creds = service_account.Credentials.from_service_account_file(
                    path, scopes=_SCOPES)
                return creds, self.project or creds.project_id
            if emulator:
                return AnonymousCredentials(), self.project or "volume-stream"
            creds, project = google.auth.default(scopes=_SCOPES)
            return creds, self.project or project

    def storage_client(self) -> Any:
        """A `google.cloud.storage.Client` (thread-safe for the calls the store makes)."""
        from google.cloud import storage

        endpoint = self.storage_emulator()
        creds, project = self.credentials(emulator=bool(endpoint))
        with translate_errors("storage", "create client", self):
            return storage.Client(project=project, credentials=creds,
                                  client_options={"api_endpoint": endpoint} if endpoint else None)

    def subscriber(self) -> Any:
        """A Pub/Sub `SubscriberClient` (the GAPIC one: unary Pull, Acknowledge...)."""
        from google.pubsub_v1 import SubscriberClient
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        endpoint = self.pubsub_emulator()
        with translate_errors("pubsub", "create client", self):
            if endpoint:
                import grpc

                channel = grpc.insecure_channel(endpoint)
                return SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
            creds, _ = self.credentials(emulator=False)
            return SubscriberClient(credentials=creds)

    def credential_sources(self) -> str:
        """Say, without any secret, where credentials were looked for."""
        if self.credentials_file:
            return "the service-account key file given as credentials_file"
        return ("Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, gcloud's "
                "application-default login, workload identity / the metadata server")


def _google_transient(exc: BaseException) -> bool:
    """google-api-core's share of `connectors.errors.is_transient`: 429, 5xx, deadlines,
    dropped connections."""
    return isinstance(exc, _TRANSIENT)


register_transient(_google_transient)


@contextlib.contextmanager
def translate_errors(service: str, action: str, options: GcpOptions) -> Iterator[None]:
    """Convert google-api-core / google-auth / requests errors raised inside the block into
    `connectors.errors` (any `ConnectorError` passes through unchanged)."""
    try:
        yield
    except ConnectorError:
        raise
    except (auth_exc.DefaultCredentialsError, auth_exc.RefreshError, FileNotFoundError) as exc:
        raise CredentialsError(f"no usable Google Cloud credentials for {service} ({action}): "
                               f"{type(exc).__name__}; tried {options.credential_sources()}"
                               ) from exc
    except (gexc.Unauthenticated, gexc.PermissionDenied, gexc.Forbidden,
            gexc.Unauthorized) as exc:
        raise CredentialsError(f"Google Cloud refused {service} {action}: {exc.code} "
                               f"{exc.message}; credentials from "
                               f"{options.credential_sources()}") from exc
    except (gexc.GoogleAPIError, auth_exc.GoogleAuthError, requests.RequestException) as exc:
        kind = TransientError if is_transient(exc) else ConnectorError
        raise kind(f"{service} {action} failed: {type(exc).__name__}: {exc}") from exc
