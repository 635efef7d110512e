"""SQL over warehouse tables (issue 14): `CREATE TABLE [IF NOT EXISTS] | [OR REPLACE] ... (cols) |
AS SELECT`, `DROP TABLE`, `SHOW TABLES`, `DESCRIBE [TABLE]`, `INSERT INTO | OVERWRITE ... VALUES |
SELECT`, `UPDATE`, `DELETE`, `MERGE INTO ... USING ... WHEN [NOT] MATCHED [AND c] THEN ...` on
Delta tables under `<warehouse>/tables/` (`volume_stream.tables`), and SELECT over them in Spark.

An unqualified table name is a warehouse table; `db.name` stays Spark's own. Queries run in Spark
with each warehouse table they name read from a temp view of its current files (read as
Parquet: Spark never needs `format("delta")` nor a metastore), named `__vs_<random>_<table>`
and spliced in by `sql.dml` as streams are, so a user's temp view of the same name is never
touched. Writes are committed by delta-rs:
the query feeding an INSERT / CTAS / MERGE runs through `sql.dml.run(write=...)`, so streams it
reads are consumed and their offsets move only when the delta-rs commit succeeded; UPDATE and
DELETE are translated (sqlglot) and run by delta-rs without Spark.

    run(catalog, statement, udfs)   # -> SqlResult, for any statement that is not our DDL
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlglot
from sqlglot import exp

from volume_stream.errors import InvalidInputError, NotFoundError, SqlError, VolumeStreamError
from volume_stream.sql import dml as _sql_dml
from volume_stream.sql import syntax
from volume_stream.sql.lexer import QUOTED, STRING, WORD, Statement, split
from volume_stream.sql.result import SqlResult
from volume_stream.sql.udfs import UDFS
from volume_stream.tables import Column, MergeClause, TableStore
from volume_stream.tables.functions import UnsupportedFunction

__all__ = ["parse_checked", "run"]


def _parse(text: str) -> exp.Expression | None:
    try:
        with _sql_dml._quiet_sqlglot():
            return sqlglot.parse_one(text, read="spark")
    except sqlglot.errors.SqlglotError:
        return None


def _plain_table(node: Any) -> exp.Table | None:
    if isinstance(node, exp.Schema):
        node = node.this
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier) \
            and not node.args.get("db") and not node.args.get("catalog"):
        return node
    return None


def _lookup(store: TableStore, name: str) -> str | None:
    """The stored spelling of a warehouse table name (names are case-insensitive)."""
    names = {n.lower(): n for n in store.names()}
    return names.get(name.lower())


def _streams(catalog) -> dict[str, str]:
    return {s["name"].lower(): s["name"] for s in catalog.list_streams()}


def _result(statement: Statement, label: str, message: str, rows: list | None = None,
            columns: list[str] | None = None) -> SqlResult:
    return SqlResult(label, text=statement.text, line=statement.line, message=message,
                     columns=columns or [], _rows=rows or [])


def _sub(statement: Statement, node: exp.Expression) -> Statement:
    """A statement of its own for a query inside `statement` (the source of a write)."""
    text = node.sql(dialect="spark")
    if isinstance(node, exp.Values):
        text = f"SELECT * FROM {text}"
    (sub,) = split(text)
    return dataclasses.replace(sub, line=statement.line, column=statement.column)


# ---------------------------------------------------------------------- views
def _view(catalog, store: TableStore, name: str) -> Any:
    """The table's current rows as a DataFrame. A local table's Parquet files are read by
    Spark; on an object store delta-rs reads the snapshot and hands Arrow to Spark, as the
    stream reader does (Spark has no hadoop-aws to read s3:// itself)."""
    spark = catalog.spark
    schema = store.schema(name)
    if not store.location.is_local or store.registration(name):
        return spark.createDataFrame(store.snapshot(name))
    files = store.file_uris(name)
    if not files:
        return spark.createDataFrame(schema.empty_table())
    return spark.read.parquet(*files).select(*[f"`{c}`" for c in schema.names])


@contextmanager
def _table_views(catalog, tree: exp.Expression | None) -> Iterator[dict[str, str]]:
    """Each warehouse table the statement reads as a temp view of a name of its own while it
    runs ({lower-case name as written: view}; `sql.dml` edits the statement to read them). A
    view named as the table would replace, then drop, a temp view of the user's of that name."""
    store: TableStore = catalog.tables
    names = set()
    if tree is not None:
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        streams = _streams(catalog)
        for table in tree.find_all(exp.Table):
            plain = _plain_table(table)
            if plain is None or plain.name.lower() in ctes or plain.name.lower() in streams:
                continue
            stored = _lookup(store, plain.name)
            if stored is not None:
                names.add((plain.name.lower(), stored))
    made: dict[str, str] = {}
    try:
        for written, stored in sorted(names):
            view = f"{_sql_dml.VIEW_PREFIX}{secrets.token_hex(4)}_{stored}"
            _view(catalog, store, stored).createOrReplaceTempView(view)
            made[written] = view
        yield made
    finally:
        for view in made.values():
            catalog.spark.catalog.dropTempView(view)


def _query(catalog, statement: Statement, udfs: set[str], node: exp.Expression, label: str,
           write) -> SqlResult:
    sub = _sub(statement, node)
    with _table_views(catalog, _parse(sub.text)) as views:
        result = _sql_dml.run(catalog, sub, udfs, write=write, label=label, tables=views)
    result.text, result.line = statement.text, statement.line
    return result


# ---------------------------------------------------------------------- statements
def _columns(schema: exp.Schema) -> tuple[list[Column], list[str]]:
    """The columns and the declared key (`PRIMARY KEY (a, b)`, or `a INT PRIMARY KEY`)."""
    out, key = [], []
    for col in schema.expressions:
        if isinstance(col, exp.PrimaryKey):
            if key:
                raise InvalidInputError("a table has one PRIMARY KEY, not two")
            key = [e.name for e in col.expressions]
            continue
        if not isinstance(col, exp.ColumnDef):
            raise InvalidInputError(f"unsupported table element {col.sql(dialect='spark')!r}")
        comment = None
        for constraint in col.args.get("constraints") or []:
            if isinstance(constraint.kind, exp.CommentColumnConstraint):
                comment = constraint.kind.this.name
            elif isinstance(constraint.kind, exp.PrimaryKeyColumnConstraint):
                if key:
                    raise InvalidInputError("a table has one PRIMARY KEY, not two")
                key = [col.name]
        kind = col.args.get("kind")
        out.append(Column(col.name, kind.sql(dialect="spark") if kind else "", comment))
    return out, key


def _location(statement: Statement) -> str:
    """The string after LOCATION, as our lexer reads it: `'/data/it''s/t'` is `/data/it's/t`
    (Spark's parser, and sqlglot's, read adjacent literals as one: `/data/its/t`)."""
    tokens = statement.tokens
    for i, token in enumerate(tokens[:-1]):
        if token.upper == "LOCATION" and tokens[i + 1].kind == STRING:
            return tokens[i + 1].value
    raise SqlError(f"line {statement.line}: LOCATION takes the location as one string literal",
                   statement.line, statement.column)


def _create(catalog, statement: Statement, tree: exp.Create, udfs: set[str]) -> SqlResult:
    store: TableStore = catalog.tables
    table = _plain_table(tree.this)
    name = table.name
    if name.lower() in _streams(catalog):
        raise InvalidInputError(f"{name!r} is a stream (line {statement.line}); pick another "
                                f"table name")
    stored = _lookup(store, name) or name
    exists = store.exists(stored)
    if_not_exists, replace = bool(tree.args.get("exists")), bool(tree.args.get("replace"))
    if exists and if_not_exists:
        return _result(statement, "CREATE TABLE", f"table {stored} exists; left as it is")
    if exists and not replace:
        raise SqlError(f"table {stored!r} already exists (line {statement.line}); use CREATE "
                       f"OR REPLACE TABLE or IF NOT EXISTS", statement.line, statement.column)
    comment, location, key = None, None, None
    for prop in (tree.args.get("properties") or exp.Properties()).expressions:
        if isinstance(prop, exp.SchemaCommentProperty):
            comment = prop.this.name
        elif isinstance(prop, exp.LocationProperty):
            location = _location(statement)
        elif isinstance(prop, exp.Property) and prop.name.lower() == "key":
            key = [k.strip() for k in prop.args["value"].name.split(",") if k.strip()]
    source = tree.args.get("expression")
    if location is not None:  # a user's Delta table, adopted (tables.registered)
        if source is not None or isinstance(tree.this, exp.Schema):
            raise InvalidInputError(f"CREATE TABLE {name} LOCATION '...' adopts an existing "
                                    f"Delta table: give no columns and no AS SELECT")
        catalog.register_table(stored, location, key=key, replace=replace)
        return _result(statement, "CREATE TABLE", f"registered table {stored} at "
                                                  f"{store.path(stored)} (read only)")
    if source is None:
        columns, key = _columns(tree.this)
        store.create(stored, columns, comment=comment, replace=replace, key=key)
        return _result(statement, "CREATE TABLE", f"created table {stored} at "
                                                  f"{store.path(stored)}")

    def write(df) -> str:
        rows = df.toArrow()
        if store.exists(stored) and not replace:
            raise SqlError(f"table {stored!r} already exists", statement.line, statement.column)
        store.create(stored, rows.schema, comment=comment, replace=replace)
        try:
            version, n = store.insert(stored, rows)
        except Exception:
            store.drop(stored, if_exists=True)  # nothing half-written
            raise
        return f"created table {stored} with {n} rows (version {version})"

    return _query(catalog, statement, udfs, source, "CREATE TABLE", write)


def _target(catalog, statement: Statement, node: Any, verb: str) -> str | None:
    """The stored name of a write's target, None when it is Spark's own table."""
    table = _plain_table(node)
    if table is None:
        return None
    store: TableStore = catalog.tables
    stored = _lookup(store, table.name)
    if stored is not None:
        return stored
    if store.occupied(table.name):
        store.open(table.name)  # names what is wrong with the folder
    if table.name.lower() in _streams(catalog):
        return None  # _sql_dml says streams are read-only
    if catalog.spark.catalog.tableExists(table.name):
        if verb == "MERGE":
            raise InvalidInputError(f"MERGE INTO {table.name}: it is a Spark table, not a "
                                    f"Delta table in the warehouse; MERGE needs a warehouse "
                                    f"table (CREATE TABLE {table.name} ...)")
        return None
    raise NotFoundError("table", table.name, store.names())


def _insert(catalog, statement: Statement, tree: exp.Insert, name: str,
            udfs: set[str]) -> SqlResult:
    store: TableStore = catalog.tables
    columns = [c.name for c in tree.this.expressions] if isinstance(tree.this, exp.Schema) \
        else None
    overwrite = bool(tree.args.get("overwrite"))

    def write(df) -> str:
        version, n = store.insert(name, df.toArrow(), columns=columns, overwrite=overwrite)
        return f"{n} rows {'written over' if overwrite else 'inserted into'} {name} " \
               f"(version {version})"

    return _query(catalog, statement, udfs, tree.expression,
                  "INSERT OVERWRITE" if overwrite else "INSERT", write)


def _assignments(pairs: list[exp.Expression]) -> dict[str, exp.Expression]:
    out = {}
    for eq in pairs:
        if not isinstance(eq, exp.EQ) or not isinstance(eq.this, exp.Column):
            raise InvalidInputError(f"expected column = expression, not {eq.sql('spark')!r}")
        out[eq.this.name] = eq.expression
    return out


def _where(tree: exp.Expression) -> exp.Expression | None:
    where = tree.args.get("where")
    return where.this if where is not None else None


def _merge(catalog, statement: Statement, tree: exp.Merge, name: str,
           udfs: set[str]) -> SqlResult:
    store: TableStore = catalog.tables
    target_alias = tree.this.alias or tree.this.name
    using = tree.args["using"]
    source_alias = using.alias or (using.name if isinstance(using, exp.Table) else "")
    if not source_alias:
        raise InvalidInputError("MERGE ... USING (query) needs an alias for the query")
    if isinstance(using, exp.Subquery):
        query = using.this
    else:
        plain = using.copy()
        plain.set("alias", None)
        query = exp.select("*").from_(plain)
    columns = store.schema(name).names
    whens = tree.args["whens"].expressions
    clauses = []
    for when in whens:
        then = when.args["then"]
        matched = bool(when.args.get("matched"))
        if when.args.get("source"):
            raise InvalidInputError("WHEN NOT MATCHED BY SOURCE is not supported")
        if isinstance(then, exp.Update):
            sets = _assignments(then.expressions) if then.expressions else \
                {c: exp.column(c, source_alias) for c in columns}
            clauses.append(MergeClause(True, "update", when.args.get("condition"), sets))
        elif isinstance(then, exp.Insert):
            values = then.expression.expressions if then.expression is not None else None
            if isinstance(then.this, exp.Star) or values is None:
                sets = {c: exp.column(c, source_alias) for c in columns}
            else:
                cols = [c.name for c in then.this.expressions] if then.this else columns
                if len(cols) != len(values):
                    raise InvalidInputError(f"MERGE INTO {name}: INSERT gives {len(values)} "
                                            f"values for {len(cols)} columns ({', '.join(cols)})")
                sets = dict(zip(cols, values, strict=True))
            clauses.append(MergeClause(False, "insert", when.args.get("condition"), sets))
        else:
            clauses.append(MergeClause(matched, "delete", when.args.get("condition")))

    def write(df) -> str:
        version, m = store.merge(name, df.toArrow(), tree.args["on"], clauses,
                                 target_alias=target_alias, source_alias=source_alias)
        counts = [m.get(f"num_target_rows_{k}", 0) for k in ("inserted", "updated", "deleted")]
        if not any(counts):
            return f"merged into {name}: no row inserted, updated or deleted ({name} is at " \
                   f"version {version})"
        return (f"merged into {name} (version {version}): {counts[0]} inserted, {counts[1]} "
                f"updated, {counts[2]} deleted")

    return _query(catalog, statement, udfs, query, "MERGE", write)


def _describe(statement: Statement, store: TableStore, name: str) -> SqlResult:
    info = store.describe(name)
    rows = [{"col_name": c["name"], "data_type": c["type"].lower(), "comment": c["comment"]}
            for c in info["columns"]]
    return _result(statement, "DESCRIBE TABLE", f"table {name}: {len(rows)} columns", rows,
                   ["col_name", "data_type", "comment"])


def _show(statement: Statement, store: TableStore) -> SqlResult:
    """One row per table; a table that cannot be read (a registered table whose folder is
    gone) is listed with what is known and `unreadable` saying why, not failing the list."""
    rows = []
    for name in store.names():
        try:
            info = store.describe(name)
        except VolumeStreamError as exc:
            rows.append({"name": name, "columns": None, "version": None,
                         "change_tracking": None, "comment": None, "path": store.path(name),
                         "unreadable": str(exc)})
            continue
        rows.append({"name": name, "columns": len(info["columns"]), "version": info["version"],
                     "change_tracking": info["change_tracking"], "comment": info["comment"],
                     "path": info["path"], "unreadable": None})
    bad = sum(1 for r in rows if r["unreadable"])
    return _result(statement, "SHOW TABLES", f"{len(rows)} tables"
                   + (f" ({bad} unreadable)" if bad else ""), rows,
                   ["name", "columns", "version", "change_tracking", "comment", "path",
                    "unreadable"])


def _changed(n: int, verb: str, name: str, version: int) -> str:
    if n:
        return f"{n} rows {verb} {name} (version {version})"
    return f"0 rows {verb} {name}: no row matched, nothing was committed ({name} stays at " \
           f"version {version})"


@contextmanager
def _function_located(statement: Statement) -> Iterator[None]:
    """A function UPDATE / DELETE / MERGE cannot call, located at its name in the script."""
    try:
        yield
    except UnsupportedFunction as exc:
        for i, token in enumerate(statement.tokens[:-1]):
            if token.kind == WORD and token.value.lower() in exc.spellings \
                    and statement.tokens[i + 1].text == "(":
                said = str(exc).replace(f"function {exc.function}()", f"function {token.value}()")
                raise SqlError(f"line {token.line}, column {token.column}: {said}", token.line,
                               token.column) from exc
        raise SqlError(f"statement at line {statement.line}: {exc}", statement.line,
                       statement.column) from exc


def _names_ours(catalog, statement: Statement, made: set[str] = frozenset()) -> bool:
    """Whether the statement names a warehouse table or a stream (by its words), or one of
    `made` (lower-cased names its script creates before it)."""
    words = {t.value.lower() for t in statement.tokens if t.kind in (WORD, QUOTED)}
    return bool(words & ({n.lower() for n in catalog.tables.names()} | made)) \
        or bool(words & set(_streams(catalog)))


def parse_checked(catalog, statement: Statement, made: set[str] = frozenset()
                  ) -> exp.Expression | None:
    """sqlglot's tree of a statement that is not our DDL, or its syntax error: sqlglot's, while
    Spark does not run or when the statement names a warehouse table or stream (they are found
    in sqlglot's tree: unread, `FROM people WHERE` reached Spark as the table `people` aliased
    `WHERE`, and people was "not found"); else Spark's parser's, None if it reads it."""
    try:
        with _sql_dml._quiet_sqlglot():
            return sqlglot.parse_one(statement.text, read="spark")
    except sqlglot.errors.ParseError as exc:
        if not getattr(catalog, "spark_started", True) \
                or _names_ours(catalog, statement, made):
            raise syntax.reworded(statement, exc) from exc
    except sqlglot.errors.SqlglotError:
        return None  # a tokenizer's complaint: left to the statement's own run
    edits = _sql_dml._token_edits(statement.text, set(UDFS.get(catalog.spark, {})))
    spark_parse = _sql_dml._spark_parser(catalog, statement, edits)
    if spark_parse is not None:
        spark_parse(_sql_dml.Analysis("other", statement.keyword, edits=edits)
                    .text(statement.text))
    return None


def run(catalog, statement: Statement, udfs: set[str], *,
        before_spark: Callable[[], None] | None = None,
        tree: exp.Expression | None = None) -> SqlResult:
    """Run a statement that is not our DDL: warehouse-table DDL and DML here, the rest in Spark
    with the warehouse tables it reads visible. `tree`: the statement's `parse_checked`
    (None: sqlglot could not read it, Spark's parser could).

    `before_spark` runs once the statement has parsed, before anything may start Spark (the
    CLI registers its deferred UDFs there): a syntax error never starts Spark."""
    words = [t.upper for t in statement.tokens[:3]]
    store: TableStore = catalog.tables
    if words[:2] == ["SHOW", "TABLES"] and len(statement.tokens) == 2:
        return _show(statement, store)
    if tree is None and _names_ours(catalog, statement):  # made after the script was checked
        tree = parse_checked(catalog, statement)
    if before_spark is not None:
        before_spark()
    if isinstance(tree, exp.Create) and str(tree.args.get("kind")).upper() == "TABLE" \
            and _plain_table(tree.this) is not None:
        return _create(catalog, statement, tree, udfs)
    if isinstance(tree, exp.Drop) and str(tree.args.get("kind")).upper() == "TABLE":
        tables = [_plain_table(t) for t in tree.args.get("tables") or [tree.this]]
        if len(tables) == 1 and tables[0] is not None:
            stored = _lookup(store, tables[0].name) or tables[0].name
            if store.exists(stored) or not catalog.spark.catalog.tableExists(stored):
                dropped = store.drop(stored, if_exists=bool(tree.args.get("exists")))
                return _result(statement, "DROP TABLE",
                               f"{'dropped' if dropped else 'no'} table {stored}")
    if isinstance(tree, exp.Describe):
        table = _plain_table(tree.this)
        stored = _lookup(store, table.name) if table is not None else None
        if stored is not None and table.name.lower() not in _streams(catalog):
            return _describe(statement, store, stored)
    if isinstance(tree, exp.Insert | exp.Update | exp.Delete | exp.Merge):
        verb = type(tree).__name__.upper()
        name = _target(catalog, statement, tree.this, verb)
        if name is not None:
            if isinstance(tree, exp.Insert):
                return _insert(catalog, statement, tree, name, udfs)
            if isinstance(tree, exp.Merge):
                with _function_located(statement):
                    return _merge(catalog, statement, tree, name, udfs)
            with _function_located(statement):
                if isinstance(tree, exp.Update):
                    version, n = store.update(name, _assignments(tree.expressions),
                                              _where(tree))
                    return _result(statement, "UPDATE", _changed(n, "updated in", name, version))
                version, n = store.delete(name, _where(tree))
                return _result(statement, "DELETE", _changed(n, "deleted from", name, version))
    with _table_views(catalog, tree) as views:  # a query reading them is computed while
        return _sql_dml.run(catalog, statement, udfs, materialize=bool(views),  # they exist
                            tables=views)
