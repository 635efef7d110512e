"""Warehouse tables and Table Streams on them (issue 14).

- `store`: Delta tables under `<warehouse>/tables/<name>`: DDL, DML through delta-rs (sqlglot
  translates the predicates), change tracking, hidden row identity.
- `changes`: STANDARD / APPEND_ONLY change records of a range, keyed by row id.
- `streams`: a table stream's catalog spec and the records of a pinned range.

Domain layer: imports `volume_stream.errors` and third-party libraries only, never the catalog,
SQL, CLI or daemon.
"""

from volume_stream.tables.store import HIDDEN, ROW_ID, ROW_VERSION, Column, MergeClause, TableStore
from volume_stream.tables.streams import MODES, check_table, new_spec, records_between

__all__ = [
    "HIDDEN",
    "MODES",
    "ROW_ID",
    "ROW_VERSION",
    "Column",
    "MergeClause",
    "TableStore",
    "check_table",
    "new_spec",
    "records_between",
]
