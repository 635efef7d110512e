"""What every command shares: consoles, the --warehouse/--json options, the catalog, tables."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from volume_stream.catalog import Catalog, connect
from volume_stream.config.settings import Settings

__all__ = ["AsJson", "Warehouse", "catalog", "err", "out", "print_rows"]

out = Console(width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True)

Warehouse = Annotated[str | None, typer.Option(
    "--warehouse", "-w", help="Warehouse folder or URI, e.g. s3://bucket/wh (default: "
                              "./warehouse, or $VOLUME_STREAM_WAREHOUSE)")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table.")]


def catalog(warehouse: str | Path | None) -> Catalog:
    """The catalog of `--warehouse` (default: $VOLUME_STREAM_WAREHOUSE, else ./warehouse),
    with $VOLUME_STREAM_STORAGE_OPTIONS (JSON) as its storage options."""
    settings = Settings()
    return connect(warehouse or settings.warehouse, storage_options=settings.storage_options)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_rows(rows: list[dict[str, Any]], as_json: bool, title: str | None = None) -> None:
    if as_json:
        for row in rows:
            print(json.dumps({k: _jsonable(v) for k, v in row.items()}, ensure_ascii=False))
        return
    if not rows:
        out.print(f"[dim]no {title or 'rows'}[/dim]")
        return
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(_jsonable(v)) for v in row.values()))
    out.print(table)
