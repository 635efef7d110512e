"""The `volume-stream run PIPELINE_SPEC` command: one incremental pipeline job (see
`volume_stream.jobs`), for cron, Airflow or a Kubernetes CronJob.

    volume-stream run examples/pipelines/image_metadata.toml --warehouse ./warehouse --refresh

Exit codes: 0 success; 1 failure (bad spec, unknown stream, Spark or Delta error; the offset
did not move past anything uncommitted); 3 with `--fail-on-file-errors` when files went to the
errors table.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from volume_stream.catalog import connect
from volume_stream.cli._common import Interrupted, err, out, was_interrupted
from volume_stream.cli.jobs import PipelineSpec, job_warehouse, load_spec, run_job
from volume_stream.config.settings import Settings
from volume_stream.errors import VolumeStreamError
from volume_stream.sql.result import counted

__all__ = ["register"]


def _offset(job: PipelineSpec, warehouse: str | None) -> int | None:
    """The job's stream offset now (None: no warehouse or stream yet, or it cannot be read)."""
    try:
        cat = connect(job_warehouse(job, warehouse), create=False,
                      storage_options=Settings().storage_options)
        return cat.describe_stream(job.stream)["offset"]
    except (VolumeStreamError, OSError):
        return None


def _interrupted_note(job: PipelineSpec, warehouse: str | None, before: int | None) -> str:
    """What a Ctrl-C left of the stream's offset, in the one line the CLI prints."""
    if before is None:
        return "interrupted"
    try:
        after = _offset(job, warehouse)
    except KeyboardInterrupt:
        return "interrupted"
    if after == before:
        return f"interrupted; offset of stream {job.stream} unchanged"
    if after is None:
        return "interrupted"
    return (f"interrupted; stream {job.stream} offset moved {before} -> {after} by the batches "
            f"that finished; the interrupted batch was not committed")


def register(app: typer.Typer) -> None:
    """Add the `run` command to the `volume-stream` app.

    Example:
        >>> app = typer.Typer()
        >>> register(app)  # `app run SPEC ...` now exists
    """

    @app.command("run")
    def run(
        spec: Annotated[Path, typer.Argument(help="Pipeline spec file (.toml or .json).")],
        warehouse: Annotated[str | None, typer.Option(
            "--warehouse", "-w", help="Warehouse folder (default: the spec's, "
                                      "$VOLUME_STREAM_WAREHOUSE or ./warehouse)")] = None,
        refresh: Annotated[bool | None, typer.Option(
            help="Refresh the volume before the batch (default: the spec's)")] = None,
        drain: Annotated[bool | None, typer.Option(
            help="Drain the volume's queue before the batch (default: the spec's)")] = None,
        until_empty: Annotated[bool | None, typer.Option(
            help="Run batches until the stream has nothing pending (default: the spec's)")
                               ] = None,
        fail_on_file_errors: Annotated[bool | None, typer.Option(
            help="Exit 3 if any file went to the errors table (default: the spec's)")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json/--text", help="One JSON line of metrics per batch, or a sentence.")] = True,
        verbose: Annotated[bool, typer.Option(
            "--verbose", "-v", help="Let Spark's own log lines through.")] = False,
    ) -> None:
        """Run a pipeline job: optional refresh/drain, then one batch (or until empty).

        Prints one JSON line of metrics per batch (a run with nothing pending prints one with
        files_seen 0). Spark starts only when the batch has files to process: a run with
        nothing pending exits without it.
        """
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
        if verbose:
            os.environ["VOLUME_STREAM_VERBOSE"] = "1"
        try:
            job = load_spec(spec)
            flags = {"refresh": refresh, "drain": drain, "until_empty": until_empty,
                     "fail_on_file_errors": fail_on_file_errors}
            job = job.model_copy(update={k: v for k, v in flags.items() if v is not None})
            before = _offset(job, warehouse)
            try:
                # no session yet: the catalog starts one (VOLUME_STREAM_SPARK_MASTER, else
                # local[*]) only if the batch has files to process
                result = run_job(job, warehouse=warehouse)
            except (KeyboardInterrupt, Exception) as exc:
                if was_interrupted(exc):
                    raise Interrupted(_interrupted_note(job, warehouse, before)) from None
                raise
        except VolumeStreamError as exc:
            err.print(f"[red]error:[/red] {escape(exc.message('cli'))}", soft_wrap=True,
                      highlight=False)
            raise typer.Exit(1) from exc
        except Exception as exc:  # Spark, Delta, I/O: the offset did not move; say why
            logging.getLogger("volume_stream.jobs").exception("pipeline job failed")
            err.print(f"[red]error:[/red] pipeline job failed: {type(exc).__name__}: "
                      f"{escape(str(exc))}", soft_wrap=True, highlight=False)
            raise typer.Exit(1) from exc
        for m in result.batches:
            if as_json:
                print(json.dumps(m.as_dict()), flush=True)
            else:
                out.print(f"batch {m.batch_id} of {m.stream} (versions {m.start_version}.."
                          f"{m.end_version}): {m.files_seen} files, {m.files_ok} ok, "
                          f"{m.files_failed} failed, {m.rows_written} rows written, "
                          f"{m.rows_deleted} deleted, {m.resumed_files} resumed, "
                          f"{m.seconds:.1f}s -> {m.target}")
        if result.exit_code:
            err.print(f"{counted(result.files_failed, 'files')} failed; see the errors table")
            raise typer.Exit(result.exit_code)
