"""Pipelines the daemon runs on an interval, each as a child process.

A child process keeps the daemon small and safe: a pipeline needs Spark (a JVM), may run for
minutes and may crash; the daemon's listeners need none of that. Pipelines are exactly-once by
their stream offsets (DESIGN §5), so stopping one half-way (daemon shutdown, timeout) only means
the next run sees the same range again.

    runner = PipelineRunner("images", PipelineConfig(spec=Path("images.toml")), warehouse,
                            metrics, stop)
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
from typing import Any

from volume_stream.config.daemon import PipelineConfig
from volume_stream.daemon.loop import LoopThread
from volume_stream.daemon.metrics import DaemonMetrics

__all__ = ["PipelineRunner"]

log = logging.getLogger("volume_stream.daemon")

_TERMINATE_GRACE_S = 10.0


class PipelineRunner(LoopThread):
    """Run one configured pipeline every `interval_s` (runs never overlap).

    With `spec`, the command is `volume-stream run SPEC --warehouse WAREHOUSE` (the daemon's
    warehouse); with `command`, that list is run as is. Either way `VOLUME_STREAM_WAREHOUSE` is
    set to the daemon's warehouse in the child's environment.

    Example:
        >>> PipelineRunner("p", PipelineConfig(command=["true"]), Path("wh"),
        ...                DaemonMetrics(), threading.Event()).command()
        ['true']
    """

    def __init__(self, name: str, config: PipelineConfig, warehouse: Path | str,
                 metrics: DaemonMetrics, stop: threading.Event, *,
                 spark_master: str | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        self.name = name
        #: the warehouse's storage options (no secrets: the config refuses them)
        self.storage_options = dict(storage_options or {})
        self.spark_master = spark_master
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
        env = {**os.environ, "VOLUME_STREAM_WAREHOUSE": str(self.warehouse)}
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

    def _run_once(self) -> None:
        cmd = self.command()
        env = self.environment()
        started = time.monotonic()
        log.info("pipeline %s: starting %s", self.name, " ".join(cmd),
                 extra={"pipeline": self.name})
        self.running = True
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
            outcome = self._wait(proc, started)
        finally:
            self.running = False
        self._record(outcome, proc.returncode, time.monotonic() - started)

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
