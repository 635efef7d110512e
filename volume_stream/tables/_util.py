"""Small helpers of the table store: plain Arrow types, integer columns, quoted names, an
error's first line."""

from __future__ import annotations

import pyarrow as pa
from deltalake.exceptions import DeltaError

from volume_stream.errors import InvalidInputError, VolumeStreamError, storage_full

__all__ = ["first_line", "integers", "is_panic", "plain", "quote", "statement_error"]


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


def is_panic(exc: BaseException) -> bool:
    """Whether `exc` is a Rust panic raised through PyO3 (`pyo3_runtime.PanicException`, a
    BaseException, so `except Exception` lets it through)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


def statement_error(name: str, exc: BaseException) -> VolumeStreamError | None:
    """What a failed delta-rs write of table `name` raises: a full disk's `WarehouseError`,
    or an `InvalidInputError` for the statement (delta-rs's DeltaError, the bare Exception of
    DataFusion's planning and cast errors, a panic); None for anything else (raised as is)."""
    full = storage_full(f"table {name!r}", exc) if isinstance(exc, Exception) else None
    if full is not None:
        return full
    if isinstance(exc, DeltaError) or type(exc) is Exception or is_panic(exc):
        return InvalidInputError(f"table {name!r}: the statement cannot run on this table: "
                                 f"{first_line(exc)}; nothing was written")
    return None
