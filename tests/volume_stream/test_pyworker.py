"""The Python local sessions start their workers with (`volume_stream._pyworker`): a worker the
JVM waits for connects back and sends its secret before it imports PySpark (issue 34: at load
11-16 a Python data source's streaming runner took longer than Spark's fixed 10 s to import
PySpark and connect, and the query failed with "Python worker failed to connect back"; the
secret has a fixed 10 s of its own).

The test plays the JVM's part: it listens, as `PythonWorkerFactory.createSimpleWorker` does,
and hands the worker a PySpark whose import waits until the test has seen the connection, so
an import as slow as a busy machine makes it is certain, not timed. The stand-in speaks
PySpark's handshake (a length-prefixed secret, answered "ok", then the worker's pid); the
real handshake runs in every Spark test, whose workers all start through this file."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from volume_stream._spark import worker_python

_UTIL = '''
import os, socket, struct

def _do_server_auth(sockfile, secret):
    data = secret.encode()
    sockfile.write(struct.pack("!i", len(data)) + data)
    sockfile.flush()
    (n,) = struct.unpack("!i", sockfile.read(4))
    assert sockfile.read(n) == b"ok"

def local_connect_and_auth(port, secret):
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    sockfile = sock.makefile("rwb", 65536)
    _do_server_auth(sockfile, secret)
    return sockfile, sock
'''

_RUNNER = '''
import os, struct
from pyspark.util import local_connect_and_auth

if __name__ == "__main__":
    sockfile, _ = local_connect_and_auth(int(os.environ["PYTHON_WORKER_FACTORY_PORT"]),
                                         os.environ["PYTHON_WORKER_FACTORY_SECRET"])
    sockfile.write(struct.pack("!i", os.getpid()))
    sockfile.flush()
'''


def _slow_pyspark(root: Path, gate: Path) -> Path:
    """A `pyspark` whose import waits until `gate` exists."""
    package = root / "pyspark"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        import os, select
        while not os.path.exists({str(gate)!r}):
            select.select([], [], [], 0.05)
    """))
    (package / "util.py").write_text(_UTIL)
    (package / "runner.py").write_text(_RUNNER)
    return root


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the worker closed the connection"
        data += chunk
    return data


def test_a_worker_connects_back_and_authenticates_before_importing_pyspark(tmp_path):
    gate = tmp_path / "imports-may-finish"
    path = _slow_pyspark(tmp_path / "site", gate)
    server = socket.create_server(("127.0.0.1", 0))
    secret = "s3cret"
    env = {**os.environ, "PYTHONPATH": str(path), "PYTHON_WORKER_FACTORY_SECRET": secret,
           "PYTHON_WORKER_FACTORY_PORT": str(server.getsockname()[1])}
    launcher = worker_python()
    assert launcher != sys.executable  # this machine runs it as PySpark's Python
    worker = subprocess.Popen([launcher, "-m", "pyspark.runner"], env=env, cwd=tmp_path)
    try:
        # the JVM's waits: the connection and the secret arrive while PySpark's import is
        # still held up; the pid (which the JVM awaits without a limit) after it
        server.settimeout(120)
        conn, _ = server.accept()
        conn.settimeout(120)
        (n,) = struct.unpack("!i", _read(conn, 4))
        assert _read(conn, n).decode() == secret
        conn.sendall(struct.pack("!i", 2) + b"ok")
        gate.touch()
        (pid,) = struct.unpack("!i", _read(conn, 4))
        assert pid == worker.pid
        assert worker.wait(120) == 0
    finally:
        gate.touch()
        worker.kill()
        worker.wait()
        server.close()


def test_anything_but_a_module_goes_to_the_interpreter_as_it_is(tmp_path):
    out = subprocess.run([worker_python(), "-c", "import sys; print(sys.argv[1:])", "x"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['x']"
