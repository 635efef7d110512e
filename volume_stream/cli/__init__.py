"""The `volume-stream` command line (`main`), and `python -m volume_stream.cli`.

    app      the typer root: volume, stream, watch commands; `main`
    _common  consoles, shared options, the catalog of --warehouse
    run      `run SPEC` (pipeline jobs)       jobs  the job spec, run_job, spark-submit entry
    daemon   `daemon`, `config check`         sql   `sql` (script, -e, REPL)

`main` answers `volume-stream --version` before importing the commands (pyarrow, Spark's
Python side, delta-rs), which is most of a command's start-up; `app` is loaded on first use.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["app", "main"]


def main() -> None:
    """The `volume-stream` command (see `volume_stream.cli.app.main`)."""
    if sys.argv[1:] == ["--version"]:  # (importlib.metadata alone would cost ~0.1 s)
        from volume_stream import __version__

        print(f"volume-stream {__version__}", flush=True)
        raise SystemExit(0)
    from volume_stream.cli.app import main as run

    run()


class _Cli(types.ModuleType):
    """This package, whose `app` is the typer root of `volume_stream.cli.app`, loaded on first
    use. (Importing that submodule binds the name `app` of this package to the module; the
    setter ignores it, so `from volume_stream.cli import app` is always the typer root.)"""

    @property
    def app(self) -> Any:
        from volume_stream.cli.app import app

        return app

    @app.setter
    def app(self, value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Cli
