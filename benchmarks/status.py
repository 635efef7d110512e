"""status: the status page at 100 volumes and 1,000 streams, in Chromium, and what it costs a
busy daemon (issue 27).

One warehouse of 100 local volumes (quick: 10) with 10 streams each, every stream with pending
changes, served by a real `volume-stream daemon` process that listens to all the volumes while
a writer adds files to them round robin (the busy daemon). Debian's Chromium, driven by
Playwright, opens the daemon's `/`:

    status.load.first_byte   navigation start -> first byte of `/`, median of warm loads (< 1 s)
    status.load.dcl          navigation start -> DOMContentLoaded, likewise (< 1 s)
    status.load.cold         the first load after the daemon started (its caches empty: info)
    status.cpu               the daemon's CPU time (user + system, /proc) over windows with the
                             page open and polling itself, against windows of the same length
                             with no page, in A B B A order in the same run (< 1.05x: the page adds
                             less than 5% to the daemon's CPU); the daemon's statistics pass
                             runs twice a window, so every window holds the same work

The load baseline is the same browser loading the daemon's `/metrics` from the same server (the
floor of any page there); the CPU baseline is the daemon without the page. Skipped (an error in
the report) where /usr/bin/chromium is missing.

    python -m benchmarks --only status [--quick]
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks._context import Context
from benchmarks._report import Figure, median

NAME = "status"
TITLE = "status page: load at 100 volumes / 1,000 streams in Chromium; CPU it adds to a daemon"
CLI = str(Path(sys.executable).parent / "volume-stream")
CHROMIUM = Path("/usr/bin/chromium")
LOAD_TARGET_S = 1.0
CPU_TARGET = 1.05


@dataclass(frozen=True)
class Sizes:
    volumes: int
    streams_per_volume: int
    files_per_volume: int
    loads: int          # warm page loads measured
    window_s: float     # each CPU window
    windows: int        # windows per side (A B B A: without, with, with, without...)
    writes_per_s: float


FULL = Sizes(volumes=100, streams_per_volume=10, files_per_volume=20, loads=5, window_s=30,
             windows=3, writes_per_s=20)
QUICK = Sizes(volumes=10, streams_per_volume=10, files_per_volume=5, loads=3, window_s=8,
              windows=2, writes_per_s=10)


def build(ctx: Context, sizes: Sizes) -> tuple[Path, list[Path]]:
    """A warehouse of `sizes.volumes` refreshed volumes, their streams, every stream with one
    version pending."""
    import volume_stream as vs

    wh, folders = ctx.path("status-wh"), []
    cat = vs.connect(wh)
    for i in range(sizes.volumes):
        folder = ctx.data_path("status", f"v{i:03d}")
        folder.mkdir(parents=True)
        for j in range(sizes.files_per_volume):
            (folder / f"f{j:04d}.csv").write_text(f"{i},{j}\n")
        cat.create_volume(f"v{i:03d}", folder)
        cat.refresh(f"v{i:03d}")
        for k in range(sizes.streams_per_volume):
            cat.create_stream(f"s{i:03d}_{k:02d}", on_volume=f"v{i:03d}")
        (folder / "pending.csv").write_text("p\n")
        cat.refresh(f"v{i:03d}")
        folders.append(folder)
    return wh, folders


class Daemon:
    """`volume-stream daemon` over every volume of the warehouse, as a child process."""

    def __init__(self, workdir: Path, warehouse: Path, folders: list[Path],
                 stats_interval_s: float) -> None:
        self.config = workdir / f"status-daemon-{uuid.uuid4().hex[:6]}.toml"
        self.log = self.config.with_suffix(".log")
        lines = [f'warehouse = "{warehouse}"', "[daemon]",
                 f"stats_interval_s = {stats_interval_s}", "[metrics]", "port = 0",
                 "[volumes]"]
        lines += [f'{f.name} = {{ location = "{f}", max_wait_s = 0.5 }}' for f in folders]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> Daemon:
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen([CLI, "daemon", "--config", str(self.config), "--log-json"],
                                     stdout=self._fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log.read_text()[-2000:]}")
            self.port = self.port or self._port()
            if self.port:
                try:
                    with urllib.request.urlopen(f"{self.url}/readyz", timeout=10):
                        return self
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"daemon not ready: {self.log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _port(self) -> int:
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("logger") == "volume_stream.metrics" and "port" in rec:
                    return int(rec["port"])
        return 0

    def cpu_s(self) -> float:
        """User + system CPU seconds of the daemon process so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._fh.close()


class Writer:
    """Adds a file to the volumes round robin, `per_s` a second, until stopped."""

    def __init__(self, folders: list[Path], per_s: float) -> None:
        self.folders, self.every = folders, 1.0 / per_s
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-bench-writer",
                                        daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            folder = self.folders[self.written % len(self.folders)]
            (folder / f"w{self.written:06d}.csv").write_text("w\n")
            self.written += 1

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


_TIMING = """() => { const n = performance.getEntriesByType('navigation')[0];
    return {first_byte: n.responseStart / 1000, dcl: n.domContentLoadedEventEnd / 1000}; }"""


#: a page slower than this is a measurement of its own (inf: timed out), not an error
GOTO_TIMEOUT_MS = 120_000


def _load(page, url: str) -> dict[str, float]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.goto(url, wait_until="domcontentloaded", timeout=GOTO_TIMEOUT_MS)
    except PlaywrightTimeout:
        return {"first_byte": math.inf, "dcl": math.inf}
    return page.evaluate(_TIMING)


def run(ctx: Context) -> None:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError("no /usr/bin/chromium (apt-get install chromium): nothing measured")
    sizes = QUICK if ctx.quick else FULL
    started = time.perf_counter()
    wh, folders = build(ctx, sizes)
    streams = sizes.volumes * sizes.streams_per_volume
    ctx.report.say(f"warehouse of {sizes.volumes} volumes and {streams} streams built in "
                   f"{time.perf_counter() - started:.1f} s (not measured)")
    # two statistics passes in every CPU window, so each window holds the same work
    with Daemon(ctx.workdir, wh, folders, sizes.window_s / 2) as daemon, Writer(folders, sizes.writes_per_s) as w, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            cold = _load(page, daemon.url + "/")
            loads = [_load(page, daemon.url + "/") for _ in range(sizes.loads)]
            rows = page.evaluate("document.querySelectorAll('tr[data-stream]').length")
            floor = [_load(page, daemon.url + "/metrics") for _ in range(sizes.loads)]
            for key, label in (("first_byte", "first byte"), ("dcl", "DOMContentLoaded")):
                value = median([x[key] for x in loads])
                baseline = median([x[key] for x in floor])
                ctx.report.add(Figure(
                    name=f"status.load.{key}",
                    description=f"/ of {sizes.volumes} volumes, {streams} streams, busy daemon: "
                                f"{label} (median of {sizes.loads} warm loads)",
                    value=value, unit="s", baseline=baseline, baseline_label="/metrics",
                    target=f"< {LOAD_TARGET_S:g} s", passed=value < LOAD_TARGET_S,
                    details={"loads": loads, "metrics_loads": floor, "stream_rows": rows}))
            ctx.report.add(Figure(
                name="status.load.cold", description="the first load of / (caches empty): "
                                                     "DOMContentLoaded",
                value=cold["dcl"], unit="s", baseline=median([x["dcl"] for x in loads]),
                baseline_label="warm", target="none (information)", details=cold))
            page.goto("about:blank")
            without, with_page = [], []
            # A B B A A B ...: a daemon that grows busier as files pile up weighs on both
            for opened in _abba(sizes.windows):
                if opened:
                    page.goto(daemon.url + "/", wait_until="commit", timeout=GOTO_TIMEOUT_MS)
                    with_page.append(_cpu_window(daemon, sizes.window_s))
                    polls = page.evaluate("performance.getEntriesByType('resource')"
                                          ".filter(e => e.initiatorType === 'xmlhttprequest')"
                                          ".length")
                    page.goto("about:blank")
                else:
                    without.append(_cpu_window(daemon, sizes.window_s))
        finally:
            browser.close()
        written = w.written
    base, ours = sum(without), sum(with_page)
    window = sizes.window_s * sizes.windows
    ctx.report.add(Figure(
        name="status.cpu",
        description=f"daemon CPU with / open and polling every 2 s vs without "
                    f"({sizes.windows} x {sizes.window_s:g} s windows each, {written} files "
                    f"written meanwhile)",
        value=ours, unit="s", baseline=base, baseline_label="no page",
        target=f"< {CPU_TARGET:g}x", passed=ours < CPU_TARGET * base,
        details={"without_s": without, "with_s": with_page, "window_s": sizes.window_s,
                 "added_cpu_percent_of_a_core": round(100 * (ours - base) / window, 2),
                 "daemon_cpu_percent_without": round(100 * base / window, 1),
                 "polls_in_last_window": polls}))
    ctx.report.say(f"the page added {100 * (ours - base) / window:.1f}% of one core "
                   f"(daemon without it: {100 * base / window:.1f}%)")


def _abba(windows: int) -> list[bool]:
    """Whether the page is open in each of 2 x `windows` windows, in A B B A order."""
    pattern = [False, True, True, False]
    return [pattern[i % 4] for i in range(2 * windows)]


def _cpu_window(daemon: Daemon, seconds: float) -> float:
    before = daemon.cpu_s()
    time.sleep(seconds)
    return daemon.cpu_s() - before
