"""Reading a directory table's change data feed for a version range (`DirectoryTable.changes`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table.kept import VersionsGone, is_missing_file, oldest_readable
from directory_table.layout import Layout, bucket_array, plain_types
from directory_table.schema import BUCKET_FIELD, TABLE_SCHEMA

__all__ = ["changes", "read_cdf"]


class _Table(Protocol):
    """What `changes` needs of a `DirectoryTable`."""

    path: str
    storage_options: dict[str, str]

    def reader(self, up_to: int) -> DeltaTable: ...

    def delta(self, version: int | None = None) -> DeltaTable: ...


def changes(table: _Table, after_version: int, up_to_version: int,
            buckets: Iterable[int] | None = None, columns: Iterable[str] | None = None
            ) -> pa.Table:
    """The change data feed of `table`'s versions (after_version, up_to_version].

    Each row keeps its `_bucket` (for a table in the pre-bucket layout: the bucket the path
    will have once migrated, or 0); `buckets` keeps only those buckets' changes. The commit
    that migrated the table into buckets rewrote every row unchanged: it is not part of any
    range. The table's open Delta handle is read as it is unless a commit of the range
    changes metadata (`DirectoryTable.reader`). A range whose files a VACUUM removed raises
    `kept.VersionsGone` (naming the oldest version a range still reads from). `columns`
    reads only those of the table's columns (and `_change_type`, `_commit_version`,
    `_bucket`): the others' Parquet columns are not decoded.
    """
    schema = _schema(columns)
    if up_to_version <= after_version:
        return schema.empty_table()
    try:
        return _changes(table, after_version, up_to_version, buckets, schema)
    except Exception as exc:
        if not is_missing_file(exc):
            raise
        oldest = oldest_readable(table.path, after_version, up_to_version,
                                 table.storage_options)
        if oldest <= after_version:
            raise  # every file of the range is there: another failure
        raise VersionsGone(table.path, after_version, up_to_version, oldest) from exc


def _changes(table: _Table, after_version: int, up_to_version: int,
             buckets: Iterable[int] | None, schema: pa.Schema) -> pa.Table:
    wanted = sorted(set(buckets)) if buckets is not None else None
    dt = table.reader(up_to_version)
    layout = Layout.of(dt)
    m = layout.migrated_version
    segments = [(after_version, up_to_version, dt, True)]
    if m is not None and after_version < m <= up_to_version:
        # before the migration the table had another layout: read it at that version
        segments = [(after_version, m - 1, table.delta(m - 1), False),
                    (m, up_to_version, dt, True)]
    elif m is not None and up_to_version < m:
        segments = [(after_version, up_to_version, table.delta(up_to_version), False)]
    parts = [read_cdf(seg_dt, a, b, layout, bucketed and layout.bucketed, wanted, schema)
             for a, b, seg_dt, bucketed in segments if b > a]
    parts = [p for p in parts if p.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def read_cdf(dt: DeltaTable, after: int, up_to: int, layout: Layout, bucketed: bool,
             buckets: list[int] | None, schema: pa.Schema | None = None) -> pa.Table:
    """Change rows of versions (after, up_to] of `dt`, with `_bucket`, cast to one schema
    (`_CDF_SCHEMA`, or `schema`: some of its columns, the others not read)."""
    schema = schema or _CDF_SCHEMA
    predicate = None
    if bucketed and buckets is not None:
        predicate = f"{BUCKET_FIELD.name} IN ({', '.join(map(str, buckets)) or 'NULL'})"
    read = None
    if schema != _CDF_SCHEMA:  # an unbucketed table's `_bucket` is made from the path
        read = [n for n in schema.names if bucketed or n != BUCKET_FIELD.name]
        read += [] if bucketed or "relative_path" in read else ["relative_path"]
    reader = dt.load_cdf(starting_version=after + 1, ending_version=up_to,
                         predicate=predicate, columns=read)
    # delta-rs hands out view types (string_view, binary_view); normalise to plain ones
    table = plain_types(pa.RecordBatchReader.from_stream(reader).read_all())
    if not bucketed or BUCKET_FIELD.name not in table.column_names:
        table = table.append_column(BUCKET_FIELD, bucket_array(
            table["relative_path"].to_pylist(), layout.buckets))
    table = table.select(schema.names).cast(schema)
    if buckets is not None:
        table = table.filter(pc.is_in(table[BUCKET_FIELD.name],
                                      value_set=pa.array(buckets, pa.int32())))
    return table


_CDF_SCHEMA = TABLE_SCHEMA.append(pa.field("_change_type", pa.string())).append(
    pa.field("_commit_version", pa.int64())).append(BUCKET_FIELD)


def _schema(columns: Iterable[str] | None) -> pa.Schema:
    """The CDF's schema with only `columns` of the table's (all: None)."""
    if columns is None:
        return _CDF_SCHEMA
    wanted = {*columns, "_change_type", "_commit_version", BUCKET_FIELD.name}
    unknown = wanted - set(_CDF_SCHEMA.names)
    if unknown:
        raise ValueError(f"no such columns in a directory table's change feed: {sorted(unknown)}")
    return pa.schema([f for f in _CDF_SCHEMA if f.name in wanted])
