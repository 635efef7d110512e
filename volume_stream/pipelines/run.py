"""One pipeline run on the driver: pin the stream's range, plan the files, run them on Spark in
chunks, commit each chunk to Delta, then move the stream's offset.

The order of commits is what makes a crash harmless (DESIGN §5): the batch's range is recorded
in the catalog with its batch id first (`Catalog.pin_batch`, as `consume` does); then for each
chunk the errors table is committed, then the target, each with the batch's progress as Delta
app transactions (`pipelines.sink`); the offset moves only after the last chunk. A rerun after
a crash anywhere gets the same range back from the catalog (even if the volume moved on), skips
the files its target already holds, and finishes the batch; the next batch takes the rest. `VOLUME_STREAM_TEST_CRASH_AT`
is a test hook that SIGKILLs the process at a named point (see `crash_point`).

    metrics = run_batch(pipeline)
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import logging
import os
import signal
import sys
import time
import uuid
from contextlib import nullcontext
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction

from connectors.errors import is_transient
from connectors.secrets import is_secret
from directory_table.errors import storage_transient
from volume_stream._spark import interrupted
from volume_stream.errors import ConsumeConflictError, VolumeStreamError
from volume_stream.pipelines.executor import (
    ERROR_SCHEMA,
    MANIFEST_DDL,
    RECORD_COLUMNS,
    TaskPlan,
    dump_udf,
    result_schema,
    run_partition,
)
from volume_stream.pipelines.options import PipelineMetrics
from volume_stream.pipelines.sink import DeltaSink

#: the `pipelines.pipeline.Pipeline` being run (typed loosely: that module imports this one)
Pipeline = Any

__all__ = ["CRASH_ENV", "app_id_for", "crash_point", "plan_items", "run_batch"]

log = logging.getLogger("volume_stream._pipeline_run")

#: times a chunk's Spark job runs when it fails transiently (`_run_chunk`)
CHUNK_ATTEMPTS = 3

#: Test hook: the name of a point at which to SIGKILL this process (`crash_point`).
CRASH_ENV = "VOLUME_STREAM_TEST_CRASH_AT"


def crash_point(name: str) -> None:
    """Die at once, like a power cut, if `$VOLUME_STREAM_TEST_CRASH_AT` names this point.

    Points: `after_pin` (the batch's range recorded in the catalog, nothing written),
    `after_errors_commit` (a chunk's errors committed, its target rows not),
    `after_target_commit` (all output committed, offset not moved). Only tests set the
    variable (tests/volume_stream/test_pipeline_crash.py); it is read here and nowhere else.
    """
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def app_id_for(stream: str, spec: dict[str, Any]) -> str:
    """The Delta app id of a stream: its name plus a digest of its identity, so a stream that
    is dropped and re-created (batch ids restart at 0) is a new application."""
    ident = f"{spec['volume_id']}|{spec['created_at']}".encode()
    return f"volume-stream/{stream}/{hashlib.sha256(ident).hexdigest()[:16]}"


def plan_items(records: pa.Table, options: Any) -> pa.Table:
    """The batch's work list, in a fixed order: change records filtered by the path globs and
    change types, with `_process` (run the UDF) and `_remove` (drop the path's old rows).

    With `on_delete="delete_rows"` each path appears once, as its last image in the range;
    its old rows are removed and, if its change type is selected, replaced.
    """
    records = records.select(RECORD_COLUMNS)
    if options.path_glob:
        keep = [any(fnmatch.fnmatchcase(p, g) for g in options.path_glob)
                for p in records["relative_path"].to_pylist()]
        records = records.filter(pa.array(keep, pa.bool_()))
    selected = pc.is_in(records["__change_type"], pa.array(options.change_types))
    if options.on_delete == "ignore":
        items = records.filter(selected)
        n = items.num_rows
        return (items.append_column("_process", pa.array([True] * n))
                .append_column("_remove", pa.array([False] * n)))
    records = records.append_column("_process", selected)
    rows = [r for r in records.to_pylist() if r["__change_type"] != "UPDATE_BEFORE"]
    last: dict[str, dict] = {}
    for r in rows:  # records come ordered by commit version: the last one is the newest image
        last[r["relative_path"]] = r
    final = sorted(last.values(), key=lambda r: (r["__commit_version"], r["relative_path"]))
    for r in final:
        r["_process"] = bool(r["_process"]) and r["__change_type"] != "DELETE"
        r["_remove"] = True
    schema = records.schema.append(pa.field("_remove", pa.bool_()))
    return pa.Table.from_pylist(final, schema=schema)


def _fingerprint(items: pa.Table) -> int:
    digest = hashlib.sha256()
    for r in items.select(["relative_path", "__commit_version", "__change_type",
                           "_process"]).to_pylist():
        digest.update(f"{r['relative_path']}\0{r['__commit_version']}\0{r['__change_type']}"
                      f"\0{int(r['_process'])}\n".encode())
    return int(digest.hexdigest()[:15], 16)


def _progress_bar(pipeline: Pipeline, chunks: int):
    show = pipeline.options.progress
    if show is None:
        show = chunks > 1 and sys.stderr.isatty()
    if not show:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True))


def run_batch(pipeline: Pipeline) -> PipelineMetrics:
    """Consume one pinned range of the pipeline's stream (see module docstring)."""
    started = time.monotonic()
    catalog, stream, opts = pipeline.catalog, pipeline.stream, pipeline.options
    spec, volume = catalog.stream_spec(stream)
    a, batch_id = spec["offset"], spec["batch_id"]
    app_id = app_id_for(stream, spec)
    udf_schema = pipeline.udf.arrow_schema()
    so = pipeline.storage_options
    target = DeltaSink(pipeline.target_uri, result_schema(udf_schema), "target", so)
    errors = DeltaSink(pipeline.errors_uri, ERROR_SCHEMA, "errors", so)
    tdt, edt = target.ensure(), errors.ensure()
    tprog, eprog = DeltaSink.progress(tdt, app_id), DeltaSink.progress(edt, app_id)
    if tprog is not None and tprog.batch_id > batch_id:
        raise VolumeStreamError(
            f"target {pipeline.target_uri} already holds batch {tprog.batch_id} of stream "
            f"{stream!r}, whose offset is at batch {batch_id}: the warehouse's catalog was reset "
            f"or restored; use a new target or re-create the stream")
    tprog = tprog if tprog is not None and tprog.batch_id == batch_id else None
    eprog = eprog if eprog is not None and eprog.batch_id == batch_id else None
    pinned = tprog or eprog
    # the range is recorded in the catalog with the batch id before anything runs (DESIGN §5);
    # a target written before that record existed proposes its own end
    records, now, pinned_a, end = catalog.pin_batch(
        stream, end=pinned.end_version if pinned else None)
    if (pinned_a, now["batch_id"], now["volume_id"]) != (a, batch_id, spec["volume_id"]):
        raise ConsumeConflictError(stream, a, pinned_a)  # another run finished this batch
    if pinned is not None and pinned.end_version not in (None, end):
        raise VolumeStreamError(
            f"stream {stream!r} batch {batch_id} is recorded in the catalog as versions "
            f"({a}, {end}] but {pipeline.target_uri} holds part of it as ({a}, "
            f"{pinned.end_version}]: the warehouse's catalog was reset or restored; use a new "
            f"target or re-create the stream")
    crash_point("after_pin")
    metrics: dict[str, Any] = {"stream": stream, "target": pipeline.target_uri,
                               "batch_id": batch_id, "start_version": a, "end_version": end}
    if a == end and not spec["initial_pending"]:
        return PipelineMetrics(**metrics, seconds=time.monotonic() - started)
    items = plan_items(records, opts)
    fingerprint = _fingerprint(items)
    if pinned is not None and pinned.plan != fingerprint:
        raise VolumeStreamError(
            f"stream {stream!r} batch {batch_id} was partly committed to "
            f"{pipeline.target_uri} ({pinned.done} of its files) with other options "
            f"(change_types, path_glob or on_delete); rerun with the options it started with")
    done = tprog.done if tprog else 0
    errors_done = eprog.done if eprog else 0
    total = items.num_rows
    counts = {"files_seen": total, "resumed_files": done}
    if done:
        log.info("stream %s batch %d: resuming after %d of %d files already committed",
                 stream, batch_id, done, total)
    size = opts.max_files_per_batch or max(total, 1)
    n_chunks = max(1, -(-(total - done) // size))
    reader = catalog.object_reader(volume)
    udf_blob = dump_udf(pipeline.udf)
    run_id = uuid.uuid4().hex[:8]  # names this run's data files, to clean up after a failure
    with _progress_bar(pipeline, n_chunks) as bar:
        task = bar.add_task(f"{stream} batch {batch_id}", total=total,
                            completed=done) if bar else None
        start = done
        while start < total:
            stop = min(start + size, total)
            if start < errors_done < stop:
                stop = errors_done  # the errors table already holds [.., errors_done)
            chunk = items.slice(start, stop - start)
            plan = TaskPlan(records=chunk.filter(chunk["_process"]).select(RECORD_COLUMNS),
                            tasks=0, udf_blob=udf_blob, udf_schema=udf_schema, reader=reader,
                            target_uri=target.uri, errors_uri=errors.uri, batch_id=batch_id,
                            file_prefix=f"part-b{batch_id}-f{start}-{run_id}",
                            max_attempts=opts.max_attempts,
                            retry_backoff_s=opts.retry_backoff_s,
                            striped=opts.on_delete != "delete_rows",
                            storage_options={k: v for k, v in so.items() if not is_secret(k)})
            manifest = _run_chunk(catalog.spark, plan, opts.parallelism, (target, errors),
                                  f"volume-stream pipeline {stream} batch {batch_id} "
                                  f"files {start}-{stop} of {total}")
            removals, rows_deleted = [], 0
            if opts.on_delete == "delete_rows":
                paths = set(chunk.filter(chunk["_remove"])["relative_path"].to_pylist())
                removals, rows_deleted = target.rewrite_without(tdt, paths)
                counts["paths_deleted"] = counts.get("paths_deleted", 0) + int(
                    pc.sum(pc.invert(chunk["_process"])).as_py() or 0)
            meta = {"stream": stream, "batch_id": batch_id, "start_version": a,
                    "end_version": end, "files": [start, stop], "files_total": total}
            commit = {"app_id": app_id, "batch_id": batch_id, "done": stop,
                      "end_version": end, "plan": fingerprint, "metadata": meta}
            rewritten = [{"path": r.path} for r in removals if isinstance(r, AddAction)]
            pending_errors = manifest["errors"]
            try:
                if pending_errors and errors_done < stop:
                    errors.commit(edt, DeltaSink.add_actions(pending_errors), **commit)
                    pending_errors = []
                    crash_point("after_errors_commit")
                target.commit(tdt, [*removals, *DeltaSink.add_actions(manifest["target"])],
                              **commit)
            except CommitFailedError as exc:  # another run committed this batch's app id
                target.discard([*manifest["target"], *rewritten])
                errors.discard(pending_errors)
                raise ConsumeConflictError(stream, a, catalog.stream_spec(stream)[0]["offset"]
                                           ) from exc
            errors.discard(pending_errors)  # already in the errors table from an earlier run
            for key, value in (("files_ok", manifest["ok"]), ("files_failed", manifest["failed"]),
                               ("rows_written", sum(m["num_rows"] for m in manifest["target"])),
                               ("rows_deleted", rows_deleted), ("commits", 1)):
                counts[key] = counts.get(key, 0) + value
            log.info("stream %s batch %d: committed files %d-%d of %d (%d ok, %d failed)",
                     stream, batch_id, start, stop, total, manifest["ok"], manifest["failed"])
            if bar:
                bar.update(task, completed=stop)
            start = stop
    crash_point("after_target_commit")
    catalog.commit_offset(stream, spec["volume_id"], a, end, batch_id, rows=records.num_rows)
    return PipelineMetrics(**metrics, **counts, seconds=time.monotonic() - started)


def _run_chunk(spark: Any, plan: TaskPlan, parallelism: int | None,
               sinks: tuple[DeltaSink, DeltaSink], description: str) -> dict[str, Any]:
    """Run a chunk's Spark job; a job that failed transiently (a task's write failed on the
    store after its own retries) runs again, up to `CHUNK_ATTEMPTS` times: the chunks committed
    before stay committed and the batch goes on from this one (DESIGN §7). The files of a failed
    attempt's tasks are deleted."""
    prefix = plan.file_prefix
    for attempt in range(1, CHUNK_ATTEMPTS + 1):
        plan.file_prefix = prefix if attempt == 1 else f"{prefix}-a{attempt}"
        try:
            return _run_spark(spark, plan, parallelism, description)
        except BaseException as exc:
            for sink in sinks:  # files of tasks that finished before the failure
                sink.discard_prefix(plan.file_prefix)
            if attempt == CHUNK_ATTEMPTS or not _failed_transiently(exc):
                raise
            log.warning("%s: failed transiently (%s), running it again", description,
                        _first_line(exc))
            time.sleep(2.0 * attempt)
    raise AssertionError("unreachable")


def _failed_transiently(exc: BaseException) -> bool:
    """Whether a chunk's Spark job failed on a transient store error in a task (its Python
    error comes back as the text of Spark's exception), not because it was cancelled."""
    if not isinstance(exc, Exception) or interrupted():
        return False
    text = str(exc)
    if "cancelled" in text.lower() or "canceled" in text.lower():
        return False
    return is_transient(exc) or storage_transient(OSError(text))


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def _run_spark(spark: Any, plan: TaskPlan, parallelism: int | None,
               description: str) -> dict[str, Any]:
    """Run a chunk's plan as one Spark job; return its manifest grouped by kind."""
    out: dict[str, Any] = {"target": [], "errors": [], "ok": 0, "failed": 0}
    n = plan.records.num_rows
    if n == 0:
        return out
    sc = spark.sparkContext
    plan.tasks = max(1, min(n, parallelism or 2 * sc.defaultParallelism))
    sc.setJobDescription(description)
    try:
        df = spark.range(0, plan.tasks, 1, numPartitions=plan.tasks).mapInArrow(
            functools.partial(run_partition, plan), MANIFEST_DDL)
        rows = df.toArrow().to_pylist()
    finally:
        sc.setJobDescription(None)
    for row in rows:
        if row["kind"] == "counts":
            out["ok"] += row["ok"]
            out["failed"] += row["failed"]
        else:
            out[row["kind"]].append(row)
    return out
