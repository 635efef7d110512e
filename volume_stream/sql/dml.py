"""Spark SQL over streams (DESIGN §8): every statement that is not our DDL runs in Spark, with
each stream it names visible as a view of its pending changes, pinned when the statement starts.

sqlglot (Spark dialect) finds the unqualified table references that name streams (CTE names and
write targets excluded). Each is replaced, by position in the original text, with a fresh temp
view `__vs_<random>_<stream>` aliased back to the name as written, so the rest of the statement
reaches Spark exactly as typed, two statements never share a view, and a user's own views are
never touched. Only names the catalog holds (validated identifiers) and names generated here are
ever spliced in, so no name can inject SQL.

A SELECT (or any read) pins with `read_stream` and never moves an offset. INSERT INTO / INSERT
OVERWRITE / CREATE TABLE AS SELECT / MERGE / UPDATE / DELETE that read streams pin with
`catalog.consume`, so each stream's offset moves to the pinned version only when Spark has run
the statement, and stays where it was when it fails. Two adaptations keep the seed's statements
running as written: a bare `VARCHAR` (no length) becomes `STRING`, and a schema-qualified call
of a registered Python UDF (`public.fc_image_to_text(...)`) drops its qualifier.

    run(catalog, statement, udfs={"fc_image_to_text"})  # -> SqlResult
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from volume_stream._spark import is_connect
from volume_stream.errors import (
    InvalidInputError,
    NotFoundError,
    SqlError,
    SqlSyntaxError,
    VolumeStreamError,
)
from volume_stream.sql.lexer import QUOTED, WORD, Statement, position
from volume_stream.sql.result import SqlResult
from volume_stream.sql.udfs import registered_udfs

__all__ = ["VIEW_PREFIX", "Analysis", "analyze", "run", "summary"]

_SPARK = Dialect.get_or_raise("spark")
_WRITES = (exp.Insert, exp.Merge, exp.Update, exp.Delete)
_READS = (exp.Select, exp.SetOperation, exp.Subquery, exp.Describe, exp.Values)
_NO_TABLES = (exp.Use, exp.Set, exp.Command)
#: the start of the temp views made here and in `sql.tables` (never a user's name)
VIEW_PREFIX = "__vs_"
_LINE_POS = re.compile(r"\(line (\d+), pos (\d+)\)")


@dataclass
class Analysis:
    """What a statement does with streams, and the edits that make it runnable in Spark."""

    kind: str                                  # "read" | "write" | "other"
    label: str                                 # "SELECT", "INSERT", "CREATE TABLE", ...
    streams: dict[str, str] = field(default_factory=dict)   # stream name -> its view
    edits: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, new text)
    tables: dict[str, str] = field(default_factory=dict)    # warehouse table -> its view

    def text(self, original: str) -> str:
        out, last = [], 0
        for start, end, new in sorted(self.edits):
            out += [original[last:start], new]
            last = end
        return "".join(out) + original[last:]

    def original_offset(self, offset: int) -> int:
        """Map an offset in the rewritten text back to the statement as written."""
        shift = 0
        for start, end, new in sorted(self.edits):
            if offset < start + shift:
                break
            if offset < start + shift + len(new):
                return start
            shift += len(new) - (end - start)
        return offset - shift


@contextmanager
def _quiet_sqlglot():
    # sqlglot warns on stderr when it falls back to an opaque Command; that is expected here
    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _token_edits(text: str, udfs: set[str]) -> list[tuple[int, int, str]]:
    try:
        tokens = _SPARK.tokenize(text)
    except sqlglot.errors.TokenError:
        return []
    edits = []
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.token_type == TokenType.VARCHAR and (nxt is None
                                                    or nxt.token_type != TokenType.L_PAREN):
            edits.append((tok.start, tok.end + 1, "STRING"))
        elif (tok.token_type in (TokenType.VAR, TokenType.IDENTIFIER) and i + 3 < len(tokens)
              and tokens[i + 1].token_type == TokenType.DOT
              and tokens[i + 2].text.lower() in udfs
              and tokens[i + 3].token_type == TokenType.L_PAREN
              and (i == 0 or tokens[i - 1].token_type != TokenType.DOT)):
            edits.append((tok.start, tokens[i + 2].start, ""))
    return edits


def _label(tree: exp.Expression) -> str:
    if isinstance(tree, exp.Insert):
        return "INSERT OVERWRITE" if tree.args.get("overwrite") else "INSERT"
    if isinstance(tree, exp.Create):
        return f"CREATE {tree.args.get('kind') or ''}".strip()
    if isinstance(tree, exp.Command):
        return str(tree.this).upper()
    if isinstance(tree, exp.SetOperation | exp.Subquery):
        return "SELECT"
    return type(tree).__name__.upper()


def _targets(tree: exp.Expression) -> set[int]:
    target = tree.this if isinstance(tree, _WRITES + (exp.Create,)) else None
    if isinstance(target, exp.Schema):
        target = target.this
    return {id(target)} if isinstance(target, exp.Table) else set()


def _token_scan(statement: Statement, streams: dict[str, str]) -> list[str]:
    return sorted({streams[t.value.lower()] for t in statement.tokens
                   if t.kind in (WORD, QUOTED) and t.value.lower() in streams})


def analyze(statement: Statement, streams: dict[str, str], udfs: set[str],
            spark_parse: Callable[[str], None] | None = None,
            tables: dict[str, str] | None = None) -> Analysis:
    """Find the streams a statement reads and the edits it needs.

    `streams` maps lower-cased stream names to their stored names; `udfs` holds lower-cased
    names of registered Python UDFs. `spark_parse`, when given, is asked to parse a statement
    sqlglot could not, so a syntax error is reported by Spark with its line and column.
    `tables` maps lower-cased warehouse table names to the temp views that hold their rows
    (`sql.tables`): each reference is edited to read its view, as a stream's is.
    """
    tables = tables or {}
    text = statement.text
    edits = _token_edits(text, udfs)
    try:
        with _quiet_sqlglot():
            tree = sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        named = _token_scan(statement, streams)
        if spark_parse is None:  # no Spark to ask (not started yet): sqlglot's word is final
            raise syntax_error(statement, exc) from exc
        spark_parse(Analysis("other", statement.keyword, edits=edits).text(text))
        if named:
            raise InvalidInputError(
                f"statement at line {statement.line} names streams {named} but could not be "
                f"analysed to find where it reads them ({str(exc).splitlines()[0]}); rewrite it "
                f"in plain Spark SQL") from exc
        return Analysis("other", statement.keyword, edits=edits)  # Spark reports its errors
    label = _label(tree)
    if isinstance(tree, _NO_TABLES):
        if isinstance(tree, exp.Command) and _token_scan(statement, streams):
            if spark_parse is not None:  # a misspelled statement is a syntax error first
                spark_parse(Analysis("other", statement.keyword, edits=edits).text(text))
            raise InvalidInputError(f"a {label} statement cannot read streams (line "
                                    f"{statement.line}); read them in a SELECT or INSERT")
        return Analysis("other", label, edits=edits)
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    targets = _targets(tree)
    found: dict[str, str] = {}
    found_tables: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        ident = table.this
        if (not isinstance(ident, exp.Identifier) or table.args.get("db")
                or table.args.get("catalog")):
            continue
        name = streams.get(ident.name.lower())
        if ident.name.lower() in ctes:
            continue
        if name is None:
            view = tables.get(ident.name.lower())
            if view is not None and id(table) not in targets:
                start, end = ident.meta["start"], ident.meta["end"] + 1
                plain = table.alias or isinstance(tree, exp.Describe)
                edits.append((start, end, f"`{view}`" if plain else
                              f"`{view}` AS `{ident.name}`"))
                found_tables[ident.name] = view
            continue
        if id(table) in targets:
            raise InvalidInputError(f"{name!r} is a stream and streams are read-only (line "
                                    f"{statement.line}); to write a table of that name, qualify "
                                    f"it (database.{ident.name})")
        view = found.setdefault(name, f"{VIEW_PREFIX}{secrets.token_hex(4)}_{name}")
        start, end = ident.meta["start"], ident.meta["end"] + 1
        plain = table.alias or isinstance(tree, exp.Describe)
        edits.append((start, end, f"`{view}`" if plain else f"`{view}` AS `{ident.name}`"))
    if isinstance(tree, _WRITES) or (isinstance(tree, exp.Create)
                                     and str(tree.args.get("kind")).upper() == "TABLE"
                                     and tree.args.get("expression") is not None):
        kind = "write"
    elif isinstance(tree, _READS):
        kind = "read"
    else:
        kind = "other"
        if found:
            raise InvalidInputError(
                f"a {label} statement cannot read streams (line {statement.line}): a view or "
                f"cache over a stream would outlive the statement's pinned range; read the "
                f"stream in a SELECT, INSERT or CREATE TABLE ... AS SELECT")
    return Analysis(kind, label, found, edits, found_tables)


# ---------------------------------------------------------------------- errors
def syntax_error(statement: Statement, exc: Exception) -> SqlSyntaxError:
    """sqlglot's parse error as a `SqlSyntaxError` located in the script (no Spark needed)."""
    errors = getattr(exc, "errors", None) or [{}]
    first = errors[0]
    line, col = first.get("line"), first.get("col")
    offset = statement.pos
    if line and col:
        lines = statement.text.split("\n")
        line = min(line, len(lines))
        # sqlglot's col is where the offending token ends; point at its start
        highlight = first.get("highlight") or ""
        col0 = max(0, min(col, len(lines[line - 1])) - len(highlight))
        offset += sum(len(x) + 1 for x in lines[:line - 1]) + col0
    description = first.get("description") or str(exc).splitlines()[0]
    found = first.get("highlight") or ""
    message = description + (f" near {found!r}" if found else "")
    line_no, column = position(statement.script, offset)
    return SqlSyntaxError(message, line_no, column, found=found,
                          snippet=statement.snippet(offset))


def _script_offset(statement: Statement, analysis: Analysis, line: int, col0: int) -> int:
    """Offset in the script of (line, 0-based column) of the text that was sent to Spark."""
    sent = analysis.text(statement.text)
    offset = sum(len(x) + 1 for x in sent.split("\n")[:max(0, line - 1)]) + col0
    return statement.pos + analysis.original_offset(min(offset, len(sent)))


def _clean(message: str, analysis: Analysis) -> str:
    for name, view in [*analysis.streams.items(), *analysis.tables.items()]:
        message = message.replace(f"`{view}`", f"`{name}`").replace(view, name)
    return message


_PY_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit): .+")


def summary(message: str, fallback: str) -> str:
    """The line that says what went wrong: a Python UDF's own exception if there is one (Spark
    wraps it in a traceback and JVM frames), else Spark's first line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    python = [line for line in lines if _PY_ERROR.match(line)
              and not line.startswith(("org.", "java.", "py4j.", "scala."))]
    if python and "Traceback" in message:
        return python[-1] + " (raised in a Python UDF)"
    return lines[0] if lines else fallback


def _convert(exc: Exception, catalog, statement: Statement, analysis: Analysis) -> Exception:
    from pyspark.errors import AnalysisException, ParseException

    message = _clean(str(exc).strip(), analysis)
    first = summary(message, type(exc).__name__)
    if isinstance(exc, ParseException):
        match = _LINE_POS.search(message)
        offset = (statement.pos if not match else
                  _script_offset(statement, analysis, int(match.group(1)), int(match.group(2))))
        line, col = position(statement.script, offset)
        first = _LINE_POS.sub("", first).strip()
        return SqlSyntaxError(first, line, col, snippet=statement.snippet(offset))
    if isinstance(exc, AnalysisException):
        condition = exc.getCondition() or ""
        params = exc.getMessageParameters() or {}
        if condition == "TABLE_OR_VIEW_NOT_FOUND":
            name = params.get("relationName", "?").replace("`", "")
            tables = [t.name for t in catalog.spark.catalog.listTables()
                      if not t.name.startswith(VIEW_PREFIX)] + catalog.tables.names()
            streams = [f"{s['name']} (stream)" for s in catalog.list_streams()]
            return NotFoundError("table", name, tables + streams)
        if condition == "UNRESOLVED_ROUTINE":
            name = params.get("routineName", "?").replace("`", "")
            err = NotFoundError("function", name, registered_udfs(catalog.spark))
            err.args = (f"{err}; register a Python function with "
                        f"catalog.register_udf(name, fn, return_type)",)
            return err
        context = exc.getQueryContext()
        if context:
            offset = statement.pos + analysis.original_offset(max(0, context[0].startIndex()))
            line, col = position(statement.script, offset)
            return SqlError(f"line {line}, column {col}: {first}", line, col)
        return SqlError(f"statement at line {statement.line}: {first}", statement.line,
                        statement.column)
    return SqlError(f"statement at line {statement.line} failed: {first}", statement.line,
                    statement.column)


# ---------------------------------------------------------------------- running
def _sql(catalog, statement: Statement, analysis: Analysis, materialize: bool = False):
    try:
        spark = catalog.spark
        df = spark.sql(analysis.text(statement.text))
        if is_connect(spark):
            # Spark Connect analyses a query lazily, by name, at each use: resolve it now (so
            # its errors are ours) and, if it reads stream or table views, compute it while
            # they exist
            if df.columns and (analysis.streams or materialize):
                df = df.localCheckpoint(eager=True)
        return df
    except VolumeStreamError:
        raise
    except Exception as exc:  # Spark's errors become ours, located in the script
        raise _convert(exc, catalog, statement, analysis) from exc


def _spark_parser(catalog, statement: Statement, edits: list) -> Callable[[str], None] | None:
    """Spark's own parser (authoritative) once a local session runs; None before that, or on
    Spark Connect (no parse-only call there): then sqlglot's verdict stands, and a syntax error
    is reported without starting Spark."""
    if not getattr(catalog, "spark_started", True):
        return None
    if is_connect(catalog.spark):
        return lambda text: None  # Spark reports it when the statement runs

    def parse(text: str) -> None:
        try:
            # parse only (nothing is analysed or run): the session's own SQL parser
            catalog.spark._jsparkSession.sessionState().sqlParser().parsePlan(text)
        except Exception as exc:
            from pyspark.errors import ParseException

            if isinstance(exc, ParseException):
                raise _convert(exc, catalog, statement, Analysis("other", "", edits=edits)
                               ) from exc
    return parse


def run(catalog, statement: Statement, udfs: set[str], *,
        write: Callable[[object], str] | None = None, label: str | None = None,
        before_spark: Callable[[], None] | None = None, materialize: bool = False,
        tables: dict[str, str] | None = None) -> SqlResult:
    """Run one Spark SQL statement with its streams pinned; move offsets only on success.

    With `write` (a query feeding a warehouse-table write, `volume_stream.sql.tables`), the
    streams are consumed and `write(df)` runs inside the pins: the offsets move only when the
    write has committed. It returns what it did, for the result's message.

    The statement is analysed (and a syntax error reported) before Spark is asked for;
    `before_spark` runs just before (the CLI registers its deferred UDFs there).
    `materialize`: the statement reads temp views its caller drops when this returns (warehouse
    tables, `tables`: lower-cased name -> view): on Spark Connect, which resolves names at
    each use, the result is computed now.
    """
    streams = {s["name"].lower(): s["name"] for s in catalog.list_streams()}
    analysis = analyze(statement, streams, udfs,
                       _spark_parser(catalog, statement, _token_edits(statement.text, udfs)),
                       tables)
    if write is not None:
        analysis.kind, analysis.label = "write", label or analysis.label
    result = SqlResult(analysis.label, text=statement.text, line=statement.line)
    written = None
    if before_spark is not None:
        before_spark()
    spark = catalog.spark
    views = analysis.streams
    try:
        with ExitStack() as pins:
            for name in sorted(views):
                if analysis.kind == "write":
                    batch = pins.enter_context(catalog.consume(name))
                    batch.df.createOrReplaceTempView(views[name])
                    result.offsets[name] = {"start": batch.start_version,
                                            "end": batch.end_version,
                                            "batch_id": batch.batch_id,
                                            "records": batch.records.num_rows}
                else:
                    catalog.read_stream(name).createOrReplaceTempView(views[name])
            df = _sql(catalog, statement, analysis, materialize)
            if write is not None:
                written = _write(catalog, statement, analysis, write, df)
            # leaving the ExitStack commits the offsets (in reverse order of pinning)
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)
    if df.columns and write is None:
        result._df, result._query = df, True
    else:
        result._rows = []
    result.message = _message(analysis, result)
    if written and not result.offsets:
        result.message = f"{analysis.label}: {written}"
    return result


def _write(catalog, statement: Statement, analysis: Analysis, write: Callable, df) -> str:
    try:
        return write(df)
    except VolumeStreamError:
        raise
    except Exception as exc:  # Spark runs the query lazily, inside the write
        raise _convert(exc, catalog, statement, analysis) from exc


def _message(analysis: Analysis, result: SqlResult) -> str:
    if result.offsets:
        moved = "; ".join(
            f"stream {n}: offset {o['start']} -> {o['end']} ({o['records']} records, batch "
            f"{o['batch_id']})" if o["end"] != o["start"] or o["records"] else
            f"stream {n}: nothing pending" for n, o in sorted(result.offsets.items()))
        return f"{analysis.label}: ok; {moved}"
    if analysis.streams:
        return f"{analysis.label}: read {', '.join(sorted(analysis.streams))} (offsets unchanged)"
    return f"{analysis.label}: ok"

