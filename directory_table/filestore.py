"""Files next to a Delta table for the rewrite path (`directory_table.rewrite`) and sorted
compaction: Parquet data files read and written on a local disk or S3, the log entry of a commit
created with put-if-absent, and the small pool of daemon threads that reads and writes them.

S3 goes through boto3, never through delta-rs's storage handler: a threaded scan of a delta-rs
dataset can abort the process at exit (deltalake 1.6 with pyarrow 26), plain Parquet reads of
our own cannot, so files may be read on any thread.
"""

from __future__ import annotations

import os
import queue
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError

from directory_table.layout import plain_types
from directory_table.schema import TABLE_SCHEMA
from directory_table.storage import s3_client, split_s3

__all__ = ["PARQUET", "Store", "run", "spare_cores"]

_NAMES = TABLE_SCHEMA.names
#: runs of items `run` hands each writer thread (a few: a slow item does not hold up the rest)
_RUNS_PER_WRITER = 4
#: threads reading, encoding and writing files (Parquet and file I/O release the GIL)
WRITERS = int(os.environ.get("VS_WRITERS", "2"))


def _is_local(uri: str) -> bool:
    return uri.startswith("file://") or "://" not in uri


def _local_root(uri: str) -> str:
    return unquote(uri.removeprefix("file://")).rstrip("/")


class _Writers:
    """A few daemon threads started once per process (starting threads per commit costs
    milliseconds on a busy machine); `map` runs jobs on them and returns results in order.
    Daemon threads: a commit waits for its files before writing its log entry, so nothing a
    commit needs is ever left half done at exit."""

    def __init__(self, count: int):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(count):
            threading.Thread(target=self._work, name=f"directory-table-writer-{i}",
                             daemon=True).start()

    def _work(self) -> None:
        while True:
            fn, arg, future = self.jobs.get()
            try:
                future.set_result(fn(arg))
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def map(self, fn, args: list) -> list:
        futures = []
        for arg in args:
            future: Future = Future()
            self.jobs.put((fn, arg, future))
            futures.append(future)
        return [f.result() for f in futures]


_POOL: _Writers | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> _Writers:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _Writers(WRITERS)
    return _POOL


def spare_cores() -> bool:
    """Whether the machine has a core to spare (1-minute load average at most the core count
    less one). On a machine busier than that, threads only add work (measured on 2 cores at
    load 5-6: 10k events into 1M rows cost 1.65 s of CPU on one thread, 2.0-2.2 s on two,
    and took longer too, as the threads wait for each other's GIL turns)."""
    try:
        return os.getloadavg()[0] <= (os.cpu_count() or 1) - 1
    except OSError:  # no load average on this platform
        return True


def run(fn: Callable, args: list) -> list:
    """`[fn(a) for a in args]`, on the writer threads when there are several and the machine
    has a core to spare: in a few runs of consecutive items per thread (one hand-over per item
    costs a thread switch each, which a busy machine makes slow)."""
    if len(args) <= 1 or WRITERS <= 1 or not spare_cores():
        return [fn(a) for a in args]
    runs = min(len(args), WRITERS * _RUNS_PER_WRITER)
    step = -(-len(args) // runs)
    parts = _pool().map(lambda part: [fn(a) for a in part],
                        [args[i:i + step] for i in range(0, len(args), step)])
    return [r for part in parts for r in part]


#: Parquet settings of the files written here. Dictionary encoding and column statistics cost
#: more per small file than the rest of the write (measured: 32 files of 640 rows in 25-30 ms
#: with pyarrow's defaults, 8 ms without); Delta readers prune on the statistics in the log
#: (`rewrite._stats`), and a file of a few thousand rows is one row group, so Parquet's own
#: statistics would say the same. No Arrow schema in the footer: the Parquet types read back
#: as `TABLE_SCHEMA` (about 10% of a small file's write).
PARQUET = {"compression": "snappy", "use_dictionary": False, "write_statistics": False,
           "store_schema": False}


def _parquet(table: pa.Table) -> pa.Buffer:
    """`table` as the bytes of a Parquet file (encoding into memory and writing the file in
    one call costs half of what pyarrow's own file output does for a small file)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **PARQUET)
    return sink.getvalue()


def _conform(table: pa.Table) -> pa.Table:
    """A data file's rows as `TABLE_SCHEMA` (plain types; columns it lacks are null)."""
    if table.schema.equals(TABLE_SCHEMA):
        return table
    table = plain_types(table)
    if table.column_names != TABLE_SCHEMA.names:
        table = pa.table({f.name: (table[f.name] if f.name in table.column_names
                                   else pa.nulls(table.num_rows, f.type))
                          for f in TABLE_SCHEMA})
    return table if table.schema == TABLE_SCHEMA else table.cast(TABLE_SCHEMA)


class Store:
    """Reads and puts the files and the log entry of one commit next to the table (local disk
    or S3: boto3, never delta-rs's handler, so reads may run on any thread)."""

    def __init__(self, table_uri: str, options: dict[str, str]):
        self.local = _is_local(table_uri)
        if self.local:
            self.root = _local_root(table_uri)
        else:
            self.bucket, prefix = split_s3(table_uri)
            self.prefix = prefix.rstrip("/")
            self._options = options
            self._client = None
            self._lock = threading.Lock()

    @property
    def client(self):
        """The boto3 client, made on first use (once, for every thread)."""
        with self._lock:
            if self._client is None:
                self._client = s3_client(self._options)
            return self._client

    def read(self, path: str) -> pa.Table:
        """The rows of the data file at `path` (relative to the table, as in the log)."""
        if self.local:
            with open(f"{self.root}/{unquote(path)}", "rb") as f:
                body = f.read()
        else:
            body = self.client.get_object(Bucket=self.bucket,
                                          Key=f"{self.prefix}/{unquote(path)}")["Body"].read()
        # whole small files: one read, then no pre-buffering (measured ~1/3 less per file
        # than letting Parquet open and pre-buffer the file itself)
        file = pq.ParquetFile(pa.py_buffer(body), pre_buffer=False)
        names = file.schema_arrow.names
        columns = _NAMES if names == _NAMES else [n for n in _NAMES if n in names]
        return _conform(file.read(columns=columns, use_threads=False))

    def make_dirs(self, folders: set[str]) -> None:
        if self.local:
            for folder in folders:
                if not os.path.isdir(f"{self.root}/{folder}"):
                    os.makedirs(f"{self.root}/{folder}", exist_ok=True)

    def put(self, path: str, table: pa.Table) -> int:
        """Write `table` as a Parquet file at `path` (relative to the table); its size."""
        data = _parquet(table)
        self.put_bytes(path, data)
        return data.size

    def put_bytes(self, path: str, data: bytes | pa.Buffer) -> None:
        """Write a file at `path` (relative to the table)."""
        if self.local:
            with open(f"{self.root}/{path}", "wb") as f:
                f.write(data)
        else:
            body = data.to_pybytes() if isinstance(data, pa.Buffer) else data
            self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{path}", Body=body)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """`length` bytes of the file at `path` (relative to the table) from `offset` (a
        deletion vector inside a DV file: `directory_table.dv`)."""
        if self.local:
            with open(f"{self.root}/{unquote(path)}", "rb") as f:
                f.seek(offset)
                return f.read(length)
        return self.client.get_object(
            Bucket=self.bucket, Key=f"{self.prefix}/{unquote(path)}",
            Range=f"bytes={offset}-{offset + length - 1}")["Body"].read()

    def create_log_entry(self, version: int, body: bytes) -> None:
        """Create `_delta_log/<version>.json`, or raise CommitFailedError if it exists."""
        name = f"_delta_log/{version:020d}.json"
        if self.local:
            final = f"{self.root}/{name}"
            tmp = f"{self.root}/_delta_log/_commit_{uuid.uuid4()}.json.tmp"
            with open(tmp, "wb") as f:
                f.write(body)
            try:
                os.link(tmp, final)
            except FileExistsError as exc:
                raise CommitFailedError(f"version {version} already exists") from exc
            finally:
                os.unlink(tmp)
            return
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}", Body=body,
                                   IfNoneMatch="*")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409,
                                                                                        412):
                raise CommitFailedError(f"version {version} already exists") from exc
            raise
