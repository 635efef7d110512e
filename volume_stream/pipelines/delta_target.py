"""A pipeline target written by Spark's own Delta connector (`format="delta"`), exactly once
the standard way: Delta's idempotent writes (DESIGN §7).

Every batch is one Spark job: the UDF runs on the executors (`executor.run_rows_partition`)
and hands its rows back as a DataFrame, kept (persisted) while Spark appends the error rows
to `<target>_errors` and the result rows to the target with
`.option("txnAppId", app_id).option("txnVersion", batch_id)`: Delta records the pair in the
same commit, and skips a write whose `txnVersion` is not above the one it holds for `txnAppId`.
`app_id` is the pipeline's (`run.app_id_for`: the stream and its identity), `batch_id` the
stream's batch id, which the catalog pins with the batch's range before anything runs (as for
the default target). So a run killed anywhere before the offset moved runs the same batch
again and writes nothing twice: the errors table's append is skipped if it landed, and a
target that holds the batch already is seen before the UDF runs again (then only the offset
moves). One commit per table per batch: `max_files_per_batch` and `on_delete="delete_rows"`
are the default target's.

    cat.pipeline("new_files", peek, "peeks", format="delta").run_once()
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from deltalake import DeltaTable

from connectors.secrets import is_secret
from volume_stream import _jars
from volume_stream.errors import ConfigError, ConsumeConflictError, VolumeStreamError
from volume_stream.pipelines.executor import (
    ERROR_SCHEMA,
    RECORD_COLUMNS,
    TaskPlan,
    dump_udf,
    result_schema,
    rows_schema,
    run_rows_partition,
)
from volume_stream.pipelines.options import PipelineMetrics
from volume_stream.pipelines.run import app_id_for, crash_point, plan_items

__all__ = ["run_delta_batch", "spark_uri", "transaction_version", "write_idempotent"]

log = logging.getLogger("volume_stream._pipeline_run")

#: Pipeline (typed loosely: `pipelines.pipeline` imports this module)
Pipeline = Any


def spark_uri(uri: str) -> str:
    """A table location as Spark reads it (S3 through hadoop-aws's `s3a://`: a `ConfigError`
    naming `volume-stream jars fetch s3` when those jars are not fetched)."""
    if uri.startswith(("s3://", "s3a://")):
        _jars.require("s3", f"a Spark table on S3 ({uri})")
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def transaction_version(uri: str, app_id: str,
                        storage_options: dict[str, str] | None = None) -> int | None:
    """The `txnVersion` the Delta table at `uri` holds for `app_id` (None: no table, no such
    app, or a table delta-rs cannot open: Spark's own check still skips a repeated write)."""
    try:
        return DeltaTable(uri, storage_options=storage_options).transaction_version(app_id)
    except Exception:  # noqa: BLE001 - only an optimisation: the write itself is idempotent
        return None


def write_idempotent(df: Any, uri: str, app_id: str, version: int) -> None:
    """Append `df` to the Delta table at `uri` (created if new) unless the table already holds
    `version` (or later) of `app_id`: Delta's idempotent write.

    Raises:
        ConfigError: the session has no Delta Lake connector.
    """
    try:
        (df.write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", version)
         .save(spark_uri(uri)))
    except Exception as exc:
        text = str(exc)
        if "DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source: delta" in text:
            raise ConfigError(
                f"pipeline target {uri} has format 'delta', written by Delta Lake's Spark "
                f"connector, which this Spark session does not have: run `make install` (the "
                f"jars go to .venv/jars), or give spark-submit --packages "
                f"io.delta:delta-spark_2.13:<version>") from exc
        raise


def run_delta_batch(pipeline: Pipeline) -> PipelineMetrics:
    """Consume one pinned range of the pipeline's stream into a target Spark writes."""
    started = time.monotonic()
    catalog, stream, opts = pipeline.catalog, pipeline.stream, pipeline.options
    spec, volume = catalog.stream_spec(stream)
    a, batch_id = spec["offset"], spec["batch_id"]
    app_id = app_id_for(stream, spec)
    so = pipeline.storage_options
    held = transaction_version(pipeline.target_uri, app_id, so)
    if held is not None and held > batch_id:
        raise VolumeStreamError(
            f"target {pipeline.target_uri} already holds batch {held} of stream {stream!r}, "
            f"whose offset is at batch {batch_id}: the warehouse's catalog was reset or "
            f"restored; use a new target or re-create the stream")
    records, now, pinned_a, end = catalog.pin_batch(stream)
    if (pinned_a, now["batch_id"], now["volume_id"]) != (a, batch_id, spec["volume_id"]):
        raise ConsumeConflictError(stream, a, pinned_a)  # another run finished this batch
    crash_point("after_pin")
    metrics: dict[str, Any] = {"stream": stream, "target": pipeline.target_uri,
                               "batch_id": batch_id, "start_version": a, "end_version": end}
    if a == end and not spec["initial_pending"]:
        return PipelineMetrics(**metrics, seconds=time.monotonic() - started)
    items = plan_items(records, opts)
    counts: dict[str, int] = {"files_seen": items.num_rows}
    if held == batch_id:  # a run that died before moving the offset wrote the whole batch
        log.info("stream %s batch %d: the target holds it already; moving the offset", stream,
                 batch_id)
        counts["resumed_files"] = items.num_rows
    elif items.num_rows:
        counts.update(_write_batch(pipeline, items, app_id, batch_id, catalog.object_reader(
            volume)))
    crash_point("after_target_commit")
    catalog.commit_offset(stream, spec["volume_id"], a, end, batch_id, rows=records.num_rows)
    return PipelineMetrics(**metrics, **counts, seconds=time.monotonic() - started)


def _write_batch(pipeline: Pipeline, items: Any, app_id: str, batch_id: int,
                 reader: Any) -> dict[str, int]:
    """Run the UDF over the batch on Spark and write errors, then results, idempotently."""
    from pyspark import StorageLevel
    from pyspark.sql.pandas.types import from_arrow_schema

    opts, spark = pipeline.options, pipeline.catalog.spark
    udf_schema = pipeline.udf.arrow_schema()
    plan = TaskPlan(records=items.filter(items["_process"]).select(RECORD_COLUMNS), tasks=0,
                    udf_blob=dump_udf(pipeline.udf), udf_schema=udf_schema, reader=reader,
                    target_uri=pipeline.target_uri, errors_uri=pipeline.errors_uri,
                    batch_id=batch_id, file_prefix="", max_attempts=opts.max_attempts,
                    retry_backoff_s=opts.retry_backoff_s,
                    storage_options={k: v for k, v in pipeline.storage_options.items()
                                     if not is_secret(k)})
    sc = spark.sparkContext
    plan.tasks = max(1, min(plan.records.num_rows,
                            opts.parallelism or 2 * sc.defaultParallelism))
    sc.setJobDescription(f"volume-stream pipeline {pipeline.stream} batch {batch_id} "
                         f"({plan.records.num_rows} files) -> {pipeline.target_uri}")
    rows = spark.range(0, plan.tasks, 1, numPartitions=plan.tasks).mapInArrow(
        functools.partial(run_rows_partition, plan), from_arrow_schema(rows_schema(udf_schema)))
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)  # the UDF runs once for both tables
    try:
        done = rows.where("kind = 'counts'").groupBy().sum("ok", "failed").collect()[0]
        ok, failed = int(done[0] or 0), int(done[1] or 0)
        if failed:
            errors = rows.where("kind = 'error'").select(
                *(f"error.`{c}`" for c in ERROR_SCHEMA.names))
            write_idempotent(errors, pipeline.errors_uri, app_id, batch_id)
            crash_point("after_errors_commit")
        target = rows.where("kind = 'target'").select(
            *(f"target.`{c}`" for c in result_schema(udf_schema).names))
        written = target.count()
        write_idempotent(target, pipeline.target_uri, app_id, batch_id)
    finally:
        rows.unpersist()
        sc.setJobDescription(None)
    log.info("stream %s batch %d: %d files ok, %d failed, %d rows -> %s (txnAppId %s, "
             "txnVersion %d)", pipeline.stream, batch_id, ok, failed, written,
             pipeline.target_uri, app_id, batch_id)
    return {"files_ok": ok, "files_failed": failed, "rows_written": written, "commits": 1}
