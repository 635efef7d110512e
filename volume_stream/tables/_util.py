"""Small helpers of the table store: delta-rs calls on a deep stack, and plain Arrow types."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

__all__ = ["deep_stack", "plain"]

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

