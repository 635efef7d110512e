"""Incremental pipeline jobs: one spec file (TOML or JSON) describes a pipeline; a job run
optionally refreshes or drains the volume, runs one batch (or until the stream is empty), and
exits 0 on success, non-zero on failure — for cron, Airflow and Kubernetes CronJobs.

Two front doors run the same code: `volume-stream run SPEC` (embedded local Spark, or the
active session) and `spark-submit examples/run_job.py SPEC` (any master: the session comes from
spark-submit's `--master`/`--conf`). A spec, with relative paths resolved against its folder:

    stream = "image_files"
    udf = "../image_metadata.py:image_metadata"   # a file, or "package.module:function"
    target = "image_meta"                         # a name in the warehouse, or a path
    refresh = true                                # list the volume before the batch
    until_empty = true                            # run batches until nothing is pending

    [options]                                     # Catalog.pipeline options
    path_glob = ["*.jpg", "*.png"]
    max_files_per_batch = 500                     # or format = "delta": Spark writes it

    [create.stream]                               # create the stream if it does not exist
    volume = "landing"
    show_initial_rows = true
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import os
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from connectors.errors import is_transient
from volume_stream._spark import get_spark
from volume_stream.catalog import connect
from volume_stream.config.settings import Settings
from volume_stream.errors import ConfigError, InvalidInputError, VolumeStreamError
from volume_stream.pipelines.udf import FileUdf
from volume_stream.streams.changes import StreamMode

__all__ = ["EXIT_FAILED", "EXIT_FILE_ERRORS", "EXIT_OK", "JobResult", "PipelineSpec",
           "load_spec", "load_udf", "main", "run_job"]

log = logging.getLogger("volume_stream.jobs")

EXIT_OK, EXIT_FAILED, EXIT_FILE_ERRORS = 0, 1, 3


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PipelineOptionsSpec(_Model):
    change_types: list[str] = ["INSERT", "UPDATE_AFTER"]
    path_glob: str | list[str] | None = None
    on_delete: Literal["ignore", "delete_rows"] = "ignore"
    max_files_per_batch: int | None = Field(default=None, ge=1)
    parallelism: int | None = Field(default=None, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    retry_backoff_s: float = Field(default=0.5, ge=0)
    format: Literal["delta"] | None = None


class VolumeCreateSpec(_Model):
    name: str
    location: str
    recursive: bool = True
    include: list[str] | None = None
    exclude: list[str] | None = None


class StreamCreateSpec(_Model):
    volume: str | None = None
    mode: StreamMode = "STANDARD"
    show_initial_rows: bool = False


class CreateSpec(_Model):
    volume: VolumeCreateSpec | None = None
    stream: StreamCreateSpec | None = None


class PipelineSpec(_Model):
    """A pipeline job, as read from a spec file (see the module docstring)."""

    stream: str
    udf: str
    target: str
    warehouse: str | None = None
    refresh: bool = False
    drain: bool = False
    drain_timeout_s: float = Field(default=300, gt=0)
    until_empty: bool = False
    max_batches: int = Field(default=1000, ge=1)
    fail_on_file_errors: bool = False
    options: PipelineOptionsSpec = PipelineOptionsSpec()
    create: CreateSpec = CreateSpec()
    base_dir: str = "."


def load_spec(path: str | os.PathLike) -> PipelineSpec:
    """Read and validate a `.toml` or `.json` pipeline spec.

    Raises:
        InvalidInputError: unreadable file, bad syntax, unknown or wrongly typed keys.

    Example:
        >>> spec = load_spec("examples/pipelines/image_metadata.toml")
        >>> spec.target
        'image_meta'
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read pipeline spec {path}: {exc.strerror or exc}"
                                ) from exc
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InvalidInputError(f"pipeline spec {path} is not valid "
                                f"{'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {exc}"
                                ) from exc
    if not isinstance(data, dict):
        raise InvalidInputError(f"pipeline spec {path} must be a table/object at the top")
    data.pop("base_dir", None)
    try:
        return PipelineSpec(**data, base_dir=str(path.resolve().parent))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        raise InvalidInputError(f"pipeline spec {path}: {problems}") from exc


def _resolve(base: str, value: str) -> str:
    if len(urlparse(value).scheme) > 1:
        return value  # a URI (s3://...) is not relative to anything
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else Path(base) / path)


def load_udf(ref: str, base_dir: str | os.PathLike = ".") -> Any:
    """The `@file_udf` named by `"path/to/file.py:function"` or `"package.module:function"`.

    Example:
        >>> load_udf("examples/image_metadata.py:image_metadata")
        FileUdf(image_metadata, ...)
    """
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise InvalidInputError(f"udf {ref!r} must look like 'path/to/file.py:function' or "
                                f"'package.module:function'")
    try:
        if module_ref.endswith(".py") or "/" in module_ref or os.sep in module_ref:
            file = Path(_resolve(str(base_dir), module_ref))
            if not file.is_file():
                raise InvalidInputError(f"udf {ref!r}: no such file {file}")
            name = f"_volume_stream_udf_{file.stem}"
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # pickling the UDF by value needs it registered
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_ref)
    except InvalidInputError:
        raise
    except Exception as exc:
        raise InvalidInputError(f"udf {ref!r}: importing {module_ref} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
    udf = getattr(module, attr, None)
    if udf is None:
        raise InvalidInputError(f"udf {ref!r}: {module_ref} has no {attr!r}")
    if not isinstance(udf, FileUdf):
        raise InvalidInputError(f"udf {ref!r} is not decorated with @volume_stream.file_udf("
                                f"schema)")
    return udf


@dataclass
class JobResult:
    """The batches a job ran and the exit code it ends with."""

    batches: list[Any] = field(default_factory=list)
    exit_code: int = EXIT_OK

    @property
    def files_failed(self) -> int:
        return sum(m.files_failed for m in self.batches)


def job_session(master: str | None = None) -> Any:
    """The SparkSession of a job: the active one; under spark-submit the one its `--master`
    and `--conf` describe; else volume-stream's embedded local session.

    Example:
        >>> job_session("local[2]").sparkContext.master  # outside spark-submit
        'local[2]'
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # spark-submit started the JVM: keep its master
        session = (SparkSession.builder.appName("volume-stream-job")
                   .config("spark.sql.session.timeZone", "UTC")
                   .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                   .getOrCreate())
        return session
    return get_spark(master)


def job_warehouse(spec: PipelineSpec, warehouse: str | os.PathLike | None = None
                  ) -> str | os.PathLike:
    """The warehouse a job runs in: `warehouse`, else the spec's, else the environment's."""
    if warehouse:
        return warehouse
    return _resolve(spec.base_dir, spec.warehouse) if spec.warehouse else Settings().warehouse


def run_job(spec: PipelineSpec, *, warehouse: str | os.PathLike | None = None,
            spark: Any = None) -> JobResult:
    """Prepare (create, refresh, drain), then run one batch or until the stream is empty.

    Example:
        >>> result = run_job(load_spec("job.toml"), warehouse="./warehouse")
        >>> result.exit_code
        0
    """
    settings = Settings()
    where = job_warehouse(spec, warehouse)
    catalog = _retrying("opening the warehouse", lambda: connect(
        where, storage_options=settings.storage_options, spark=spark))
    if spec.create.volume is not None:
        v = spec.create.volume
        if v.name not in {x["name"] for x in catalog.list_volumes()}:
            options = {k: val for k, val in (("include", v.include), ("exclude", v.exclude))
                       if val}
            catalog.create_volume(v.name, _resolve(spec.base_dir, v.location),
                                  recursive=v.recursive, **options)
    if spec.create.stream is not None and spec.stream not in {
            s["name"] for s in catalog.list_streams()}:
        s = spec.create.stream
        on = s.volume or (spec.create.volume.name if spec.create.volume else None)
        if on is None:
            raise ConfigError("[create.stream] needs `volume` (or a [create.volume] section)")
        catalog.create_stream(spec.stream, on_volume=on, mode=s.mode,
                              show_initial_rows=s.show_initial_rows)
    volume = _retrying(f"stream {spec.stream}",
                       lambda: catalog.describe_stream(spec.stream)).get("volume")
    if volume is None:
        raise ConfigError(f"stream {spec.stream!r} is on a table; file pipelines read streams "
                          f"on volumes")
    if spec.refresh:
        m = _retrying(f"refresh of {volume}", lambda: catalog.refresh(volume))
        log.info("refreshed %s: +%d ~%d -%d", volume, m.inserted, m.updated, m.deleted)
    if spec.drain:
        catalog.watch(volume, until_idle=True, timeout=spec.drain_timeout_s,
                      refresh=False)  # `refresh` above lists it when asked
    udf = load_udf(spec.udf, spec.base_dir)
    target = spec.target
    if "/" in target or target.startswith("."):
        target = _resolve(spec.base_dir, target)
    pipeline = catalog.pipeline(spec.stream, udf, target,
                                **spec.options.model_dump(exclude_none=True))
    result = JobResult()
    for _ in range(spec.max_batches if spec.until_empty else 1):
        metrics = _retrying(f"stream {spec.stream} batch", pipeline.run_once)
        empty = metrics.start_version == metrics.end_version and not metrics.files_seen
        if empty and result.batches:
            break  # nothing more pending: not a batch (a run with nothing at all reports one)
        result.batches.append(metrics)
        if empty:
            break
    if spec.fail_on_file_errors and result.files_failed:
        result.exit_code = EXIT_FILE_ERRORS
    return result


#: attempts of a step that fails transiently (a store answering 503, a body cut off): a batch
#: is safe to run again (its range is pinned in the catalog; its target skips what it holds)
_ATTEMPTS, _BACKOFF_S, _BACKOFF_MAX_S = 5, 0.5, 10.0


def _retrying(what: str, step: Any) -> Any:
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return step()
        except Exception as exc:
            if attempt == _ATTEMPTS or not is_transient(exc):
                raise
            delay = min(_BACKOFF_MAX_S, _BACKOFF_S * 2 ** (attempt - 1))
            log.warning("%s failed (attempt %d of %d), retrying in %.1fs: %s: %s", what,
                        attempt, _ATTEMPTS, delay, type(exc).__name__, exc)
            time.sleep(delay)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `spark-submit examples/run_job.py SPEC [options]`; returns the exit code.

    Prints one JSON line of metrics per batch on stdout; errors go to stderr.
    """
    parser = argparse.ArgumentParser(prog="run_job", description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="pipeline spec (.toml or .json)")
    parser.add_argument("--warehouse", help="warehouse folder (overrides the spec)")
    flag = argparse.BooleanOptionalAction
    parser.add_argument("--refresh", action=flag, help="refresh the volume first")
    parser.add_argument("--drain", action=flag, help="drain the volume's queue first")
    parser.add_argument("--until-empty", action=flag,
                        help="run batches until the stream has nothing pending")
    parser.add_argument("--fail-on-file-errors", action=flag,
                        help=f"exit {EXIT_FILE_ERRORS} if any file went to the errors table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        spec = load_spec(args.spec)
        flags = {k: getattr(args, k) for k in ("refresh", "drain", "until_empty",
                                                "fail_on_file_errors")
                 if getattr(args, k) is not None}  # given on the command line: beats the spec
        spec = spec.model_copy(update=flags)
        spark = job_session()
        log.info("pipeline job %s on Spark master %s", args.spec, spark.sparkContext.master)
        result = run_job(spec, warehouse=args.warehouse, spark=spark)
    except VolumeStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception:
        log.exception("pipeline job failed")
        return EXIT_FAILED
    for metrics in result.batches:
        print(json.dumps(metrics.as_dict()), flush=True)
    return result.exit_code
