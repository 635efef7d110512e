"""Tokens and statements of a SQL script, with line and column of everything.

`split(text)` cuts a script into statements on top-level ';' and hands each its tokens; strings
('...' and "..." with '' doubling and backslash escapes), backtick identifiers, `--` line
comments and (nested) `/* */` comments are understood, so a ';' inside any of them does not
split. Positions are offsets into the whole script, so an error in the third statement of a
file names the file's own line and column. An unterminated string, identifier or comment is a
`SqlSyntaxError` pointing at where it opened.

    >>> [s.keyword for s in split("SHOW VOLUMES; -- done\\nSELECT ';'")]
    ['SHOW', 'SELECT']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from volume_stream.errors import SqlError, SqlSyntaxError

__all__ = ["SqlError", "SqlSyntaxError", "Statement", "Token", "is_complete", "position", "split",
           "tokenize"]

WORD, QUOTED, STRING, NUMBER, OP = "word", "quoted identifier", "string", "number", "symbol"

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"\d+(\.\d*)?([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?")
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}


@dataclass(frozen=True)
class Token:
    """One token: `text` as written, `value` unquoted/unescaped (upper-cased for words is up to
    the reader: use `upper`), `pos` its offset in the script."""

    kind: str
    text: str
    value: str
    pos: int
    line: int
    column: int

    @property
    def upper(self) -> str:
        return self.value.upper() if self.kind == WORD else ""

    def describe(self) -> str:
        """How an error message shows this token (never a string literal's content)."""
        if self.kind == STRING:
            return "a string literal"
        if self.kind == "end":
            return "the end of the statement"
        return repr(self.text)


@dataclass(frozen=True)
class Statement:
    """One statement of a script: its `text` (first to last token, comments inside kept),
    where it starts, and its tokens (the terminating ';' excluded)."""

    text: str
    pos: int
    line: int
    column: int
    tokens: tuple[Token, ...]
    index: int = 0
    script: str = field(default="", repr=False, compare=False)

    @property
    def keyword(self) -> str:
        return self.tokens[0].upper if self.tokens else ""

    def end_token(self) -> Token:
        """A pseudo-token just after the statement's last token, for 'expected ...' errors."""
        last = self.tokens[-1]
        pos = last.pos + len(last.text)
        line, column = position(self.script, pos)
        return Token("end", "", "", pos, line, column)

    def snippet(self, pos: int) -> str:
        """The script line holding `pos` with a caret under it (for error messages)."""
        start = self.script.rfind("\n", 0, pos) + 1
        end = self.script.find("\n", pos)
        text = self.script[start:end if end >= 0 else len(self.script)]
        return f"  {text}\n  {' ' * (pos - start)}^"


def position(text: str, pos: int) -> tuple[int, int]:
    """1-based (line, column) of offset `pos` in `text`."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _quoted(text: str, start: int, quote: str) -> tuple[int, str]:
    """End offset (exclusive) and unescaped value of the quoted run opening at `start`."""
    out: list[str] = []
    i = start + 1
    backslash = quote != "`"
    while i < len(text):
        ch = text[i]
        if ch == quote:
            if i + 1 < len(text) and text[i + 1] == quote:  # '' inside '...'
                out.append(quote)
                i += 2
                continue
            return i + 1, "".join(out)
        if ch == "\\" and backslash and i + 1 < len(text):
            nxt = text[i + 1]
            # unknown escapes keep their backslash, so 'C:\data' stays a Windows path
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    line, column = position(text, start)
    what = "identifier" if quote == "`" else "string"
    raise SqlSyntaxError(f"unterminated {what} (opened here, no closing {quote})", line, column,
                         expected=(quote,), found="the end of the text")


def _comment_end(text: str, start: int) -> int:
    depth, i = 0, start
    while i < len(text) - 1:
        pair = text[i:i + 2]
        if pair == "/*":
            depth += 1
            i += 2
        elif pair == "*/":
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    line, column = position(text, start)
    raise SqlSyntaxError("unterminated comment (opened here, no closing */)", line, column,
                         expected=("*/",), found="the end of the text")


def tokenize(text: str) -> list[Token]:
    """Every token of `text`, comments and whitespace dropped."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    line, line_start = 1, 0

    def at(pos: int) -> tuple[int, int]:
        return line, pos - line_start + 1

    while i < n:
        ch = text[i]
        if ch == "\n":
            line, line_start = line + 1, i + 1
            i += 1
            continue
        if ch.isspace():
            i += 1
            continue
        start = i
        if text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if text.startswith("/*", i):
            end = _comment_end(text, i)
            line += text.count("\n", i, end)
            if "\n" in text[i:end]:
                line_start = text.rfind("\n", i, end) + 1
            i = end
            continue
        if ch in "'\"`":
            end, value = _quoted(text, i, ch)
            kind = QUOTED if ch == "`" else STRING
            tokens.append(Token(kind, text[i:end], value, start, *at(start)))
            newlines = text.count("\n", i, end)
            if newlines:
                line += newlines
                line_start = text.rfind("\n", i, end) + 1
            i = end
            continue
        match = _WORD.match(text, i) if (ch.isalpha() or ch == "_") else None
        if match:
            tokens.append(Token(WORD, match.group(), match.group(), start, *at(start)))
            i = match.end()
            continue
        match = _NUMBER.match(text, i) if (ch.isdigit() or ch == ".") else None
        if match:
            tokens.append(Token(NUMBER, match.group(), match.group(), start, *at(start)))
            i = match.end()
            continue
        tokens.append(Token(OP, ch, ch, start, *at(start)))
        i += 1
    return tokens


def split(text: str) -> list[Statement]:
    """The statements of a script, in order; empty ones (only comments, ';;') are skipped."""
    statements: list[Statement] = []
    current: list[Token] = []

    def flush() -> None:
        if current:
            first, last = current[0], current[-1]
            statements.append(Statement(text[first.pos:last.pos + len(last.text)], first.pos,
                                        first.line, first.column, tuple(current),
                                        len(statements) + 1, text))
            current.clear()

    for token in tokenize(text):
        if token.kind == OP and token.text == ";":
            flush()
        else:
            current.append(token)
    flush()
    return statements


def is_complete(text: str) -> bool:
    """Whether `text` ends a statement (a top-level ';' after the last token): for prompts."""
    try:
        tokens = tokenize(text)
    except SqlSyntaxError:
        return False  # an open string or comment: keep reading
    return bool(tokens) and tokens[-1].kind == OP and tokens[-1].text == ";"
