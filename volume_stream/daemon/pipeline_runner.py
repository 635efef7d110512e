"""Pipelines the daemon runs on an interval: in the daemon's one Spark session, or as a child
process.

A `spec` pipeline runs in-process by default: its job (`cli.jobs.run_job`, what `volume-stream
run SPEC` does) uses the daemon's shared Spark session (`SharedSpark`), started when a batch
first has files to process and kept warm for every later interval and every other pipeline.
Each run's Spark jobs carry a tag, so a timeout or the daemon's shutdown interrupts them. With
`isolate = true` (or an explicit `command`) the run is a child process as before, which a
crash or a leak cannot take the daemon down with; the child's stdout and stderr (its metrics
lines, Spark's log4j lines, a traceback) are read line by line and logged through the daemon's
logging, tagged with the pipeline: with `--log-json` every line the daemon writes is JSON.
Pipelines are exactly-once by their stream offsets (DESIGN §5), so stopping one half-way
(daemon shutdown, timeout) only means the next run sees the same range again.

    runner = PipelineRunner("images", PipelineConfig(spec=Path("images.toml")), warehouse,
                            metrics, stop, spark=SharedSpark())
    runner.start()
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from volume_stream._spark import connect_conf, get_spark
from volume_stream.config.daemon import PipelineConfig, SparkConfig
from volume_stream.daemon.loop import LoopThread
from volume_stream.daemon.metrics import DaemonMetrics
from volume_stream.errors import VolumeStreamError

__all__ = ["PipelineRunner", "SharedSpark"]

log = logging.getLogger("volume_stream.daemon")

_TERMINATE_GRACE_S = 10.0


class SharedSpark:
    """The daemon's one Spark session, started on first `get()` (thread-safe) and stopped by
    `stop()`. With `connect_port` it also serves Spark Connect there (the plugin that ships
    with pyspark 4), so `volume-stream sql --remote sc://HOST:PORT` uses this warm Spark.

    Example:
        >>> shared = SharedSpark(SparkConfig(connect_port=15002))
        >>> shared.get().sql("SELECT 1").count()
        1
    """

    def __init__(self, config: SparkConfig | None = None, master: str | None = None) -> None:
        self.config = config or SparkConfig()
        self.master = self.config.master or master
        self._lock = threading.Lock()
        self._session: Any = None
        self._owned = False
        self.error: BaseException | None = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def get(self) -> Any:
        with self._lock:
            if self._session is None:
                started = time.monotonic()
                conf = ({} if self.config.connect_port is None else
                        connect_conf(self.config.connect_port, self.config.connect_host))
                from pyspark import SparkContext

                # a Spark already running in this process (tests, spark-submit) is used, and
                # left running at stop(); only one this object started is stopped
                self._owned = SparkContext._active_spark_context is None
                try:
                    self._session = get_spark(self.master, "volume-stream-daemon",
                                              extra_conf=conf)
                except BaseException as exc:
                    self.error = exc
                    raise
                where = (f", serving Spark Connect on sc://{self.config.connect_host}:"
                         f"{self.config.connect_port}" if conf else "")
                log.info("Spark started in %.1fs%s", time.monotonic() - started, where)
            return self._session

    def stop(self) -> None:
        """Stop the session if this object started it. A JVM that is already gone (a signal
        sent to the daemon's whole process group reaches Spark's JVM too, which exits at once)
        is logged, not raised: the daemon is stopping, not failing."""
        with self._lock:
            session, self._session = self._session, None
            if session is None or not self._owned:
                return
            try:
                session.stop()
            except Exception as exc:  # py4j: ConnectionRefusedError, Py4JNetworkError
                log.warning("Spark had already stopped (its JVM is gone: %s: %s)",
                            type(exc).__name__, exc)


class PipelineRunner(LoopThread):
    """Run one configured pipeline every `interval_s` (runs never overlap).

    With `spec` (and not `isolate`), the job runs in this process on `spark`, the daemon's
    shared session. With `isolate`, the command is `volume-stream run SPEC --warehouse
    WAREHOUSE` (the daemon's warehouse); with `command`, that list is run as is. Either way
    `VOLUME_STREAM_WAREHOUSE` is set to the daemon's warehouse in the child's environment.

    Example:
        >>> PipelineRunner("p", PipelineConfig(command=["true"]), Path("wh"),
        ...                DaemonMetrics(), threading.Event()).command()
        ['true']
    """

    def __init__(self, name: str, config: PipelineConfig, warehouse: Path | str,
                 metrics: DaemonMetrics, stop: threading.Event, *,
                 spark_master: str | None = None, spark: SharedSpark | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        self.name = name
        #: the warehouse's storage options (no secrets: the config refuses them)
        self.storage_options = dict(storage_options or {})
        self.spark_master = spark_master
        self.spark = spark or SharedSpark(master=spark_master)
        self.config = config
        self.warehouse = warehouse
        self.metrics = metrics
        self._stop = stop
        self.runs = 0
        self.last_outcome: str | None = None
        self.last_returncode: int | None = None
        self.running = False
        self._thread = threading.Thread(target=self._run, name=f"volume-stream-pipeline-{name}",
                                        daemon=True)

    def command(self) -> list[str]:
        if self.config.command is not None:
            return list(self.config.command)
        return [sys.executable, "-m", "volume_stream.cli", "run", str(self.config.spec),
                "--warehouse", str(self.warehouse)]

    def environment(self) -> dict[str, str]:
        """The child's environment: this one plus the daemon's warehouse and, when the daemon
        configuration sets `spark_master`, the master its Spark session is built with."""
        env = {**os.environ, "VOLUME_STREAM_WAREHOUSE": str(self.warehouse),
               "PYTHONUNBUFFERED": "1"}  # its lines reach the daemon's log as they are written
        if self.storage_options:
            env["VOLUME_STREAM_STORAGE_OPTIONS"] = json.dumps(self.storage_options)
        if self.spark_master:
            env["VOLUME_STREAM_SPARK_MASTER"] = self.spark_master
        return env

    def status(self) -> dict[str, Any]:
        return {"alive": self.alive, "running": self.running, "runs": self.runs,
                "last_outcome": self.last_outcome, "last_returncode": self.last_returncode}

    def _run(self) -> None:
        cfg = self.config
        next_run = time.monotonic() + (0 if cfg.run_on_start else cfg.interval_s)
        while not self._stop.wait(max(0.0, next_run - time.monotonic())):
            started = time.monotonic()
            try:
                self._run_once()
            except Exception:
                log.exception("pipeline %s: could not run", self.name,
                              extra={"pipeline": self.name})
                self._record("failed", None, time.monotonic() - started)
            # a run longer than the interval delays the next one; runs never pile up
            next_run = max(started + cfg.interval_s, time.monotonic())

    @property
    def in_process(self) -> bool:
        """Whether runs happen in this process's shared Spark session (not a child process)."""
        return self.config.spec is not None and not self.config.isolate

    def _run_once(self) -> None:
        if self.in_process:
            self._run_in_process()
            return
        cmd = self.command()
        env = self.environment()
        started = time.monotonic()
        log.info("pipeline %s: starting %s", self.name, " ".join(cmd),
                 extra={"pipeline": self.name})
        self.running = True
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    errors="replace", bufsize=1)
            relays = [threading.Thread(target=self._relay, args=(pipe, which), daemon=True,
                                       name=f"volume-stream-pipeline-{self.name}-{which}")
                      for pipe, which in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
            for relay in relays:
                relay.start()
            try:
                outcome = self._wait(proc, started)
            finally:
                for relay in relays:  # the pipes reach EOF once the child is gone
                    relay.join(timeout=_TERMINATE_GRACE_S)
        finally:
            self.running = False
        self._record(outcome, proc.returncode, time.monotonic() - started)

    def _relay(self, pipe: IO[str], which: str) -> None:
        """Log each line the child writes on `which` (its metrics JSON becomes `batch`)."""
        extra: dict[str, Any] = {"pipeline": self.name, "child_stream": which}
        with pipe:
            for raw in pipe:
                line = raw.rstrip("\r\n")
                if not line.strip():
                    continue
                if which == "stdout" and line.startswith("{"):
                    try:
                        batch = json.loads(line)
                    except ValueError:
                        batch = None
                    if isinstance(batch, dict):
                        log.info("pipeline %s: batch %s: %s files, %s failed", self.name,
                                 batch.get("batch_id"), batch.get("files_seen"),
                                 batch.get("files_failed"), extra={**extra, "batch": batch})
                        continue
                log.log(logging.INFO if which == "stdout" else logging.WARNING, "%s", line,
                        extra=extra)
    def _run_in_process(self) -> None:
        """One run of the spec's job on the shared session; its Spark jobs carry a tag that a
        timeout or the daemon's stop interrupts (the offsets then stay where they were)."""
        tag = f"volume-stream-pipeline-{self.name}-{self.runs}"
        box: dict[str, Any] = {}

        def session() -> Any:
            spark = self.spark.get()
            spark.addTag(tag)  # this thread's jobs only
            box["spark"] = spark
            return spark

        def work() -> None:
            from volume_stream.cli.jobs import EXIT_FAILED, load_spec, run_job

            try:
                result = run_job(load_spec(self.config.spec), warehouse=self.warehouse,
                                 spark=session)
                box["code"] = result.exit_code
                for m in result.batches:
                    if m.files_seen:  # as a child's metrics line is logged: a `batch` field
                        batch = m.as_dict()
                        log.info("pipeline %s: batch %s: %s files, %s failed", self.name,
                                 batch.get("batch_id"), batch.get("files_seen"),
                                 batch.get("files_failed"),
                                 extra={"pipeline": self.name, "batch": batch})
            except Exception as exc:
                box["code"] = EXIT_FAILED
                log.error("pipeline %s: run failed: %s: %s", self.name, type(exc).__name__,
                          exc, exc_info=not isinstance(exc, VolumeStreamError),
                          extra={"pipeline": self.name})
            finally:
                if "spark" in box:
                    box["spark"].removeTag(tag)

        started = time.monotonic()
        log.info("pipeline %s: starting %s in the daemon's Spark session", self.name,
                 self.config.spec, extra={"pipeline": self.name})
        self.running = True
        worker = threading.Thread(target=work, name=f"volume-stream-pipeline-{self.name}-run",
                                  daemon=True)
        try:
            worker.start()
            outcome = self._watch(worker, started, tag, box)
        finally:
            self.running = False
        code = box.get("code")
        if outcome == "ok" and code:
            outcome = "failed"
        self._record(outcome, code, time.monotonic() - started)

    def _watch(self, worker: threading.Thread, started: float, tag: str,
               box: dict[str, Any]) -> str:
        timeout = self.config.timeout_s
        while True:
            worker.join(0.2)
            if not worker.is_alive():
                return "ok"
            why = ("the daemon is stopping" if self._stop.is_set() else
                   f"it ran longer than timeout_s={timeout:g}"
                   if timeout is not None and time.monotonic() - started > timeout else None)
            if why is None:
                continue
            log.warning("pipeline %s: interrupting its Spark jobs because %s (its stream offsets "
                        "did not move, the next run sees the same changes)", self.name, why,
                        extra={"pipeline": self.name})
            if "spark" in box:
                try:
                    box["spark"].interruptTag(tag)
                except Exception as exc:  # the JVM is gone already: so are its jobs
                    log.warning("pipeline %s: could not interrupt its Spark jobs (%s: %s)",
                                self.name, type(exc).__name__, exc,
                                extra={"pipeline": self.name})
            worker.join(_TERMINATE_GRACE_S)
            if worker.is_alive():
                log.error("pipeline %s: still running %.0fs after the interrupt (outside "
                          "Spark); left to finish on its own", self.name, _TERMINATE_GRACE_S,
                          extra={"pipeline": self.name})
            return "stopped" if self._stop.is_set() else "timeout"

    def _wait(self, proc: subprocess.Popen, started: float) -> str:
        timeout = self.config.timeout_s
        while True:
            try:
                proc.wait(timeout=0.2)
                return "ok" if proc.returncode == 0 else "failed"
            except subprocess.TimeoutExpired:
                pass
            if self._stop.is_set():
                self._terminate(proc, "the daemon is stopping")
                return "stopped"
            if timeout is not None and time.monotonic() - started > timeout:
                self._terminate(proc, f"it ran longer than timeout_s={timeout:g}")
                return "timeout"

    def _terminate(self, proc: subprocess.Popen, why: str) -> None:
        log.warning("pipeline %s: terminating pid %d because %s (its stream offsets did not "
                    "move, the next run sees the same changes)", self.name, proc.pid, why,
                    extra={"pipeline": self.name})
        proc.terminate()
        try:
            proc.wait(timeout=_TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _record(self, outcome: str, returncode: int | None, seconds: float) -> None:
        self.runs += 1
        self.last_outcome, self.last_returncode = outcome, returncode
        self.metrics.pipeline_runs.labels(self.name, outcome).inc()
        self.metrics.pipeline_seconds.labels(self.name).set(seconds)
        level = logging.INFO if outcome in ("ok", "stopped") else logging.ERROR
        log.log(level, "pipeline %s: %s in %.1fs (exit code %s)", self.name, outcome, seconds,
                returncode, extra={"pipeline": self.name, "outcome": outcome,
                                   "returncode": returncode, "seconds": round(seconds, 3)})
