"""The Python that a local Spark session starts its Python workers with: `python -m MODULE`, as
PySpark runs them, except that a worker the JVM waits for connects back and authenticates
before it imports PySpark (DESIGN §5).

Spark 4 starts the driver-side runners of a Python data source (a streaming reader's
`pyspark.sql.streaming.python_streaming_source_runner`, the planners of `pyspark.sql.worker`)
as plain workers and waits a fixed 10 s for each to connect back, then another fixed 10 s for
its secret (`PythonWorkerFactory.createSimpleWorker`, `SocketAuthHelper.authClient`; no
setting changes either). PySpark connects only after its imports (0.3 s of CPU), which took
18-20 s of wall time on a 2-core machine at load 15: the query failed with "Python worker
failed to connect back". Here the connection and the secret (PySpark's handshake: the secret's
length and bytes, answered "ok" the same way) go first, with the standard library alone; then
PySpark is imported and uses that connection, writing the worker's pid on it as it always
does (the JVM waits for that without a limit).

`_spark` writes this file, with a `#!` line naming the interpreter, as `PYSPARK_PYTHON` of the
local sessions it starts; it imports nothing of volume-stream, so it runs wherever that Python
does. Anything but `-m MODULE` is handed to the interpreter as it is.
"""

from __future__ import annotations

import os
import runpy
import socket
import struct
import sys


def _connect_early() -> tuple[object, socket.socket] | None:
    """(what PySpark will ask to connect to, the socket connected and authenticated now) when
    this worker is one the JVM waits for (its port and secret, or its Unix socket, in the
    environment)."""
    path = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    port = os.environ.get("PYTHON_WORKER_FACTORY_PORT")
    secret = os.environ.get("PYTHON_WORKER_FACTORY_SECRET")
    timeout = int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    try:
        if path and secret is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(path)
            return path, sock
        if port and secret is not None:
            ipv6 = os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true"
            sock = socket.create_connection(("::1" if ipv6 else "127.0.0.1", int(port)),
                                            timeout=timeout)
            _authenticate(sock, secret)
            return int(port), sock
    except (OSError, ValueError):
        pass  # PySpark connects as it always does, and reports what goes wrong
    return None


def _authenticate(sock: socket.socket, secret: str) -> None:
    """PySpark's `_do_server_auth`: the secret, then the JVM's "ok" (each length-prefixed)."""
    data = secret.encode("utf-8")
    sock.sendall(struct.pack("!i", len(data)) + data)
    (length,) = struct.unpack("!i", _read(sock, 4))
    if _read(sock, length) != b"ok":
        raise ConnectionError("the JVM refused this worker's secret")


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the JVM closed the connection")
        data += chunk
    return data


def _hand_over(conn_info: object, sock: socket.socket) -> None:
    """Make PySpark's first `local_connect_and_auth(conn_info, ...)` return `sock`, already
    authenticated."""
    import pyspark.util as util  # the import that made the connection late

    original = util.local_connect_and_auth
    early: list[socket.socket] = [sock]

    def local_connect_and_auth(info, auth_secret):  # noqa: ANN001, ANN202 (PySpark's own)
        if not early or info != conn_info:
            return original(info, auth_secret)
        mine = early.pop()
        return mine.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536))), mine

    for name, loaded in list(sys.modules.items()):  # modules that imported it by name
        if name.startswith("pyspark") and getattr(loaded, "local_connect_and_auth",
                                                  None) is original:
            loaded.local_connect_and_auth = local_connect_and_auth


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "-m":
        os.execv(sys.executable, [sys.executable, *argv])
    module = argv[1]
    early = _connect_early()
    sys.path[0] = os.getcwd()  # what `python -m` puts first, not this file's folder
    if early is not None:
        _hand_over(*early)
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
