"""The one list of what counts as a secret: option, configuration and property names whose
values are credentials, never stored, logged or shown.

    >>> is_secret("aws_secret_access_key"), is_secret("ACCESS_KEY_SECRET"), is_secret("region")
    (True, True, False)
"""

from __future__ import annotations

__all__ = ["SECRET_KEYS", "SECRET_MARKERS", "is_secret"]

#: option / configuration key names (lower case) that hold credentials
SECRET_KEYS = frozenset({
    "access_key_id", "access_key_secret", "aws_access_key_id", "aws_secret_access_key",
    "aws_session_token", "password", "secret", "secret_access_key", "security_token",
    "session_token", "token",
})

#: parts of a name (upper case) that mark it as a credential: environment variables,
#: SQL connection properties, keys of unknown connectors
SECRET_MARKERS = ("SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ACCESS_KEY",
                  "ACCESS_ID")


def is_secret(key: str) -> bool:
    """Whether a key (option, configuration key, property or environment variable name) holds
    a credential: one of `SECRET_KEYS`, or containing one of `SECRET_MARKERS`."""
    name = str(key)
    return name.lower() in SECRET_KEYS or any(m in name.upper() for m in SECRET_MARKERS)
