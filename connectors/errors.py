"""Errors the connectors raise on purpose, in one tree, and the one "is this transient" rule.

    ConnectorError                  a queue or object store call failed (SDK error converted)
    ├── TransientError              it failed in a way worth retrying (throttling, 5xx, network)
    ├── ListenerClosedError         a listener was used after `close()` (every provider alike)
    ├── MalformedMessageError       a queue message is not an event we understand (ValueError)
    ├── CredentialsError            no usable credentials; the message names what was tried
    ├── ObjectNotFoundError         the object is gone (FileNotFoundError)
    ├── ObjectChangedError          the object changed while it was being read
    └── InvalidPathError            a relative path that must never enter a table (ValueError)

SDK exceptions are converted at the connector edge with `raise ... from exc`, so callers catch
these and still see the SDK error as `__cause__`. Messages never contain secrets.

`is_transient(exc)` is the single retry rule of every provider: a `TransientError`, a builtin
`ConnectionError`/`TimeoutError`, or an SDK error that a provider's classifier (registered with
`register_transient`) calls transient; a converted error is judged by its `__cause__`.

    >>> is_transient(TransientError("throttled")), is_transient(ValueError("no"))
    (True, False)
"""

from __future__ import annotations

import errno
from collections.abc import Callable

__all__ = [
    "ConnectorError",
    "CredentialsError",
    "InvalidPathError",
    "InventoryError",
    "ListenerClosedError",
    "MalformedMessageError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "TransientError",
    "is_transient",
    "register_transient",
]


class ConnectorError(Exception):
    """Base of every connector error."""


class TransientError(ConnectorError):
    """A call failed in a way worth retrying (throttling, server trouble, a dropped link)."""


class ListenerClosedError(ConnectorError):
    """A listener was asked to receive after `close()`; the message names the listener."""


class MalformedMessageError(ConnectorError, ValueError):
    """A queue message that cannot be parsed; it is left on the queue for its dead-letter policy."""


class CredentialsError(ConnectorError):
    """No usable cloud credentials were found, or the service rejected them."""


class ObjectNotFoundError(ConnectorError, FileNotFoundError):
    """The object does not exist (any more): deleted between the event and the read."""


class ObjectChangedError(ConnectorError):
    """The object was replaced while a read resumed (its ETag no longer matches)."""


class InventoryError(ConnectorError):
    """An inventory report (S3 Inventory, OSS inventory) is malformed, incomplete, or does not
    match its checksums; the message names the object."""


class InvalidPathError(ConnectorError, ValueError):
    """A relative path that must never enter a directory table ('..', leading '/', NUL...)."""


_CLASSIFIERS: list[Callable[[BaseException], bool]] = []
#: OS-level failures of a mount or a socket that a retry can outlive (NFS, FUSE, resets)
_TRANSIENT_ERRNOS = frozenset({
    errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
    errno.ECONNREFUSED, errno.EPIPE, errno.ESTALE, errno.EBUSY, errno.EINTR,
    errno.EHOSTUNREACH, errno.ENETUNREACH,
})


#: never worth a retry, whatever caused them
_PERMANENT = (ObjectNotFoundError, CredentialsError, MalformedMessageError, InvalidPathError,
              FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def register_transient(classifier: Callable[[BaseException], bool]) -> None:
    """Teach `is_transient` a provider's SDK errors (called once when the provider loads)."""
    if classifier not in _CLASSIFIERS:
        _CLASSIFIERS.append(classifier)


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying with backoff, whichever provider raised them.

    Example:
        >>> is_transient(ConnectorError("x")), is_transient(TimeoutError())
        (False, True)
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if isinstance(current, _PERMANENT):
            return False
        if isinstance(current, TransientError | ConnectionError | TimeoutError):
            return True
        if isinstance(current, OSError) and current.errno in _TRANSIENT_ERRNOS:
            return True
        if any(classify(current) for classify in _CLASSIFIERS):
            return True
        # follow what caused it: a wrapper (a UDF's own error, an SDK's) of a reset is a reset
        current = current.__cause__ or current.__context__
    return False
