"""The warehouse folder and its catalog table (DESIGN §3)."""

from volume_stream.warehouse.store import (
    MARKER,
    NAME_PATTERN,
    NAME_RULE,
    STREAM,
    VOLUME,
    CatalogState,
    Warehouse,
    check_name,
    entry,
    now,
)

__all__ = ["MARKER", "NAME_PATTERN", "NAME_RULE", "STREAM", "VOLUME", "CatalogState", "Warehouse", "check_name", "entry",
           "now"]
