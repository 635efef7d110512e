"""A `volume-stream` process that cannot go on says so in one line (issues 22 and 24): a Spark
Connect server that is not there (or does not answer) is reported within --connect-timeout, and
Ctrl-C (SIGINT to the whole process group, as a terminal sends it) during Spark work prints one
line and exits 130. Every process here is a real `volume-stream` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import volume_stream as vs

CLI = str(Path(sys.executable).parent / "volume-stream")
REPO = Path(__file__).resolve().parents[2]


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("VOLUME_STREAM_")}
    out.update({"VOLUME_STREAM_SPARK_LOG": str(tmp_path / "spark.log"),
                "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", **extra})
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_missing_spark_connect_server_is_reported_at_once(tmp_path):
    vs.connect(tmp_path / "wh")  # SELECT only reads: it needs a warehouse
    port = _free_port()  # nothing listens there
    proc = subprocess.run([CLI, "sql", "--warehouse", str(tmp_path / "wh"), "--remote",
                           f"sc://127.0.0.1:{port}", "-e", "SELECT 1"], capture_output=True,
                          text=True, env=env(tmp_path), timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot connect to sc://127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_silent_spark_connect_server_times_out(tmp_path):
    """A port that accepts connections but never answers: --connect-timeout bounds the wait."""
    vs.connect(tmp_path / "wh")  # SELECT only reads: it needs a warehouse
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        proc = subprocess.run([CLI, "sql", "--warehouse", str(tmp_path / "wh"), "--remote",
                               f"sc://127.0.0.1:{port}", "--connect-timeout", "3", "-e",
                               "SELECT 1"], capture_output=True, text=True, env=env(tmp_path),
                              timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot connect to sc://127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "3" in proc.stderr and "Traceback" not in proc.stderr


def test_ctrl_c_while_connecting_stops_at_once(tmp_path):
    vs.connect(tmp_path / "wh")  # SELECT only reads: it needs a warehouse
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(120)
        port = server.getsockname()[1]
        proc = subprocess.Popen([CLI, "sql", "--warehouse", str(tmp_path / "wh"), "--remote",
                                 f"sc://127.0.0.1:{port}", "--connect-timeout", "600", "-e",
                                 "SELECT 1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env(tmp_path), start_new_session=True)
        try:
            conn, _ = server.accept()  # the client is connecting
            conn.close()
            os.killpg(proc.pid, signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert stderr.strip() == "interrupted", stderr


# ---------------------------------------------------------------------- Ctrl-C during Spark work
SLOW_UDF = """
import os, time

def slow(value):
    open(os.environ["MARKER"], "w").write("started")
    time.sleep(600)
    return value
"""


@pytest.fixture
def slow(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data)
    cat.create_stream("s", "vol", show_initial_rows=True)
    cat.refresh("vol")
    (tmp_path / "slow_udfs.py").write_text(SLOW_UDF)
    return tmp_path / "wh"


def interrupt_when_started(tmp_path: Path, args: list[str]) -> tuple[int, str, str]:
    """Run the CLI, wait until the slow UDF runs on a Spark worker (its marker file), then send
    SIGINT to the process group (what Ctrl-C in a terminal does)."""
    marker = tmp_path / "marker"
    proc = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, start_new_session=True,
                            env=env(tmp_path, MARKER=str(marker)))
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # polling for the marker, not a fixed wait
        assert marker.exists(), proc.communicate(timeout=60)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, stdout, stderr


def test_ctrl_c_during_a_query_prints_one_line(tmp_path, slow):
    code, stdout, stderr = interrupt_when_started(
        tmp_path, ["sql", "--warehouse", str(slow), "--udf", "slow=slow_udfs:slow", "-e",
                   "SELECT slow(relative_path) AS p FROM s"])
    assert code == 130, stdout + stderr
    assert stderr.strip() == "interrupted", stderr


@pytest.mark.slow  # a CLI process with its own Spark JVM, interrupted: make soak
def test_ctrl_c_during_a_write_says_the_offset_is_unchanged(tmp_path, slow):
    before = vs.connect(slow).describe_stream("s")
    code, stdout, stderr = interrupt_when_started(
        tmp_path, ["sql", "--warehouse", str(slow), "--udf", "slow=slow_udfs:slow", "-e",
                   "CREATE TABLE t AS SELECT slow(relative_path) AS p FROM s"])
    assert code == 130, stdout + stderr
    assert stderr.strip() == "interrupted; offset of stream s unchanged", stderr
    after = vs.connect(slow).describe_stream("s")
    assert (after["offset"], after["batch_id"]) == (before["offset"], before["batch_id"])


@pytest.mark.slow  # a CLI process with its own Spark JVM, interrupted: make soak
def test_ctrl_c_during_a_pipeline_run_prints_one_line(tmp_path, slow):
    (tmp_path / "udf.py").write_text(
        "import os, time\nimport volume_stream as vs\n\n@vs.file_udf('n long')\n"
        "def size(file):\n    open(os.environ['MARKER'], 'w').write('started')\n"
        "    time.sleep(600)\n    return {'n': file.size}\n")
    spec = tmp_path / "job.toml"
    spec.write_text('stream = "s"\nudf = "udf.py:size"\ntarget = "sizes"\n')
    before = vs.connect(slow).describe_stream("s")
    code, stdout, stderr = interrupt_when_started(
        tmp_path, ["run", str(spec), "--warehouse", str(slow)])
    assert code == 130, stdout + stderr
    assert stderr.strip() == "interrupted; offset of stream s unchanged", stderr
    after = vs.connect(slow).describe_stream("s")
    assert (after["offset"], after["batch_id"]) == (before["offset"], before["batch_id"])


def test_py4j_records_of_an_interrupt_are_dropped_where_py4j_logs_them(caplog):
    """py4j logs on its child loggers ("py4j.clientserver"); the CLI's filter has to sit there,
    since records propagated to the root logger never pass the root logger's filters. The
    record here is the one CI printed: a broken pipe while closing the connection Ctrl-C broke."""
    import logging

    from volume_stream.cli._common import _Py4jInterrupts, quiet_py4j_interrupts

    def broken_pipe_after_interrupt() -> BaseException:
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise BrokenPipeError(32, "Broken pipe") from None
        except BrokenPipeError as exc:
            exc.__context__ = KeyboardInterrupt()
            return exc

    loggers = [logging.getLogger(n) for n in ("py4j.clientserver", "py4j.java_gateway")]
    quiet_py4j_interrupts()
    try:
        with caplog.at_level(logging.INFO):
            for log in loggers:
                exc = broken_pipe_after_interrupt()
                log.error("Exception occurred while shutting down connection",
                          exc_info=(type(exc), exc, exc.__traceback__))
                log.error("a py4j error of its own")
            exc = broken_pipe_after_interrupt()  # py4j's logging.exception(...): the root logger
            logging.getLogger().handle(logging.makeLogRecord({
                "name": "root", "levelno": logging.ERROR, "levelname": "ERROR",
                "msg": "KeyboardInterrupt while sending command.",
                "pathname": "/venv/site-packages/py4j/java_gateway.py",
                "exc_info": (type(exc), exc, exc.__traceback__)}))
            logging.getLogger().error("not py4j's", exc_info=(type(exc), exc, None))
        assert [r.getMessage() for r in caplog.records] == [
            "a py4j error of its own", "a py4j error of its own", "not py4j's"]
    finally:
        for log in [*loggers, logging.getLogger("py4j"), logging.getLogger()]:
            for f in [f for f in log.filters if isinstance(f, _Py4jInterrupts)]:
                log.removeFilter(f)
