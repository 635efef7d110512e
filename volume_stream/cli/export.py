"""The `volume-stream export` command: DataX-style export of a volume's change log
(`volume_stream.shards.export`).

    volume-stream export landing --start-ms A --end-ms B --out /exports/landing \\
        [--format parquet|csv|delta] [--status-table T] [--export-sequence-info]
        [--max-retries 30] [--engine threads|spark] [--safety-lag-ms 5000]
    volume-stream export landing --date 20261123 --out /exports/landing
    volume-stream export --job job.json            # a DataX OTSStream Reader job file

Prints one JSON line of totals; exit 0 on success, 1 on an error (no traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from volume_stream.cli._common import Warehouse, catalog
from volume_stream.errors import InvalidInputError
from volume_stream.shards.datax import job_options
from volume_stream.shards.export import SAFETY_LAG_MS

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the `export` command to the `volume-stream` app."""

    @app.command("export")
    def export(
        name: Annotated[str | None, typer.Argument(
            help="The volume, or a SQL table with change tracking on.")] = None,
        start_ms: Annotated[int | None, typer.Option(help="Range start (ms, included).")] = None,
        end_ms: Annotated[int | None, typer.Option(help="Range end (ms, excluded).")] = None,
        date: Annotated[str | None, typer.Option(help="A UTC day, yyyyMMdd.")] = None,
        out: Annotated[str | None, typer.Option(
            help="Output folder, or Delta table (a folder or s3://...) with --format delta.")
                       ] = None,
        format: Annotated[str, typer.Option(help="parquet, csv or delta.")] = "parquet",
        status_table: Annotated[str | None, typer.Option(
            help="Record progress per shard here; a re-run resumes.")] = None,
        export_sequence_info: Annotated[bool, typer.Option(
            help="Add the sequence_info column.")] = False,
        max_retries: Annotated[int, typer.Option(help="Retries of storage errors.")] = 30,
        engine: Annotated[str, typer.Option(
            help="threads, or spark (one task per shard).")] = "threads",
        safety_lag_ms: Annotated[int, typer.Option(
            help="How long ago (ms) the range must have ended.")] = SAFETY_LAG_MS,
        job: Annotated[Path | None, typer.Option(help="A DataX job file (JSON).")] = None,
        warehouse: Warehouse = None,
    ) -> None:
        """Export the changes committed in a time range, one row per column version."""
        options: dict[str, Any]
        if job is not None:
            if name or out or start_ms is not None or end_ms is not None or date:
                raise InvalidInputError("--job takes its volume, range and output from the "
                                        "job file; give no other arguments")
            name, options = job_options(job)
            options["engine"] = engine
            options.setdefault("safety_lag_ms", safety_lag_ms)
        else:
            if not name or out is None:
                raise InvalidInputError("give the volume and --out (or --job job.json)")
            options = {"out": out, "start_ms": start_ms, "end_ms": end_ms, "date": date,
                       "format": format, "status_table": status_table,
                       "export_sequence_info": export_sequence_info, "max_retries": max_retries,
                       "engine": engine, "safety_lag_ms": safety_lag_ms}
        result = catalog(warehouse).export_changes(name, **options)
        print(json.dumps(result.as_dict()))
