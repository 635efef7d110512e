"""Syntax errors found without Spark, in volume-stream's words (issue 22).

Starting Spark to hear that `hello world` is not SQL costs ten seconds, and sqlglot's own
messages name its classes (`Required keyword: 'expression' missing for <class ...Mul>`). Before
a statement that is not our DDL goes on, `check(statement)` refuses, pointing at the token:

* a first word no Spark SQL statement starts with (`help`, `hello world`, `SELEC`), with the
  closest statement word ("did you mean SELECT?");
* `SHOW x` for an `x` neither Spark nor volume-stream shows (`SHOW VOLUMEZ`);
* a statement ending in a symbol that needs something after it (`SELECT a,`, `... WHERE a =`).

`reworded(statement, exc)` turns a sqlglot parse error into a `SqlSyntaxError` saying what was
expected after which token ("expected a table name after 'FROM', found the end of the
statement"; `sql.tables.parse_checked` raises it). Statements these cannot judge go on to
sqlglot, and Spark's parser has the last word once Spark runs.
"""

from __future__ import annotations

import difflib
import re

from volume_stream.errors import SqlSyntaxError
from volume_stream.sql.lexer import OP, WORD, Statement, Token, position

__all__ = ["STARTERS", "check", "reworded"]

#: the words a Spark SQL (or volume-stream DDL) statement can start with
STARTERS = frozenset("""
    SELECT WITH VALUES FROM TABLE MAP REDUCE INSERT UPDATE DELETE MERGE REPLACE CREATE DROP ALTER
    SHOW DESCRIBE DESC EXPLAIN USE SET RESET CACHE UNCACHE CLEAR REFRESH ANALYZE MSCK REPAIR
    ADD LIST LOAD TRUNCATE COMMENT DECLARE EXECUTE CALL BEGIN IF WHILE REPEAT FOR LOOP CASE
    LEAVE ITERATE GRANT REVOKE LOCK UNLOCK START COMMIT ROLLBACK EXPORT IMPORT DFS
""".split())

#: what SHOW takes: volume-stream's objects, then Spark's
SHOW_TARGETS = frozenset("""
    VOLUMES STREAMS CONNECTIONS VOLUME STORAGE TABLE TABLES VIEWS DATABASES SCHEMAS NAMESPACES
    FUNCTIONS USER SYSTEM ALL COLUMNS PARTITIONS TBLPROPERTIES CREATE CURRENT CATALOGS
    PROCEDURES COLLATIONS ROLES ROLE GRANT PRINCIPALS COMPACTIONS TRANSACTIONS INDEXES LOCKS
""".split())

_SHOW_SUGGESTIONS = frozenset("""
    VOLUMES STREAMS CONNECTIONS TABLES VIEWS DATABASES SCHEMAS NAMESPACES FUNCTIONS COLUMNS
    PARTITIONS TBLPROPERTIES CATALOGS
""".split())
_COMMON = ("SELECT", "WITH", "INSERT", "CREATE", "SHOW", "DESCRIBE", "DROP", "ALTER", "UPDATE",
           "DELETE", "MERGE")
#: symbols a statement cannot end with
_OPEN_ENDED = frozenset(",=<>+-/%(.|&^!")


def _error(statement: Statement, message: str, token: Token, *, at_end: bool = False,
           expected: tuple[str, ...] = ()) -> SqlSyntaxError:
    offset = token.pos + len(token.text) if at_end else token.pos
    line, column = position(statement.script, offset)
    found = "the end of the statement" if at_end else token.describe()
    return SqlSyntaxError(message, line, column, expected=expected, found=found,
                          snippet=statement.snippet(offset))


def _suggest(word: str, choices: frozenset[str]) -> str:
    match = difflib.get_close_matches(word.upper(), sorted(choices), n=1, cutoff=0.7)
    return f"did you mean {match[0]}? " if match else ""


def check(statement: Statement) -> None:
    """Raise a `SqlSyntaxError` for a statement plainly not SQL (see the module's list)."""
    tokens = statement.tokens
    if not tokens:
        return
    first = tokens[0]
    if not (first.kind == OP and first.text == "("):
        if first.kind != WORD or first.upper not in STARTERS:
            raise _error(statement, f"{first.describe()} does not start a SQL statement; "
                                    f"{_suggest(first.value, STARTERS)}a statement starts with "
                                    f"{', '.join(_COMMON)}, ...", first, expected=_COMMON)
    if first.upper == "SHOW":
        if len(tokens) == 1:
            raise _error(statement, "SHOW what? e.g. SHOW VOLUMES, SHOW STREAMS, SHOW TABLES",
                         first, at_end=True, expected=("VOLUMES", "STREAMS", "TABLES"))
        what = tokens[1]
        if what.kind != WORD or what.upper not in SHOW_TARGETS:
            raise _error(statement, f"SHOW cannot show {what.describe()}; "
                                    f"{_suggest(what.value, _SHOW_SUGGESTIONS)}SHOW takes VOLUMES, "
                                    f"STREAMS, CONNECTIONS, TABLES, VIEWS, FUNCTIONS, ...",
                         what, expected=("VOLUMES", "STREAMS", "TABLES"))
    last = tokens[-1]
    if last.kind == OP and last.text in _OPEN_ENDED and len(tokens) > 1:
        raise _error(statement, f"the statement ends after {last.describe()}; something must "
                                f"follow it", last, at_end=True)


# ---------------------------------------------------------------------- sqlglot's errors
_REQUIRED = re.compile(r"Required keyword: '(\w+)' missing for <class '[\w.]*?(\w+)'>")
_EXPECTED = re.compile(r"Expected (.+?) but got <Token token_type: TokenType\.(\w+), "
                       r"text: (.*?), line:")
_CONDITIONS = {"Where", "Having", "Qualify", "Join", "If"}


def _what(kind: str, node: str) -> str:
    if node in _CONDITIONS:
        return "a condition"
    if node in ("Order", "Group", "Cluster", "Distribute", "Sort"):
        return "the columns"
    if node in ("Limit", "Offset", "Fetch"):
        return "a number"
    return "a table" if kind == "table" else "an expression"


def _located(statement: Statement, info: dict) -> Token | None:
    """The statement's token sqlglot's error names (by its line, end column and text)."""
    line, col, highlight = info.get("line"), info.get("col"), info.get("highlight") or ""
    if not line or not col:
        return None
    lines = statement.text.split("\n")
    line = min(line, len(lines))
    start = sum(len(x) + 1 for x in lines[:line - 1]) + max(0, col - len(highlight))
    pos = statement.pos + start
    for token in statement.tokens:  # the token there, else the last one before it
        if token.pos <= pos < token.pos + max(1, len(token.text)):
            return token
    before = [t for t in statement.tokens if t.pos <= pos]
    return before[-1] if before else None


def reworded(statement: Statement, exc: Exception) -> SqlSyntaxError:
    """sqlglot's parse error as a `SqlSyntaxError` in our words, pointing at the token."""
    info = (getattr(exc, "errors", None) or [{}])[0]
    description = info.get("description") or str(exc).splitlines()[0]
    token = _located(statement, info) or statement.tokens[-1]
    nxt = [t for t in statement.tokens if t.pos > token.pos]
    after = f"after {token.describe()}"
    required = _REQUIRED.search(description)
    expected = _EXPECTED.search(description)
    if required:
        what = _what(required.group(1), required.group(2))
        if nxt:
            return _error(statement, f"expected {what} {after}, found {nxt[0].describe()}",
                          nxt[0])
        return _error(statement, f"expected {what} {after}, found the end of the statement",
                      token, at_end=True)
    if expected:
        what, kind, text = expected.groups()
        what = re.sub(r"^table name$", "a table name", what)
        if kind == "SENTINEL" or not nxt:
            return _error(statement, f"expected {what} {after}, found the end of the "
                                     f"statement", token, at_end=True)
        return _error(statement, f"expected {what}, found {text!r}", nxt[0])
    if description.startswith("Expecting "):
        want = description.removeprefix("Expecting ").strip()
        if not nxt:
            return _error(statement, f"expected {want!r} {after}, found the end of the "
                                     f"statement", token, at_end=True)
        return _error(statement, f"expected {want!r}, found {token.describe()}", token)
    if description.startswith("Invalid expression / Unexpected token"):
        return _error(statement, f"unexpected {token.describe()}", token)
    if "<" in description and ("class" in description or "Token" in description):
        description = "cannot read the statement here"  # sqlglot's internals: not for users
    return _error(statement, description[:1].lower() + description[1:], token)
