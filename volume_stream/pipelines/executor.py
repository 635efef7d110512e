"""The executor side of a pipeline: run the file UDF over a slice of change records and write
its rows as Parquet data files straight into the Delta table folders, uncommitted.

The driver ships a `TaskPlan` (the chunk's change records, the pickled UDF, the volume's object
reader) inside a `mapInArrow` over `spark.range(tasks)`; task `i` takes records `i, i+tasks,
...` (striped, so folders of big files spread over tasks; or a contiguous slice when data files
should cover narrow path ranges, for deletes to prune), calls the UDF once per file, retries
transient read errors with exponential back-off, writes result rows and error rows to Parquet
files in the target and errors table folders, and returns only a small manifest: one row per
file written (path, size, row count, Delta stats) and one row of counters. Rows never travel to
the driver; the driver commits the listed files to Delta (`pipelines.sink`). Files of a task
attempt that failed or lost a speculative race are never listed, so never committed. A target
that Spark's Delta connector writes (`format="delta"`, `pipelines.delta_target`) gets the rows
themselves instead (`run_rows_partition`), for Spark to write.

A file is listed only once it reads back from the store as written (`verify_data_file`: its
stored size is the bytes the writer sent, its Parquet footer reads and counts its rows): a store
or proxy that changes an upload (an S3-compatible store keeping `aws-chunked` framing in the
object, a cut-off body) fails the file's write, which the task redoes, instead of a committed
file nobody can read (DESIGN §7).
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from connectors.errors import is_transient
from directory_table.schema import TS
from directory_table.storage import filesystem_for
from volume_stream.pipelines.udf import FileRecord
from volume_stream.streams.changes import RECORD_SCHEMA

__all__ = [
    "CorruptDataFileError",
    "ERROR_SCHEMA",
    "MANIFEST_DDL",
    "RECORD_COLUMNS",
    "TaskPlan",
    "WRITE_ATTEMPTS",
    "apply_udf",
    "dump_udf",
    "is_transient",
    "result_schema",
    "run_partition",
    "run_rows",
    "run_rows_partition",
    "rows_schema",
    "stats_json",
    "verify_data_file",
    "write_parquet",
]

log = logging.getLogger(__name__)

#: the change-record columns a task gets (the commit timestamp stays on the driver)
RECORD_COLUMNS = [c for c in RECORD_SCHEMA.names if c != "__commit_timestamp"]
MANIFEST_DDL = ("kind string, path string, size bigint, num_rows bigint, stats string, "
                "ok bigint, failed bigint")
MANIFEST_SCHEMA = pa.schema([("kind", pa.string()), ("path", pa.string()), ("size", pa.int64()),
                             ("num_rows", pa.int64()), ("stats", pa.string()),
                             ("ok", pa.int64()), ("failed", pa.int64())])
ERROR_SCHEMA = pa.schema([
    ("relative_path", pa.string()), ("url", pa.string()), ("__change_type", pa.string()),
    ("__commit_version", pa.int64()), ("batch_id", pa.int64()), ("attempt", pa.int32()),
    ("error_type", pa.string()), ("error", pa.string()), ("traceback", pa.string()),
    ("failed_at", TS),
])
#: Columns whose min/max go into each data file's Delta stats (used to prune deletes).
STATS_COLUMNS = ("relative_path", "__commit_version")
#: times a task writes its files when writing them fails transiently (`run_task`)
WRITE_ATTEMPTS = 5
_FLUSH_ROWS = 50_000
_FLUSH_BYTES = 64 << 20
_MAX_ERROR_CHARS = 4_000
_MAX_TRACEBACK_CHARS = 32_000


def result_schema(udf_schema: pa.Schema) -> pa.Schema:
    """The target's columns: relative_path, the UDF's columns, then the change metadata."""
    return pa.schema([pa.field("relative_path", pa.string()), *udf_schema,
                      pa.field("__change_type", pa.string()),
                      pa.field("__commit_version", pa.int64()), pa.field("processed_at", TS)])


def normalize_rows(out: Any, names: frozenset[str]) -> list[dict[str, Any]]:
    """A UDF's return value as a list of row dicts; a clear TypeError/ValueError otherwise."""
    if out is None:
        return []
    if isinstance(out, Mapping):
        rows = [out]
    elif isinstance(out, str | bytes) or not hasattr(out, "__iter__"):
        raise TypeError(f"a file_udf must return a dict, an iterable of dicts or None, not "
                        f"{type(out).__name__}")
    else:
        rows = list(out)
    result = []
    for row in rows:
        if hasattr(row, "asDict"):
            row = row.asDict()
        if not isinstance(row, Mapping):
            raise TypeError(f"a file_udf row must be a dict, not {type(row).__name__}")
        extra = set(row) - names
        if extra:
            raise ValueError(f"row has column(s) {sorted(extra)} not in the UDF schema "
                             f"({', '.join(sorted(names))})")
        result.append(dict(row))
    return result


def apply_udf(fn: Any, record: FileRecord, udf_schema: pa.Schema, *, max_attempts: int = 3,
              retry_backoff_s: float = 0.5, sleep: Any = time.sleep
              ) -> tuple[pa.Table | None, BaseException | None, int]:
    """Call `fn(record)`; return (rows as Arrow, None, attempts) or (None, error, attempts).

    Transient read errors are retried up to `max_attempts` tries with exponential back-off;
    any other exception (or rows that do not fit the schema) fails the file at once.

    Example:
        >>> schema = pa.schema([("n", pa.int64())])
        >>> table, error, attempts = apply_udf(lambda f: {"n": 1}, record, schema)
    """
    names = frozenset(udf_schema.names)
    for attempt in range(1, max_attempts + 1):
        try:
            rows = normalize_rows(fn(record), names)
            return pa.Table.from_pylist(rows, schema=udf_schema), None, attempt
        except Exception as exc:
            if attempt < max_attempts and is_transient(exc):
                sleep(retry_backoff_s * 2 ** (attempt - 1))
                continue
            return None, exc, attempt
    raise AssertionError("unreachable")  # pragma: no cover


def dump_udf(udf: Any) -> bytes:
    """Pickle a UDF for the executors. Its module is pickled by value unless it is installed
    (site-packages), so UDFs from scripts, notebooks or `path/to/file.py` need no shipping."""
    from pyspark import cloudpickle

    fn = getattr(udf, "fn", udf)
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value = (module is not None and module.__name__ != "__main__"
                and "-packages" not in (getattr(module, "__file__", None) or "-packages")
                and module.__name__ not in cloudpickle.list_registry_pickle_by_value())
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(udf)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def stats_json(table: pa.Table) -> str:
    """Delta `stats` for a data file: row count, and min/max/null count of `STATS_COLUMNS`."""
    mins, maxs, nulls = {}, {}, {}
    for name in STATS_COLUMNS:
        if name not in table.column_names:
            continue
        column = table[name]
        nulls[name] = column.null_count
        if column.null_count < len(column):
            bounds = pc.min_max(column)
            mins[name], maxs[name] = bounds["min"].as_py(), bounds["max"].as_py()
    return json.dumps({"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs,
                       "nullCount": nulls})


class CorruptDataFileError(OSError):
    """A data file on the store is not what was written; it must not be committed."""


def verify_data_file(fs: pafs.FileSystem, path: str, written: int, rows: int) -> int:
    """Check that `path` reads back as the `written` bytes of a Parquet file of `rows` rows (a
    HEAD and a ranged GET of the footer); its size. Raises CorruptDataFileError otherwise."""
    stored = fs.get_file_info(path).size
    problem = None
    if stored != written:
        problem = f"{stored} bytes stored, {written} written"
    else:
        try:
            found = pq.read_metadata(path, filesystem=fs).num_rows
        except pa.ArrowInvalid as exc:  # "Parquet magic bytes not found", a bad footer
            problem = str(exc).splitlines()[0]
        else:
            problem = None if found == rows else f"{found} rows stored, {rows} written"
    if problem:
        raise CorruptDataFileError(
            f"data file {path} does not read back as written ({problem}): the store or a proxy "
            f"changed the upload, so it is not committed. An S3-compatible store that keeps "
            f"'aws-chunked' upload framing in objects does this (its fix, or "
            f"AWS_REQUEST_CHECKSUM_CALCULATION=when_required in the executors' environment)")
    return stored


def write_parquet(fs: pafs.FileSystem, path: str, table: pa.Table) -> int:
    """Write `table` as one snappy Parquet file and verify it (`verify_data_file`); its size."""
    with fs.open_output_stream(path) as sink:
        pq.write_table(table, sink, compression="snappy")
        written = sink.tell()
    return verify_data_file(fs, path, written, table.num_rows)


class _DataFile:
    """One Parquet data file being written to a table folder; opened on the first rows."""

    def __init__(self, uri: str, schema: pa.Schema, prefix: str,
                 options: dict[str, str] | None = None) -> None:
        # credentials from this executor's environment or role; `options` hold no secret
        self.fs, self.base = filesystem_for(uri, options)
        self.schema, self.prefix = schema, prefix
        self.name: str | None = None
        self._writer: pq.ParquetWriter | None = None
        self._sink: Any = None
        self._pending: list[pa.Table] = []
        self._pending_rows = self._pending_bytes = 0
        self._stats: list[pa.Table] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        if self._pending_rows >= _FLUSH_ROWS or self._pending_bytes >= _FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        if self._writer is None:
            self.name = f"{self.prefix}-{uuid.uuid4().hex}.snappy.parquet"
            if not isinstance(self.fs, pafs.S3FileSystem):  # S3 has no folders to make
                self.fs.create_dir(self.base, recursive=True)
            # our own stream: its position after the writer closes is the bytes sent
            self._sink = self.fs.open_output_stream(f"{self.base}/{self.name}")
            self._writer = pq.ParquetWriter(self._sink, self.schema, compression="snappy")
        self._writer.write_table(table)
        self._stats.append(table.select([c for c in STATS_COLUMNS if c in table.column_names]))
        self.rows += table.num_rows
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0

    def close(self, kind: str) -> dict[str, Any] | None:
        """Finish the file; its manifest row, or None if nothing was written."""
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        written = self._sink.tell()
        self._sink.close()  # the upload completes here
        size = verify_data_file(self.fs, f"{self.base}/{self.name}", written, self.rows)
        stats = stats_json(pa.concat_tables(self._stats))
        return {"kind": kind, "path": self.name, "size": size, "num_rows": self.rows,
                "stats": stats, "ok": 0, "failed": 0}

    def discard(self) -> None:
        if self._writer is not None:
            for step in (self._writer.close, self._sink.close,
                         lambda: self.fs.delete_file(f"{self.base}/{self.name}")):
                try:
                    step()
                except OSError:
                    pass


@dataclass
class TaskPlan:
    """Everything one chunk's tasks need; pickled into the Spark job's closure."""

    records: pa.Table
    tasks: int
    udf_blob: bytes
    udf_schema: pa.Schema
    reader: Any
    target_uri: str
    errors_uri: str
    batch_id: int
    file_prefix: str
    max_attempts: int = 3
    retry_backoff_s: float = 0.5
    striped: bool = True
    #: the target's storage options without secrets (endpoint, region, ...)
    storage_options: dict[str, str] | None = None

    def share(self, index: int) -> pa.Table:
        """Task `index`'s records."""
        n = self.records.num_rows
        if self.striped:
            return self.records.take(pa.array(range(index, n, self.tasks), pa.int64()))
        start, stop = n * index // self.tasks, n * (index + 1) // self.tasks
        return self.records.slice(start, stop - start)


def _error_row(record: FileRecord, exc: BaseException, attempt: int, batch_id: int) -> dict:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kind = type(exc)
    return {"relative_path": record.relative_path, "url": record.url,
            "__change_type": record.change_type, "__commit_version": record.commit_version,
            "batch_id": batch_id, "attempt": attempt,
            "error_type": f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins."),
            "error": (f"{kind.__name__}: {exc}")[:_MAX_ERROR_CHARS],
            "traceback": tb[-_MAX_TRACEBACK_CHARS:], "failed_at": datetime.now(UTC)}


def _with_meta(rows: pa.Table, record: FileRecord, schema: pa.Schema) -> pa.Table:
    n = rows.num_rows
    meta = {"relative_path": pa.array([record.relative_path] * n, pa.string()),
            "__change_type": pa.array([record.change_type] * n, pa.string()),
            "__commit_version": pa.array([record.commit_version] * n, pa.int64()),
            "processed_at": pa.array([datetime.now(UTC)] * n, TS)}
    return pa.Table.from_arrays([meta[f.name] if f.name in meta else rows[f.name]
                                 for f in schema], schema=schema)


def run_task(plan: TaskPlan, index: int) -> Iterator[pa.RecordBatch]:
    """Process task `index`'s share of the plan's records; yield its manifest. A data file that
    does not read back as written (`CorruptDataFileError`) is deleted and the share redone, up
    to `plan.max_attempts` times; a write that failed transiently (an upload whose every request
    attempt failed: resets, 5xx, a store too slow to answer) is deleted and redone too, up to
    `WRITE_ATTEMPTS` times, so one failed upload does not fail the batch (DESIGN §7)."""
    from pyspark import cloudpickle

    udf = cloudpickle.loads(plan.udf_blob)
    fn = getattr(udf, "fn", udf)
    corrupt = transient = 0
    while True:
        try:
            manifest = _task_manifest(plan, index, fn)
            break
        except CorruptDataFileError as exc:
            corrupt += 1
            if corrupt >= plan.max_attempts:
                raise
            log.warning("task %d: %s; writing its files again", index, exc)
            time.sleep(plan.retry_backoff_s * 2 ** (corrupt - 1))
        except OSError as exc:
            transient += 1
            if not is_transient(exc) or transient >= WRITE_ATTEMPTS:
                raise
            log.warning("task %d: writing its files failed (%s); writing them again", index,
                        str(exc).splitlines()[0][:500])
            time.sleep(min(30.0, max(plan.retry_backoff_s, 0.5) * 2 ** (transient - 1)))
    yield pa.RecordBatch.from_pylist(manifest, schema=MANIFEST_SCHEMA)


def _task_manifest(plan: TaskPlan, index: int, fn: Any) -> list[dict[str, Any]]:
    """Run the UDF over task `index`'s share and write its files; their manifest rows."""
    schema = result_schema(plan.udf_schema)
    prefix = f"{plan.file_prefix}-t{index:04d}"
    results = _DataFile(plan.target_uri, schema, prefix, plan.storage_options)
    errors = _DataFile(plan.errors_uri, ERROR_SCHEMA, prefix, plan.storage_options)
    ok = failed = 0
    try:
        for record, rows, exc, attempts in _applied(plan, index, fn):
            if exc is None:
                ok += 1
                results.add(_with_meta(rows, record, schema))
            else:
                failed += 1
                errors.add(pa.Table.from_pylist(
                    [_error_row(record, exc, attempts, plan.batch_id)], schema=ERROR_SCHEMA))
        manifest = [m for m in (results.close("target"), errors.close("errors")) if m]
    except BaseException:
        results.discard()
        errors.discard()
        raise
    manifest.append({"kind": "counts", "path": None, "size": 0, "num_rows": 0, "stats": None,
                     "ok": ok, "failed": failed})
    return manifest


def _applied(plan: TaskPlan, index: int, fn: Any) -> Iterator[tuple[FileRecord, Any, Any, int]]:
    """Each record of task `index`'s share with what the UDF made of it: (record, rows, the
    exception of its last attempt or None, attempts)."""
    for rec in plan.share(index).to_pylist():
        record = _record(rec, plan)
        yield (record, *apply_udf(fn, record, plan.udf_schema, max_attempts=plan.max_attempts,
                                  retry_backoff_s=plan.retry_backoff_s))


def _record(rec: dict[str, Any], plan: TaskPlan) -> FileRecord:
    return FileRecord(relative_path=rec["relative_path"], url=rec["url"], size=rec["size"],
                      last_modified_time=rec["last_modified_time"], etag=rec["etag"],
                      change_type=rec["__change_type"], commit_version=rec["__commit_version"],
                      reader=plan.reader)


def rows_schema(udf_schema: pa.Schema) -> pa.Schema:
    """What `run_rows_partition` yields: a row of the target (`target`), of the errors table
    (`error`) or a task's counters (`ok`, `failed`), told apart by `kind`."""
    return pa.schema([("kind", pa.string()),
                      ("target", pa.struct(list(result_schema(udf_schema)))),
                      ("error", pa.struct(list(ERROR_SCHEMA))),
                      ("ok", pa.int64()), ("failed", pa.int64())])


def run_rows(plan: TaskPlan, index: int) -> Iterator[pa.RecordBatch]:
    """Task `index`'s share of the plan's records through the UDF, its rows handed back to
    Spark (a pipeline whose target Spark writes, `format="delta"`), not written to files."""
    from pyspark import cloudpickle

    udf = cloudpickle.loads(plan.udf_blob)
    fn = getattr(udf, "fn", udf)
    schema, out = result_schema(plan.udf_schema), rows_schema(plan.udf_schema)
    targets, errors, ok, failed = [], [], 0, 0
    for record, rows, exc, attempts in _applied(plan, index, fn):
        if exc is None:
            ok += 1
            targets.append(_with_meta(rows, record, schema))
        else:
            failed += 1
            errors.append(_error_row(record, exc, attempts, plan.batch_id))
    parts = [("target", pa.concat_tables(targets, promote_options="none") if targets else None),
             ("error", pa.Table.from_pylist(errors, schema=ERROR_SCHEMA) if errors else None)]
    for kind, table in parts:
        if table is None or not table.num_rows:
            continue
        n = table.num_rows
        columns = {"kind": pa.array([kind] * n, pa.string()),
                   "target": pa.nulls(n, out.field("target").type),
                   "error": pa.nulls(n, out.field("error").type),
                   "ok": pa.nulls(n, pa.int64()), "failed": pa.nulls(n, pa.int64())}
        columns[kind] = pa.StructArray.from_arrays(
            [c.combine_chunks() for c in table.columns], fields=list(table.schema))
        yield pa.RecordBatch.from_pydict(columns, schema=out)
    yield pa.RecordBatch.from_pydict(
        {"kind": ["counts"], "target": pa.nulls(1, out.field("target").type),
         "error": pa.nulls(1, out.field("error").type), "ok": [ok], "failed": [failed]},
        schema=out)


def run_rows_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]
                       ) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function of `run_rows`: each input row is a task index."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield from run_rows(plan, int(index))


def run_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: each input row is a task index from `spark.range(tasks)`."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield from run_task(plan, int(index))
