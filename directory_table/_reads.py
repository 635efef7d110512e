"""Reading a directory table's rows straight from its local data files (`local_rows`)."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from directory_table.layout import Layout
from directory_table.schema import BUCKET_FIELD, BUCKETED_SCHEMA

__all__ = ["local_rows"]


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
