"""Errors the connectors raise on purpose, in one tree.

    ConnectorError                  a queue or object store call failed (SDK error converted)
    ├── MalformedMessageError       a queue message is not an event we understand (ValueError)
    ├── CredentialsError            no usable credentials; the message names what was tried
    └── ObjectNotFoundError         the object is gone (FileNotFoundError)

botocore / boto3 exceptions are converted at the connector edge with `raise ... from exc`, so
callers catch these and still see the SDK error as `__cause__`. Messages never contain secrets.
"""

from __future__ import annotations

__all__ = [
    "ConnectorError",
    "CredentialsError",
    "MalformedMessageError",
    "ObjectNotFoundError",
]


class ConnectorError(Exception):
    """Base of every connector error."""


class MalformedMessageError(ConnectorError, ValueError):
    """A queue message that cannot be parsed; it is left on the queue for its dead-letter policy."""


class CredentialsError(ConnectorError):
    """No usable cloud credentials were found, or the service rejected them."""


class ObjectNotFoundError(ConnectorError, FileNotFoundError):
    """The object does not exist (any more): deleted between the event and the read."""
