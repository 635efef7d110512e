"""Every error volume-stream raises on purpose, in one tree.

    VolumeStreamError
    ├── NotFoundError            unknown volume / stream / table (names what exists)
    ├── AlreadyExistsError       a name is taken and replace=False
    ├── StaleStreamError         the stream's offset is older than the oldest kept version
    ├── ConsumeConflictError     another consumer moved the offset first
    ├── InvalidInputError        bad argument: mode, name, path, location (also a ValueError)
    ├── SqlError                 a SQL statement failed (line and column of the script)
    │   └── SqlSyntaxError       names line, column and what was expected (also InvalidInputError)
    ├── ConfigError              bad or missing configuration, credentials
    ├── SourceError              a queue, object-store or folder read failed (a connector's
    │   │                        ConnectorError other than CredentialsError, which is ConfigError)
    │   └── InventoryError       an inventory report is malformed, incomplete or fails its
    │                            checksums (connectors.errors.InventoryError); names the object
    ├── ExpiredIteratorError     a shard iterator is expired, forged or not of this change log
    ├── TrimmedDataError         a shard position is older than the change log's retention
    ├── CommitConflictError      another writer committed to the same directory table version
    │                            (directory_table.CommitConflict)
    ├── UnsupportedFeatureError  a Delta table uses a table feature volume-stream cannot read or
    │                            write (turned on by another writer); names table and features
    └── WarehouseError           the warehouse folder is corrupt or not a warehouse (also a
                                 volume's missing directory table: directory_table.TableMissing)

Errors of the layers below (`connectors.errors.ConnectorError`, `directory_table.TableMissing`,
`directory_table.CommitConflict`, `directory_table.protocol.UnsupportedFeature`) and
third-party errors are converted where they cross into
volume-stream's public API, with `raise ... from exc` (the original stays as `__cause__`), so
callers catch these. `converted(what)` is the one place that does it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from connectors.errors import ConnectorError, CredentialsError
from connectors.errors import InventoryError as _ReportError
from directory_table.kept import VersionsGone
from directory_table.protocol import UnsupportedFeature
from directory_table.table import CommitConflict, TableMissing

__all__ = [
    "AlreadyExistsError",
    "CommitConflictError",
    "ConfigError",
    "ConsumeConflictError",
    "ExpiredIteratorError",
    "InvalidInputError",
    "InventoryError",
    "NotFoundError",
    "SourceError",
    "SqlError",
    "SqlSyntaxError",
    "StaleStreamError",
    "TrimmedDataError",
    "UnsupportedFeatureError",
    "VolumeStreamError",
    "WarehouseError",
    "storage_full",
]


class VolumeStreamError(Exception):
    """Base of every volume-stream error.

    An error whose remedy depends on the front door (a Python argument, a CLI flag, a SQL
    clause) keeps the fact and the advice apart: `str(exc)` gives the Python advice,
    `exc.message("cli")` or `exc.message("sql")` the one for that front door.
    """

    fact: str | None = None
    advice: dict[str, str] | None = None

    @classmethod
    def advised(cls, fact: str, *, python: str, cli: str, sql: str) -> VolumeStreamError:
        """An error of this class saying `fact`, with advice for each front door."""
        exc = cls(f"{fact}; {python}")
        exc.fact, exc.advice = fact, {"python": python, "cli": cli, "sql": sql}
        return exc

    def message(self, front: str = "python") -> str:
        """The message with the advice for `front` ("python", "cli" or "sql")."""
        if self.fact and self.advice and front in self.advice:
            return f"{self.fact}; {self.advice[front]}"
        return str(self)


class NotFoundError(VolumeStreamError, LookupError):
    """An object does not exist. The message lists the objects of that kind that do."""

    def __init__(self, kind: str, name: str, existing: Iterable[str] = ()):
        existing = sorted(existing)
        shown = ", ".join(existing) if existing else "none"
        super().__init__(f"{kind} {name!r} does not exist (existing {kind}s: {shown})")
        self.kind, self.name, self.existing = kind, name, existing

    @classmethod
    def orphaned(cls, kind: str, name: str, stream: str, existing: Iterable[str] = ()
                 ) -> NotFoundError:
        """The error of stream `stream` whose `kind` `name` was dropped, or dropped and made
        again (a new one of that name is not the one the stream read)."""
        exc = cls(kind, name, existing)
        exc.args = (f"stream {stream!r}: its {kind} {name!r} was dropped or replaced after the "
                    f"stream was created; recreate the stream (existing {kind}s: "
                    f"{', '.join(exc.existing) or 'none'})",)
        return exc


class AlreadyExistsError(VolumeStreamError):
    def __init__(self, kind: str, name: str):
        self.fact = f"{kind} {name!r} already exists"
        self.advice = {"python": "pass replace=True to replace it",
                       "cli": "add --replace to replace it",
                       "sql": "write CREATE OR REPLACE to replace it, or IF NOT EXISTS to keep "
                              "it"}
        super().__init__(f"{self.fact}; {self.advice['python']}")
        self.kind, self.name = kind, name


class StaleStreamError(VolumeStreamError):
    def __init__(self, stream: str, offset: int, oldest: int):
        super().__init__(
            f"stream {stream!r} is stale: its offset is version {offset} but the oldest kept "
            f"version is {oldest} (older versions were removed by retention or a VACUUM); "
            f"recreate the "
            f"stream (optionally with show_initial_rows=True) to start again"
        )
        self.stream, self.offset, self.oldest = stream, offset, oldest


class ConsumeConflictError(VolumeStreamError):
    def __init__(self, stream: str, expected: int, found: int):
        super().__init__(
            f"stream {stream!r}: another consumer committed first (this batch started at "
            f"offset {expected}, the offset is now {found}); the offset was not moved again"
        )
        self.stream, self.expected, self.found = stream, expected, found


class InvalidInputError(VolumeStreamError, ValueError):
    """A bad argument; the message says what is allowed."""


class ConfigError(VolumeStreamError):
    """Bad or missing configuration or credentials."""


class WarehouseError(VolumeStreamError):
    """The warehouse folder is not a volume-stream warehouse or is damaged."""


class SourceError(VolumeStreamError):
    """A queue or object-store call failed (network, missing bucket or queue, refused call)."""


class InventoryError(SourceError):
    """An inventory report cannot be used: a checksum or size does not match, a data file is
    missing or unreadable, the manifest is malformed or of another bucket. Nothing was
    committed."""


class CommitConflictError(VolumeStreamError):
    """Another writer committed the directory table version this commit was planned on."""


class UnsupportedFeatureError(VolumeStreamError):
    """A Delta table uses table features volume-stream cannot read or write (another writer,
    e.g. a user's Spark, turned them on): `table` and `features` name them. Nothing was read or
    written."""

    def __init__(self, message: str, table: str, features: Iterable[str]):
        super().__init__(message)
        self.table, self.features = table, list(features)


class ExpiredIteratorError(VolumeStreamError):
    """A shard iterator is past its 15 minutes, was not issued by this warehouse (forged or
    altered), or names a change log, stream or shard that is gone."""


class TrimmedDataError(VolumeStreamError):
    """A shard position (sequence number or iterator) is older than the change log keeps."""


class SqlError(VolumeStreamError):
    """A SQL statement failed; `line` and `column` (1-based) say where in the script."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.line, self.column = line, column


class SqlSyntaxError(SqlError, InvalidInputError):
    """The text is not valid SQL here: says line, column, what was expected and what was found.

    `expected` lists what would have been valid; `found` describes the token that was there.
    """

    def __init__(self, message: str, line: int, column: int, *, expected: tuple[str, ...] = (),
                 found: str = "", snippet: str = ""):
        text = f"syntax error at line {line}, column {column}: {message}"
        if snippet:
            text += "\n" + snippet
        super().__init__(text, line, column)
        self.expected, self.found = expected, found


@contextmanager
def converted(what: str) -> Iterator[None]:
    """Convert the lower layers' errors into this tree; `what` names the object ("volume 'x'").

    CredentialsError → ConfigError, any other ConnectorError → SourceError, TableMissing →
    WarehouseError, CommitConflict → CommitConflictError, UnsupportedFeature →
    UnsupportedFeatureError, VersionsGone (files a VACUUM removed) → WarehouseError, any
    other OSError (a local volume's folder gone or unreadable) → SourceError; each keeps the
    original as its cause.
    """
    try:
        yield
    except CredentialsError as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    except _ReportError as exc:
        raise InventoryError(f"{what}: {exc}") from exc
    except ConnectorError as exc:
        raise SourceError(f"{what}: {exc}") from exc
    except TableMissing as exc:
        raise WarehouseError(f"{what}: directory table missing: {exc}") from exc
    except CommitConflict as exc:
        raise CommitConflictError(f"{what}: {exc}") from exc
    except UnsupportedFeature as exc:
        raise UnsupportedFeatureError(f"{what}: {exc}", exc.path, exc.features) from exc
    except VersionsGone as exc:  # a stream says StaleStreamError; other readers say this
        raise WarehouseError(f"{what}: {exc}") from exc
    except OSError as exc:  # a local volume's folder gone or unreadable (or a full disk)
        raise (storage_full(what, exc) or SourceError(f"{what}: {exc}")) from exc
    except Exception as exc:  # delta-rs reports a full disk as DeltaError / Exception
        full = storage_full(what, exc)
        if full is None:
            raise
        raise full from exc


_FULL = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")


def storage_full(what: str, exc: BaseException) -> WarehouseError | None:
    """A WarehouseError in our words when `exc` (or its cause) is a full disk or quota, else
    None. delta-rs says it as "Failed to parse parquet: ... No space left on device (os error
    28)", after a Rust panic line on stderr; a reader should see what to do."""
    seen = exc
    while seen is not None:
        if getattr(seen, "errno", None) in (28, 122) or any(
                k in str(seen).lower() for k in _FULL):
            return WarehouseError(f"{what}: the storage is full (no space left on the device "
                                  f"or over quota); nothing was written; free some space and "
                                  f"run it again")
        seen = seen.__cause__ or seen.__context__
    return None
