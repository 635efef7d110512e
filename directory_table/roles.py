"""Storage options that carry an assumed role's temporary credentials, refreshed before expiry
(DESIGN §3.2).

delta-rs takes static credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_SESSION_TOKEN`) in its `storage_options`. With a `role_arn` option (also `AWS_ROLE_ARN`,
`AWS_IAM_ROLE_ARN`) `live_options` returns a `RoleOptions`: a dict holding the other options plus
the role's current temporary credentials, got with STS `AssumeRole` (boto3, the credentials given
in the options or else the standard chain). Every user of the options (delta-rs table opens,
boto3 and pyarrow clients of `storage`) calls `refresh()` first, which assumes the role again once
the credentials are within `role_refresh_seconds` (default 600) of their expiry and updates the
dict *in place*, bumping `generation` so that holders of an open `DeltaTable` reopen it. A
long-running daemon therefore keeps working across expiries.

    opts = live_options({"role_arn": "arn:aws:iam::1:role/wh", "AWS_REGION": "eu-west-1"})
    opts.refresh()          # assumes the role if needed; opts["AWS_SESSION_TOKEN"] is current

Only the role's settings travel to executors (pickling keeps no credential); each process
assumes the role itself. Keys: `role_arn`, `role_session_name` (default "volume-stream"),
`role_external_id`, `role_duration_seconds` (900..43200, default 3600), `role_refresh_seconds`,
`sts_endpoint_url` (else `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`, else boto3's).
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from connectors.errors import ConnectorError, CredentialsError
from connectors.secrets import hide, is_secret, reveal, revealed

__all__ = ["ROLE_KEYS", "RoleOptions", "fresh", "generation", "live_options"]

#: the role's settings under their stored names, with the aliases accepted for each
ROLE_KEYS = {
    "role_arn": ("role_arn", "aws_role_arn", "aws_iam_role_arn"),
    "role_session_name": ("role_session_name", "aws_role_session_name",
                          "aws_iam_role_session_name"),
    "role_external_id": ("role_external_id", "external_id", "aws_external_id"),
    "role_duration_seconds": ("role_duration_seconds",),
    "role_refresh_seconds": ("role_refresh_seconds",),
    "sts_endpoint_url": ("sts_endpoint_url", "aws_endpoint_url_sts"),
}
_ALIASES = {alias: key for key, aliases in ROLE_KEYS.items() for alias in aliases}
_STATIC = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")


def _get(options: dict[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    for name in names:
        if lowered.get(name):
            return str(lowered[name])
    return None


class RoleOptions(dict):
    """delta-rs storage options whose credentials are those of an assumed role (see module)."""

    def __init__(self, options: dict[str, Any]):
        role: dict[str, str] = {}
        base: dict[str, str] = {}
        for key, value in options.items():
            stored = _ALIASES.get(str(key).lower())
            if stored is not None:
                role[stored] = str(value)
            else:
                base[str(key)] = str(value)
        super().__init__({k: v for k, v in base.items() if k.lower() not in _STATIC})
        self.update(role)
        self.role_arn = role["role_arn"]
        if not _ARN.match(self.role_arn):
            raise ConnectorError(f"role_arn {self.role_arn!r} is not an IAM role ARN (expected "
                                 f"arn:aws:iam::<12-digit account>:role/<name>)")
        # the base credentials the role is assumed with: Secret, unwrapped by ClientOptions
        self._source = hide({k.lower(): v for k, v in base.items() if k.lower() in _STATIC})
        try:
            self.duration = int(role.get("role_duration_seconds", 3600))
            self.threshold = float(role.get("role_refresh_seconds", 600))
        except ValueError:
            raise ConnectorError(f"role {self.role_arn}: role_duration_seconds and "
                                 f"role_refresh_seconds must be numbers") from None
        if not 900 <= self.duration <= 43200:
            raise ConnectorError(f"role {self.role_arn}: role_duration_seconds must be between "
                                 f"900 and 43200 (STS's limits), not {self.duration}")
        self.generation = 0
        self.expiry: datetime | None = None
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple:
        # never pickle a credential: the other process assumes the role itself
        return (RoleOptions, ({k: v for k, v in self.items() if not is_secret(k)},))

    def __repr__(self) -> str:
        return f"RoleOptions(role_arn={self.role_arn!r}, generation={self.generation})"

    def _client_options(self) -> Any:
        from connectors.aws.client import ClientOptions  # boto3 only where a role is assumed

        endpoint = (self.get("sts_endpoint_url") or _get(self, "aws_endpoint_url")
                    or None)
        region = _get(self, "aws_region", "region", "aws_default_region")
        return ClientOptions.of(
            endpoint_url=endpoint, region_name=region or "us-east-1",
            aws_access_key_id=self._source.get("aws_access_key_id"),
            aws_secret_access_key=self._source.get("aws_secret_access_key"),
            aws_session_token=self._source.get("aws_session_token"), max_attempts=3)

    def needs_refresh(self, now: datetime | None = None) -> bool:
        if self.expiry is None:
            return True
        now = now or datetime.now(UTC)
        return self.expiry - now <= timedelta(seconds=self.threshold)

    def refresh(self) -> RoleOptions:
        """Assume the role if the credentials are missing or near expiry (thread-safe).

        Raises:
            CredentialsError: STS refused (bad role, no base credentials, ...); the message
                names the role, never a secret.
        """
        with self._lock:
            if not self.needs_refresh():
                return self
            from connectors.aws.client import translate_errors

            opts = self._client_options()
            kwargs: dict[str, Any] = {
                "RoleArn": self.role_arn, "DurationSeconds": self.duration,
                "RoleSessionName": self.get("role_session_name") or "volume-stream"}
            if self.get("role_external_id"):
                kwargs["ExternalId"] = self["role_external_id"]
            try:
                with translate_errors("sts", f"assume role {self.role_arn}", opts):
                    creds = opts.client("sts").assume_role(**kwargs)["Credentials"]
            except CredentialsError:
                raise
            except ConnectorError as exc:
                raise CredentialsError(f"cannot assume role {self.role_arn}: {exc}") from exc
            self.update(AWS_ACCESS_KEY_ID=creds["AccessKeyId"],
                        AWS_SECRET_ACCESS_KEY=creds["SecretAccessKey"],
                        AWS_SESSION_TOKEN=creds["SessionToken"])
            expiry = creds["Expiration"]
            self.expiry = expiry if expiry.tzinfo else expiry.replace(tzinfo=UTC)
            self.generation += 1
            return self


_SHARED: dict[tuple, RoleOptions] = {}
_SHARED_LOCK = threading.Lock()


def live_options(options: dict[str, Any] | None) -> dict[str, str]:
    """`options` as storage options: a `RoleOptions` when they name a role, else a plain dict
    of strings. An existing `RoleOptions` is returned as it is; equal role options share one
    `RoleOptions` per process (an executor assumes the role once, not once per file)."""
    if isinstance(options, RoleOptions):
        return options
    options = {str(k): str(reveal(v)) for k, v in (options or {}).items()}
    if any(_ALIASES.get(k.lower()) == "role_arn" for k in options):
        key = tuple(sorted(options.items()))
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = RoleOptions(options)
            return _SHARED[key]
    if any(k.lower() in _ALIASES for k in options):
        extra = sorted(k for k in options if k.lower() in _ALIASES)
        raise ConnectorError(f"storage options {extra} need a role_arn")
    return options


def fresh(options: dict[str, str] | None) -> dict[str, str]:
    """`options` with current credentials (refreshes a `RoleOptions` when needed)."""
    if isinstance(options, RoleOptions):
        options.refresh()
        return options
    return revealed(options)


def generation(options: dict[str, str] | None) -> int:
    """How many times `options`' credentials changed (0 for static options): a holder of an
    open `DeltaTable` reopens it when this moves (the table keeps the options it opened with)."""
    return options.generation if isinstance(options, RoleOptions) else 0
