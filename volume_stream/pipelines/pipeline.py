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
`pipelines.executor`; Delta side: `pipelines.sink`; the batch plan and resume logic:
`pipelines.run`; the function's side: `pipelines.udf`.

    import volume_stream as vs

    @vs.file_udf("size_kb double, first_line string")
    def peek(file: vs.FileRecord):
        with file.open() as f:
            return {"size_kb": file.size / 1024, "first_line": f.readline().decode().strip()}

    cat = vs.connect("./warehouse")
    metrics = cat.pipeline("new_files", peek, "peeks").run_once()
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any
from urllib.parse import unquote, urlparse

from volume_stream.errors import ConfigError, InvalidInputError, NotFoundError, StaleStreamError
from volume_stream.pipelines.delta_target import run_delta_batch
from volume_stream.pipelines.options import META_COLUMNS, PipelineMetrics, PipelineOptions
from volume_stream.pipelines.run import run_batch
from volume_stream.pipelines.sink import resolve_target
from volume_stream.pipelines.udf import FileUdf

__all__ = ["Pipeline"]

log = logging.getLogger("volume_stream.pipeline")


def _refuse_registered(catalog: Any, target: str, uri: str) -> None:
    """A target (or errors table) at `<warehouse>/tables/<name>` of a registered table would
    be written beside its pointer, unseen by SELECT and deleted by DROP TABLE: registered
    tables are read-only everywhere (`tables.registered`)."""
    tables = catalog.tables
    folder, _, name = uri.rstrip("/").rpartition("/")
    if "://" not in uri:
        folder, name = os.path.dirname(os.path.realpath(uri)), os.path.basename(uri)
        same = folder == os.path.realpath(tables.root) if tables.location.is_local else False
    else:
        same = folder == tables.root
    try:
        registered = same and tables.registration(name) is not None
    except InvalidInputError:  # not a table's name: no table is there
        registered = False
    if registered:
        raise InvalidInputError(
            f"pipeline target {target!r}: {uri} is table {name!r}, registered from "
            f"{tables.path(name)}; volume-stream only reads registered tables (their owner "
            f"writes them); give the pipeline another target")


class Pipeline:
    """A per-file UDF over a stream, writing to a Delta target; made by `Catalog.pipeline`.

    Args:
        catalog: The catalog of the stream (a `volume_stream.Catalog`; only its public
            methods are used: stream_spec, latest_version, records_between, object_reader,
            commit_offset, spark, warehouse).
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
        format: None (default): the executors write the target's files and volume-stream
            commits them with delta-rs; "delta": Spark's Delta connector writes each batch,
            exactly once by Delta's idempotent writes (txnAppId, txnVersion).

    Example:
        >>> p = cat.pipeline("new_images", image_metadata, "image_meta", path_glob="*.jpg")
        >>> p.run_once().files_ok
        120
    """

    def __init__(self, catalog: Any, stream: str, udf: FileUdf, target: str,
                 **options: Any) -> None:
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
        _, volume = catalog.stream_spec(stream)  # fail now if the stream or its volume is gone
        self.target_uri = resolve_target(catalog.warehouse.root, target)
        if volume.scheme == "file" and "://" not in self.target_uri:
            root = os.path.realpath(unquote(urlparse(volume.location).path))
            where = os.path.realpath(self.target_uri)
            if os.path.commonpath([root, where]) == root:
                raise InvalidInputError(
                    f"target {where} is inside volume {volume.name!r} ({root}): its files would "
                    f"come back as changes of the stream; put the target elsewhere")
        self.errors_uri = self.target_uri.rstrip("/") + "_errors"
        for uri in (self.target_uri, self.errors_uri):
            _refuse_registered(catalog, target, uri)
        #: an object-store target uses the warehouse's storage options (same store)
        self.storage_options: dict[str, str] = (
            catalog.warehouse.storage_options if "://" in self.target_uri else {})
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
        if self.options.format == "delta":
            return run_delta_batch(self)
        return run_batch(self)

    def run_forever(self, interval_s: float = 10.0, *, stop: threading.Event | None = None,
                    max_batches: int | None = None) -> list[PipelineMetrics]:
        """Call `run_once` every `interval_s` seconds until `stop` is set, `max_batches` runs
        happened, or Ctrl-C. A failing run is logged and retried at the next tick, except for
        errors no retry can fix (unknown stream, stale stream, bad input or configuration).

        Example:
            >>> pipeline.run_forever(30)  # doctest: +SKIP
        """
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
