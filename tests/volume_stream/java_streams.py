"""The AWS SDK for Java v2's `DynamoDbStreamsClient` as a test's client of the shard API: the
probe program (tests/volume_stream/java/StreamsProbe.java) is compiled once against the SDK
bundle jar `make install` fetched (volume_stream/_jars.py, the `s3` group) and kept, keyed by
the hash of its source and the jar's name, in the temporary directory; one JVM then answers
command lines with JSON lines for a whole test module.

    with JavaStreams.start() as java:
        java.client(server.url, "us-east-1", "AKID", "SECRET")
        java.call("list", "-", 100)   # {"streams": [...], "pages": 1}
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from volume_stream import _jars

SOURCE = Path(__file__).parent / "java" / "StreamsProbe.java"


def bundle_jar() -> Path:
    """The AWS SDK v2 bundle jar of the `s3` jar group; fails the test when it is missing."""
    jars = sorted((_jars.jars_dir() / "s3").glob("software.amazon.awssdk_bundle-*.jar"))
    if not jars:
        pytest.fail(f"the AWS SDK for Java v2 bundle jar is not in {_jars.jars_dir() / 's3'}: "
                    f"run `make install` (python -m volume_stream._jars fetch)")
    return jars[-1]


def compiled(jar: Path) -> Path:
    """The folder of the compiled probe, compiling it the first time (atomically: a folder
    renamed into place, so two runs at once never see half a compilation)."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.fail("javac (a JDK 17) is needed to build the Java SDK probe")
    digest = hashlib.sha256(SOURCE.read_bytes() + jar.name.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"volume-stream-streams-probe-{digest}"
    if (out / "StreamsProbe.class").is_file():
        return out
    work = Path(tempfile.mkdtemp(prefix="streams-probe-", dir=out.parent))
    # C1 only: javac's run is short, the optimising compiler would not pay for itself
    run = subprocess.run([javac, "-J-XX:TieredStopAtLevel=1", "-J-Xshare:auto", "-nowarn",
                          "-d", str(work), "-cp", str(jar), str(SOURCE)],
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        pytest.fail(f"javac failed on {SOURCE.name}:\n{run.stderr[-3000:]}")
    try:
        work.rename(out)
    except OSError:  # another run put it there first
        shutil.rmtree(work, ignore_errors=True)
    return out


class JavaStreams:
    """One JVM running the probe; `call` sends a command and returns its JSON answer."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(proc.stdout, selectors.EVENT_READ)
        assert self._line(120) == {"ready": True}

    @classmethod
    def start(cls) -> JavaStreams:
        jar = bundle_jar()
        classes = compiled(jar)
        proc = subprocess.Popen(
            ["java", "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-Xmx256m", "-cp",
             f"{classes}{os.pathsep}{jar}", "StreamsProbe"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return cls(proc)

    def _line(self, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0, "the Java SDK probe did not answer in time"
            if not self._selector.select(left):
                continue
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            assert chunk, f"the Java SDK probe exited ({self.proc.wait(10)})"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def call(self, command: str, *fields: Any, timeout: float = 120) -> Any:
        text = "\t".join([command, *("-" if f is None else str(f) for f in fields)])
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def client(self, url: str, region: str, key: str, secret: str) -> None:
        assert self.call("client", url, region, key, secret) == {"ok": True}

    def close(self) -> None:
        self._selector.close()
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdout.close()

    def __enter__(self) -> JavaStreams:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
