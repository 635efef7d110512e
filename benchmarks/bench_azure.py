"""latency.azure and discovery.azure: Azure Blob Storage volumes on Azurite (issue 36).

Azurite (`make emulators`) serves Blob and Queue storage; it emits no Event Grid events, so the
benchmark's writer uploads each blob and then sends the queue message Event Grid would
(tests/azure_fixtures.py: the blob's real ETag and size, base64 JSON in the Event Grid
schema) -- the clock of a record starts when that message is on the queue, i.e. what a
real account adds (Event Grid's own delivery delay, typically sub-second) is not measured.

* `latency.azure.p50` / `.p95`: blob written and its event queued -> its INSERT visible in
  `read_stream_arrow`, through a `volume-stream daemon` process listening to the Storage Queue
  (default options: an empty queue is polled again after 50 ms, doubling to 1 s), against a
  listing poller (`refresh` back to back, in its own process) on another prefix of the same
  container; both prefixes hold `existing` blobs before the clock starts. Target: p50 <= 0.2x
  the poller's (S3 + SQS on moto: 0.10x).
* `discovery.azure.10k`: 10 new blobs in a volume of 10k: the time from the last event queued
  to the 10 INSERTs readable with a `Catalog.watch` loop, against one `refresh` (a List Blobs of
  the 10k and the diff), the least a listing poller pays to see them.

    python -m benchmarks.bench_azure [--quick]        # alone
    python -m benchmarks --only azure                 # with the others
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._context import Context, run_alone
from benchmarks._report import Figure
from benchmarks.bench_latency import (
    FULL,
    QUICK,
    DaemonProcess,
    RefreshPoller,
    Sizes,
    _figures,
    measure,
    percentile,
)

NAME = "azure"
TITLE = "Azure Blob Storage volumes on Azurite: latency and discovery"
RATIO_TARGET = 0.2
DISCOVERY_EXISTING = 10_000


class _Emulator:
    """Azurite for the benchmark, with AZURE_STORAGE_CONNECTION_STRING pointing at it."""

    def __enter__(self) -> _Emulator:
        from tests.azure_fixtures import make_rig, start_azurite

        self.workdir = tempfile.mkdtemp(prefix="bench-azurite-")
        self.proc, self.emulator = start_azurite(self.workdir)
        self.saved = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = self.emulator.connection_string
        self.rig = make_rig(self.emulator)
        return self

    def fill(self, prefix: str, count: int) -> None:
        container = self.rig.blobs
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: container.upload_blob(f"{prefix}old/o{i:06d}.bin", b"old"),
                          range(count)))

    def location(self, prefix: str) -> str:
        from tests.azure_fixtures import ACCOUNT

        return f"abfss://{self.rig.container}@{ACCOUNT}.dfs.core.windows.net/{prefix}"

    def __exit__(self, *exc: object) -> None:
        from tests.s3_warehouse_fixtures import stop_process

        if self.saved is None:
            os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
        else:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = self.saved
        stop_process(self.proc)


def run_latency(ctx: Context, sizes: Sizes) -> None:
    import volume_stream as vs

    with _Emulator() as az:
        existing = sizes.existing // 4  # Azurite takes uploads at ~1-2k/s on two cores
        az.fill("ours/", existing)
        az.fill("base/", existing)
        warehouse = ctx.path("latency-azure-wh")
        cat = vs.connect(warehouse)
        cat.create_volume("vol", az.location("ours/"),
                          notification=vs.AzureQueueNotification(az.rig.queue_name))
        cat.create_volume("base", az.location("base/"))
        cat.refresh("vol")
        cat.refresh("base")
        cat.create_stream("ours", "vol", mode="APPEND_ONLY")
        cat.create_stream("base", "base", mode="APPEND_ONLY")
        body = os.urandom(2048)

        def writer(prefix: str, deliver: bool) -> Any:
            return lambda name: az.rig.put(f"{prefix}{name}", body, deliver=deliver)

        with DaemonProcess(ctx.workdir, warehouse, {}, env=dict(os.environ)):
            ours = measure(cat, "ours", writer("ours/", True), sizes)
        with RefreshPoller(warehouse, "base", env=dict(os.environ)) as poller:
            base = measure(cat, "base", writer("base/", False), sizes)
        base["refreshes"] = poller.refreshes
        _figures(ctx, "azure", f"{sizes.files} blobs into Azure Blob + Storage Queue on Azurite "
                 f"({existing:,} already there), daemon", ours, base,
                 "Blob-listing refresh poller", target=True, max_ratio=RATIO_TARGET)


def run_discovery(ctx: Context, quick: bool) -> None:
    import volume_stream as vs

    existing = DISCOVERY_EXISTING  # 10k even when quick: the size the issue asks about
    with _Emulator() as az:
        az.fill("in/", existing)
        cat = vs.connect(ctx.path("discovery-azure-wh"))
        cat.create_volume("vol", az.location("in/"), notification=vs.AzureQueueNotification(
            az.rig.queue_name, wait_seconds=1))
        cat.refresh("vol")
        cat.create_stream("s", "vol", mode="APPEND_ONLY")
        stop = threading.Event()

        def watching() -> None:
            while not stop.is_set():
                cat.watch("vol", timeout=1, refresh=False)

        ours, listing = [], []
        watcher = threading.Thread(target=watching, name="bench-azure-watch")
        watcher.start()
        try:
            for round_ in range(3):
                for i in range(10):
                    az.rig.put(f"in/new{round_}/n{i}.bin", b"new")
                queued = time.perf_counter()
                while cat.read_stream_arrow("s").num_rows < 10 * (round_ + 1):
                    time.sleep(0.005)
                ours.append(time.perf_counter() - queued)
        finally:
            stop.set()
            watcher.join()
        for i in range(10):  # what a listing poller pays to see the next ten
            az.rig.put(f"in/polled/n{i}.bin", b"new", deliver=False)
        started = time.perf_counter()
        metrics = cat.refresh("vol")
        listing.append(time.perf_counter() - started)
        assert metrics.inserted == 10, metrics
    value, baseline = percentile(ours, 0.5), listing[0]
    ctx.report.add(Figure(
        name=f"discovery.azure.{existing // 1000}k",
        description=f"10 new blobs in an abfss:// volume of {existing:,} on Azurite: last event "
                    f"queued -> 10 INSERTs readable (median of 3)",
        value=value, unit="s", baseline=baseline,
        baseline_label="one refresh (List Blobs + diff)", target="none (information)",
        details={"ours_s": ours}))


def run(ctx: Context) -> None:
    run_latency(ctx, QUICK if ctx.quick else FULL)
    run_discovery(ctx, ctx.quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_azure",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    return run_alone(NAME, TITLE, run, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
