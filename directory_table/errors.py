"""The directory table's own errors (converted to `VolumeStreamError`s by `volume_stream`), and
which storage errors of delta-rs and pyarrow are transient.

delta-rs (object_store) and pyarrow's S3 filesystem raise a plain `OSError` (a `DeltaError`, or
an `ArrowInvalid` from a change data feed's stream)
whose message carries the HTTP outcome; `storage_transient` tells a retry-worthy one (5xx,
SlowDown / throttling, a reset or timed-out connection, a cut-off body) from the rest, and is
registered with `connectors.errors.register_transient`, so `is_transient` knows them.

    >>> storage_transient(OSError("Generic S3 error: ... Server returned non-2xx status code"
    ...                           ": 503 Service Unavailable: <Code>SlowDown</Code>"))
    True
"""

from __future__ import annotations

import re

import pyarrow as pa
from deltalake.exceptions import DeltaError

from connectors.errors import register_transient

__all__ = ["CommitConflict", "TableMissing", "storage_transient"]


class TableMissing(FileNotFoundError):
    """No directory table at the given path."""


class CommitConflict(RuntimeError):
    """Another writer kept winning the race for the next version."""


_TRANSIENT = re.compile(
    r"non-2xx status code\W+5\d\d|\b(500 Internal Server Error|502 Bad Gateway|"
    r"503 Service Unavailable|504 Gateway Timeout)\b|<Code>(SlowDown|InternalError|"
    r"ServiceUnavailable|RequestTimeout)</Code>|AWS Error (SLOW_DOWN|INTERNAL_FAILURE|"
    r"SERVICE_UNAVAILABLE|NETWORK_CONNECTION|THROTTLING)|HTTP (response code|status):? 5\d\d|"
    r"error sending request|connection (reset|closed|refused|aborted)|broken pipe|"
    r"timed out|error decoding response body|unexpected end of file|incomplete message|"
    r"curl error", re.IGNORECASE)


def storage_transient(exc: BaseException) -> bool:
    """Whether a delta-rs / pyarrow storage error is worth retrying."""
    if isinstance(exc, FileNotFoundError | PermissionError | TableMissing):
        return False
    return (isinstance(exc, OSError | DeltaError | pa.ArrowException)
            and bool(_TRANSIENT.search(str(exc))))


register_transient(storage_transient)
