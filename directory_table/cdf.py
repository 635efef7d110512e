"""Reading a directory table's change data feed for a version range (`DirectoryTable.changes`)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table.layout import Layout, bucket_array, plain_types
from directory_table.schema import BUCKET_FIELD, TABLE_SCHEMA

__all__ = ["read_cdf"]


def read_cdf(dt: DeltaTable, after: int, up_to: int, layout: Layout, bucketed: bool,
             buckets: list[int] | None) -> pa.Table:
    """Change rows of versions (after, up_to] of `dt`, with `_bucket`, cast to one schema."""
    predicate = None
    if bucketed and buckets is not None:
        predicate = f"{BUCKET_FIELD.name} IN ({', '.join(map(str, buckets)) or 'NULL'})"
    reader = dt.load_cdf(starting_version=after + 1, ending_version=up_to,
                         predicate=predicate)
    # delta-rs hands out view types (string_view, binary_view); normalise to plain ones
    table = plain_types(pa.RecordBatchReader.from_stream(reader).read_all())
    if not bucketed or BUCKET_FIELD.name not in table.column_names:
        table = table.append_column(BUCKET_FIELD, bucket_array(
            table["relative_path"].to_pylist(), layout.buckets))
    table = table.select(_CDF_SCHEMA.names).cast(_CDF_SCHEMA)
    if buckets is not None:
        table = table.filter(pc.is_in(table[BUCKET_FIELD.name],
                                      value_set=pa.array(buckets, pa.int32())))
    return table


_CDF_SCHEMA = TABLE_SCHEMA.append(pa.field("_change_type", pa.string())).append(
    pa.field("_commit_version", pa.int64())).append(BUCKET_FIELD)


def _empty_cdf() -> pa.Table:
    return _CDF_SCHEMA.empty_table()
