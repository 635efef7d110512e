"""The SparkSession volume-stream works in: the active one if there is one (spark-submit, a
notebook), a Spark Connect session when a remote is given (`sc://host:port`, e.g. a daemon's
warm Spark), else an embedded local session with settings suited to small driver-side batches.

Nothing here starts Spark at import: callers ask for a session only when a statement or a batch
really needs one (`Catalog.spark` is lazy), so syntax errors and empty runs never pay the JVM.

Spark's own output (log4j lines, the JVM's warnings, Python workers' stderr) is kept out of the
terminal unless `verbose` (or `VOLUME_STREAM_VERBOSE=1`): the local JVM is launched with its
stdout and stderr appended to `spark_log_path()` (`$VOLUME_STREAM_SPARK_LOG`, else
`volume-stream-spark.log` in the temp folder).

A local JVM started here runs with the jars `make install` fetched into the virtual environment
(`volume_stream._jars`): with Delta Lake's own Spark connector there, the session has Delta's SQL
extension and catalog, so `spark.read.format("delta").load(cat.table_path(name))`, the change
data feed and time travel work on the warehouse's tables (docs/spark-delta.md). Without those
jars the session is a plain Spark one, as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from volume_stream import _jars
from volume_stream.config.settings import Settings
from volume_stream.errors import ConfigError

__all__ = ["connect_conf", "get_spark", "interrupted", "is_connect", "jvm_conf", "remote_url",
           "spark_log_path", "worker_python"]

#: the Spark Connect plugin that serves sc:// clients from inside a driver (ships with pyspark 4)
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def remote_url(remote: str | None) -> str | None:
    """`sc://host:port` from `--remote` or `$VOLUME_STREAM_SPARK_REMOTE` (None: no remote)."""
    value = remote or Settings().spark_remote
    if not value:
        return None
    return value if value.startswith("sc://") else f"sc://{value}"


def is_connect(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_conf(port: int, host: str = "127.0.0.1") -> dict[str, str]:
    """The Spark settings that make a local session also serve Spark Connect on host:port."""
    return {"spark.plugins": CONNECT_PLUGIN,
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port)}


def _verbose(verbose: bool | None) -> bool:
    return Settings().verbose if verbose is None else verbose


def spark_log_path() -> Path:
    """Where a quiet local JVM's own output goes."""
    configured = os.environ.get("VOLUME_STREAM_SPARK_LOG")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / \
        "volume-stream-spark.log"


def _launch_quietly(builder: Any) -> None:
    """Launch the JVM gateway now, its stdout/stderr appended to `spark_log_path()`, so the
    session built next uses it (pyspark launches a gateway only when it has none)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        conf = SparkConf(loadDefaults=False)
        for key, value in builder._options.items():
            conf.set(key, value)
        path = spark_log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm


def get_spark(master: str | None = None, app_name: str = "volume-stream", *,
              remote: str | None = None, verbose: bool | None = None,
              extra_conf: dict[str, str] | None = None) -> Any:
    """Return the active SparkSession, a Spark Connect session (`remote`, or
    `$VOLUME_STREAM_SPARK_REMOTE`), or build a local one (`local[*]` unless `master` says).

    The session time zone is UTC: directory-table timestamps are UTC instants and must print as
    such. Arrow is on, because change sets travel driver <-> JVM as Arrow batches.

    Example:
        >>> get_spark(remote="sc://127.0.0.1:15002").sql("SELECT 1").collect()
        [Row(1=1)]
    """
    from pyspark.sql import SparkSession

    url = remote_url(remote)
    if url is not None:
        return _connect(url, Settings().connect_timeout)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit (a gateway is already running) its --master wins; else local.
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = master or Settings().spark_master or "local[*]"
        builder = builder.master(master)
    if ("PYSPARK_GATEWAY_PORT" not in os.environ and str(master).startswith("local")
            and os.environ.get("PYSPARK_PYTHON") in (None, "", sys.executable)):
        # workers on this machine: this Python, connecting back early (`_pyworker`)
        os.environ["PYSPARK_PYTHON"] = worker_python()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    quiet = not _verbose(verbose) and "PYSPARK_GATEWAY_PORT" not in os.environ
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        # tables live in the volume-stream warehouse: Spark's own default `spark-warehouse/`
        # would appear in the working directory, so it is kept out of the way, in a folder of
        # this process (its in-memory catalog forgets Spark's own tables at exit anyway)
        .config("spark.sql.warehouse.dir", _spark_warehouse_dir())
        .config("spark.sql.catalogImplementation", "in-memory")
    )
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # a JVM launched here: with our jars
        for key, value in jvm_conf().items():
            builder = builder.config(key, value)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    if quiet:
        _launch_quietly(builder)
    session = builder.getOrCreate()
    _cancel_jobs_on_sigint(session.sparkContext)
    session.sparkContext.setLogLevel("WARN" if _verbose(verbose) else "ERROR")
    quiet_query_context_loggers()
    return session


def worker_python() -> str:
    """The executable local sessions start Python workers with: `_pyworker.py` with a `#!` line
    naming this interpreter, written once into the temp folder (its name carries a digest of
    its text); this interpreter itself where a script cannot run (a path with spaces, a temp
    folder mounted `noexec`)."""
    text = f"#!{sys.executable}\n" + Path(__file__).with_name("_pyworker.py").read_text()
    folder = Path(tempfile.gettempdir())
    try:
        if " " in sys.executable or os.statvfs(folder).f_flag & os.ST_NOEXEC:
            return sys.executable
        path = folder / f"volume-stream-python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        if not path.exists():
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            os.replace(tmp, path)
        return str(path)
    except OSError:
        return sys.executable


_SIGINTS = 0  # Ctrl-Cs received while a local session ran


def interrupted() -> bool:
    """Whether Ctrl-C (SIGINT) has cancelled this process's Spark jobs: the error a cancelled
    job raises (often in place of the KeyboardInterrupt, from PySpark's `finally` blocks) is
    then the interrupt's doing, not a failure to report."""
    return _SIGINTS > 0


def _cancel_jobs_on_sigint(sc: Any) -> None:
    """Replace the SIGINT handler PySpark installs with one that works mid-call.

    PySpark's handler calls `cancelAllJobs` on the py4j connection the main thread is blocked
    on, which fails ("reentrant call") and logs two tracebacks before the KeyboardInterrupt.
    This one cancels from a thread of its own (its own connection) and raises the
    KeyboardInterrupt at once. A handler someone else installed is left alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if "SparkContext" not in getattr(current, "__qualname__", ""):
        return

    def cancel() -> None:
        try:
            sc.cancelAllJobs()
        except Exception:  # noqa: S110 - the JVM is gone or going: nothing left to cancel
            pass

    def on_sigint(signum: int, frame: Any) -> None:
        global _SIGINTS
        _SIGINTS += 1
        threading.Thread(target=cancel, name="spark-cancel", daemon=True).start()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)


def _host_port(url: str) -> tuple[str, int]:
    """Host and port of `sc://host:port[/;params]` (Spark Connect's default port 15002)."""
    from urllib.parse import urlparse

    try:
        parsed = urlparse(url.split("/;")[0])
        return parsed.hostname or "localhost", parsed.port or 15002
    except ValueError as exc:
        raise ConfigError(f"Spark Connect {url}: not a sc://HOST:PORT URL ({exc})") from exc


def _connect(url: str, timeout: float) -> Any:
    """A Spark Connect session to `url`, or a ConfigError within `timeout` seconds.

    pyspark's client retries an unreachable server for about ten minutes (and its first
    Ctrl-C is lost in the retries): the port is probed first, and the session is made in a
    helper thread that the main thread waits for, interruptibly, at most `timeout` seconds."""
    import socket
    import threading

    from pyspark.sql import SparkSession

    hint = "is the daemon running with [spark] connect_port?"
    host, port = _host_port(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(f"cannot connect to {url} ({reason.lower()} within {timeout:g}s); "
                          f"{hint}") from exc
    outcome: dict[str, Any] = {}

    def make() -> None:
        try:
            quiet_query_context_loggers()  # errors become ours, in one line, as locally
            outcome["session"] = SparkSession.builder.remote(url).getOrCreate()
            outcome["session"].conf.set("spark.sql.session.timeZone", "UTC")  # the first call
            outcome["ready"] = True
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc

    worker = threading.Thread(target=make, name="spark-connect", daemon=True)
    worker.start()
    try:
        worker.join(timeout)
    finally:
        if not outcome.get("ready") and "session" in outcome:
            _close(outcome["session"])  # else its exit handler would call the server again
    if worker.is_alive():
        raise ConfigError(f"cannot connect to {url} (no Spark Connect answer within "
                          f"{timeout:g}s; raise it with --connect-timeout); {hint}")
    exc = outcome.get("error")
    if isinstance(exc, ImportError):
        raise ConfigError(f"Spark Connect {url}: the client needs pyspark[connect] "
                          f"({exc})") from exc
    if exc is not None:
        raise ConfigError(f"cannot connect to {url} ({str(exc).strip().splitlines()[0]}); "
                          f"{hint}") from exc
    return outcome["session"]


def _close(session: Any) -> None:
    """Close a Spark Connect client that never reached its server."""
    try:
        session.client.close()
    except Exception:  # noqa: S110 - nothing more to release
        pass


def jvm_conf() -> dict[str, str]:
    """The settings that put the fetched jars on the driver's and executors' class path (they
    are local files: executors of a local cluster read them in place, nothing is copied),
    when Delta Lake's connector is among them, turn on its SQL extension and catalog, and map
    the class-data archive `make install` built from them (`_jars.archive_options`)."""
    paths = _jars.class_path()
    if not paths:
        return {}
    joined = os.pathsep.join(paths)
    conf = {"spark.driver.extraClassPath": joined, "spark.executor.extraClassPath": joined}
    archive = _jars.archive_options()
    if archive:  # the driver starts from the class-data archive `make install` built
        conf["spark.driver.extraJavaOptions"] = archive
    if _jars.has_delta():
        conf.update(_jars.DELTA_CONF)
    return conf


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


def _spark_warehouse_dir() -> str:
    """A temp folder for Spark's own (non-warehouse) tables, one per process, removed at exit."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix="volume-stream-spark-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
