"""Stream semantics (DESIGN §5): turn the directory table's change data feed between two
versions into the change records a stream returns. Pure Arrow, no Spark, no I/O.

STANDARD gives the minimal change set per path between the offset version `a` and `b`: the
first CDF row of a path in (a, b] tells whether it existed at `a` (a preimage or delete shows
the image at `a`), the last one whether it exists at `b` (an insert or postimage shows the image
at `b`). APPEND_ONLY gives every insert in (a, b]. `__commit_version`/`__commit_timestamp` are
those of the commit that wrote the image shown, so a DELETE or UPDATE_BEFORE carries the
version of the old image, as in the seed's examples.

    records = standard_changes(table.changes(a, b))
"""

from __future__ import annotations

from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from directory_table.schema import PUBLIC_COLUMNS, TS

__all__ = [
    "MODES",
    "RECORD_COLUMNS",
    "RECORD_DDL",
    "RECORD_SCHEMA",
    "StreamMode",
    "append_only_changes",
    "initial_rows",
    "standard_changes",
]

#: the stream modes, the first the default; `StreamMode` is the same as a type (pydantic)
MODES = ("STANDARD", "APPEND_ONLY")
StreamMode = Literal[MODES]  # type: ignore[valid-type]

RECORD_SCHEMA = pa.schema(
    [
        pa.field("relative_path", pa.string()),
        pa.field("url", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("last_modified_time", TS),
        pa.field("etag", pa.string()),
        pa.field("__change_type", pa.string()),
        pa.field("__commit_version", pa.int64()),
        pa.field("__commit_timestamp", TS),
    ]
)

#: the names of a change record's columns, in order
RECORD_COLUMNS = tuple(RECORD_SCHEMA.names)

_DDL_TYPES = {pa.string(): "string", pa.int64(): "bigint", TS: "timestamp"}
#: the change-record schema as a Spark DDL string (the Spark data source's schema)
RECORD_DDL = ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in RECORD_SCHEMA)

# Within one commit a path's old image comes before its new one.
_PHASE = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}
_OLD = ("update_preimage", "delete")
_NEW = ("insert", "update_postimage")


def _records(rows: pa.Table, change_type: str) -> pa.Table:
    n = rows.num_rows
    cols = [rows[c] for c in PUBLIC_COLUMNS]
    cols += [pa.array([change_type] * n, pa.string()), rows["_image_version"],
             rows["_image_timestamp"]]
    return pa.Table.from_arrays(cols, schema=RECORD_SCHEMA)


def _sorted(records: pa.Table) -> pa.Table:
    if records.num_rows == 0:
        return records
    order = pc.sort_indices(records, [("__commit_version", "ascending"),
                                      ("relative_path", "ascending"),
                                      ("__change_type", "descending")])
    # 'UPDATE_BEFORE' > 'UPDATE_AFTER' alphabetically, so descending puts BEFORE first
    return records.take(order)


def standard_changes(cdf: pa.Table) -> pa.Table:
    """The minimal change set of a CDF range (see module docstring)."""
    if cdf.num_rows == 0:
        return RECORD_SCHEMA.empty_table()
    phase = pa.array([_PHASE[t] for t in cdf["_change_type"].to_pylist()], pa.int8())
    cdf = cdf.append_column("_phase", phase)
    cdf = cdf.take(pc.sort_indices(cdf, [("relative_path", "ascending"),
                                         ("_commit_version", "ascending"),
                                         ("_phase", "ascending")]))
    cdf = cdf.append_column("_i", pa.array(range(cdf.num_rows), pa.int64()))
    bounds = (cdf.select(["relative_path", "_i"])
              .group_by("relative_path", use_threads=False)
              .aggregate([("_i", "min"), ("_i", "max")]))
    first = cdf.take(bounds["_i_min"])
    last = cdf.take(bounds["_i_max"])
    at_a = pc.is_in(first["_change_type"], pa.array(_OLD))
    at_b = pc.is_in(last["_change_type"], pa.array(_NEW))
    differs = pc.invert(_same_image(first, last))
    deletes = first.filter(pc.and_(at_a, pc.invert(at_b)))
    inserts = last.filter(pc.and_(pc.invert(at_a), at_b))
    both = pc.and_(pc.and_(at_a, at_b), differs)
    return _sorted(pa.concat_tables([
        _records(deletes, "DELETE"),
        _records(inserts, "INSERT"),
        _records(first.filter(both), "UPDATE_BEFORE"),
        _records(last.filter(both), "UPDATE_AFTER"),
    ]))


def _same_image(a: pa.Table, b: pa.Table) -> pa.ChunkedArray:
    same = None
    for col in PUBLIC_COLUMNS:
        eq = pc.fill_null(pc.equal(a[col], b[col]), False)
        both_null = pc.and_(pc.is_null(a[col]), pc.is_null(b[col]))
        col_same = pc.or_(eq, both_null)
        same = col_same if same is None else pc.and_(same, col_same)
    return same


def append_only_changes(cdf: pa.Table) -> pa.Table:
    """Every INSERT image of the range, overwrites and deletes left out."""
    inserts = cdf.filter(pc.equal(cdf["_change_type"], "insert"))
    return _sorted(_records(inserts, "INSERT"))


def initial_rows(snapshot: pa.Table) -> pa.Table:
    """A snapshot shown as INSERTs (SHOW_INITIAL_ROWS), each with the version that wrote it."""
    return _sorted(_records(snapshot, "INSERT"))
