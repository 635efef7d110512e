"""The versioned directory table: one row per file of a volume, a Delta table with Change Data
Feed, committed with delta-rs (DESIGN §2–§4)."""

from directory_table.batch import Batch
from directory_table.layout import DEFAULT_BUCKETS, Layout
from directory_table.maintenance import OptimizeResult
from directory_table.planner import Plan, plan_changes
from directory_table.schema import PUBLIC_COLUMNS, TABLE_SCHEMA
from directory_table.table import ApplyResult, CommitConflict, DirectoryTable, TableMissing

__all__ = [
    "DEFAULT_BUCKETS",
    "Layout",
    "OptimizeResult",
    "PUBLIC_COLUMNS",
    "TABLE_SCHEMA",
    "ApplyResult",
    "Batch",
    "CommitConflict",
    "DirectoryTable",
    "Plan",
    "TableMissing",
    "plan_changes",
]
