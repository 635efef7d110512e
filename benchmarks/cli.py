"""cli: how long `volume-stream` commands take when they should not need Spark's start-up.

Each figure is the wall time of a real `volume-stream` process (median of a few runs), against
the start-up of a bare `python -c pass` measured in the same run; the targets are absolute
seconds (issue 17):

    cli.sql_syntax_error   `sql -e "SELEC ..."`: the error is reported before Spark starts (< 2 s)
    cli.run_nothing_pending `run SPEC` with nothing pending exits without Spark (< 3 s)
    cli.sql_remote         `sql --remote sc://...` SELECT over a stream, answered by a running
                           daemon's warm Spark through Spark Connect (< 3 s)

The remote figure starts a real daemon with `[spark] connect_port` first (its start-up is not
measured) and one warm-up query (the server's first Python worker).

    python -m benchmarks --only cli [--quick]
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchmarks._context import Context
from benchmarks._report import Figure, median

NAME = "cli"
TITLE = "CLI commands that need no Spark start-up, and SQL on a daemon's warm Spark"
CLI = str(Path(sys.executable).parent / "volume-stream")

UDF = """
import volume_stream as vs

@vs.file_udf("n long")
def size(file):
    return {"n": file.size}
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _seconds(cmd: list[str], repeats: int, ok=(0,), cwd: Path | None = None,
             cpu: list[float] | None = None) -> float:
    """Median wall time of `cmd`; the median CPU time (user + system) of the process goes to
    `cpu` (on a machine shared with busy neighbours wall time waits for a core, CPU time
    does not)."""
    runs, cpus = [], []
    for _ in range(repeats):
        started, cpu_before = time.perf_counter(), _cpu()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
        runs.append(time.perf_counter() - started)
        cpus.append(_cpu() - cpu_before)
        if proc.returncode not in ok:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: "
                               f"{proc.stdout[-1000:]}{proc.stderr[-2000:]}")
    if cpu is not None:
        cpu.append(median(cpus))
    return median(runs)


def _figure(ctx: Context, name: str, description: str, value: float, baseline: float,
            target_s: float, cpu: float | None = None, base_cpu: float | None = None) -> None:
    ctx.report.add(Figure(f"cli.{name}", description, value, "s", baseline,
                          "python -c pass", f"< {target_s:g} s", value < target_s))
    if cpu is not None:
        ctx.report.add(Figure(f"cli.{name}.cpu", "the same, CPU time of the command's process",
                              cpu, "s", base_cpu, "python -c pass CPU", "info"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def run(ctx: Context) -> None:
    import volume_stream as vs

    repeats = 1 if ctx.quick else 3
    cpu: list[float] = []
    base = _seconds([sys.executable, "-c", "pass"], max(3, repeats), cpu=cpu)
    base_cpu = cpu.pop()
    root = ctx.path("cli")
    data, wh = root / "data", root / "wh"
    data.mkdir(parents=True)
    for i in range(20):
        (data / f"f{i:02d}.txt").write_text("x" * i)
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    cat.refresh("vol")
    cat.create_stream("s", "vol", show_initial_rows=True)
    cat.create_stream("idle", "vol")            # created at the latest version: nothing pending
    w = ["--warehouse", str(wh)]

    t = _seconds([CLI, "sql", *w, "-e", "SELEC relative_path FROM s"], repeats, ok=(1,),
                 cpu=cpu)
    _figure(ctx, "sql_syntax_error", "`sql -e` with a syntax error (no Spark)", t, base, 2,
            cpu.pop(), base_cpu)

    (root / "udf.py").write_text(textwrap.dedent(UDF))
    (root / "job.toml").write_text('stream = "idle"\nudf = "udf.py:size"\ntarget = "sizes"\n')
    t = _seconds([CLI, "run", str(root / "job.toml"), *w], repeats, cpu=cpu)
    _figure(ctx, "run_nothing_pending", "`run SPEC` with nothing pending (no Spark)", t, base, 3,
            cpu.pop(), base_cpu)

    port = _free_port()
    config = root / "vs.toml"
    config.write_text(f'warehouse = "{wh}"\n[metrics]\nenabled = false\n'
                      f'[spark]\nmaster = "local[2]"\nconnect_port = {port}\n'
                      f'[volumes.vol]\nrefresh_interval_s = 0\n')
    log = (root / "daemon.log").open("wb")
    daemon = subprocess.Popen([CLI, "daemon", "--config", str(config)], cwd=root, stdout=log,
                              stderr=subprocess.STDOUT)
    try:
        started = time.perf_counter()
        while not _port_open(port):
            if daemon.poll() is not None or time.perf_counter() - started > 600:
                raise RuntimeError(f"daemon's Spark Connect not up: "
                                   f"{(root / 'daemon.log').read_text()[-2000:]}")
            time.sleep(0.5)
        ctx.report.say(f"daemon with Spark Connect on port {port} up in "
                       f"{time.perf_counter() - started:.1f} s (not measured)")
        query = [CLI, "sql", *w, "--remote", f"sc://127.0.0.1:{port}", "-e",
                 "SELECT relative_path, size FROM s ORDER BY relative_path"]
        warm = _seconds(query, 1)
        ctx.report.say(f"first remote query {warm:.1f} s (warm-up, not measured)")
        t = _seconds(query, repeats, cpu=cpu)
        _figure(ctx, "sql_remote", "`sql --remote` SELECT over a stream on a daemon's Spark",
                t, base, 3, cpu.pop(), base_cpu)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(120)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
    ctx.report.note("load_avg_1", round(os.getloadavg()[0], 2))
