"""The one list of what counts as a secret: option, configuration and property names whose
values are credentials, never stored, logged or shown.

    >>> is_secret("aws_secret_access_key"), is_secret("ACCESS_KEY_SECRET"), is_secret("region")
    (True, True, False)

Values of secret names are held as `Secret` (a pydantic `SecretStr`) wherever they are kept:
`repr`, `str` and f-strings show `**********`, and a pickled `Secret` comes back as None (the
other process takes credentials from its own environment or role). `reveal` unwraps one at
the SDK call edge only.

    >>> opts = hide({"aws_secret_access_key": "s3cr3t", "region": "eu"})
    >>> opts, reveal(opts["aws_secret_access_key"])
    ({'aws_secret_access_key': Secret('**********'), 'region': 'eu'}, 's3cr3t')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

__all__ = ["SECRET_KEYS", "SECRET_MARKERS", "Secret", "hide", "is_secret", "reveal", "revealed"]

#: option / configuration key names (lower case) that hold credentials
SECRET_KEYS = frozenset({
    "access_key_id", "access_key_secret", "aws_access_key_id", "aws_secret_access_key",
    "aws_session_token", "password", "secret", "secret_access_key", "security_token",
    "session_token", "token", "account_key", "connection_string", "sas_token",
})

#: parts of a name (upper case) that mark it as a credential: environment variables,
#: SQL connection properties, keys of unknown connectors
SECRET_MARKERS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY",
                  "ACCESS_ID", "ACCOUNT_KEY", "STORAGE_KEY", "SAS_KEY", "CONNECTION_STRING")


def is_secret(key: str) -> bool:
    """Whether a key (option, configuration key, property or environment variable name) holds
    a credential: one of `SECRET_KEYS`, or containing one of `SECRET_MARKERS`."""
    name = str(key)
    return name.lower() in SECRET_KEYS or any(m in name.upper() for m in SECRET_MARKERS)


def _absent() -> None:
    return None


class Secret(SecretStr):
    """A credential in memory: masked when shown, never pickled (unpickles as None)."""

    def __reduce__(self) -> tuple:
        return (_absent, ())

    def __deepcopy__(self, memo: dict) -> Secret:
        return self

    def __copy__(self) -> Secret:
        return self


def hide(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`options` with the values of secret names (`is_secret`) held as `Secret`."""
    return {k: (Secret(v) if is_secret(k) and isinstance(v, str) else v)
            for k, v in (options or {}).items()}


def reveal(value: Any) -> Any:
    """The plain value of a `Secret` (at the SDK call edge); anything else as it is."""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def revealed(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`options` with every `Secret` unwrapped: only for handing to an SDK."""
    return {k: reveal(v) for k, v in (options or {}).items()}
