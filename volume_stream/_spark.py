"""The SparkSession volume-stream works in: the active one if there is one (spark-submit, a
notebook), else an embedded local session with settings suited to small driver-side batches."""

from __future__ import annotations

import logging
import os
import sys
import tempfile

from pyspark.sql import SparkSession

from volume_stream.config.settings import Settings

__all__ = ["get_spark"]


def get_spark(master: str | None = None, app_name: str = "volume-stream") -> SparkSession:
    """Return the active SparkSession, or build a local one (`local[*]` unless `master` says).

    The session time zone is UTC: directory-table timestamps are UTC instants and must print as
    such. Arrow is on, because change sets travel driver <-> JVM as Arrow batches.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit (a gateway is already running) its --master wins; else local.
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master or Settings().spark_master or "local[*]")
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        # tables live in the volume-stream warehouse: Spark's own default `spark-warehouse/`
        # would appear in the working directory, so it is kept out of the way
        .config("spark.sql.warehouse.dir",
                os.path.join(tempfile.gettempdir(), f"volume-stream-spark-{os.getuid()}"))
        .config("spark.sql.catalogImplementation", "in-memory")
    )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    quiet_query_context_loggers()
    return session


def quiet_query_context_loggers() -> None:
    """Silence the loggers through which PySpark prints every analysis error (a JSON record with
    the whole Java stack) before raising it: volume-stream converts the exception into its own
    error with one message, and the CLI prints that."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # an older PySpark without them
        return
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)
