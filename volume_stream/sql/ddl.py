"""A hand-written parser for the seed's DDL: storage connections, external volumes, streams on
volumes, and their ALTER / DROP / SHOW / DESCRIBE statements (DESIGN §8).

`parse(statement)` returns a small frozen dataclass per statement, or None when the statement
is not DDL of ours (then it is Spark SQL). Keywords are case-insensitive; names are validated
identifiers (letters, digits, '_'; backticks allowed but the same rule applies), so no name
can carry SQL anywhere. Every error is a `SqlSyntaxError` with the line, the column, what was
expected and what was found.

    CREATE [OR REPLACE] STORAGE CONNECTION [IF NOT EXISTS] c TYPE OSS
        ENDPOINT = '...' REGION = '...' ROLE_ARN = '...' | ACCESS_ID = ENV('VAR') ...
    CREATE [OR REPLACE] EXTERNAL VOLUME [IF NOT EXISTS] v LOCATION '...' [USING CONNECTION c]
        [NOTIFICATION = (QUEUE_TYPE = '...', QUEUE_NAME = '...', VIRTUAL_CLUSTER = '...')]
        [DIRECTORY = (ENABLE = TRUE [, AUTO_REFRESH = TRUE])] [RECURSIVE = TRUE | FALSE]
    CREATE [OR REPLACE] [TABLE] STREAM [IF NOT EXISTS] s ON VOLUME v [TIMESTAMP AS OF expr]
        [COMMENT = '...'] [WITH PROPERTIES ('TABLE_STREAM_MODE' = '...', ...)]
    ALTER VOLUME v REFRESH
    DROP [STORAGE] CONNECTION | [TABLE] STREAM | [EXTERNAL] VOLUME [IF EXISTS] name [CASCADE]
    SHOW VOLUMES | STREAMS | CONNECTIONS | VOLUME DIRECTORY v
    DESC[RIBE] [STORAGE] CONNECTION | [TABLE] STREAM | [EXTERNAL] VOLUME name
"""

from __future__ import annotations

import re
from typing import Any

from volume_stream.errors import InvalidInputError
from volume_stream.sql.lexer import NUMBER, OP, QUOTED, STRING, WORD, SqlSyntaxError, Statement
from volume_stream.sql.lexer import Token as _Token
from volume_stream.sql.statements import (
    AlterTable,
    AlterVolume,
    CreateConnection,
    CreateStream,
    CreateVolume,
    Describe,
    Drop,
    EnvRef,
    Prop,
    Show,
)
from volume_stream.warehouse import check_name

__all__ = [
    "AlterTable", "AlterVolume", "CreateConnection", "CreateStream", "CreateVolume", "Describe", "Drop",
    "EnvRef", "Prop", "Show", "parse",
]

_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Parser:
    def __init__(self, statement: Statement):
        self.statement = statement
        self.tokens = statement.tokens
        self.i = 0

    # ------------------------------------------------------------------ primitives
    def peek(self, k: int = 0) -> _Token:
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else self.statement.end_token()

    def next(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def error(self, message: str, token: _Token | None = None,
              expected: tuple[str, ...] = ()) -> SqlSyntaxError:
        token = token or self.peek()
        found = token.describe()
        if expected:
            shown = " or ".join(expected) if len(expected) <= 3 else \
                "one of " + ", ".join(expected)
            message = f"{message}: expected {shown}, found {found}"
        # a connection's line may hold a secret: never echo it back
        secret = self.statement.keyword == "CREATE" and any(
            t.upper == "CONNECTION" for t in self.tokens[:6])
        snippet = "" if secret else self.statement.snippet(token.pos)
        return SqlSyntaxError(message, token.line, token.column, expected=expected, found=found,
                              snippet=snippet)

    def at(self, *words: str) -> bool:
        return all(self.peek(k).upper == w for k, w in enumerate(words))

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str, context: str = "") -> None:
        for word in words:
            if not self.accept(word):
                raise self.error(context or "unexpected token", expected=(word,))

    def accept_op(self, op: str) -> bool:
        token = self.peek()
        if token.kind == OP and token.text == op:
            self.i += 1
            return True
        return False

    def expect_op(self, op: str, context: str) -> None:
        if not self.accept_op(op):
            raise self.error(context, expected=(f"'{op}'",))

    def identifier(self, what: str) -> str:
        token = self.peek()
        if token.kind not in (WORD, QUOTED):
            raise self.error(f"{what} name missing", expected=(f"a {what} name",))
        self.i += 1
        if self.peek().kind == OP and self.peek().text == ".":
            raise self.error(f"{what} names are not qualified (volume-stream has no schemas); "
                             f"write just the name", token)
        try:
            check_name(what, token.value)
        except InvalidInputError as exc:
            raise self.error(str(exc), token) from exc
        return token.value

    def string(self, what: str) -> str:
        token = self.peek()
        if token.kind != STRING:
            raise self.error(what, expected=("a string literal",))
        self.i += 1
        return token.value

    def value(self, key: str) -> Prop:
        token = self.peek()
        if token.kind == STRING:
            self.i += 1
            return Prop(token.value, token)
        if token.kind == NUMBER:
            self.i += 1
            text = token.value
            return Prop(float(text) if any(c in text for c in ".eE") else int(text), token)
        if token.kind == WORD:
            if token.upper in ("TRUE", "FALSE"):
                self.i += 1
                return Prop(token.upper == "TRUE", token)
            if token.upper == "ENV" and self.peek(1).text == "(":
                self.i += 2
                var_token = self.peek()
                var = self.string("ENV() takes the name of an environment variable")
                if not _ENV_VAR.match(var):
                    raise self.error(f"invalid environment variable name {var!r}", var_token)
                self.expect_op(")", "ENV(...) is not closed")
                return Prop(EnvRef(var), token)
            self.i += 1
            return Prop(token.value, token)  # a bare word, e.g. TYPE OSS
        raise self.error(f"value of {key} missing",
                         expected=("a string literal", "TRUE", "FALSE", "a number", "ENV('VAR')"))

    def key(self, what: str) -> _Token:
        token = self.peek()
        if token.kind == WORD:
            self.i += 1
            return token
        if token.kind == STRING and what == "property":  # WITH PROPERTIES ('KEY' = ...)
            self.i += 1
            return token
        raise self.error(f"{what} name missing", expected=(f"a {what} name",))

    def prop_list(self, what: str, *, parens: bool = True) -> dict[str, Prop]:
        """`(K = v, K = v)` (commas optional), or without parens until a non-property token."""
        props: dict[str, Prop] = {}
        if parens:
            self.expect_op("(", f"{what} takes a parenthesised list")
        while True:
            if parens and self.accept_op(")"):
                return props
            if not parens and self.peek().kind != WORD:
                return props
            key_token = self.key("property")
            key = key_token.value.upper()
            if key in props:
                raise self.error(f"{key} is given twice in {what}", key_token)
            self.expect_op("=", f"after {key}")
            props[key] = self.value(key)
            self.accept_op(",")
            if parens and self.peek().kind == "end":
                raise self.error(f"{what} list is not closed", expected=("')'",))

    def done(self, what: str) -> None:
        if self.peek().kind != "end":
            raise self.error(f"unexpected text after {what}", expected=("the end of the statement",))

    def if_not_exists(self) -> bool:
        if self.accept("IF"):
            self.expect("NOT", "EXISTS", context="IF NOT EXISTS")
            return True
        return False

    # ------------------------------------------------------------------ statements
    def create(self) -> Any:
        self.expect("CREATE")
        replace = self.accept("OR", "REPLACE")
        if self.accept("STORAGE"):
            self.expect("CONNECTION", context="CREATE STORAGE")
            return self.create_connection(replace)
        if self.accept("EXTERNAL"):
            self.expect("VOLUME", context="CREATE EXTERNAL")
            return self.create_volume(replace)
        if self.accept("VOLUME"):
            return self.create_volume(replace)
        self.accept("TABLE")
        self.expect("STREAM", context="CREATE")
        return self.create_stream(replace)

    def _check_replace(self, replace: bool, if_not_exists: bool, token: _Token) -> None:
        if replace and if_not_exists:
            raise self.error("OR REPLACE and IF NOT EXISTS cannot be combined", token)

    def create_connection(self, replace: bool) -> CreateConnection:
        first = self.peek()
        if_not_exists = self.if_not_exists()
        self._check_replace(replace, if_not_exists, first)
        name = self.identifier("connection")
        self.expect("TYPE", context=f"CREATE STORAGE CONNECTION {name}")
        self.accept_op("=")
        type_prop = self.value("TYPE")
        props = self.prop_list("the connection properties", parens=False)
        self.done(f"CREATE STORAGE CONNECTION {name}")
        return CreateConnection(name, str(type_prop.value).upper(),
                                {**props, "TYPE": type_prop}, replace, if_not_exists)

    def create_volume(self, replace: bool) -> CreateVolume:
        first = self.peek()
        if_not_exists = self.if_not_exists()
        self._check_replace(replace, if_not_exists, first)
        name = self.identifier("volume")
        seen: dict[str, Any] = {}
        tokens: dict[str, _Token] = {}
        clauses = ("LOCATION", "USING", "NOTIFICATION", "DIRECTORY", "RECURSIVE",
                   "DATA_RETENTION_DAYS", "DELETION_VECTORS", "INCLUDE", "EXCLUDE", "COMMENT")
        while self.peek().kind != "end":
            token = self.peek()
            clause = token.upper
            if clause not in clauses:
                raise self.error(f"unknown clause in CREATE EXTERNAL VOLUME {name}",
                                 expected=clauses)
            if clause in seen:
                raise self.error(f"{clause} is given twice", token)
            self.i += 1
            tokens[clause] = token
            if clause == "LOCATION":
                tokens["LOCATION"] = self.peek()
                seen[clause] = self.string("LOCATION takes the location as a string literal")
            elif clause == "USING":
                self.expect("CONNECTION", context="USING")
                seen[clause] = self.identifier("connection")
            elif clause in ("NOTIFICATION", "DIRECTORY"):
                self.expect_op("=", f"after {clause}")
                seen[clause] = self.prop_list(clause)
            else:
                self.expect_op("=", f"after {clause}")
                seen[clause] = self.value(clause)
        if "LOCATION" not in seen:
            raise self.error(f"CREATE EXTERNAL VOLUME {name} needs a LOCATION",
                             expected=("LOCATION '...'",))
        recursive = seen.get("RECURSIVE")
        if recursive is not None and not isinstance(recursive.value, bool):
            raise self.error("RECURSIVE takes TRUE or FALSE", recursive.token)
        options = {k: seen[k] for k in ("DATA_RETENTION_DAYS", "DELETION_VECTORS", "INCLUDE",
                                        "EXCLUDE", "COMMENT") if k in seen}
        return CreateVolume(name, seen["LOCATION"], seen.get("USING"), seen.get("NOTIFICATION"),
                            seen.get("DIRECTORY"), None if recursive is None else recursive.value,
                            options, replace, if_not_exists, tokens["LOCATION"],
                            tokens.get("NOTIFICATION"))

    def create_stream(self, replace: bool) -> CreateStream:
        first = self.peek()
        if_not_exists = self.if_not_exists()
        self._check_replace(replace, if_not_exists, first)
        name = self.identifier("stream")
        self.expect("ON", context=f"CREATE STREAM {name}")
        on_table = self.accept("TABLE")
        on_table or self.expect("VOLUME", context=f"CREATE STREAM {name} ON")
        target = self.identifier("table" if on_table else "volume")
        volume, table = ("", target) if on_table else (target, None)
        timestamp = timestamp_expr = comment = None
        props: dict[str, Prop] = {}
        while self.peek().kind != "end":
            if self.accept("TIMESTAMP"):
                self.expect("AS", "OF", context="TIMESTAMP")
                timestamp, timestamp_expr = self.timestamp_expression()
            elif self.accept("COMMENT"):
                self.accept_op("=")
                comment = self.string("COMMENT takes a string literal")
            elif self.accept("WITH"):
                self.expect("PROPERTIES", context="WITH")
                props = self.prop_list("PROPERTIES")
            else:
                raise self.error(f"unexpected text in CREATE STREAM {name}",
                                 expected=("TIMESTAMP AS OF", "COMMENT", "WITH PROPERTIES",
                                           "the end of the statement"))
        return CreateStream(name, volume, props, timestamp, timestamp_expr, comment, replace,
                            if_not_exists, table)

    def timestamp_expression(self) -> tuple[str | None, str | None]:
        start = self.peek()
        if start.kind == "end":
            raise self.error("TIMESTAMP AS OF needs a timestamp", expected=("a timestamp",))
        after = self.peek(1)
        if start.kind == STRING and (after.kind == "end" or after.upper in ("COMMENT", "WITH")):
            self.i += 1
            return start.value, None
        depth, last = 0, start
        while self.peek().kind != "end":
            token = self.peek()
            if depth == 0 and token.upper in ("COMMENT", "WITH"):
                break
            depth += {"(": 1, ")": -1}.get(token.text, 0) if token.kind == OP else 0
            last = self.next()
        text = self.statement.script[start.pos:last.pos + len(last.text)]
        return None, text

    def alter(self) -> AlterVolume | AlterTable:
        self.expect("ALTER")
        if self.accept("TABLE"):
            name = self.identifier("table")
            self.expect("SET", context=f"ALTER TABLE {name}")
            self.accept("PROPERTIES") or self.expect("TBLPROPERTIES", context="SET")
            props = self.prop_list("PROPERTIES")
            self.done(f"ALTER TABLE {name} SET PROPERTIES")
            return AlterTable(name, props)
        self.expect("VOLUME", context="ALTER")
        name = self.identifier("volume")
        if self.accept("SET"):  # the one property a volume's table can change: DESIGN §4.8
            props = self.prop_list("SET", parens=False)
            self.done(f"ALTER VOLUME {name} SET")
            if list(props) != ["DELETION_VECTORS"] or props["DELETION_VECTORS"].value is not True:
                raise self.error(f"ALTER VOLUME {name} SET takes DELETION_VECTORS = TRUE only",
                                 expected=("DELETION_VECTORS = TRUE",))
            return AlterVolume(name, "UPGRADE")
        self.expect("REFRESH", context=f"ALTER VOLUME {name}")
        self.done(f"ALTER VOLUME {name} REFRESH")
        return AlterVolume(name)

    def _kind(self, verb: str) -> str:
        if self.accept("STORAGE"):
            self.expect("CONNECTION", context=f"{verb} STORAGE")
            return "connection"
        if self.accept("CONNECTION"):
            return "connection"
        if self.accept("EXTERNAL"):
            self.expect("VOLUME", context=f"{verb} EXTERNAL")
            return "volume"
        if self.accept("VOLUME"):
            return "volume"
        self.accept("TABLE")
        self.expect("STREAM", context=verb)
        return "stream"

    def drop(self) -> Drop:
        self.expect("DROP")
        kind = self._kind("DROP")
        if_exists = False
        if self.accept("IF"):
            self.expect("EXISTS", context="IF EXISTS")
            if_exists = True
        name = self.identifier(kind)
        cascade = kind == "volume" and self.accept("CASCADE")
        self.done(f"DROP {kind.upper()} {name}")
        return Drop(kind, name, if_exists, cascade)

    def show(self) -> Show:
        self.expect("SHOW")
        if self.accept("VOLUME", "DIRECTORY"):
            name = self.identifier("volume")
            self.done(f"SHOW VOLUME DIRECTORY {name}")
            return Show("directory", name)
        for words, kind in ((("VOLUMES",), "volumes"), (("STREAMS",), "streams"),
                            (("TABLE", "STREAMS"), "streams"), (("CONNECTIONS",), "connections"),
                            (("STORAGE", "CONNECTIONS"), "connections")):
            if self.accept(*words):
                self.done(f"SHOW {' '.join(words)}")
                return Show(kind)
        raise self.error("unknown SHOW", expected=("VOLUMES", "STREAMS", "CONNECTIONS",
                                                   "VOLUME DIRECTORY"))

    def describe(self) -> Describe:
        self.next()  # DESCRIBE | DESC
        self.accept("EXTENDED")
        kind = self._kind("DESCRIBE")
        name = self.identifier(kind)
        self.done(f"DESCRIBE {kind.upper()} {name}")
        return Describe(kind, name)


def _is_ours(tokens: tuple[_Token, ...]) -> bool:
    words = [t.upper for t in tokens[:10]]
    head = words[0] if words else ""
    rest = words[1:]
    if head == "CREATE":
        if rest[:2] == ["OR", "REPLACE"]:
            rest = rest[2:]
        if rest[:1] in (["STORAGE"], ["EXTERNAL"], ["VOLUME"], ["STREAM"]):
            return True
        if rest[:2] == ["TABLE", "STREAM"]:
            # CREATE TABLE STREAM s ON ... (the seed) vs CREATE TABLE stream (...) (Spark)
            k = len(words) - len(rest) + 2 + (3 if rest[2:5] == ["IF", "NOT", "EXISTS"] else 0)
            return k + 1 < len(tokens) and tokens[k + 1].upper == "ON"
        return False
    if head == "ALTER":
        return rest[:1] == ["VOLUME"] or (rest[:1] == ["TABLE"] and rest[2:3] == ["SET"]
                                          and rest[3:4] in (["PROPERTIES"], ["TBLPROPERTIES"]))
    if head in ("DROP", "DESCRIBE", "DESC"):
        if rest[:1] == ["EXTENDED"]:
            rest = rest[1:]
        return rest[:1] in (["STORAGE"], ["CONNECTION"], ["STREAM"], ["VOLUME"],
                            ["EXTERNAL"]) or rest[:2] == ["TABLE", "STREAM"]
    if head == "SHOW":
        return rest[:1] in (["VOLUMES"], ["STREAMS"], ["CONNECTIONS"]) or rest[:2] in (
            ["VOLUME", "DIRECTORY"], ["TABLE", "STREAMS"], ["STORAGE", "CONNECTIONS"])
    return False


def parse(statement: Statement) -> Any | None:
    """The statement as a DDL dataclass, or None if it is Spark SQL."""
    if not statement.tokens or not _is_ours(statement.tokens):
        return None
    parser = _Parser(statement)
    head = statement.keyword
    if head == "CREATE":
        return parser.create()
    if head == "ALTER":
        return parser.alter()
    if head == "DROP":
        return parser.drop()
    if head == "SHOW":
        return parser.show()
    return parser.describe()
