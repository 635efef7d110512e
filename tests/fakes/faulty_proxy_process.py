"""`FaultyProxy` in a process of its own, for clients that must not share the test's process:
delta-rs blocks holding the GIL on some calls (`load_cdf`), so an in-process HTTP server it
talks to can deadlock (see tests/s3_warehouse_fixtures.py).

    with FaultyProxyProcess(moto_endpoint, rate=0.2, faults=("error500", "slowdown503"),
                            seed=5, paused=True) as proxy:
        ...connect through proxy.endpoint...
        proxy.resume()            # faults from now on
        proxy.counts()            # {"forwarded": 120, "error500": 14, "slowdown503": 17}
        proxy.fail_uploads(12)    # the next 12 part uploads answer 500

The child is `python -m tests.fakes.faulty_proxy_process UPSTREAM RATE FAULTS SEED PAUSED
HOLD_UPLOADS_S`; it prints its endpoint, then answers `pause`, `resume`, `counts` and
`fail_uploads N` lines on stdin (one JSON line each) and stops when stdin closes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fakes.faulty_proxy import FaultyProxy

__all__ = ["FaultyProxyProcess"]

_ROOT = Path(__file__).resolve().parents[2]


class FaultyProxyProcess:
    def __init__(self, upstream: str, *, rate: float, faults: tuple[str, ...],
                 seed: int = 0, paused: bool = False, hold_uploads_s: float = 0.0):
        self._args = [upstream, str(rate), ",".join(faults), str(seed), str(int(paused)),
                      str(hold_uploads_s)]
        self._proc: subprocess.Popen | None = None
        self.endpoint = ""

    def _ask(self, command: str) -> Any:
        assert self._proc is not None and self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        return json.loads(self._proc.stdout.readline())

    def pause(self) -> None:
        self._ask("pause")

    def resume(self) -> None:
        self._ask("resume")

    def counts(self) -> dict[str, int]:
        return self._ask("counts")

    def fail_uploads(self, n: int) -> None:
        self._ask(f"fail_uploads {n}")

    def __enter__(self) -> FaultyProxyProcess:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.faulty_proxy_process", *self._args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=_ROOT)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the faulty proxy process did not start")
        self.endpoint = json.loads(line)["endpoint"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _main(upstream: str, rate: str, faults: str, seed: str, paused: str,
          hold_uploads_s: str = "0") -> None:
    proxy = FaultyProxy(upstream, rate=float(rate), faults=tuple(faults.split(",")),
                        seed=int(seed), hold_uploads_s=float(hold_uploads_s)).start()
    if paused == "1":
        proxy.pause()
    print(json.dumps({"endpoint": proxy.endpoint}), flush=True)
    try:
        for line in sys.stdin:
            command = line.strip()
            if command == "pause":
                proxy.pause()
            elif command == "resume":
                proxy.resume()
            elif command.startswith("fail_uploads "):
                proxy.fail_uploads(int(command.split()[1]))
            print(json.dumps(dict(proxy.counts) if command == "counts" else {"ok": command}),
                  flush=True)
    finally:
        proxy.stop()


if __name__ == "__main__":
    _main(*sys.argv[1:7])
