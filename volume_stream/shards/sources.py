"""What a change log reads: a volume's directory table or a change-tracked warehouse table.

A source names its key column (one key's records stay in one shard, in commit order), its
public columns (what images carry), its bucket count (shards are ranges of buckets), and gives
the change data feed of versions (after, up_to] restricted to a shard's buckets:

- `VolumeSource`: key `relative_path`, the directory table's public columns and buckets; the
  CDF is read bucket-pruned by `DirectoryTable.changes(buckets=...)`, those columns only.
- `TableSource`: a SQL table with change tracking on; key its `key` column(s) (its declared
  key, `tables.keys`; else the hidden row id `_vs_row_id`, which UPDATE and MERGE keep),
  images its visible columns, bucket `crc32(str(key)) % TABLE_BUCKETS` (several columns:
  their `str`s joined by U+001F; `directory_table.layout.bucket_of`, as volumes hash paths);
  the CDF is read whole and filtered to the shard's buckets.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from directory_table import DirectoryTable
from directory_table.layout import bucket_array, bucket_of
from directory_table.schema import PUBLIC_COLUMNS, TABLE_SCHEMA
from volume_stream.errors import InvalidInputError
from volume_stream.shards.model import Shard
from volume_stream.tables.keys import key_columns
from volume_stream.tables.store import CDF, ROW_ID, TableStore

__all__ = ["TABLE_BUCKETS", "TableSource", "VolumeSource", "key_texts", "row_sizes",
           "text_bytes"]

#: the hash buckets of a table's change log (its shards are ranges of them)
TABLE_BUCKETS = 64


def key_texts(cdf: pa.Table, key: str | tuple[str, ...]) -> list[str]:
    """What a table's key hashes as, per row: `str(value)` of a one-column key (as before
    keys could have several columns), else the columns' `str`s joined by U+001F."""
    if isinstance(key, str):
        return [str(k) for k in cdf[key].to_pylist()]
    return ["\x1f".join(map(str, values))
            for values in zip(*(cdf[k].to_pylist() for k in key), strict=True)]


class VolumeSource:
    """A volume's directory table."""

    kind = "volume"
    key = "relative_path"
    columns: tuple[str, ...] = PUBLIC_COLUMNS

    def __init__(self, table: DirectoryTable):
        self.table = table

    @property
    def log_path(self) -> str:
        return f"{self.table.path}/_delta_log"

    @property
    def storage_options(self) -> dict[str, str]:
        return getattr(self.table, "storage_options", None) or {}

    def buckets(self) -> int:
        return self.table.layout().buckets

    def schema(self) -> pa.Schema:
        """The public columns' types."""
        return pa.schema([TABLE_SCHEMA.field(c) for c in PUBLIC_COLUMNS])

    def version(self) -> int:
        return self.table.version()

    def oldest_version(self) -> int:
        return self.table.oldest_version()

    def history(self) -> list[dict[str, Any]]:
        return self.table.history()

    def changes(self, after: int, up_to: int, shard: Shard) -> pa.Table:
        """The shard's CDF rows: the public columns and the change columns only."""
        if not shard.hash_buckets or shard.hash_buckets == self.table.layout().buckets:
            return self.table.changes(after, up_to, buckets=shard.buckets, columns=self.columns)
        cdf, [rows] = self.changes_of(after, up_to, [shard])
        return cdf.take(pa.array(rows))

    def changes_of(self, after: int, up_to: int, shards: list[Shard]
                   ) -> tuple[pa.Table, list[np.ndarray | None]]:
        """One read of every bucket's changes, and the rows of it that are each shard's
        `changes(after, up_to, s)` (indices in order; None: all of them). `_bucket` is the
        bucket the shards' ranges are of: the table's, or, for a table re-bucketed (migrated)
        after the change log was made, the path's hashed into the log's bucket count."""
        cdf = self.table.changes(after, up_to, columns=self.columns)
        n = next((s.hash_buckets for s in shards if s.hash_buckets), 0)
        if n and n != self.table.layout().buckets:
            at = cdf.schema.get_field_index("_bucket")
            cdf = cdf.set_column(at, cdf.schema.field(at), bucket_array(
                cdf["relative_path"].to_pylist(), n).cast(cdf.schema.field(at).type))
        b = cdf["_bucket"].to_numpy()
        return cdf, [np.flatnonzero((b >= s.bucket_lo) & (b < s.bucket_hi)) for s in shards]


class TableSource:
    """A change-tracked warehouse table of `store`, keyed by `key`: the hidden row id, a
    column, or several (a list; `key` is then a tuple, else a name; `key_columns` a tuple)."""

    kind = "table"

    def __init__(self, store: TableStore, name: str,
                 key: str | list[str] | tuple[str, ...] = ROW_ID):
        columns = key_columns(key)
        if not columns:
            raise InvalidInputError(f"table {name!r}: a change log's key names a column, not "
                                    f"{key!r}")
        self.store, self.name = store, name
        self.key_columns: tuple[str, ...] = columns
        self.key: str | tuple[str, ...] = columns[0] if len(columns) == 1 else columns
        if not store.change_tracking(name):
            raise InvalidInputError(
                f"table {name!r} does not have change tracking on, so it has no change log; "
                f"run ALTER TABLE {name} SET PROPERTIES ('change_tracking' = 'true')")
        self.columns = tuple(store.schema(name).names)
        if self.key == ROW_ID and not store.has_row_ids(name):
            raise InvalidInputError(
                f"table {name!r} was not created by volume-stream (no row ids): give its "
                f"change log a key column (key=...), or declare one "
                f"(ALTER TABLE {name} SET TBLPROPERTIES ('key' = '...'))")
        for k in columns:
            if k != ROW_ID and k not in self.columns:
                raise InvalidInputError(f"table {name!r} has no column {k!r} to key its change "
                                        f"log by; columns: {', '.join(self.columns)}")
        self.log_path = f"{store.path(name)}/_delta_log"

    def buckets(self) -> int:
        return TABLE_BUCKETS

    def schema(self) -> pa.Schema:
        """The visible columns' types (and the hidden row id's when it keys the log)."""
        schema = self.store.schema(self.name)
        return schema.append(pa.field(ROW_ID, pa.int64())) if self.key == ROW_ID else schema

    def tracked_since(self) -> int:
        """The version that turned change tracking on (the CDF is readable after it): the
        last kept `SET TBLPROPERTIES` enabling it, else the oldest kept version."""
        for h in self.store.open(self.name).history():  # newest first
            props = (h.get("operationParameters") or {}).get("properties") or ""
            if h.get("operation") == "SET TBLPROPERTIES" and CDF in props and "true" in props:
                return int(h["version"])
        return self.store.oldest_version(self.name)

    def version(self) -> int:
        return self.store.version(self.name)

    def oldest_version(self) -> int:
        return self.store.oldest_version(self.name)

    def history(self) -> list[dict[str, Any]]:
        return [{**h, "version": v, "timestamp": when} for v, when, h in (
            (h["version"], datetime.fromtimestamp(h["timestamp"] / 1000, UTC), h)
            for h in self.store.open(self.name).history())]

    def changes(self, after: int, up_to: int, shard: Shard) -> pa.Table:
        cdf, [rows] = self.changes_of(after, up_to, [shard])
        return cdf if rows is None else cdf.take(pa.array(rows))

    def changes_of(self, after: int, up_to: int, shards: list[Shard]
                   ) -> tuple[pa.Table, list[np.ndarray | None]]:
        """One read of the table's changes, and the rows of it that are each shard's
        `changes(after, up_to, s)` (indices in order; None: all of them), the keys hashed
        once."""
        cdf = self.store.changes(self.name, after, up_to)
        hashed: dict[int, np.ndarray] = {}
        out: list[np.ndarray | None] = []
        for shard in shards:
            n = shard.hash_buckets or TABLE_BUCKETS
            if cdf.num_rows == 0 or (shard.bucket_lo <= 0 and shard.bucket_hi >= n):
                out.append(None)
                continue
            if n not in hashed:
                hashed[n] = np.array([bucket_of(k, n) for k in key_texts(cdf, self.key)],
                                     np.int64)
            b = hashed[n]
            out.append(np.flatnonzero((b >= shard.bucket_lo) & (b < shard.bucket_hi)))
        return cdf, out


def text_bytes(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """The UTF-8 bytes of each string of `col` (what DynamoDB counts), 0 for a null: the
    differences of each chunk's offsets, no pass over the text."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    out = []
    for chunk in chunks:
        n = len(chunk)
        wide = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
        offsets = np.frombuffer(chunk.buffers()[1], wide)[chunk.offset:chunk.offset + n + 1] \
            if n else np.zeros(1, wide)
        lengths = np.diff(offsets)  # (an int64 copy of int32 offsets costs more than the diff)
        if chunk.null_count:  # a null's slot may have bytes
            lengths[pc.is_null(chunk).to_numpy(zero_copy_only=False)] = 0
        out.append(lengths)
    if len(out) == 1:
        return out[0]
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def row_sizes(rows: pa.Table, columns: tuple[str, ...],
              lengths: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Approximate bytes of each row's image as DynamoDB counts them: attribute names plus
    values (strings their UTF-8 bytes, timestamps 32, other values 8); `lengths` keeps the
    string columns' `text_bytes` for another call over the same rows."""
    lengths = {} if lengths is None else lengths
    texts = [c for c in columns if pa.types.is_string(rows.schema.field(c).type)
             or pa.types.is_large_string(rows.schema.field(c).type)]
    fixed = sum(len(c) for c in columns) + sum(
        32 if pa.types.is_timestamp(rows.schema.field(c).type) else 8
        for c in columns if c not in texts)
    sizes = np.full(rows.num_rows, fixed, np.int64)
    for c in texts:
        made = lengths.get(c)
        if made is None:
            made = lengths[c] = text_bytes(rows[c])
        sizes += made
    return sizes
