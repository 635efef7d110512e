"""Shared fixtures: one local SparkSession for the whole run, and a guard that fails any test
which leaves one of our threads or a child process running."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", os.sys.executable)
# Every Spark driver the tests start (this process's, and those of the CLI processes, daemons
# and jobs they run, which inherit the variable; spark-submit adds it to the driver's JVM
# options) compiles with the client compiler only: the JIT's optimising tier spends more CPU
# than a test JVM of a minute ever gets back (measured: a driver's start-up and first queries
# took 37 s of CPU, 20 s with the class-data archive, 10 s with both). Nothing tested depends
# on it; `make bench` and users' processes keep the JVM's default. For the same reason they
# evaluate expressions interpreted instead of generating and compiling Java for each (Spark's
# own test suites run both modes; results are the same): a test's queries run once on a few
# rows, and compiling them cost more than running them (measured: 11-22% of the CPU of
# tests/interop/test_register.py and test_cli_first_run.py).
os.environ.setdefault("SPARK_SUBMIT_OPTS",
                      "-XX:TieredStopAtLevel=1 -Dspark.sql.codegen.factoryMode=NO_CODEGEN")


#: children a session-scoped fixture started (an emulator) that outlive the test that first
#: asked for them: not a leak of that test
SESSION_CHILDREN: set[int] = set()


def _child_pids() -> set[int]:
    me = os.getpid()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # field 4 (after the parenthesised command, which may contain spaces) is the ppid
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == me:
            pids.add(int(entry))
    return pids - SESSION_CHILDREN


def _our_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("volume-stream") or not t.daemon}


@pytest.fixture(autouse=True)
def no_leaks():
    threads_before = _our_threads()
    children_before = _child_pids()
    yield
    deadline = time.monotonic() + 5
    while True:
        leaked_threads = {t for t in _our_threads() - threads_before if t.is_alive()}
        leaked_children = _child_pids() - children_before
        # a zombie or a just-exiting child is not a leak once it is gone
        leaked_children = {p for p in leaked_children if Path(f"/proc/{p}").exists()
                           and " Z " not in Path(f"/proc/{p}/stat").read_text()}
        if not leaked_threads and not leaked_children:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    pytest.fail(f"test leaked threads {sorted(t.name for t in leaked_threads)} "
                f"or child processes {sorted(leaked_children)}")


@pytest.fixture(scope="session")
def spark():
    from volume_stream._spark import get_spark

    session = get_spark(master="local[2]")
    yield session
    # Spark's own threads and JVM live for the session; stopped once at the end.
    session.stop()
