"""Where an export may write (`export_changes(out=...)`): never inside the warehouse, and an
object-store URI only for a Delta table (parquet and csv exports are local files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from volume_stream.errors import InvalidInputError

__all__ = ["checked_out"]


def checked_out(catalog: Any, out: str | os.PathLike, fmt: str) -> str:
    """`out` as text, refused when it is inside the warehouse (an export would become part of
    what it exports, and retention or a drop would delete it) or an object-store URI for a
    format written as local files (parquet, csv: only delta tables go to a URI)."""
    text = os.fspath(out)
    scheme = urlparse(text).scheme
    remote = len(scheme) > 1 and scheme != "file"
    if remote and fmt != "delta":
        raise InvalidInputError(f"out {text!r}: {fmt} exports are written as files in a local "
                                f"folder; export to an object store with format 'delta', or "
                                f"give a local folder")
    warehouse = str(catalog.warehouse.uri).rstrip("/")
    if remote:
        target = text.rstrip("/")
    else:
        target = str(Path(text.removeprefix("file://")).resolve())
        warehouse = str(Path(warehouse.removeprefix("file://")).resolve()) \
            if catalog.warehouse.location.is_local else warehouse
    if target == warehouse or target.startswith(warehouse + "/"):
        raise InvalidInputError(f"out {text!r} is inside the warehouse {catalog.warehouse.uri}; "
                                f"export to a folder outside it")
    return text
