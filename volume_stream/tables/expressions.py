"""SQL expressions (Spark dialect, as users write them) translated with sqlglot for delta-rs,
whose predicates and update expressions are DataFusion SQL: identifiers are quoted (so case and
leading underscores survive), literals and operators are rendered in the Postgres-like dialect
DataFusion reads. Nothing is built by string pasting of user text.

    to_delta("id = 1 OR name = 'x'")     # -> '"id" = 1 OR "name" = \\'x\\''
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from volume_stream.errors import InvalidInputError

__all__ = ["column_names", "parse_expression", "to_delta"]

_OUT = "postgres"


def parse_expression(text: str) -> exp.Expression:
    """Parse one Spark SQL expression; a syntax error is an InvalidInputError."""
    try:
        return sqlglot.parse_one(text, read="spark", into=exp.Condition)
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidInputError(f"cannot parse expression {text!r}: "
                                f"{str(exc).splitlines()[0]}") from exc


def to_delta(node: exp.Expression | str, *, columns: list[str] | None = None,
             table: str = "") -> str:
    """The expression as delta-rs (DataFusion) SQL.

    With `columns`, every unqualified column must be one of them (case-insensitively; the
    stored spelling is used), so a typo is reported here naming the table, not by DataFusion.
    Subqueries are refused: delta-rs evaluates predicates row by row.
    """
    if isinstance(node, str):
        node = parse_expression(node)
    node = node.copy()
    if node.find(exp.Subquery, exp.Select):
        raise InvalidInputError(f"table {table!r}: subqueries are not supported in UPDATE / "
                                f"DELETE / MERGE conditions; use MERGE ... USING (query)")
    if columns is not None:
        lookup = {c.lower(): c for c in columns}
        for col in node.find_all(exp.Column):
            if col.table:
                continue
            stored = lookup.get(col.name.lower())
            if stored is None:
                raise InvalidInputError(f"table {table!r} has no column {col.name!r} "
                                        f"(columns: {', '.join(columns)})")
            col.set("this", exp.to_identifier(stored, quoted=True))
    for ident in node.find_all(exp.Identifier):
        ident.set("quoted", True)
    return node.sql(dialect=_OUT)


def column_names(node: exp.Expression) -> set[tuple[str, str]]:
    """(qualifier, name) of each column an expression reads (qualifier '' if none)."""
    return {(c.table or "", c.name) for c in node.find_all(exp.Column)}
