"""Reading a directory table's rows at one version (`DirectoryTable.snapshot`): straight from
its local data files when it can (`local_rows`), else through delta-rs's dataset."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from directory_table.kept import VersionsGone, is_missing_file, oldest_readable
from directory_table.layout import Layout, bucket_array
from directory_table.schema import BUCKET_FIELD, BUCKETED_SCHEMA

__all__ = ["local_rows", "snapshot"]


def local_rows(dt: DeltaTable, columns: list[str], buckets: Iterable[int] | None,
                 ) -> pa.Table | None:
    """A local table's rows read straight from its data files (a refresh reads them every
    time: 3x faster than delta-rs's dataset at 20k rows); None when that does not apply
    (object stores, partition columns asked for, an unbucketed table and `buckets`)."""
    uris = None
    if BUCKET_FIELD.name not in columns and "://" not in dt.table_uri.replace("file://", ""):
        if buckets is None:
            uris = dt.file_uris()
        elif Layout.of(dt).bucketed:
            wanted = [str(b) for b in sorted(set(buckets))]
            uris = dt.file_uris(file_pruning_predicate=[(BUCKET_FIELD.name, "in", wanted)])
    if uris is None or any("://" in u for u in uris):
        return None
    schema = pa.schema([BUCKETED_SCHEMA.field(n) for n in columns])
    return ds.dataset(uris, schema=schema, format="parquet").to_table(use_threads=False)


def snapshot(dt: DeltaTable, columns: list[str], buckets: Iterable[int] | None, *,
             path: str, latest: int, storage_options: dict[str, str] | None) -> pa.Table:
    """Every row of `dt`'s version (`columns`; `buckets` only), cast to the table's types.

    Raises:
        VersionsGone: a VACUUM removed files of this version (`kept`).
    """
    try:
        table = _rows(dt, columns, buckets)
    except Exception as exc:
        if not is_missing_file(exc):
            raise
        version = dt.version()  # its snapshot is gone: at best the next one reads
        oldest = min(latest, max(version + 1, oldest_readable(path, version, latest,
                                                              storage_options)))
        raise VersionsGone(path, version - 1, version, oldest) from exc
    return table.cast(pa.schema([BUCKETED_SCHEMA.field(n) for n in table.column_names]))


def _rows(dt: DeltaTable, columns: list[str], buckets: Iterable[int] | None) -> pa.Table:
    table = local_rows(dt, columns, buckets)  # None: not local, or `_bucket` asked
    if table is None and buckets is None:
        return dt.to_pyarrow_dataset().to_table(use_threads=False, columns=columns)
    if table is not None:
        return table
    wanted = sorted(set(buckets))
    layout = Layout.of(dt)
    if layout.bucketed:
        dataset = dt.to_pyarrow_dataset(file_pruning_predicate=[
            (BUCKET_FIELD.name, "in", [str(b) for b in wanted])])
        return dataset.to_table(use_threads=False, columns=columns)
    table = dt.to_pyarrow_dataset().to_table(use_threads=False,
                                             columns=list({*columns, "relative_path"}))
    return table.filter(pc.is_in(
        bucket_array(table["relative_path"].to_pylist(), layout.buckets),
        value_set=pa.array(wanted, pa.int32()))).select(columns)
