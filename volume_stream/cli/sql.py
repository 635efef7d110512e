"""`volume-stream sql`: run SQL against a warehouse from the command line.

    volume-stream sql -e "SHOW VOLUMES"
    volume-stream sql examples/image_recognition.sql --udf fc_image_to_text=my_udfs:recognise
    volume-stream sql < script.sql
    volume-stream sql                     # an interactive prompt when stdin is a terminal

Statements run one by one and each result is printed as it completes (a table, or JSON lines
with --json). A script is parsed whole first (a syntax error anywhere runs none of it), then
stops at its first error, which is printed with its line and column, and the command exits
with status 1; the interactive prompt reports the error and carries on.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from volume_stream._spark import remote_url
from volume_stream.cli._common import (
    Interrupted,
    Warehouse,
    discard_new_warehouses,
    err,
    out,
    print_rows,
    was_interrupted,
)
from volume_stream.cli._common import catalog as open_catalog
from volume_stream.errors import InvalidInputError, SqlError, VolumeStreamError
from volume_stream.sql import check_script, register_udf_lazily, run_statement, statements
from volume_stream.sql.dml import summary
from volume_stream.sql.lexer import QUOTED, WORD, Statement, is_complete
from volume_stream.sql.result import counted

__all__ = ["load_udf", "register", "repl", "run_text"]

SQL_HELP = """\
volume-stream SQL: end each statement with ';' (exit or quit leaves the prompt).

  CREATE [OR REPLACE] EXTERNAL VOLUME v LOCATION 's3://bucket/prefix/' [NOTIFICATION = (...)]
  CREATE STORAGE CONNECTION c TYPE OSS ENDPOINT = '...' ...;  SHOW CONNECTIONS
  ALTER VOLUME v REFRESH;  SHOW VOLUMES;  SHOW VOLUME DIRECTORY v;  DESCRIBE VOLUME v
  CREATE STREAM s ON VOLUME v [WITH PROPERTIES ('TABLE_STREAM_MODE' = 'APPEND_ONLY')]
  SHOW STREAMS;  DESCRIBE STREAM s;  DROP STREAM s
  CREATE TABLE t (col type, ...) | AS SELECT ...;  SHOW TABLES;  DESCRIBE TABLE t
  CREATE TABLE STREAM ts ON TABLE t
  SELECT ... FROM s                 a stream's pending changes (its offset does not move)
  INSERT INTO t SELECT ... FROM s   reads the stream and moves its offset when it commits
  UPDATE t SET ... WHERE ...;  DELETE FROM t WHERE ...;  MERGE INTO t USING ... ON ...

Any other Spark SQL runs in Spark (started on first need).\
"""
PROMPT, MORE = "volume-stream> ", "            -> "
BANNER = ("volume-stream SQL: end statements with ';'; help lists what runs here; Ctrl-C "
          "clears a statement; exit, quit or Ctrl-D leaves.")
_ADDED_FOLDERS: set[str] = set()  # put on sys.path by load_udf: their modules go by value


def load_udf(spec: str, search: Sequence[Path] = ()) -> tuple[str, Any, str]:
    """Parse `NAME=module:function[:return_type]` into (name, function, return_type).

    The module is imported as Python would, with the current folder and the `search` folders
    (the SQL file's) added to the path, so `my_udfs.py` beside you or beside the script loads
    without PYTHONPATH. A module found in one of those folders is shipped to Spark's workers
    by value (they need not find it on their own path).

    Example:
        >>> load_udf("fc_image_to_text=my_udfs:recognise:string")[0]
        'fc_image_to_text'
    """
    name, sep, target = spec.partition("=")
    parts = target.split(":")
    if not sep or len(parts) not in (2, 3) or not all(parts[:2]):
        raise InvalidInputError(f"--udf {spec!r}: write NAME=module:function[:return_type]")
    folders = list(dict.fromkeys(str(Path(f).resolve()) for f in (Path.cwd(), *search)))
    for folder in folders:
        if folder not in sys.path:
            sys.path.append(folder)  # after site-packages: never shadows an installed module
            _ADDED_FOLDERS.add(folder)
    try:
        module = importlib.import_module(parts[0])
        fn = getattr(module, parts[1])
    except (ImportError, AttributeError) as exc:
        raise InvalidInputError(f"--udf {spec!r}: cannot load {parts[0]}:{parts[1]} ({exc}; "
                                f"looked also in {', '.join(folders)})") from exc
    source = getattr(module, "__file__", None)
    if source and any(Path(source).resolve().is_relative_to(f) for f in _ADDED_FOLDERS):
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[parts[0].split(".")[0]])
    return name.strip(), fn, parts[2] if len(parts) == 3 else "string"


def _print(result: Any, as_json: bool, limit: int) -> None:

    message = result.message
    if result.is_query:
        try:  # Spark computes a query here: a runtime error is the statement's, in one line
            rows = [r.asDict(recursive=True) for r in result.df.limit(limit + 1).collect()]
        except VolumeStreamError:
            raise
        except Exception as exc:
            raise SqlError(f"statement at line {result.line} failed: "
                           f"{summary(str(exc), type(exc).__name__)}", result.line, 1) from exc
        print_rows(rows[:limit], as_json, None)
        more = len(rows) > limit
        message += f" ({'first ' if more else ''}{counted(min(len(rows), limit), 'rows')} shown)"
    elif result.rows:
        print_rows(result.rows, as_json, None)
    # with --json, stdout carries JSON lines only
    (err if as_json else out).print(message, markup=False, highlight=False, soft_wrap=True)


def run_text(catalog, text: str, *, as_json: bool = False, limit: int = 1000) -> None:
    """Run a script, printing each statement's result; raises the first error.

    Example:
        >>> run_text(cat, "SHOW VOLUMES; SHOW STREAMS", as_json=True)
    """

    script = [(s, [t.upper for t in s.tokens] == ["HELP"]) for s in statements(text)]
    trees = check_script(catalog, [s for s, is_help in script if not is_help])  # runs nothing
    for statement, is_help in script:
        if is_help:
            out.print(SQL_HELP, markup=False, highlight=False)
            continue
        with _offsets_on_interrupt(catalog, statement):
            _print(run_statement(catalog, statement, tree=trees.pop(0)), as_json, limit)


_MOVES_OFFSETS = {"INSERT", "CREATE", "MERGE", "UPDATE", "DELETE"}
#: first words of statements that only read (they never create the warehouse)
_READS = {"SHOW", "SELECT", "DESCRIBE", "DESC", "EXPLAIN", "VALUES", "TABLE", "HELP"}


@contextmanager
def _offsets_on_interrupt(catalog, statement: Statement) -> Iterator[None]:
    """Turn Ctrl-C into `Interrupted`, saying what became of the offsets of the streams a
    writing statement reads ("interrupted; offset of stream s unchanged")."""
    before: dict[str, int] = {}
    if statement.keyword in _MOVES_OFFSETS:
        streams = {s["name"].lower(): s for s in catalog.list_streams()}
        for token in statement.tokens:
            if token.kind in (WORD, QUOTED) and token.value.lower() in streams:
                stream = streams[token.value.lower()]
                before[stream["name"]] = stream["offset"]
    try:
        yield
    except (KeyboardInterrupt, Exception) as exc:
        if was_interrupted(exc):
            raise Interrupted(_interrupted_note(catalog, before)) from None
        raise


def _interrupted_note(catalog, before: dict[str, int]) -> str:
    if not before:
        return "interrupted"
    try:
        after = {s["name"]: s["offset"] for s in catalog.list_streams()}
    except (VolumeStreamError, KeyboardInterrupt):
        return "interrupted"
    same = sorted(n for n, offset in before.items() if after.get(n) == offset)
    notes = []
    if same:
        notes.append(f"offset of stream {same[0]} unchanged" if len(same) == 1 else
                     f"offsets of streams {', '.join(same)} unchanged")
    notes += [f"stream {n} offset moved to {after.get(n)} (the statement had committed)"
              for n in sorted(set(before) - set(same))]
    return "; ".join(["interrupted", *notes])


def _report(exc: VolumeStreamError) -> None:

    err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)


def repl(catalog, read_line: Callable[[str], str], *, as_json: bool = False,
         limit: int = 1000) -> int:
    """The interactive loop: read lines until a statement ends with ';', run it, repeat.

    `read_line(prompt)` returns the next line or raises EOFError (as `input` does). `exit`,
    `quit` or the end of input leave; Ctrl-C (KeyboardInterrupt while reading) clears the
    statement being typed. Returns the number of statements that failed.

    Example:
        >>> repl(cat, input)          # what `volume-stream sql` does on a terminal
    """

    failures, buffer = 0, ""
    err.print(BANNER, highlight=False)
    while True:
        try:
            line = read_line(MORE if buffer.strip() else PROMPT)
        except EOFError:
            break
        except KeyboardInterrupt:  # Ctrl-C clears what is being typed, as in psql
            err.print("\n(cleared; exit, quit or Ctrl-D leaves)" if buffer.strip() else
                      "\n(exit, quit or Ctrl-D leaves)", highlight=False)
            buffer = ""
            continue
        if not buffer.strip() and line.strip().rstrip(";").lower() in ("exit", "quit", "\\q"):
            return failures
        buffer += line + "\n"
        if not is_complete(buffer):
            continue
        text, buffer = buffer, ""
        try:
            run_text(catalog, text, as_json=as_json, limit=limit)
        except VolumeStreamError as exc:
            failures += 1
            _report(exc)
    if buffer.strip():  # a last statement without ';'
        try:
            run_text(catalog, buffer, as_json=as_json, limit=limit)
        except VolumeStreamError as exc:
            failures += 1
            _report(exc)
    return failures


def register(app: typer.Typer) -> None:
    """Add the `sql` command to the `volume-stream` app.

    Example:
        >>> register(app)       # done by volume_stream.cli at import
    """

    @app.command("sql")
    def sql(
        file: Annotated[Path | None, typer.Argument(
            help="A SQL script to run ('-' for stdin).", show_default=False)] = None,
        execute: Annotated[str | None, typer.Option(
            "--execute", "-e", help="SQL text to run.", show_default=False)] = None,
        udf: Annotated[list[str] | None, typer.Option(
            "--udf", help="Register a Python UDF: NAME=module:function[:return_type].",
            show_default=False)] = None,
        limit: Annotated[int, typer.Option(help="Print at most this many rows per query.")
                         ] = 1000,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines.")] = False,
        warehouse: Warehouse = None,
        remote: Annotated[str | None, typer.Option(
            "--remote", help="Use a running Spark Connect server, e.g. a daemon's warm Spark: "
                             "sc://HOST:PORT [default: $VOLUME_STREAM_SPARK_REMOTE]",
            show_default=False)] = None,
        connect_timeout: Annotated[float | None, typer.Option(
            "--connect-timeout", help="Seconds to wait for the --remote server [default: 10, "
                                      "or $VOLUME_STREAM_CONNECT_TIMEOUT]",
            show_default=False)] = None,
        verbose: Annotated[bool, typer.Option(
            "--verbose", "-v", help="Let Spark's own log lines through.")] = False,
    ) -> None:
        """Run SQL: -e TEXT, a FILE, stdin, or an interactive prompt.

        Spark starts only for a statement that needs it (DDL and syntax errors never do);
        with --remote, statements run on that Spark Connect server instead.
        """

        if file is not None and execute is not None:
            raise typer.BadParameter("give a FILE or -e TEXT, not both")
        if verbose:
            os.environ["VOLUME_STREAM_VERBOSE"] = "1"
        if connect_timeout is not None:
            if connect_timeout <= 0:
                raise typer.BadParameter("--connect-timeout must be more than 0 seconds")
            os.environ["VOLUME_STREAM_CONNECT_TIMEOUT"] = str(connect_timeout)
        try:
            text: str | None = None
            if execute is not None:
                text = execute
            elif file is not None and str(file) != "-":
                try:
                    text = file.read_text()
                except OSError as exc:
                    raise InvalidInputError(f"cannot read {file}: {exc.strerror}") from exc
            elif file is None and sys.stdin.isatty():
                text = None  # the prompt
            else:
                text = sys.stdin.read()
            # a script that may create things creates the warehouse; one that only reads
            # (SHOW, SELECT, DESCRIBE...) needs one: a mistyped --warehouse is an error
            create = text is None or not all(s.keyword in _READS for s in statements(text))
            catalog = open_catalog(warehouse, create=create, remote=remote_url(remote))
            for spec in udf or []:
                name, fn, return_type = load_udf(
                    spec, [file.parent] if file is not None and str(file) != "-" else [])
                register_udf_lazily(catalog, name, fn, return_type)
            if text is None:
                failures = repl(catalog, input, as_json=as_json, limit=limit)
                discard_new_warehouses()  # a prompt that made nothing leaves no warehouse
                raise typer.Exit(1 if failures else 0)
            run_text(catalog, text, as_json=as_json, limit=limit)
        except VolumeStreamError as exc:
            _report(exc)
            raise typer.Exit(1) from None
