"""The `volume-stream` command line (`main`), and `python -m volume_stream.cli`.

    app      the typer root: volume, stream, watch commands; `main`
    _common  consoles, shared options, the catalog of --warehouse
    run      `run SPEC` (pipeline jobs)       jobs  the job spec, run_job, spark-submit entry
    daemon   `daemon`, `config check`         sql   `sql` (script, -e, REPL)
"""

from volume_stream.cli.app import app, main

__all__ = ["app", "main"]
