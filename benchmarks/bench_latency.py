"""latency: a file's close -> its INSERT visible in `read_stream`, through the daemon.

A real `volume-stream daemon` process (default, adaptive batching) watches
a local folder while the benchmark writes 200 files, one every 50 ms, and notes when each was
closed; a reader polls `read_stream_arrow` on an APPEND_ONLY stream every 5 ms (the same change
records `read_stream` hands Spark) and notes when each file's INSERT first shows up. p50 and p95
are the figures (target p50 < 2 s; the seed's Volume Stream documents about 60 s). Each value is
an upper bound: a record counts from the start of the first read that returns it.
(Until round 2 session 4 the reader polled every 50 ms, the writer's own cadence: phase-locked,
that added up to 50 ms + a read to both sides, more than the listener's whole latency, and
squeezed every ratio towards 1.)

The baseline, measured in the same run on the same kind of files, is the best a listing-based
poller can do (Spark's file source, Auto Loader's directory listing): `refresh` run back to back,
with no sleep, on a second volume, in its own process like the daemon (in a thread of this
process it shared the GIL with the reader). Both volumes already hold 20k files (S3: 1k) (backfilled before the
clock starts): a listing walks them all every time, a listener never looks at them. With moto's server at hand (the dev dependencies), the same
is measured for S3 + SQS: `put_object` returns -> record visible, against a refresh poller over
the S3 listing; and for GCS + Pub/Sub on the emulators (`latency.gcs`, benchmarks/latency_gcs.py:
p50 <= 0.2x its listing poller's).

`latency.local.p50` must also be <= 0.5x the poller's p50 (a listener must beat polling).

`latency.scale.*` (issue 12): the same daemon close -> record p50 with the volume's directory
table at 10M rows (quick: 200k), against the same with 10k rows: < 2 s and <= 1.5x; and the
daemon's peak RSS (VmHWM) < 1.5 GiB. The tables are the `scale` benchmark's cached templates
(bulk appends, `.bench/scale/`), hard-linked in as the volume's table; the daemon does no start
refresh there (the folder does not hold the template's files), so each record is one event.

    python -m benchmarks.bench_latency [--quick]      # alone
    python -m benchmarks --only latency               # with the others
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._context import Context, run_alone
from benchmarks._report import Figure, count_label

NAME = "latency"
TITLE = "file close -> record in read_stream, through the daemon"
TARGET_P50_S = 2.0
POLL_S = 0.005
CLI = str(Path(sys.executable).parent / "volume-stream")


@dataclass(frozen=True)
class Sizes:
    files: int
    every_s: float
    existing: int  # files already in each volume (what a listing has to walk)


FULL = Sizes(files=200, every_s=0.05, existing=20_000)
QUICK = Sizes(files=30, every_s=0.05, existing=2_000)
#: directory table rows for `latency.scale` (large, small)
SCALE_ROWS = {False: (10_000_000, 10_000), True: (200_000, 10_000)}
LISTENER_VS_POLLER = 0.5
SCALE_RATIO = 1.5
RSS_LIMIT_GIB = 1.5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("inf")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# ---------------------------------------------------------------------- measuring
def measure(cat: Any, stream: str, write: Callable[[str], None], sizes: Sizes,
            timeout: float = 120.0) -> dict[str, Any]:
    """Write `sizes.files` files with `write(name)` (which returns once the file is closed)
    while polling the stream; return per-file latencies and the poll costs."""
    closed: dict[str, float] = {}
    seen: dict[str, float] = {}
    reads: list[float] = []
    done = threading.Event()

    def writer() -> None:
        for i in range(sizes.files):
            name = f"b{i % 5}/f{i:05d}.bin"
            write(name)
            closed[name] = time.time()
            time.sleep(sizes.every_s)
        done.set()

    thread = threading.Thread(target=writer, name="bench-latency-writer")
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            started = time.time()
            records = cat.read_stream_arrow(stream)
            reads.append(time.time() - started)
            for path in records["relative_path"].to_pylist():
                seen.setdefault(path, started)
            if done.is_set() and len(seen) >= sizes.files:
                break
            time.sleep(POLL_S)
    finally:
        thread.join()
    latencies = [seen[p] - closed[p] for p in closed if p in seen]
    return {"latencies": latencies, "missing": sizes.files - len(latencies),
            "read_median_s": statistics.median(reads) if reads else None, "reads": len(reads)}


class RefreshPoller:
    """The baseline: `refresh` back to back on a volume, in its own process (like the daemon:
    the reader's polling in this process must not take the GIL from it)."""

    _CODE = ("import os, signal, sys, volume_stream as vs\n"
             "cat, n = vs.connect(sys.argv[1]), 0\n"
             "def stop(*_):\n"
             "    print(n, flush=True)\n"
             "    os._exit(0)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "print('ready', flush=True)\n"
             "while True:\n"
             "    cat.refresh(sys.argv[2])\n"
             "    n += 1\n")

    def __init__(self, warehouse: Path, volume: str, env: dict[str, str] | None = None) -> None:
        self.warehouse, self.volume, self.env = warehouse, volume, env
        self.refreshes = 0
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> RefreshPoller:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self._CODE, str(self.warehouse), self.volume],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=self.env, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"refresh poller exited: {self.proc.wait()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        self.refreshes = int(out.split()[-1]) if out.split() else 0


class DaemonProcess:
    """`volume-stream daemon --config FILE --log-json` as a child process."""

    def __init__(self, workdir: Path, warehouse: Path, volume: dict[str, Any],
                 env: dict[str, str] | None = None) -> None:
        self.config = workdir / f"daemon-{uuid.uuid4().hex[:6]}.toml"
        self.log = self.config.with_suffix(".log")
        table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in volume.items())
        self.config.write_text(f'warehouse = "{warehouse}"\n[metrics]\nport = 0\n'
                               f"[volumes]\nvol = {{ {table} }}\n")
        self.env = env
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> DaemonProcess:
        self._fh = self.log.open("wb")
        self.proc = subprocess.Popen([CLI, "daemon", "--config", str(self.config), "--log-json"],
                                     stdout=self._fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        self._wait_ready()
        return self

    def _port(self) -> int | None:
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("logger") == "volume_stream.metrics" and "port" in rec:
                    return int(rec["port"])
        return None

    def _wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited: {self.log.read_text()[-2000:]}")
            port = self._port()
            if port:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"daemon not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def peak_rss_gib(self) -> float | None:
        """The daemon process's peak resident set (VmHWM), while it runs."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024 / 1024
        return None

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._fh.close()


def _figures(ctx: Context, case: str, label: str, ours: dict, base: dict, base_label: str,
             target: bool, max_ratio: float | None = None) -> None:
    for q, pname in ((0.5, "p50"), (0.95, "p95")):
        value, baseline = percentile(ours["latencies"], q), percentile(base["latencies"], q)
        has_target = target and pname == "p50"
        text, passed = f"< {TARGET_P50_S:g} s", value < TARGET_P50_S and not ours["missing"]
        if max_ratio is not None:
            text += f" and <= {max_ratio:g}x the {base_label}"
            passed = passed and value <= max_ratio * baseline
        ctx.report.add(Figure(
            name=f"latency.{case}.{pname}", description=f"{label}, {pname}", value=value,
            unit="s", baseline=baseline, baseline_label=base_label,
            target=text if has_target else "none (information)",
            passed=passed if has_target else None,
            details={"ours": {k: v for k, v in ours.items() if k != "latencies"},
                     "baseline": {k: v for k, v in base.items() if k != "latencies"},
                     "ours_max_s": max(ours["latencies"], default=None)}))


# ---------------------------------------------------------------------- local
def run_local(ctx: Context, sizes: Sizes) -> None:
    import volume_stream as vs

    data_ours, data_base = ctx.data_path("latency-ours"), ctx.data_path("latency-base")
    for folder in (data_ours, data_base):
        for b in range(5):
            (folder / f"b{b}").mkdir(parents=True, exist_ok=True)
        old = folder / "old"
        old.mkdir()
        for i in range(sizes.existing):
            (old / f"o{i:06d}.bin").write_bytes(b"old")
    warehouse = ctx.path("latency-wh")
    cat = vs.connect(warehouse)
    cat.create_volume("vol", data_ours)
    cat.create_volume("base", data_base)
    cat.refresh("vol")
    cat.refresh("base")
    cat.create_stream("ours", "vol", mode="APPEND_ONLY")
    cat.create_stream("base", "base", mode="APPEND_ONLY")
    body = os.urandom(2048)

    def writer(folder: Path) -> Callable[[str], None]:
        def write(name: str) -> None:
            with open(folder / name, "wb") as fh:
                fh.write(body)
        return write

    with DaemonProcess(ctx.workdir, warehouse, {}):
        ours = measure(cat, "ours", writer(data_ours), sizes)
    with RefreshPoller(warehouse, "base") as poller:
        base = measure(cat, "base", writer(data_base), sizes)
    base["refreshes"] = poller.refreshes
    _figures(ctx, "local", f"{sizes.files} files into a local volume ({sizes.existing:,} "
             f"already there), daemon (inotify)", ours,
             base, "refresh poller", target=True, max_ratio=LISTENER_VS_POLLER)


# ---------------------------------------------------------------------- 10M-row table
def _volume_on_template(ctx: Context, rows: int) -> tuple[Any, Path, Path]:
    """A warehouse whose volume 'vol' has the cached `rows`-row template as its directory
    table (hard-linked), an APPEND_ONLY stream on it, and an empty watched folder."""
    import volume_stream as vs
    from benchmarks.scale import link_copy, template
    from directory_table import DEFAULT_BUCKETS

    data = ctx.data_path(f"latency-scale-{rows}")
    for b in range(5):
        (data / f"b{b}").mkdir(parents=True, exist_ok=True)
    warehouse = ctx.path(f"latency-scale-wh-{rows}")
    cat = vs.connect(warehouse)
    cat.create_volume("vol", data)
    root = Path(cat.directory_table("vol").root)
    link_copy(template(ctx, rows, DEFAULT_BUCKETS), root)
    cat.create_stream("ours", "vol", mode="APPEND_ONLY")
    return cat, warehouse, data


def run_scale(ctx: Context, sizes: Sizes) -> None:
    large, small = SCALE_ROWS[ctx.quick]
    results: dict[int, dict[str, Any]] = {}
    body = os.urandom(2048)
    quiet = {"refresh_on_start": False, "refresh_interval_s": 0, "optimize_interval_s": 0}
    for rows in (small, large):
        cat, warehouse, data = _volume_on_template(ctx, rows)
        files = cat.directory_table("vol").file_count()

        def write(name: str, folder: Path = data) -> None:
            with open(folder / name, "wb") as fh:
                fh.write(body)

        with DaemonProcess(ctx.workdir, warehouse, quiet) as daemon:
            result = measure(cat, "ours", write, sizes)
            result["peak_rss_gib"] = daemon.peak_rss_gib()
        result["table_rows"] = files
        results[rows] = result
    big, little = results[large], results[small]
    big_label, little_label = count_label(large), count_label(small)
    p50, base50 = percentile(big["latencies"], 0.5), percentile(little["latencies"], 0.5)
    ctx.report.add(Figure(
        name="latency.scale.p50",
        description=f"{sizes.files} files closed -> record, daemon (inotify), directory table "
                    f"of {big_label} rows, p50",
        value=p50, unit="s", baseline=base50, baseline_label=f"same with {little_label} rows",
        target=f"< {TARGET_P50_S:g} s and <= {SCALE_RATIO:g}x the {little_label} case",
        passed=p50 < TARGET_P50_S and p50 <= SCALE_RATIO * base50 and not big["missing"],
        details={str(k): {n: v for n, v in r.items() if n != "latencies"}
                 for k, r in results.items()}))
    rss, base_rss = big["peak_rss_gib"], little["peak_rss_gib"]
    ctx.report.add(Figure(
        name="latency.scale.rss", description=f"daemon peak RSS (VmHWM) with {big_label} rows",
        value=rss if rss is not None else float("inf"), unit="GiB",
        baseline=base_rss if base_rss is not None else float("inf"),
        baseline_label=f"with {little_label} rows", target=f"< {RSS_LIMIT_GIB:g} GiB",
        passed=rss is not None and rss < RSS_LIMIT_GIB))


# ---------------------------------------------------------------------- S3 + SQS
def run_sqs(ctx: Context, sizes: Sizes) -> None:
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        ctx.report.note("sqs", None, f"S3 + SQS skipped: {exc} (install the dev extras)")
        return
    import volume_stream as vs
    from volume_stream.volumes import SqsNotification

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
             "AWS_EC2_METADATA_DISABLED": "true"}
    saved = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    try:
        kw = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        s3, sqs = boto3.client("s3", **kw), boto3.client("sqs", **kw)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        queue_url = sqs.create_queue(QueueName=bucket)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"]
                                       )["Attributes"]["QueueArn"]
        s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"],
                                     "Filter": {"Key": {"FilterRules": [
                                         {"Name": "prefix", "Value": "ours/"}]}}}]})
        warehouse = ctx.path("latency-sqs-wh")
        cat = vs.connect(warehouse)
        cat.create_volume("vol", f"s3://{bucket}/ours/", notification=SqsNotification(queue_url))
        cat.create_volume("base", f"s3://{bucket}/base/")
        existing = sizes.existing // 20  # moto answers puts slowly: a smaller backlog
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda key: s3.put_object(Bucket=bucket, Key=key, Body=b"old"),
                          [f"{p}/old/o{i:06d}.bin" for p in ("ours", "base")
                           for i in range(existing)]))
        sqs.purge_queue(QueueUrl=queue_url)
        cat.refresh("vol")
        cat.refresh("base")
        cat.create_stream("ours", "vol", mode="APPEND_ONLY")
        cat.create_stream("base", "base", mode="APPEND_ONLY")
        body = os.urandom(2048)

        def writer(prefix: str) -> Callable[[str], None]:
            return lambda name: s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)

        with DaemonProcess(ctx.workdir, warehouse, {}, env=dict(os.environ)):
            ours = measure(cat, "ours", writer("ours"), sizes)
        with RefreshPoller(warehouse, "base", env=dict(os.environ)) as poller:
            base = measure(cat, "base", writer("base"), sizes)
        base["refreshes"] = poller.refreshes
        _figures(ctx, "sqs", f"{sizes.files} objects into S3 + SQS on moto's server "
                 f"({existing:,} already there), daemon",
                 ours, base, "S3-listing refresh poller", target=True)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    ctx.report.note("files", sizes.files,
                    f"{sizes.files} files, one every {sizes.every_s * 1000:.0f} ms; reads every "
                    f"{POLL_S * 1000:.0f} ms (each value is an upper bound at that resolution)")
    run_local(ctx, sizes)
    run_scale(ctx, sizes)
    run_sqs(ctx, sizes)
    from benchmarks.latency_gcs import run_latency  # imports this module

    run_latency(ctx, sizes)


def main(argv: list[str] | None = None) -> int:
    """Run this benchmark alone: `python -m benchmarks.bench_latency [--quick] [--keep]`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_latency",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.files} files, not "
                                                             f"{FULL.files}")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    args = parser.parse_args(argv)
    return run_alone(NAME, TITLE, run, quick=args.quick, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
