"""Table Stream semantics on warehouse tables: the change data feed of (a, b] turned into change
records `__change_type, __commit_version, __commit_timestamp, <the table's columns>`.

The rule is the volume streams' one (`volume_stream.streams.changes`, DESIGN §5) with the row id as
the key: STANDARD is the minimal change set per row between the offset `a` and `b` — the first
CDF row of a row id tells whether it existed at `a` (a pre-image or delete is its image at
`a`), the last whether it exists at `b`; inserted then updated = one INSERT of the latest
image; inserted then deleted = nothing; changed back to the old value = nothing; several
updates = one UPDATE_BEFORE (image at `a`) and one UPDATE_AFTER (image at `b`). Old images
carry the version that wrote them (`_vs_row_version`), as in the seed's tables. APPEND_ONLY is
every inserted image of the range. Pure Arrow, no I/O.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from volume_stream.tables.store import ROW_ID, ROW_VERSION
from volume_stream.tables.types import TS

__all__ = ["META", "append_only", "initial", "keyed", "record_schema", "standard"]

META = ("__change_type", "__commit_version", "__commit_timestamp")
_OLD = pa.array(["update_preimage", "delete"])
_NEW = pa.array(["insert", "update_postimage"])


def record_schema(columns: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field("__change_type", pa.string()),
                      pa.field("__commit_version", pa.int64()),
                      pa.field("__commit_timestamp", TS), *columns])


def _records(rows: pa.Table, change_type: str, columns: pa.Schema,
             times: dict[int, datetime], version_col: str) -> pa.Table:
    versions = rows[version_col].cast(pa.int64())
    known = sorted(times)
    idx = pc.index_in(versions, value_set=pa.array(known, pa.int64()))
    stamps = pa.array([times[v] for v in known], TS).take(idx) if known \
        else pa.nulls(rows.num_rows, TS)
    arrays = [pa.array([change_type] * rows.num_rows, pa.string()), versions, stamps]
    arrays += [rows[f.name] for f in columns]
    return pa.Table.from_arrays(arrays, schema=record_schema(columns))


def _sorted(records: pa.Table, keys: pa.ChunkedArray | None = None) -> pa.Table:
    if records.num_rows == 0:
        return records
    sort = [("__commit_version", "ascending")]
    if keys is not None:
        records = records.append_column("_k", keys)
        sort.append(("_k", "ascending"))
    # 'UPDATE_BEFORE' > 'UPDATE_AFTER': descending puts the old image first
    sort.append(("__change_type", "descending"))
    records = records.take(pc.sort_indices(records, sort))
    return records.drop_columns(["_k"]) if keys is not None else records


def standard(cdf: pa.Table, columns: pa.Schema, times: dict[int, datetime]) -> pa.Table:
    """The minimal change set of a CDF range keyed by row id (see module docstring)."""
    if cdf.num_rows == 0:
        return record_schema(columns).empty_table()
    phase = pc.if_else(pc.is_in(cdf["_change_type"], _OLD), 0, 1).cast(pa.int8())
    cdf = cdf.append_column("_phase", phase)
    cdf = cdf.take(pc.sort_indices(cdf, [(ROW_ID, "ascending"),
                                         ("_commit_version", "ascending"),
                                         ("_phase", "ascending")]))
    cdf = cdf.append_column("_i", pa.array(range(cdf.num_rows), pa.int64()))
    bounds = (cdf.select([ROW_ID, "_i"]).group_by(ROW_ID, use_threads=False)
              .aggregate([("_i", "min"), ("_i", "max")]))
    first = cdf.take(bounds["_i_min"])
    last = cdf.take(bounds["_i_max"])
    at_a = pc.is_in(first["_change_type"], _OLD)
    at_b = pc.is_in(last["_change_type"], _NEW)
    differs = pc.invert(_same(first, last, columns))
    deletes = first.filter(pc.and_(at_a, pc.invert(at_b)))
    inserts = last.filter(pc.and_(pc.invert(at_a), at_b))
    both = pc.and_(pc.and_(at_a, at_b), differs)
    befores, afters = first.filter(both), last.filter(both)
    parts = [(deletes, "DELETE"), (inserts, "INSERT"), (befores, "UPDATE_BEFORE"),
             (afters, "UPDATE_AFTER")]
    # listed in the order the changes happened (an UPDATE_BEFORE beside its UPDATE_AFTER)
    records = pa.concat_tables([_records(t, ct, columns, times, ROW_VERSION) for t, ct in parts])
    happened = [last.filter(m)["_commit_version"].combine_chunks() for m in
                (pc.and_(at_a, pc.invert(at_b)), pc.and_(pc.invert(at_a), at_b), both, both)]
    keys = [t[ROW_ID].combine_chunks() for t, _ in parts]
    records = records.append_column("_v", pa.concat_arrays(happened).cast(pa.int64()))
    records = records.append_column("_k", pa.concat_arrays(keys))
    records = records.take(pc.sort_indices(records, [("_v", "ascending"), ("_k", "ascending"),
                                                     ("__change_type", "descending")]))
    return records.drop_columns(["_v", "_k"])


def _same(a: pa.Table, b: pa.Table, columns: pa.Schema) -> pa.ChunkedArray:
    same = pa.chunked_array([pa.array([True] * a.num_rows, pa.bool_())])
    for f in columns:
        eq = pc.fill_null(pc.equal(a[f.name], b[f.name]), False)
        both_null = pc.and_(pc.is_null(a[f.name]), pc.is_null(b[f.name]))
        if pa.types.is_floating(f.type):  # NaN equals NaN (as Spark compares them)
            both_null = pc.or_(both_null, pc.fill_null(
                pc.and_(pc.is_nan(a[f.name]), pc.is_nan(b[f.name])), False))
        same = pc.and_(same, pc.or_(eq, both_null))
    return same


def append_only(cdf: pa.Table, columns: pa.Schema, times: dict[int, datetime]) -> pa.Table:
    """Every inserted image of the range; later updates and deletes do not affect it."""
    inserts = cdf.filter(pc.equal(cdf["_change_type"], "insert"))
    keys = inserts[ROW_ID] if ROW_ID in inserts.column_names else None
    return _sorted(_records(inserts, "INSERT", columns, times, "_commit_version"), keys)


def initial(snapshot: pa.Table, columns: pa.Schema, times: dict[int, datetime]) -> pa.Table:
    """A snapshot (with its hidden columns) shown as INSERTs with the version of each image."""
    keys = snapshot[ROW_ID] if ROW_ID in snapshot.column_names else None
    return _sorted(_records(snapshot, "INSERT", columns, times, ROW_VERSION), keys)


def keyed(cdf: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """A change feed of a table without row ids (a registered one) given row identity by its
    key: one `_vs_row_id` per distinct key value, and every image dated by the change that
    shows it (`_vs_row_version` = `_commit_version`: Delta records no version that wrote a row
    of a table it did not write, so an old image carries the version that replaced it)."""
    text = [pc.fill_null(pc.cast(cdf[k], pa.string()), "\x00") for k in key]
    joined = text[0] if len(text) == 1 else pc.binary_join_element_wise(*text, "\x1f")
    ids = pc.rank(joined.combine_chunks(), sort_keys="ascending",
                  tiebreaker="dense").cast(pa.int64())  # ordered by key, so output is stable
    versions = cdf["_commit_version"].cast(pa.int64())
    return cdf.append_column(ROW_ID, ids).append_column(ROW_VERSION, versions)
