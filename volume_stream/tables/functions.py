"""The Spark SQL functions an UPDATE / DELETE / MERGE expression may call (DESIGN §8.2).

delta-rs evaluates these expressions in DataFusion and also writes each one back as text into
its commit. That formatter knows only some of DataFusion's expressions: `length(s) = 2` was
refused with "Unable to convert expression to string", and the same function inside another
(`abs(length(s))`) made delta-rs panic (`pyo3_runtime.PanicException`, a Rust backtrace on the
terminal). So an expression may call only the functions of `SUPPORTED`, each written as the
DataFusion function that computes what Spark's does (the differential test against Spark SQL,
tests/volume_stream/tables/test_predicates.py, draws them); any other function is an
`UnsupportedFunction` naming it, before anything reaches delta-rs.

    check_functions(parse_one("length(trim(s)) = 2"), table="t")   # -> character_length(...)
    check_functions(parse_one("soundex(s) = 'A1'"), table="t")     # UnsupportedFunction
"""

from __future__ import annotations

import re

from sqlglot import exp

from volume_stream.errors import SqlError

__all__ = ["SUPPORTED", "UnsupportedFunction", "check_functions"]

#: what the error lists, as users write the functions
SUPPORTED = ("abs", "coalesce (nvl, ifnull)", "nullif", "nvl2", "if", "upper (ucase)", "lower (lcase)", "length (char_length, character_length)",
             "trim", "ltrim", "rtrim", "concat", "instr (locate, position; no start)",
             "substr (substring; a literal start >= 1 and length >= 0)", "reverse",
             "startswith", "endswith", "isnull", "isnotnull", "CAST", "CASE")

#: sqlglot's nodes for functions DataFusion computes as Spark does, and writes back as text
#: (not greatest / least: DataFusion folds `least(abs(CAST(1 AS INT)), 2)` to 2, wrongly, when
#: its arguments are constants of two integer widths)
_AS_IS = (exp.Cast, exp.TryCast, exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Nvl2, exp.Abs,
          exp.Upper, exp.Lower, exp.Trim, exp.Reverse, exp.StartsWith, exp.EndsWith)
_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_NULL_TESTS = {"isnull": False, "isnotnull": True}


#: other spellings of a function sqlglot reads as one (the error names the first)
_SPELLINGS = {"substring": ("substr",), "locate": ("instr", "position"),
              "regexp_like": ("rlike", "regexp")}


class UnsupportedFunction(SqlError):
    """A function an UPDATE / DELETE / MERGE expression may not call; `function` names it
    (lower case) and `spellings` are the names it may have been written with, so the SQL front
    door can point at it in the statement."""

    def __init__(self, message: str, function: str):
        super().__init__(message)
        self.function = function
        self.spellings = (function, *_SPELLINGS.get(function, ()))


def _name(node: exp.Func) -> str:
    """The function's name as Spark writes it (`instr` is sqlglot's STR_POSITION)."""
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    called = _CALL.match(node.sql(dialect="spark"))
    return (called[1] if called else node.sql_name()).lower()


def _refuse(node: exp.Func, table: str, only: str = "") -> UnsupportedFunction:
    """The error for `node`; `only`: the form in which that function is supported."""
    name = _name(node)
    where = "UPDATE / DELETE / MERGE expressions (they run in delta-rs)"
    why = (f"is supported in {where} only {only}" if only else
           f"is not supported in {where}; supported: {', '.join(SUPPORTED)}")
    return UnsupportedFunction(f"table {table!r}: function {name}() {why}; nothing was written",
                               name)


def _literal_int(node: exp.Expression | None) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
        return int(node.this)
    return None


def _call(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _bigint(node: exp.Expression) -> exp.Expression:
    """`node` (a 32-bit integer in DataFusion) as BIGINT, the type of integer literals:
    DataFusion refused `coalesce(strpos('ab', 'b'), 5)` ("CASE expression 'then' values had
    multiple data types: Int64, Int32"). The values are Spark's (INT) all the same."""
    return exp.Cast(this=node, to=exp.DataType.build("BIGINT"))


def _rewritten(node: exp.Func, table: str) -> exp.Expression | None:
    """The DataFusion form of a supported function that needs one (None: as it is)."""
    if isinstance(node, exp.Length):  # delta-rs cannot write DataFusion's `length` back
        return _bigint(_call("character_length", node.this))
    if isinstance(node, exp.Concat):  # Spark's concat is NULL if any part is: so is ||
        parts = node.expressions
        out = parts[0]
        for part in parts[1:]:
            out = exp.DPipe(this=out, expression=part, safe=True)
        return exp.Paren(this=out)
    if isinstance(node, exp.StrPosition):
        if node.args.get("position") is not None or node.args.get("occurrence") is not None:
            raise _refuse(node, table, "without a start position")
        return _bigint(_call("strpos", node.this, node.args["substr"]))
    if isinstance(node, exp.Substring):
        # DataFusion counts a start <= 0 as Postgres does, Spark from the end: only a start
        # both read alike is taken
        start, length = node.args.get("start"), node.args.get("length")
        if _literal_int(start) in (None, 0) or (length is not None
                                                and _literal_int(length) is None):
            raise _refuse(node, table, "with a literal start >= 1 and a literal length "
                                       "(DataFusion counts other starts unlike Spark)")
        return _call("substr", node.this, start, *([length] if length is not None else []))
    if isinstance(node, exp.Anonymous) and _name(node) in _NULL_TESTS:
        if len(node.expressions) != 1:
            raise _refuse(node, table, "with one argument")
        test = exp.Is(this=node.expressions[0], expression=exp.Null())
        return exp.Paren(this=exp.Not(this=test) if _NULL_TESTS[_name(node)] else test)
    return None


def check_functions(node: exp.Expression, *, table: str = "") -> exp.Expression:
    """`node` (changed in place) with each function call in its DataFusion form.

    Raises:
        UnsupportedFunction: a function not in `SUPPORTED`, or one called in a form whose
            DataFusion reading differs from Spark's (`substr(s, 0)`, `locate(x, s, 2)`).
    """
    for item in reversed(list(node.find_all(exp.Func))):  # innermost first
        if isinstance(item, _AS_IS) or type(item) in (exp.And, exp.Or):  # AND, OR: operators
            continue
        new = _rewritten(item, table)
        if new is None:
            raise _refuse(item, table)
        if item is node:
            node = new
        else:
            item.replace(new)
    return node
