"""SQL column types of warehouse tables and their Arrow types, and the checked cast of rows
into a table's schema (a type mismatch is refused, never silently coerced).

    arrow_type("DECIMAL(10, 2)")   # -> decimal128(10, 2)
    conform(rows, schema, table="t")
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from volume_stream.errors import InvalidInputError

__all__ = ["arrow_type", "conform", "sql_type"]

TS = pa.timestamp("us", tz="UTC")
_SIMPLE = {
    "TINYINT": pa.int8(), "BYTE": pa.int8(), "SMALLINT": pa.int16(), "SHORT": pa.int16(),
    "INT": pa.int32(), "INTEGER": pa.int32(), "BIGINT": pa.int64(), "LONG": pa.int64(),
    "FLOAT": pa.float32(), "REAL": pa.float32(), "DOUBLE": pa.float64(),
    "STRING": pa.string(), "VARCHAR": pa.string(), "CHAR": pa.string(), "TEXT": pa.string(),
    "BOOLEAN": pa.bool_(), "BOOL": pa.bool_(), "DATE": pa.date32(), "TIMESTAMP": TS,
    "TIMESTAMP_LTZ": TS, "TIMESTAMP_NTZ": pa.timestamp("us"), "BINARY": pa.binary(),
}
_TYPE = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?\s*$")


def arrow_type(sql: str) -> pa.DataType:
    """The Arrow type of a SQL column type (VARCHAR(n) and CHAR(n) are strings)."""
    m = _TYPE.match(sql or "")
    name = m.group(1).upper() if m else ""
    if name in ("DECIMAL", "NUMERIC", "DEC"):
        precision = int(m.group(2) or 10)
        scale = int(m.group(3) or 0)
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise InvalidInputError(f"invalid type {sql!r}: DECIMAL(p, s) needs 1 <= p <= 38 "
                                    f"and 0 <= s <= p")
        return pa.decimal128(precision, scale)
    if name in _SIMPLE:
        return _SIMPLE[name]
    raise InvalidInputError(f"unsupported column type {sql!r}; supported: "
                            f"{', '.join(sorted(_SIMPLE))}, DECIMAL(p, s)")


def sql_type(t: pa.DataType) -> str:
    """The SQL name of an Arrow type (as DESCRIBE TABLE shows it)."""
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    names = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT",
             pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
             pa.string(): "STRING", pa.large_string(): "STRING", pa.bool_(): "BOOLEAN",
             pa.date32(): "DATE", pa.binary(): "BINARY"}
    return names.get(t, str(t).upper())


def _a(word: str) -> str:
    """`word` with its article, as it is read: "an INT", "a STRING", "an ARRAY<...>"."""
    return f"{'an' if word[:1].upper() in 'AEIOU' else 'a'} {word}"


def _family(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "time"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def conform(rows: pa.Table, schema: pa.Schema, *, table: str,
            columns: list[str] | None = None) -> pa.Table:
    """`rows` cast to `schema`, matched by position (or to `columns`, the others null).

    Numbers convert among themselves when the value fits, timestamps and dates likewise;
    strings never become numbers or the reverse.

    Raises:
        InvalidInputError: wrong column count, an unknown column, a type mismatch, or a value
            that does not fit, naming the table and the column.
    """
    names = columns if columns is not None else schema.names
    unknown = [c for c in names if c not in schema.names]
    if unknown:
        raise InvalidInputError(f"table {table!r} has no column(s) {unknown} (columns: "
                                f"{', '.join(schema.names)})")
    if rows.num_columns != len(names):
        raise InvalidInputError(f"table {table!r}: {len(names)} column(s) expected "
                                f"({', '.join(names)}), the data has {rows.num_columns}")
    given = dict(zip(names, rows.columns, strict=True))
    out = []
    for field in schema:
        col = given.get(field.name)
        if col is None:
            out.append(pa.nulls(rows.num_rows, field.type))
            continue
        src, dst = _family(col.type), _family(field.type)
        if src != "null" and src != dst:
            raise InvalidInputError(
                f"table {table!r}, column {field.name!r}: cannot store {_a(sql_type(col.type))} "
                f"value in {_a(sql_type(field.type))} column (type mismatch)")
        try:
            if pa.types.is_timestamp(col.type) and pa.types.is_timestamp(field.type) \
                    and col.type.tz is None and field.type.tz is not None:
                col = pc.assume_timezone(col, "UTC")
            out.append(col.cast(field.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidInputError(f"table {table!r}, column {field.name!r}: a value does "
                                    f"not fit {sql_type(field.type)} ({exc})") from exc
    return pa.Table.from_arrays(out, schema=schema)
