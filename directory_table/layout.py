"""The bucketed layout of a directory table: what makes a write cost O(batch), not O(files).

Each row carries `_bucket = crc32(relative_path) % B`, the table's Delta partition column; `B`
is fixed when the table is created and recorded in its configuration (`volume_stream.buckets`).
Inside a bucket, rows are written sorted by `relative_path` into files of about
`delta.targetFileSize` bytes, so the min/max statistics of each data file bound the paths it
holds. A batch then touches only its buckets, and inside them only the files whose path range
can hold one of its paths (`touched_files`):

- lookups read those files only (`read_matching`; the rewrite path, `directory_table.rewrite`,
  reads them whole once and rewrites them);
- delta-rs merges (tables in the pre-bucket layout) name the batch's buckets as a literal `IN`
  list (delta-rs prunes partitions on a literal list, not on a join predicate) and, for small
  batches, the paths too (file pruning on min/max statistics).

A table written before this layout existed (no partition column) is read as it is: `Layout`
says `bucketed=False`, every file is a candidate (min/max pruning still applies), and
`DirectoryTable.migrate()` rewrites it into buckets.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

from directory_table.storage import filesystem_for

__all__ = [
    "BUCKETS_KEY",
    "DEFAULT_BUCKETS",
    "DEFAULT_TARGET_FILE_SIZE",
    "MIGRATED_KEY",
    "TARGET_FILE_SIZE_KEY",
    "Layout",
    "bucket_array",
    "bucket_groups",
    "bucket_of",
    "buckets_of",
    "for_layout",
    "in_list",
    "plain_types",
    "read_matching",
    "touched_files",
]

#: table property holding the bucket count
BUCKETS_KEY = "volume_stream.buckets"
#: table property holding the version that rewrote a pre-bucket table into buckets
MIGRATED_KEY = "volume_stream.migrated_version"
#: bucket count of a new table (fixed for its lifetime)
DEFAULT_BUCKETS = 16
#: table property (Delta's own) bounding the size of the data files writers make; delta-rs
#: honours it in appends and compaction, `directory_table.rewrite` in its rewrites
TARGET_FILE_SIZE_KEY = "delta.targetFileSize"
#: data file size of a new table: files of a few thousand rows, sorted by path inside their
#: bucket, so a small batch rewrites little and min/max statistics prune
DEFAULT_TARGET_FILE_SIZE = 128 * 1024
BUCKET_COLUMN = "_bucket"
#: delta-rs truncates long string statistics (1.6: to 64 chars, the max rounded up); a max at
#: least this long is also treated as a possible prefix of the real max, to be safe
_STATS_PREFIX_LEN = 32


def bucket_of(relative_path: str, buckets: int) -> int:
    return zlib.crc32(relative_path.encode()) % buckets if buckets > 1 else 0


def buckets_of(paths: Iterable[str], buckets: int) -> list[int]:
    """`bucket_of` of each of `paths` (one loop, no call per path: batches of 10k paths)."""
    if buckets <= 1:
        return [0 for _ in paths]
    crc32 = zlib.crc32
    return [crc32(p.encode()) % buckets for p in paths]


def bucket_array(paths: Iterable[str], buckets: int) -> pa.Array:
    return pa.array(buckets_of(paths, buckets), pa.int32())


@dataclass(frozen=True)
class Layout:
    """How one version of a table is laid out."""

    #: bucket count used to hash paths (1 for an unpartitioned table)
    buckets: int
    #: True when `_bucket` is the partition column
    bucketed: bool
    #: version that migrated the table into buckets (its change feed is not user data)
    migrated_version: int | None = None

    @classmethod
    def of(cls, dt: DeltaTable) -> Layout:
        meta = dt.metadata()
        bucketed = list(meta.partition_columns) == [BUCKET_COLUMN]
        config = meta.configuration
        if bucketed and BUCKETS_KEY not in config:
            raise ValueError(f"{dt.table_uri}: partitioned by {BUCKET_COLUMN} but no "
                             f"{BUCKETS_KEY} in its configuration")
        buckets = int(config[BUCKETS_KEY]) if bucketed else 1
        migrated = config.get(MIGRATED_KEY)
        return cls(buckets=max(1, buckets), bucketed=bucketed,
                   migrated_version=int(migrated) if bucketed and migrated else None)

    def bucket_of(self, relative_path: str) -> int:
        return bucket_of(relative_path, self.buckets)

    def merge_predicate(self, paths: list[str], max_literal_paths: int = 256) -> str:
        """`t` joined with `s` on the path, with the target restricted by literals to the
        buckets of `paths` and, for up to `max_literal_paths` paths, to the paths within
        each bucket (`(_bucket = 3 AND relative_path IN (...)) OR ...`): delta-rs prunes
        partitions on literal lists, not on join predicates, and a per-bucket path list lets
        min/max statistics skip the files of a bucket that hold none of its paths."""
        parts = []
        by_bucket: dict[int, list[str]] = {}
        for p in paths:
            by_bucket.setdefault(self.bucket_of(p), []).append(p)
        small = len(paths) <= max_literal_paths
        if self.bucketed:
            col = f"t.{BUCKET_COLUMN}"
            parts.append(f"{col} IN ({', '.join(str(b) for b in sorted(by_bucket)) or 'NULL'})")
            if small and paths:
                parts.append("(" + " OR ".join(
                    f"({col} = {b} AND t.relative_path IN ({in_list(ps)}))"
                    for b, ps in sorted(by_bucket.items())) + ")")
        elif small and paths:
            parts.append(f"t.relative_path IN ({in_list(paths)})")
        parts.append("t.relative_path = s.relative_path")
        return " AND ".join(parts)


def bucket_groups(paths: list[str], layout: Layout, limit: int) -> list[list[str]]:
    """`paths` split into groups of whole buckets of at most about `limit` paths each."""
    if len(paths) <= limit:
        return [paths] if paths else []
    buckets = max(layout.buckets, -(-len(paths) // limit))
    by_bucket: dict[int, list[str]] = {}
    for p in paths:
        by_bucket.setdefault(bucket_of(p, buckets), []).append(p)
    groups: list[list[str]] = [[]]
    for b in sorted(by_bucket):
        if groups[-1] and len(groups[-1]) + len(by_bucket[b]) > limit:
            groups.append([])
        groups[-1].extend(by_bucket[b])
    return groups


def for_layout(rows: pa.Table, layout: Layout, buckets: Iterable[int] | None = None,
               order: Iterable[int] | None = None) -> pa.Table:
    """`rows` with their `_bucket` (`buckets`, when the caller knows them), sorted by
    (bucket, path) (`order`: the rows in that order, when the caller knows it), for a
    bucketed table; as they are for a table in the pre-bucket layout."""
    if not layout.bucketed:
        return rows
    rows = rows.append_column(pa.field(BUCKET_COLUMN, pa.int32()),
                              pa.array(buckets, pa.int32()) if buckets is not None else
                              bucket_array(rows["relative_path"].to_pylist(), layout.buckets))
    if order is not None:
        return rows.take(pa.array(order, pa.int64()))
    return rows.sort_by([(BUCKET_COLUMN, "ascending"), ("relative_path", "ascending")])


def in_list(values: Iterable[str]) -> str:
    """SQL string literals, comma separated (quotes doubled)."""
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


def touched_files(dt: DeltaTable, layout: Layout, paths: list[str],
                  actions: pa.Table | None = None) -> list[str]:
    """Data files (paths relative to the table) that may hold one of `paths`: files of the
    paths' buckets whose min/max `relative_path` statistics bracket one of them. `actions`:
    the table's add actions (flattened), when the caller has them already."""
    if not paths:
        return []
    if actions is None:
        actions = pa.table(dt.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    wanted = sorted(set(paths))
    cols = actions.column_names
    files = actions["path"].to_pylist()
    mins = actions["min.relative_path"].to_pylist() if "min.relative_path" in cols else None
    maxs = actions["max.relative_path"].to_pylist() if "max.relative_path" in cols else None
    if layout.bucketed and f"partition.{BUCKET_COLUMN}" in cols:
        by_bucket: dict[int, list[str]] = {}
        for p in wanted:
            by_bucket.setdefault(layout.bucket_of(p), []).append(p)
        parts = actions[f"partition.{BUCKET_COLUMN}"].to_pylist()
    else:
        by_bucket, parts = {0: wanted}, [0] * len(files)
    out = []
    for i, file in enumerate(files):
        candidates = by_bucket.get(int(parts[i]) if parts[i] is not None else -1)
        if candidates is None:
            continue
        lo = mins[i] if mins is not None else None
        hi = maxs[i] if maxs is not None else None
        if _brackets(candidates, lo, hi):
            out.append(file)
    return out


def _brackets(sorted_paths: list[str], lo: str | None, hi: str | None) -> bool:
    """Whether some path p satisfies lo <= p <= hi (None: unbounded). A max as long as the
    statistics' truncation length may be a prefix of the real max: paths it prefixes count."""
    start = bisect.bisect_left(sorted_paths, lo) if lo is not None else 0
    if start >= len(sorted_paths):
        return False
    first = sorted_paths[start]
    if hi is None or first <= hi:
        return True
    return len(hi) >= _STATS_PREFIX_LEN and first.startswith(hi)


def plain_types(table: pa.Table) -> pa.Table:
    """Cast view types (string_view, binary_view) that delta-rs hands out to plain ones."""
    fields = []
    for f in table.schema:
        if pa.types.is_string_view(f.type):
            f = f.with_type(pa.string())
        elif pa.types.is_binary_view(f.type):
            f = f.with_type(pa.binary())
        fields.append(f)
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)


def read_matching(dt: DeltaTable, files: list[str], paths: list[str], columns: list[str],
                  ) -> pa.Table | None:
    """The rows of `paths` found in the given data files (paths relative to the table), in
    one scan filtered as it reads (multi-threaded for a local table). None when nothing matched."""
    if not files:
        return None
    dataset = _files_dataset(dt, files, columns)
    value_set = pa.array(paths, pa.string())
    # Filtered batch by batch in memory, not as a scan filter: delta-rs files can disagree
    # on string vs string_view, which breaks pyarrow's statistics pruning.
    found = []
    # a scan through delta-rs's storage handler stays single-threaded: threaded scans of
    # delta-rs datasets can abort the process at exit (deltalake 1.6 with pyarrow 25/26)
    local = isinstance(dataset.filesystem, pafs.LocalFileSystem)
    for batch in dataset.to_batches(columns=columns, use_threads=local):
        keys = batch.column("relative_path")
        if not pa.types.is_string(keys.type):
            keys = keys.cast(pa.string())
        hits = batch.filter(pc.is_in(keys, value_set=value_set))
        if hits.num_rows:
            found.append(plain_types(pa.Table.from_batches([hits])))
    return pa.concat_tables(found, promote_options="permissive") if found else None


def _files_dataset(dt: DeltaTable, files: list[str], columns: list[str],
                   storage_options: dict[str, str] | None = None) -> ds.Dataset:
    """A dataset of some of the table's data files, in the order given, read as plain
    (non-view) types: straight from the local disk when the table is local, else through
    delta-rs's storage handler."""
    full = dt.schema().to_arrow()
    schema = pa.schema([pa.field(c, _plain(pa.schema(full).field(c).type)) for c in columns])
    uri = dt.table_uri
    if uri.startswith("file://") or "://" not in uri:
        root = uri.removeprefix("file://").rstrip("/")
        return ds.dataset([f"{root}/{unquote(f)}" for f in files], schema=schema,
                          format="parquet", filesystem=pafs.LocalFileSystem())
    if "deletionVectors" in (dt.protocol().reader_features or ()):
        # delta-rs refuses a dataset of a table with deletion vectors: the files by path
        fs, root = filesystem_for(uri, storage_options)
        return ds.dataset([f"{root.rstrip('/')}/{unquote(f)}" for f in files], schema=schema,
                          format="parquet", filesystem=fs)
    dataset = dt.to_pyarrow_dataset()
    by_path = {f.path: f for f in dataset.get_fragments()}
    # in the order given; a file newer than the handle (the write path's handle may lag
    # behind the file index, `directory_table.files`) is opened by its path
    fragments = [by_path.get(f) or dataset.format.make_fragment(f, dataset.filesystem)
                 for f in files]
    return ds.FileSystemDataset(fragments, schema, dataset.format, dataset.filesystem)


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    return t
