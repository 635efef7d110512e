"""The SQL front door (DESIGN §8): the seed's DDL for connections, volumes and streams, and Spark
SQL over streams, through `Catalog.sql(text)` and `volume-stream sql`.

A script is split on ';' (strings and `--` / `/* */` comments respected) and every statement
is parsed before any runs (a syntax error anywhere runs nothing); then they run in order, and
the first failure stops it, naming the line and column. DDL (`CREATE STORAGE
CONNECTION`, `CREATE EXTERNAL VOLUME`, `CREATE STREAM ... ON VOLUME`, `ALTER VOLUME ...
REFRESH`, `DROP`, `SHOW`, `DESCRIBE`) runs against the catalog without starting Spark. Every
other statement runs in Spark SQL with each stream it names visible as its pending changes,
pinned at the statement's start: a SELECT never moves an offset; INSERT INTO / INSERT OVERWRITE /
CREATE TABLE ... AS SELECT (and MERGE / UPDATE / DELETE) move the offsets of the streams they
read to the pinned version when they succeed, and not when they fail. Unqualified tables are
Delta tables in the warehouse (`sql.tables`: CREATE / DROP / SHOW / DESCRIBE TABLE, INSERT,
UPDATE, DELETE, MERGE committed by delta-rs), and `CREATE TABLE STREAM s ON TABLE t` streams them.

    cat.register_udf("fc_image_to_text", recognise, "string")
    cat.sql(open("examples/image_recognition.sql").read())
    cat.sql("SELECT * FROM str_dish_images").df.show()     # offsets unchanged

Errors: `SqlSyntaxError` (an `InvalidInputError`) for text that does not parse, with `line`,
`column`, `expected` and `found`; `NotFoundError` names unknown volumes, streams, connections,
tables and functions with what exists; other failures of a statement are `SqlError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from sqlglot import exp

from volume_stream._spark import is_connect
from volume_stream.errors import InvalidInputError, SqlSyntaxError, VolumeStreamError
from volume_stream.sql import ddl, ddl_exec, syntax, tables
from volume_stream.sql.lexer import OP, Statement, split
from volume_stream.sql.result import SqlResult
from volume_stream.sql.statements import CreateStream
from volume_stream.sql.udfs import PENDING as _PENDING
from volume_stream.sql.udfs import UDFS as _UDFS
from volume_stream.tables.expressions import MAX_NESTING

#: the Catalog (volume_stream.catalog) this runs against; only its public methods are used
Catalog = Any

__all__ = ["check_script", "check_statement", "register_udf", "register_udf_lazily", "run_script",
           "run_sql", "run_statement", "statements"]

_UDF_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def statements(text: str) -> list[Statement]:
    """The statements of a script, each with its line and column (nothing is run).

    Example:
        >>> [s.line for s in statements("SHOW VOLUMES;\\nSHOW STREAMS")]
        [1, 2]
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"SQL text must be a string, not {type(text).__name__}")
    return split(text)


def check_statement(catalog: Catalog, statement: Statement, made: set[str] | None = None
                    ) -> Any:
    """Raise the statement's syntax error, running nothing; return what the statement parsed
    to for `run_statement(tree=...)` (our DDL's dataclass, a sqlglot tree, or None where
    only Spark's parser reads it).

    Our DDL is read by our parser. Anything else is read by sqlglot; where sqlglot cannot,
    it is a syntax error while Spark is not running (its verdict is final then: no Spark is
    started to say it) or when the statement names a warehouse table or stream (finding them
    needs sqlglot's tree; `made`: lower-cased names earlier statements of its script create),
    and otherwise Spark's own parser judges (a local session; on Spark Connect, when it
    runs)."""
    parsed = ddl.parse(statement)
    if parsed is not None:
        return parsed
    _check_nesting(statement)
    syntax.check(statement)
    return tables.parse_checked(catalog, statement, made or set())


def check_script(catalog: Catalog, script: list[Statement]) -> list[Any]:
    """`check_statement` of every statement of a script, before any of it runs: a syntax
    error in its tenth statement is reported with nothing run."""
    made: set[str] = set()
    out = []
    for statement in script:
        out.append(check_statement(catalog, statement, made))
        made |= _created(out[-1])
    return out


def _created(parsed: Any) -> set[str]:
    """The lower-cased name of the table or stream a checked statement creates, if any."""
    if isinstance(parsed, CreateStream):
        return {parsed.name.lower()}
    target = parsed.this if isinstance(parsed, exp.Create) else None
    target = target.this if isinstance(target, exp.Schema) else target
    return {target.name.lower()} if isinstance(target, exp.Table) else set()


_UNCHECKED = object()


def run_statement(catalog: Catalog, statement: Statement, *, tree: Any = _UNCHECKED
                  ) -> SqlResult:
    """Run one statement (DDL against the catalog, anything else in Spark SQL). `tree`: what
    `check_statement` returned for it (then it is not checked again).

    Example:
        >>> (first,) = statements("SHOW STREAMS")
        >>> run_statement(cat, first).rows
        []
    """
    if tree is _UNCHECKED:
        tree = check_statement(catalog, statement)
    if not isinstance(tree, exp.Expression | None):
        try:
            return ddl_exec.execute(catalog, tree, statement)
        except VolumeStreamError as exc:
            if exc.advice and "sql" in exc.advice:
                exc.args = (exc.message("sql"),)  # SQL advice for SQL ("CREATE OR REPLACE")
            raise
    if getattr(catalog, "spark_started", True):
        _flush_pending(catalog)
        udfs = set(_UDFS.get(catalog.spark, {}))
    else:  # Spark starts only if the statement parses (dml.run): syntax errors come first
        udfs = {name.lower() for name, _, _ in _PENDING.get(catalog, [])}
    return tables.run(catalog, statement, udfs, before_spark=lambda: _flush_pending(catalog),
                      tree=tree)


def _check_nesting(statement: Statement) -> None:
    """Parentheses nested past MAX_NESTING are a syntax error at the one that goes too deep
    (sqlglot's parser recurses per level and Python's stack ends near a hundred)."""
    depth = 0
    for token in statement.tokens:
        if token.kind == OP and token.text == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise SqlSyntaxError(f"parentheses nest more than {MAX_NESTING} levels deep",
                                     token.line, token.column, found="(",
                                     snippet=statement.snippet(token.pos))
        elif token.kind == OP and token.text == ")":
            depth -= 1


def _flush_pending(catalog: Catalog) -> None:
    for name, fn, return_type in _PENDING.pop(catalog, []):
        register_udf(catalog, name, fn, return_type)


def run_script(catalog: Catalog, text: str) -> Iterator[SqlResult]:
    """Run a script statement by statement, yielding each result as it completes.

    The whole script is split and parsed (`check_script`: a syntax error anywhere in it is
    raised before anything runs); then each statement runs when the iterator reaches it, and
    the first one that fails raises, leaving the later ones unrun.

    Example:
        >>> for result in run_script(cat, "SHOW VOLUMES; SHOW STREAMS"):
        ...     print(result.message)
    """
    script = statements(text)
    for statement, tree in zip(script, check_script(catalog, script), strict=True):
        yield run_statement(catalog, statement, tree=tree)


def run_sql(catalog: Catalog, text: str) -> SqlResult:
    """Run every statement of `text`; return the last statement's result.

    Example:
        >>> cat.sql("CREATE EXTERNAL VOLUME v LOCATION '/data/in'; ALTER VOLUME v REFRESH").message
        'refreshed v: listed 3, +3 ~0 -0 (version 1)'
    """
    results = list(run_script(catalog, text))
    if not results:
        raise InvalidInputError("no SQL statement in the text (only blanks or comments)")
    return results[-1]


def register_udf_lazily(catalog: Catalog, name: str, fn: Callable[..., Any] | Any,
                        return_type: Any = "string") -> None:
    """`register_udf` when the catalog's Spark session starts (at once if it runs already), so
    a script of DDL or with a syntax error never starts Spark for its UDFs.

    Example:
        >>> register_udf_lazily(cat, "shout", lambda s: s.upper() + "!")
    """
    _check_udf(name, fn)
    if getattr(catalog, "spark_started", True):
        register_udf(catalog, name, fn, return_type)
    else:
        _PENDING.setdefault(catalog, []).append((name, fn, return_type))


def _check_udf(name: str, fn: Any) -> None:
    if not isinstance(name, str) or not _UDF_NAME.match(name):
        raise InvalidInputError(f"invalid function name {name!r}: use letters, digits and '_', "
                                f"starting with a letter or '_'")
    if not callable(fn):
        raise InvalidInputError(f"register_udf({name!r}, ...) needs a function, not "
                                f"{type(fn).__name__}")


def _pickle_by_value(fn: Any) -> None:
    import sys

    from pyspark import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is not None and module.__name__ not in ("__main__", "builtins"):
        package = module.__name__.split(".")[0]
        if package not in ("volume_stream", "connectors", "directory_table", "pyspark"):
            cloudpickle.register_pickle_by_value(module)


def register_udf(catalog: Catalog, name: str, fn: Callable[..., Any] | Any,
                 return_type: Any = "string") -> None:
    """Make a Python function callable from `catalog.sql(...)` as `name(...)`.

    `return_type` is a Spark type (a DDL string such as "string", "double",
    "struct<label:string,score:double>", or a `DataType`). A call written with a schema, e.g.
    the seed's `public.fc_image_to_text(...)`, reaches the same function. The function runs on
    Spark executors, so it must be picklable and must not use the driver's objects.

    Example:
        >>> cat.register_udf("fc_image_to_text", lambda task, url: "noodles", "string")
        >>> cat.sql("SELECT fc_image_to_text('dish', 'file:///a.jpg') AS r").rows
        [{'r': 'noodles'}]
    """
    _check_udf(name, fn)
    spark = catalog.spark
    if is_connect(spark):  # the server may not have the function's module: ship its code
        _pickle_by_value(fn)
    from pyspark.errors import PySparkException

    try:
        if hasattr(fn, "evalType") and hasattr(fn, "returnType"):  # already a Spark UDF
            spark.udf.register(name, fn)
        else:
            spark.udf.register(name, fn, return_type)
    except PySparkException as exc:
        raise InvalidInputError(f"cannot register {name!r} with return type {return_type!r}: "
                                f"{str(exc).strip().splitlines()[0]}") from exc
    _UDFS.setdefault(spark, {})[name.lower()] = name
