"""The run context every benchmark receives: sizes mode, scratch folders, the Spark session.

Two scratch folders: `workdir` (warehouses, Delta tables, Spark checkpoints) on the ordinary
temp disk, and `datadir` (the files of local volumes) on tmpfs (`/dev/shm`) when there is one,
because creating 100k small files on the VM's disk takes minutes, on tmpfs seconds. Both
systems compared in a figure always work on the same folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks._report import Report

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Context", "default_datadir", "run_alone"]

SPARK_MASTER = "local[2]"


def default_datadir() -> str:
    """`/dev/shm` when it is a writable folder, else the temp folder."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


@dataclass
class Context:
    """Settings and shared resources of one `python -m benchmarks` run."""

    report: Report
    quick: bool = False
    profile: bool = False
    keep: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vs-bench-")))
    datadir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(
        prefix="vs-bench-data-", dir=default_datadir())))
    _spark: SparkSession | None = None
    _cache: dict = field(default_factory=dict)

    def path(self, *parts: str) -> Path:
        """A fresh (not yet existing) path under the workdir."""
        return self.workdir.joinpath(*parts)

    def data_path(self, *parts: str) -> Path:
        """A path under the tmpfs data folder (for volume files)."""
        return self.datadir.joinpath(*parts)

    @property
    def spark(self) -> SparkSession:
        """The local Spark session (started on first use)."""
        if self._spark is None:
            from volume_stream._spark import get_spark

            started = time.perf_counter()
            self._spark = get_spark(master=SPARK_MASTER)
            self.report.say(f"Spark session ({SPARK_MASTER}) started in "
                            f"{time.perf_counter() - started:.1f} s (not measured)")
        return self._spark

    @property
    def spark_started(self) -> bool:
        return self._spark is not None

    def cached(self, key: object, build):
        """`build()` once per run and key (e.g. a 1M-row template table shared by benchmarks)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def close(self) -> None:
        """Stop Spark and delete the scratch folders (unless `keep`)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
            shutil.rmtree(self.datadir, ignore_errors=True)


def run_alone(name: str, title: str, run: Callable[[Context], None], *, quick: bool,
              keep: bool = False) -> int:
    """Run one benchmark's `run` outside `python -m benchmarks` (a module's own `main`):
    its figures printed as measured, then the summary lines."""
    report = Report(echo=lambda line: print(line, flush=True))
    ctx = Context(report, quick=quick, keep=keep)
    section = report.begin(name, title)
    started = time.perf_counter()
    try:
        run(ctx)
    finally:
        section.seconds = time.perf_counter() - started
        ctx.close()
    for line in report.summary_lines():
        print(line)
    return 0
