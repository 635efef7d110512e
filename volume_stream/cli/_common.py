"""What every command shares: consoles, the --warehouse/--json options, the catalog, tables."""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand

from volume_stream._spark import interrupted as spark_interrupted
from volume_stream.catalog import Catalog, connect
from volume_stream.config.settings import Settings
from volume_stream.warehouse.location import Location
from volume_stream.warehouse.store import MARKER

__all__ = ["INTERRUPTED", "UsageCommand", "usage_names", "AsJson", "Interrupted", "quiet_py4j_interrupts", "was_interrupted", "Warehouse", "catalog", "err", "has_warehouse", "out", "print_rows",
           "stop_on_sigterm"]

# No emoji codes anywhere (`acs:ram::1234` is a role ARN, not a sheep); table cells are Text,
# so data is never read as markup either.
out = Console(width=None if sys.stdout.isatty() else 240, emoji=False)
err = Console(stderr=True, emoji=False)

#: the exit code of a command stopped by Ctrl-C (SIGINT), as shells report it
INTERRUPTED = 130


class Interrupted(BaseException):  # noqa: N818 - not an error: what the user asked for
    """A command stopped by Ctrl-C; the message is the one line `main` prints ("interrupted;
    offset of stream s unchanged"), and the process exits 130. A BaseException, as
    KeyboardInterrupt is, so no `except Exception` on the way out takes it for a failure."""


def was_interrupted(exc: BaseException | None) -> bool:
    """Whether `exc` is Ctrl-C's doing: a KeyboardInterrupt, one in its chain, or any error
    once SIGINT has cancelled the Spark jobs (a cancelled job's error replaces the interrupt)."""
    if exc is not None and spark_interrupted():
        return True
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _Py4jInterrupts(logging.Filter):
    """Drop py4j's records of a Ctrl-C: it logs every KeyboardInterrupt that lands in a JVM call
    as an error with its traceback (and errors of closing the connection the interrupt broke)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        from_py4j = record.name.startswith("py4j") or "py4j" in record.pathname
        return not (from_py4j and was_interrupted(exc))


_PY4J_LOGGERS = ("", "py4j", "py4j.clientserver", "py4j.java_gateway")


def quiet_py4j_interrupts() -> None:
    """Keep py4j's tracebacks of a Ctrl-C off the terminal (the CLI says "interrupted").

    py4j logs on the root logger (`logging.exception`) and on its own loggers; the filter sits
    on each, since a logger's filters see only the records made on it, never those propagated
    from its children."""
    for name in _PY4J_LOGGERS:
        log = logging.getLogger(name)
        if not any(isinstance(f, _Py4jInterrupts) for f in log.filters):
            log.addFilter(_Py4jInterrupts())


Warehouse = Annotated[str | None, typer.Option(
    "--warehouse", "-w", help="Warehouse folder or URI, e.g. s3://bucket/wh (default: "
                              "./warehouse, or $VOLUME_STREAM_WAREHOUSE)")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table.")]


def catalog(warehouse: str | Path | None, *, create: bool = False,
            remote: str | None = None) -> Catalog:
    """The catalog of `--warehouse` (default: $VOLUME_STREAM_WAREHOUSE, else ./warehouse),
    with $VOLUME_STREAM_STORAGE_OPTIONS (JSON) as its storage options.

    Only commands that create something pass `create=True`; the others get a WarehouseError
    saying there is no warehouse there, and nothing is created.
    """
    settings = Settings()
    where = warehouse or settings.warehouse
    if create:
        note_new_warehouse(where)
    return connect(where, storage_options=settings.storage_options, create=create,
                   remote=remote)


#: local warehouse folders this command is about to create (removed again if it fails)
_NEW_WAREHOUSES: list[Path] = []
_FRESH = {MARKER, "_catalog"}


def note_new_warehouse(where: str | Path) -> None:
    """Remember `where` if it is a local folder with no warehouse yet: a command that then
    fails before writing anything leaves nothing behind (`discard_new_warehouses`)."""
    location = Location.parse(where)
    if location.is_local and not location.exists(MARKER):
        path = Path(location.uri)
        if not path.exists() or not any(path.iterdir()):
            _NEW_WAREHOUSES.append(path)


def discard_new_warehouses() -> None:
    """Remove the warehouses this failed command created, if they are still as created: the
    marker and a catalog table at its first version (no volume, stream or table was made)."""
    for path in _NEW_WAREHOUSES:
        log_dir = path / "_catalog" / "_delta_log"
        try:
            names = {p.name for p in path.iterdir()}
            commits = [p for p in log_dir.iterdir() if p.suffix == ".json"]
        except OSError:
            continue
        if names <= _FRESH and len(commits) <= 1:
            shutil.rmtree(path, ignore_errors=True)
    _NEW_WAREHOUSES.clear()


def has_warehouse(warehouse: str | Path | None) -> bool:
    """Whether `--warehouse` (or its default) holds a warehouse (nothing is created)."""
    settings = Settings()
    return Location.parse(warehouse or settings.warehouse, settings.storage_options).exists(MARKER)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM stops the process as Ctrl-C does (KeyboardInterrupt, which
    the watch loop turns into a clean stop with its summary)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _jsonable(value: Any) -> Any:
    """Timestamps print one way in every command: ISO 8601 in UTC with its offset (delta-rs
    hands out naive UTC times, the catalog aware ones; both meant UTC)."""
    if isinstance(value, datetime):
        aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return aware.isoformat()
    return value


def print_rows(rows: list[dict[str, Any]], as_json: bool, title: str | None = None) -> None:
    if as_json:
        for row in rows:
            print(json.dumps({k: _jsonable(v) for k, v in row.items()}, ensure_ascii=False))
        return
    if not rows:
        out.print(f"[dim]no {title or 'rows'}[/dim]")
        return
    table = Table(title=Text(title) if title else None)
    for col in rows[0]:
        table.add_column(Text(col))
    for row in rows:
        table.add_row(*(Text("" if v is None else str(_jsonable(v))) for v in row.values()))
    out.print(table)


_BRACED = re.compile(r"^\{([^{}]+)\}((?:\.\.\.)?)$|^\[([a-z][a-z0-9_]*)\]((?:\.\.\.)?)$")


class UsageCommand(TyperCommand):
    """A command whose usage line names its arguments as click and man pages do (`NAME`,
    `[NAME]`): typer 0.29 writes a required one as `{name}`."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        def named(piece: str) -> str:
            m = _BRACED.match(piece)
            if m is None:
                return piece
            if m.group(1) is not None:
                return m.group(1).upper().replace("-", "_") + m.group(2)
            return f"[{m.group(3).upper()}]{m.group(4)}"

        return [named(p) for p in super().collect_usage_pieces(ctx)]


def usage_names(app: typer.Typer) -> None:
    """Give every command of `app` and its sub-apps `UsageCommand`'s usage line."""
    for info in app.registered_commands:
        if info.cls is None or info.cls is TyperCommand:
            info.cls = UsageCommand
    for group in app.registered_groups:
        if group.typer_instance is not None:
            usage_names(group.typer_instance)


def key_values(text: str, flag: str) -> dict[str, Any]:
    """`a=1,b=x` as {"a": 1, "b": "x"}: true/false and numbers typed as TOML would type them.

    Raises:
        InvalidInputError: a pair without '=', or a secret's name (credentials come from the
            environment, never from a command line other users can see).
    """
    from connectors.secrets import is_secret
    from volume_stream.errors import InvalidInputError

    pairs: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidInputError(f"{flag} takes KEY=VALUE pairs separated by ',', not "
                                    f"{part.split('=')[0]!r}...")
        if is_secret(key):
            raise InvalidInputError(f"{flag} {key}: credentials come from the environment "
                                    "(e.g. AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS, "
                                    "AZURE_STORAGE_CONNECTION_STRING), never from the command "
                                    "line")
        pairs[key] = _typed(value.strip())
    return pairs


def _typed(value: str) -> Any:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value
