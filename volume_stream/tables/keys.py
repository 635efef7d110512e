"""A table's declared key: the columns its change log is keyed by (issue 25).

Declared with the table (`CREATE TABLE t (a INT, b STRING, PRIMARY KEY (a, b))`, or a column's
`PRIMARY KEY`) or later (`ALTER TABLE t SET TBLPROPERTIES ('key' = 'a,b')`), and kept as the
Delta table property `volume_stream.key` = the column names joined by commas (`''`: none).
The key is not enforced on writes: it names what a change record's `Keys` are and pairs old
and new images of one key in one commit (DESIGN §10.1).
"""

from __future__ import annotations

from collections.abc import Iterable

from volume_stream.errors import InvalidInputError

__all__ = ["KEY_PROPERTY", "check_key", "key_columns", "parse_key"]

KEY_PROPERTY = "volume_stream.key"


def key_columns(key: str | Iterable[str] | None) -> tuple[str, ...]:
    """A key as a tuple of column names: a string is one column, a list or tuple several;
    None or empty: no key."""
    if key is None:
        return ()
    if isinstance(key, str):
        return (key,) if key else ()
    try:
        names = tuple(key)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) and n for n in names):
        raise InvalidInputError(f"a key is a column name or a list of column names, "
                                f"not {key!r}")
    return names


def parse_key(value: str | None) -> tuple[str, ...]:
    """The columns of a `volume_stream.key` property value ("a,b")."""
    return tuple(n.strip() for n in str(value or "").split(",") if n.strip())


def check_key(table: str, key: Iterable[str], columns: Iterable[str]) -> tuple[str, ...]:
    """The key's columns as the table spells them; InvalidInputError naming the table for an
    unknown or repeated column."""
    spelled = {c.lower(): c for c in columns}
    out = []
    for name in key:
        stored = spelled.get(str(name).lower())
        if stored is None:
            raise InvalidInputError(f"table {table!r} has no column {name!r} for its key; "
                                    f"columns: {', '.join(spelled.values())}")
        if stored in out:
            raise InvalidInputError(f"table {table!r}: key column {stored!r} is named twice")
        out.append(stored)
    return tuple(out)
