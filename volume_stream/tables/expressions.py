"""SQL expressions (Spark dialect, as users write them) translated with sqlglot for delta-rs,
whose predicates and update expressions are DataFusion SQL: identifiers are quoted (so case and
leading underscores survive), literals and operators are rendered in the Postgres-like dialect
DataFusion reads. Nothing is built by string pasting of user text.

These rules make a translated predicate safe to hand to a DELETE or UPDATE (DESIGN §8.2):

- **Three-valued logic.** A row is touched only where the predicate is TRUE: the translation is
  `(p) IS TRUE`. Without it delta-rs folds a constant NULL predicate (`name = NULL`,
  `id + NULL > 0`, `1/0 = 1`) to "no filter" and deletes every row.
- **Bounded depth.** DataFusion plans an expression recursively on threads whose stack we do not
  size, so a left-deep chain of thousands of ORs overflowed it (a segfault) or took minutes.
  Chains of AND / OR are rebuilt as balanced trees (depth log n) and IN lists longer than
  `IN_CHUNK` become a balanced OR of shorter IN lists (the same three-valued result). Parentheses
  nested deeper than `MAX_NESTING` are refused before sqlglot's recursive parser sees them.
- **No silent overflow.** DataFusion wraps 64-bit integer arithmetic around (`9223372036854775807
  + 1` became the smallest BIGINT); Spark raises. Integer `+ - *` (integer columns and literals)
  is computed as DECIMAL(38, 0) and cast back to BIGINT, which DataFusion refuses when the value
  does not fit: the statement fails naming the table, nothing is written.
- **Known columns.** Every unqualified column must exist (case-insensitively), so a typo is
  reported naming the table, not by DataFusion.
- **No merged IN lists.** DataFusion's simplifier turns an AND of IN lists (or of ORed
  equalities) on one operand with an empty intersection into FALSE, wrong for a NULL operand:
  such predicates are wrapped in `COALESCE(p, CAST(NULL AS BOOLEAN))` (`_opaque`).
- **Keyword predicates grouped.** `IS [NOT] DISTINCT FROM`, `IS`, `LIKE`, `ILIKE`, `BETWEEN`
  go out in parentheses: DataFusion read `a <=> b AND c` as `a <=> (b AND c)` (`_grouped`).
- **ORed equalities as IN lists.** `x = 1 OR x = 2 OR ...` on one operand goes out as
  `x IN (1, 2, ...)` (ANDed `<>` as NOT IN), the same truth values: 20,000 equalities took
  27.7 s, the IN list a fraction of it (`_in_lists`).
- **Known functions only.** Only the functions of `tables.functions` (those delta-rs computes
  as Spark does and can write back to its log), in their DataFusion form; any other is an
  `UnsupportedFunction` naming it.

    to_delta("id = 1 OR name = 'x'")     # -> '"id" = 1 OR "name" = \\'x\\''
    to_delta_predicate("name = NULL")    # -> '("name" = NULL) IS TRUE'
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import sqlglot
from sqlglot import exp

from volume_stream.errors import InvalidInputError
from volume_stream.tables.functions import check_functions

__all__ = ["IN_CHUNK", "MAX_NESTING", "column_names", "deep_stack", "parse_expression",
           "to_delta", "to_delta_predicate"]

_OUT = "postgres"
#: the deepest parenthesis nesting an expression may have
MAX_NESTING = 40
#: IN lists longer than this are split into a balanced OR of lists this long
IN_CHUNK = 512
_BALANCE_FROM = 8   # chains shorter than this are left as written


def _nesting(text: str) -> int:
    """The deepest parenthesis nesting of `text`, outside quoted strings and identifiers."""
    depth = deepest = 0
    quote = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
        i += 1
    return deepest


def parse_expression(text: str) -> exp.Expression:
    """Parse one Spark SQL expression; a syntax error is an InvalidInputError."""
    shown = text if len(text) <= 80 else f"{text[:80]}... ({len(text)} characters)"
    if _nesting(text) > MAX_NESTING:
        raise InvalidInputError(f"expression {shown!r} nests parentheses {_nesting(text)} deep; "
                                f"at most {MAX_NESTING} levels are supported")
    try:
        return sqlglot.parse_one(text, read="spark", into=exp.Condition)
    except sqlglot.errors.SqlglotError as exc:
        raise InvalidInputError(f"cannot parse expression {shown!r}: "
                                f"{str(exc).splitlines()[0]}") from exc
    except RecursionError as exc:
        raise InvalidInputError(f"expression {shown!r} is nested too deeply to parse; "
                                f"simplify it") from exc


def _chain(top: exp.Expression) -> list[exp.Expression]:
    """The operands of a chain of one connective (a OR b OR c ...), in order, iteratively."""
    kind, leaves, stack = type(top), [], [top]
    while stack:
        node = stack.pop()
        if type(node) is kind:
            stack += [node.expression, node.this]
        else:
            leaves.append(node)
    return leaves


def _balanced(kind: type, leaves: list[exp.Expression]) -> exp.Expression:
    if len(leaves) == 1:
        return leaves[0]
    mid = len(leaves) // 2
    return exp.Paren(this=kind(this=_balanced(kind, leaves[:mid]),
                               expression=_balanced(kind, leaves[mid:])))


def _swapped(root: exp.Expression, item: exp.Expression, new: exp.Expression) -> exp.Expression:
    """`root` with `item` (a node of it, or itself) replaced by `new`."""
    if item is root:
        return new
    item.replace(new)
    return root


def _shallow(node: exp.Expression) -> exp.Expression:
    """`node` with long AND/OR chains balanced and long IN lists split (same truth values)."""
    for item in list(node.find_all(exp.In)):
        values = item.expressions
        if len(values) > IN_CHUNK and not item.args.get("query"):
            parts = [exp.In(this=item.this.copy(), expressions=values[i:i + IN_CHUNK])
                     for i in range(0, len(values), IN_CHUNK)]
            node = _swapped(node, item, _balanced(exp.Or, parts))
    tops = [n for n in node.find_all(exp.And, exp.Or) if type(n.parent) is not type(n)]
    for top in reversed(tops):  # deepest first: a chain's operands are final when it is built
        leaves = _chain(top)
        if len(leaves) < _BALANCE_FROM:
            continue
        node = _swapped(node, top, _balanced(type(top), leaves))
    return node


def _operands_of(kind: type, top: exp.Expression) -> list[exp.Expression]:
    """The operands of a chain of `kind` (AND / OR), through parentheses, in order."""
    leaves, stack = [], [top]
    while stack:
        node = stack.pop()
        inner = node
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if type(inner) is kind:
            stack += [inner.expression, inner.this]
        else:
            leaves.append(node)
    return leaves


def _constant(node: exp.Expression) -> str | None:
    """What kind of literal `node` is ("string", "integer", "number", "boolean", "cast:<type>"),
    None if it is not one (a NULL is left out: its equalities stay as written)."""
    while isinstance(node, exp.Paren | exp.Neg | exp.Cast):
        if isinstance(node, exp.Cast):
            return "cast:" + node.to.sql() if _constant(node.this) else None
        node = node.this
    if isinstance(node, exp.Literal):
        return "string" if node.is_string else "integer" if node.this.isdigit() else "number"
    if isinstance(node, exp.Boolean):
        return "boolean"
    return None


def _as_list_item(leaf: exp.Expression, test: type) -> tuple[str, exp.Expression,
                                                            exp.Expression] | None:
    """(operand and literal kind, operand, literal) of `operand = literal` (`test` EQ) or
    `operand <> literal` (NEQ), either way round; None for anything else."""
    while isinstance(leaf, exp.Paren):
        leaf = leaf.this
    if type(leaf) is not test:
        return None
    for operand, value in ((leaf.this, leaf.expression), (leaf.expression, leaf.this)):
        kind = _constant(value)
        if kind is None:
            continue
        if isinstance(operand, exp.Column):  # the common case, without rendering it
            return f"{kind} {operand.table.lower()}.{operand.name.lower()}", operand, value
        if operand.find(exp.Column):
            return f"{kind} {operand.sql()}", operand, value
    return None


def _in_lists(node: exp.Expression) -> exp.Expression:
    """ORed equalities of one operand with literals of one kind as an IN list, and ANDed
    inequalities as a NOT IN list: `x = 1 OR x = 2 OR y > 0` is `x IN (1, 2) OR y > 0`, the
    same truth values by SQL's definition of IN (NULL where no term is TRUE and one is
    NULL). DataFusion plans one IN list of 20,000 values in a fraction of the time of 20,000
    equalities, and `_shallow` cuts it into balanced lists of `IN_CHUNK`. The walk does not
    enter the `column = literal` terms it takes, so a 20k-term chain costs one pass."""
    chains: list[tuple[exp.Expression, list[list[exp.Expression]]]] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if type(item) not in (exp.And, exp.Or):
            stack.extend(item.iter_expressions())
            continue
        test = exp.EQ if type(item) is exp.Or else exp.NEQ
        groups: dict[str, list[exp.Expression]] = {}
        for leaf in _operands_of(type(item), item):
            found = _as_list_item(leaf, test)
            if found is None or not isinstance(found[1], exp.Column):
                stack.append(leaf)  # it may hold chains of its own
            if found is not None:
                groups.setdefault(found[0], []).append(leaf)
        merged = [g for g in groups.values() if len(g) > 1]
        if merged:
            chains.append((item, merged))
    for top, merged in reversed(chains):  # inner chains first
        kind, test = type(top), exp.EQ if type(top) is exp.Or else exp.NEQ
        first = {id(g[0]): g for g in merged}
        dropped = {id(leaf) for g in merged for leaf in g[1:]}
        out = []
        for leaf in _operands_of(kind, top):
            if id(leaf) in first:
                items = [_as_list_item(x, test) for x in first[id(leaf)]]
                listed = exp.In(this=items[0][1], expressions=[i[2] for i in items])
                out.append(listed if kind is exp.Or else exp.Not(this=listed))
            elif id(leaf) not in dropped:
                out.append(leaf)
        node = _swapped(node, top, _balanced(kind, out))
    return node


_INTEGER_TYPES = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
                  exp.DataType.Type.BIGINT}
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul)


def _integer(node: exp.Expression, integers: set[str]) -> bool:
    """Whether `node` is integer-typed: an integer column or literal, or arithmetic of them."""
    if isinstance(node, exp.Paren | exp.Neg):
        return _integer(node.this, integers)
    if isinstance(node, exp.Column):
        return node.name.lower() in integers
    if isinstance(node, exp.Literal):
        return not node.is_string and node.this.lstrip("-").isdigit()
    if isinstance(node, exp.Cast):
        return node.to.this in _INTEGER_TYPES
    if isinstance(node, _ARITHMETIC):
        return _integer(node.this, integers) and _integer(node.expression, integers)
    return False


def _checked(node: exp.Expression, integers: set[str]) -> exp.Expression:
    """Integer arithmetic computed in DECIMAL(38, 0) and cast back to BIGINT (an error, not a
    wrap-around, when the result does not fit)."""
    wide = exp.DataType.build("DECIMAL(38, 0)")
    for item in reversed(list(node.find_all(*_ARITHMETIC))):  # innermost first
        if not _integer(item, integers):
            continue
        math = type(item)(this=exp.Cast(this=item.this, to=wide.copy()),
                          expression=exp.Cast(this=item.expression, to=wide.copy()))
        node = _swapped(node, item, exp.Cast(this=exp.Paren(this=math),
                                             to=exp.DataType.build("BIGINT")))
    return node


def to_delta(node: exp.Expression | str, *, columns: list[str] | None = None,
             table: str = "", integers: set[str] | frozenset[str] = frozenset()) -> str:
    """The expression as delta-rs (DataFusion) SQL.

    With `columns`, every unqualified column must be one of them (case-insensitively; the
    stored spelling is used), so a typo is reported here naming the table, not by DataFusion.
    Subqueries are refused: delta-rs evaluates predicates row by row. `integers` names the
    integer columns (lower case): arithmetic on them is checked for overflow.
    """
    node = parse_expression(node) if isinstance(node, str) else node.copy()
    if node.find(exp.Subquery, exp.Select):
        raise InvalidInputError(f"table {table!r}: subqueries are not supported in UPDATE / "
                                f"DELETE / MERGE conditions; use MERGE ... USING (query)")
    node = _in_lists(node)  # first: the steps below walk a 20k-term chain as one IN list
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
    node = check_functions(node, table=table)
    node = _checked(node, {c.lower() for c in integers})
    shared = _shared(node)  # before `_shallow` splits long IN lists (in place)
    return _grouped(_opaque(_shallow(node), shared)).sql(dialect=_OUT)


#: predicates DataFusion's simplifier (delta-rs 1.6) merges when they share an operand: IN
#: lists, and equalities and inequalities (`x = a OR x = b` becomes `x IN (a, b)` first)
_SET_PREDICATES = (exp.In, exp.EQ, exp.NEQ)


def _operands(node: exp.Expression) -> list[str]:
    """The operands of a set predicate, as SQL text: an IN list's left side; each side of an
    (in)equality that reads a column."""
    if isinstance(node, exp.In):
        return [] if node.args.get("query") else [node.this.sql()]
    return [side.sql() for side in (node.this, node.expression) if side.find(exp.Column)]


def _shared(node: exp.Expression) -> set[str]:
    """Operands of more than one set predicate of `node` (the predicates DataFusion could
    merge). Taken before `_shallow` splits a long IN list: the OR of its chunks is a union,
    which that rule gets right."""
    seen = Counter(o for p in node.find_all(*_SET_PREDICATES) for o in _operands(p))
    return {o for o, n in seen.items() if n > 1}


#: predicates written with keywords, whose precedence against AND/OR/NOT DataFusion's parser
#: does not read as Spark does: `a IS NOT DISTINCT FROM b AND c` became
#: `a IS NOT DISTINCT FROM (b AND c)` (a DELETE of `f <=> f AND f` removed rows where f is
#: FALSE); each goes out in parentheses
_KEYWORD_PREDICATES = (exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is, exp.Like, exp.ILike,
                       exp.Between)


def _grouped(node: exp.Expression) -> exp.Expression:
    """`node` with each `_KEYWORD_PREDICATES` predicate in parentheses."""
    for item in list(node.find_all(*_KEYWORD_PREDICATES)):
        if not isinstance(item.parent, exp.Paren):
            node = _swapped(node, item, exp.Paren(this=item.copy()))
    return node


def _opaque(node: exp.Expression, shared: set[str]) -> exp.Expression:
    """Each set predicate on a `shared` operand as `COALESCE(p, CAST(NULL AS BOOLEAN))`, the
    same truth values. DataFusion's simplifier rewrites an AND of IN lists on one operand
    whose intersection or difference is empty (`x IN (0) AND NOT x IN (0)`, or the same
    written `(x = 0 OR x = 1) AND NOT (x = 0 OR x = 1)`) to FALSE, wrong where x is NULL (the
    AND is NULL): under a NOT, a DELETE removed rows SQL leaves alone. The wrapper hides the
    predicates from that rule. A predicate alone on its operand stays bare, so delta-rs still
    prunes files by it (wrapping a 100k-value IN list made its DELETE ~60% slower)."""
    if not shared:
        return node
    for item in reversed(list(node.find_all(*_SET_PREDICATES))):  # inner predicates first
        if shared.intersection(_operands(item)):
            node = _swapped(node, item, exp.Coalesce(
                this=item.copy(), expressions=[exp.cast(exp.Null(), "BOOLEAN")]))
    return node


def to_delta_predicate(node: exp.Expression | str, *, columns: list[str] | None = None,
                       table: str = "", integers: set[str] | frozenset[str] = frozenset()
                       ) -> str:
    """A condition as delta-rs SQL that is TRUE exactly where the condition is TRUE (NULL and
    FALSE both leave a row alone, as SQL's three-valued logic says)."""
    return f"({to_delta(node, columns=columns, table=table, integers=integers)}) IS TRUE"


def column_names(node: exp.Expression) -> set[tuple[str, str]]:
    """(qualifier, name) of each column an expression reads (qualifier '' if none)."""
    return {(c.table or "", c.name) for c in node.find_all(exp.Column)}


_STACK = 256 * 1024 * 1024


def deep_stack(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a thread with a 256 MiB stack: delta-rs parses and plans a predicate on
    the calling thread, recursively, and a long one overflowed the main thread's 8 MiB (a
    segfault that killed the process)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn(*args)
        except BaseException as exc:  # handed back to the caller's thread as it was
            out["error"] = exc

    old = threading.stack_size(_STACK)
    try:
        thread = threading.Thread(target=run, name="volume-stream-delta-write")
        thread.start()
    finally:
        threading.stack_size(old)
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["result"]
