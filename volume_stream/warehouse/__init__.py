"""The warehouse folder and its catalog table (DESIGN §3)."""

from volume_stream.warehouse.store import (
    MARKER,
    STREAM,
    VOLUME,
    CatalogState,
    Warehouse,
    check_name,
    entry,
    now,
)

__all__ = ["MARKER", "STREAM", "VOLUME", "CatalogState", "Warehouse", "check_name", "entry", "now"]
