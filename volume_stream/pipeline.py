"""Per-file UDF pipelines (DESIGN §7): run a Python function of one file over a stream's changes
on Spark executors and commit its rows to a Delta table exactly once.

A user decorates `f(file: FileRecord) -> dict | Iterable[dict] | None` with `@file_udf(schema)`
and calls `catalog.pipeline(stream, f, target).run_once()`. One run pins the stream's pending
range (a, b], runs `f` on executors over the files of that range (filtered by change type and
path glob), writes the rows, with `relative_path`, `__change_type`, `__commit_version` and
`processed_at`, into the Delta `target`, sends files whose function raised to `<target>_errors`,
and only then moves the stream's offset to `b`. Each Delta commit carries the stream's batch id
as a Delta app transaction, so a run that crashed after its output commit skips the committed
files on retry instead of writing them twice (exactly-once). Executor side:
`_pipeline_exec`; Delta side: `_pipeline_sink`; the batch plan and resume logic: `_pipeline_run`.

    import volume_stream as vs

    @vs.file_udf("size_kb double, first_line string")
    def peek(file: vs.FileRecord):
        with file.open() as f:
            return {"size_kb": file.size / 1024, "first_line": f.readline().decode().strip()}

    cat = vs.connect("./warehouse")
    metrics = cat.pipeline("new_files", peek, "peeks").run_once()
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from volume_stream.errors import InvalidInputError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from volume_stream.catalog import Catalog

__all__ = ["FileRecord", "FileUdf", "Pipeline", "PipelineMetrics", "file_udf"]

log = logging.getLogger(__name__)

CHANGE_TYPES = ("INSERT", "UPDATE_AFTER", "UPDATE_BEFORE", "DELETE")
ON_DELETE = ("ignore", "delete_rows")
#: Columns every result row gets beside the UDF's own.
META_COLUMNS = ("relative_path", "__change_type", "__commit_version", "processed_at")


class _BytesReader:
    """An `ObjectReader` over bytes held in memory (for `FileRecord.from_bytes`)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    def open(self, relative_path: str) -> IO[bytes]:
        return io.BytesIO(self.data)

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        return self.data[start:start + length]


@dataclass(frozen=True)
class FileRecord:
    """One file as a file UDF sees it: the change record's metadata and a lazy way to read it.

    Nothing is read until `open()`, `read_bytes()` or `read_text()` is called; `open()` streams
    from the volume's object reader (local disk, S3, OSS), so large files need not fit in memory.

    Example:
        >>> rec = FileRecord.from_bytes(b"hello\\nworld\\n", relative_path="a/b.txt")
        >>> rec.read_text().splitlines()
        ['hello', 'world']
        >>> with rec.open() as f:
        ...     f.read(5)
        b'hello'
    """

    relative_path: str
    url: str | None
    size: int | None
    last_modified_time: datetime | None
    etag: str | None
    change_type: str
    commit_version: int
    reader: Any = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        """The last segment of the path: `'cat.jpg'` for `'2024/cat.jpg'`."""
        return self.relative_path.rsplit("/", 1)[-1]

    def open(self) -> IO[bytes]:
        """A binary, streamed file-like object (use it as a context manager)."""
        return self.reader.open(self.relative_path)

    def read_bytes(self) -> bytes:
        """The whole file as bytes."""
        with self.open() as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        """The whole file decoded as text."""
        return self.read_bytes().decode(encoding, errors)

    @classmethod
    def from_bytes(cls, data: bytes, relative_path: str = "file", *, change_type: str = "INSERT",
                   commit_version: int = 0, **meta: Any) -> FileRecord:
        """A record over in-memory bytes: to unit-test a file UDF, or to call it on data you
        already hold (Spark's `binaryFile` content, say).

        Example:
            >>> FileRecord.from_bytes(b"abc").size
            3
        """
        return cls(relative_path=relative_path, url=meta.get("url"),
                   size=meta.get("size", len(data)),
                   last_modified_time=meta.get("last_modified_time"), etag=meta.get("etag"),
                   change_type=change_type, commit_version=commit_version,
                   reader=_BytesReader(data))

    @classmethod
    def from_path(cls, path: str | os.PathLike, *, change_type: str = "INSERT",
                  commit_version: int = 0) -> FileRecord:
        """A record over a local file, read through the same `LocalReader` a local volume uses.

        Example:
            >>> FileRecord.from_path("/data/in/cat.jpg").name  # doctest: +SKIP
            'cat.jpg'
        """
        from connectors.local import LocalReader, file_url

        path = os.path.abspath(os.fspath(path))
        root, name = os.path.split(path)
        st = os.stat(path)
        return cls(relative_path=name, url=file_url(root, name), size=st.st_size,
                   last_modified_time=datetime.fromtimestamp(st.st_mtime, UTC),
                   etag=f"{st.st_mtime_ns:x}-{st.st_size:x}", change_type=change_type,
                   commit_version=commit_version, reader=LocalReader(root))


class FileUdf:
    """A function of one file with a declared output schema; made by `@file_udf(schema)`.

    Calling it calls the function. `struct_type()` / `arrow_schema()` give the schema (a DDL
    string needs a SparkSession to parse; one is made if none is active).
    """

    def __init__(self, fn: Callable[[FileRecord], Any], schema: str | StructType):
        if not callable(fn):
            raise InvalidInputError(f"file_udf needs a function, not {type(fn).__name__}")
        if not isinstance(schema, str) and type(schema).__name__ != "StructType":
            raise InvalidInputError(
                f"file_udf schema must be a Spark DDL string (e.g. 'width int, height int') or "
                f"a StructType, not {type(schema).__name__}")
        self.fn = fn
        self.schema = schema
        self.__name__ = getattr(fn, "__name__", "file_udf")
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn
        self._struct: StructType | None = None

    def __repr__(self) -> str:
        return f"FileUdf({self.__name__}, {self.schema!r})"

    def __call__(self, file: FileRecord) -> Any:
        return self.fn(file)

    def struct_type(self) -> StructType:
        """The output schema as a Spark StructType (parsed once)."""
        if self._struct is None:
            from pyspark.sql.types import StructType

            if isinstance(self.schema, StructType):
                self._struct = self.schema
            else:
                from volume_stream._spark import get_spark

                get_spark()  # DDL parsing goes through the JVM
                try:
                    parsed = StructType.fromDDL(self.schema)
                except Exception as exc:
                    raise InvalidInputError(
                        f"file_udf {self.__name__}: cannot parse schema {self.schema!r}: "
                        f"{str(exc).splitlines()[0]}") from exc
                if not isinstance(parsed, StructType):
                    raise InvalidInputError(
                        f"file_udf {self.__name__}: schema {self.schema!r} is not a list of "
                        f"columns ('name type, ...')")
                self._struct = parsed
        return self._struct

    def arrow_schema(self) -> pa.Schema:
        """The output schema as Arrow (timestamps in UTC)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        try:
            return to_arrow_schema(self.struct_type(), timezone="UTC")
        except Exception as exc:
            raise InvalidInputError(f"file_udf {self.__name__}: schema {self.schema!r} has a "
                                    f"type Arrow cannot hold: {exc}") from exc


def file_udf(schema: str | StructType) -> Callable[[Callable[[FileRecord], Any]], FileUdf]:
    """Declare a function of one file as a pipeline UDF with the given output schema.

    The function gets a `FileRecord` and returns a dict (one row), an iterable of dicts (zero
    or more rows) or None (no row). Keys must be columns of `schema`; missing ones are null.

    Example:
        >>> @file_udf("n_lines long")
        ... def count_lines(file):
        ...     return {"n_lines": file.read_bytes().count(b"\\n")}
        >>> count_lines(FileRecord.from_bytes(b"a\\nb\\n"))
        {'n_lines': 2}
    """

    def wrap(fn: Callable[[FileRecord], Any]) -> FileUdf:
        return FileUdf(fn, schema)

    return wrap


@dataclass(frozen=True)
class PipelineMetrics:
    """What one `run_once` did. `start_version`/`end_version` bound the consumed range
    (start, end]; `resumed_files` counts files an earlier, interrupted run had already
    committed (skipped, not written again)."""

    stream: str
    target: str
    batch_id: int | None
    start_version: int
    end_version: int
    files_seen: int = 0
    files_ok: int = 0
    files_failed: int = 0
    rows_written: int = 0
    rows_deleted: int = 0
    paths_deleted: int = 0
    resumed_files: int = 0
    commits: int = 0
    seconds: float = 0.0

    @property
    def versions(self) -> tuple[int, int]:
        return (self.start_version, self.end_version)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PipelineOptions:
    """Validated options of a pipeline (see `Catalog.pipeline`)."""

    change_types: tuple[str, ...] = ("INSERT", "UPDATE_AFTER")
    path_glob: tuple[str, ...] = ()
    on_delete: str = "ignore"
    max_files_per_batch: int | None = None
    parallelism: int | None = None
    max_attempts: int = 3
    retry_backoff_s: float = 0.5
    progress: bool | None = None

    @classmethod
    def of(cls, change_types: Iterable[str] = ("INSERT", "UPDATE_AFTER"),
           path_glob: str | Iterable[str] | None = None, on_delete: str = "ignore",
           max_files_per_batch: int | None = None, parallelism: int | None = None,
           max_attempts: int = 3, retry_backoff_s: float = 0.5,
           progress: bool | None = None) -> PipelineOptions:
        if isinstance(change_types, str):
            change_types = [change_types]
        types = tuple(str(t).upper() for t in change_types)
        bad = [t for t in types if t not in CHANGE_TYPES]
        if bad or not types:
            raise InvalidInputError(f"invalid change_types {list(change_types)!r}; choose from "
                                    f"{', '.join(CHANGE_TYPES)}")
        globs = (path_glob,) if isinstance(path_glob, str) else tuple(path_glob or ())
        if on_delete not in ON_DELETE:
            raise InvalidInputError(f"invalid on_delete {on_delete!r}; choose from "
                                    f"{', '.join(ON_DELETE)}")
        for name, value in (("max_files_per_batch", max_files_per_batch),
                            ("parallelism", parallelism)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise InvalidInputError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInputError(f"max_attempts must be >= 1, not {max_attempts!r}")
        if retry_backoff_s < 0:
            raise InvalidInputError(f"retry_backoff_s must be >= 0, not {retry_backoff_s!r}")
        return cls(types, globs, on_delete, max_files_per_batch, parallelism, max_attempts,
                   float(retry_backoff_s), progress)


class Pipeline:
    """A per-file UDF over a stream, writing to a Delta target; made by `Catalog.pipeline`.

    Args:
        catalog: The catalog of the stream.
        stream: The stream to consume.
        udf: A `@file_udf` function.
        target: A Delta table path (or URI), or a bare name: `<warehouse>/tables/<name>`.
        change_types: Change types the UDF runs on (default INSERT and UPDATE_AFTER).
        path_glob: Glob(s) on the relative path; other files are left alone.
        on_delete: "ignore", or "delete_rows": a path's rows are removed when it is deleted
            and replaced when it changes, so the target mirrors the volume.
        max_files_per_batch: Commit the target every N files (a backlog becomes several
            commits, each resumable); None = one commit per run.
        parallelism: Spark tasks per commit (default: twice the default parallelism).
        max_attempts / retry_backoff_s: Tries per file on transient read errors, and the
            first back-off (doubled each time).
        progress: Show a progress bar on stderr (default: when it is a terminal).

    Example:
        >>> p = cat.pipeline("new_images", image_metadata, "image_meta", path_glob="*.jpg")
        >>> p.run_once().files_ok
        120
    """

    def __init__(self, catalog: Catalog, stream: str, udf: FileUdf, target: str,
                 **options: Any) -> None:
        from volume_stream._pipeline_sink import resolve_target

        if not isinstance(udf, FileUdf):
            raise InvalidInputError(
                f"pipeline udf must be decorated with @volume_stream.file_udf(schema); got "
                f"{type(udf).__name__} {getattr(udf, '__name__', udf)!r}")
        try:
            self.options = PipelineOptions.of(**options)
        except TypeError as exc:
            raise InvalidInputError(f"pipeline: {exc}") from exc
        self.catalog = catalog
        self.stream = stream
        self.udf = udf
        _, volume = catalog._stream(stream)  # fail now if the stream or its volume is gone
        self.target_uri = resolve_target(catalog.warehouse.root, target)
        if volume.scheme == "file" and "://" not in self.target_uri:
            root = os.path.realpath(unquote(urlparse(volume.location).path))
            where = os.path.realpath(self.target_uri)
            if os.path.commonpath([root, where]) == root:
                raise InvalidInputError(
                    f"target {where} is inside volume {volume.name!r} ({root}): its files would "
                    f"come back as changes of the stream; put the target elsewhere")
        self.errors_uri = self.target_uri.rstrip("/") + "_errors"
        self.target = target
        udf_schema = udf.arrow_schema()
        clash = sorted(set(udf_schema.names) & set(META_COLUMNS))
        if clash:
            raise InvalidInputError(f"file_udf {udf.__name__} declares {clash}, which the "
                                    f"pipeline adds itself; rename them")

    def __repr__(self) -> str:
        return f"Pipeline({self.stream!r} -> {self.target_uri!r}, udf={self.udf.__name__})"

    def run_once(self) -> PipelineMetrics:
        """Consume one pinned range of the stream: run the UDF, commit, move the offset.

        Safe to call again after any failure or crash: files already committed for the
        stream's current batch are skipped, the rest are processed, then the offset moves.

        Example:
            >>> m = pipeline.run_once()
            >>> (m.files_ok, m.files_failed, m.rows_written)
            (98, 2, 98)
        """
        from volume_stream._pipeline_run import run_batch

        return run_batch(self)

    def run_forever(self, interval_s: float = 10.0, *, stop: threading.Event | None = None,
                    max_batches: int | None = None) -> list[PipelineMetrics]:
        """Call `run_once` every `interval_s` seconds until `stop` is set, `max_batches` runs
        happened, or Ctrl-C. A failing run is logged and retried at the next tick, except for
        errors no retry can fix (unknown stream, stale stream, bad input or configuration).

        Example:
            >>> pipeline.run_forever(30)  # doctest: +SKIP
        """
        from volume_stream.errors import ConfigError, NotFoundError, StaleStreamError

        stop = stop or threading.Event()
        done: list[PipelineMetrics] = []
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    metrics = self.run_once()
                    done.append(metrics)
                    if metrics.files_seen:
                        log.info("pipeline %s: %s", self.stream, metrics.as_dict())
                except (NotFoundError, StaleStreamError, InvalidInputError, ConfigError):
                    raise
                except Exception as exc:  # Spark, Delta, I/O: a later tick may succeed
                    log.exception("pipeline %s: run failed, retrying in %.1fs: %s",
                                  self.stream, interval_s, exc)
                if max_batches is not None and len(done) >= max_batches:
                    break
                stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
        except KeyboardInterrupt:
            log.info("pipeline %s: stopped", self.stream)
        return done
