"""Small helpers of the table store: plain Arrow types, integer columns, quoted names, an
error's first line."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["first_line", "integers", "plain", "quote"]


def plain(table: pa.Table) -> pa.Table:
    """delta-rs hands out view types (string_view, binary_view): normalise to plain ones."""
    fields = []
    for f in table.schema:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(pa.field(f.name, t, metadata=f.metadata))
    schema = pa.schema(fields)
    return table if schema.equals(table.schema) else table.cast(schema)



def integers(schema: pa.Schema) -> set[str]:
    """The (lower-cased) names of the integer columns of `schema`."""
    return {f.name.lower() for f in schema if pa.types.is_integer(f.type)}


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (at most 300 characters), or its type's name."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def quote(name: str) -> str:
    """`name` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'
