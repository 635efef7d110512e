"""latency.gcs and discovery.gcs: a gs:// volume on the emulators (fake-gcs-server publishing
its bucket notifications to pstest, both built by `make emulators`).

* `latency.gcs`: as `latency.sqs` (benchmarks/bench_latency.py): an object's upload returns ->
  its INSERT visible in `read_stream`, through a `volume-stream daemon` pulling the Pub/Sub
  subscription, against `refresh` run back to back on a second volume of the same bucket (a
  listing poller). Both prefixes hold the same backlog of older objects, which a listing walks
  every time. Target: p50 <= 0.2x the poller's. The listener pulls with 0.1 s deadlines
  (`NOTE_OPTIONS`: pstest answers an empty Pull only after 500 ms).
* `discovery.gcs.<N>`: 10 new objects in a gs:// volume of N existing ones (10k): the last
  upload -> all 10 INSERTs readable, through the daemon, against the same listing poller; and
  the first refresh of the N objects (information).

    python -m benchmarks.latency_gcs [--quick]      # alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks._context import Context, run_alone
from benchmarks._report import Figure, count_label, timed
from benchmarks.bench_latency import (
    FULL,
    QUICK,
    DaemonProcess,
    RefreshPoller,
    Sizes,
    _figures,
    measure,
)

GCS_VS_POLLER = 0.2
#: the listener's options here: pstest answers an empty Pull only after 500 ms, and a message
#: published meanwhile waits for that answer (the service answers a held Pull when a message
#: comes), so the listener pulls with 0.1 s deadlines instead of 10 s
NOTE_OPTIONS = {"pull_timeout_s": 0.1}
DISCOVERY_FILES = {False: 10_000, True: 10_000}
NEW_FILES = 10


class _Emulators:
    """The emulators and a notified bucket, their variables set in this process meanwhile."""

    def __enter__(self) -> Any:
        from tests.gcp_fixtures import make_gcs_rig, start_emulators

        self.emulators = start_emulators()
        self.saved = {k: os.environ.get(k) for k in self.emulators.env}
        os.environ.update(self.emulators.env)
        return make_gcs_rig(self.emulators, ack_deadline=60)

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.emulators.stop()


def _emulators_missing(ctx: Context, case: str) -> bool:
    from pathlib import Path

    bin_dir = Path(sys.executable).parent
    missing = [n for n in ("fake-gcs-server", "pstest") if not (bin_dir / n).exists()]
    if missing:
        ctx.report.note(case, None, f"GCS skipped: {missing} not built (make emulators)")
    return bool(missing)


def _fill(rig: Any, keys: list[str]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: rig.put(key, b"old"), keys))


def run_latency(ctx: Context, sizes: Sizes) -> None:
    """`latency.gcs` (module docstring)."""
    if _emulators_missing(ctx, "gcs"):
        return
    import volume_stream as vs

    with _Emulators() as rig:
        existing = sizes.existing // 20  # as latency.sqs's backlog
        _fill(rig, [f"{p}/old/o{i:06d}.bin" for p in ("ours", "base") for i in range(existing)])
        _purged(rig, 2 * existing)
        warehouse = ctx.path("latency-gcs-wh")
        cat = vs.connect(warehouse)
        cat.create_volume("vol", f"gs://{rig.bucket_name}/ours/",
                          notification=vs.PubSubNotification(rig.subscription, **NOTE_OPTIONS))
        cat.create_volume("base", f"gs://{rig.bucket_name}/base/")
        cat.refresh("vol")
        cat.refresh("base")
        cat.create_stream("ours", "vol", mode="APPEND_ONLY")
        cat.create_stream("base", "base", mode="APPEND_ONLY")
        body = os.urandom(2048)

        def writer(prefix: str):
            return lambda name: rig.put(f"{prefix}/{name}", body)

        with DaemonProcess(ctx.workdir, warehouse, {}, env=dict(os.environ)):
            ours = measure(cat, "ours", writer("ours"), sizes)
        with RefreshPoller(warehouse, "base", env=dict(os.environ)) as poller:
            base = measure(cat, "base", writer("base"), sizes)
        base["refreshes"] = poller.refreshes
        _figures(ctx, "gcs", f"{sizes.files} objects into GCS + Pub/Sub on fake-gcs-server "
                 f"and pstest ({existing:,} already there), daemon",
                 ours, base, "GCS-listing refresh poller", target=True,
                 max_ratio=GCS_VS_POLLER)


def _purged(rig: Any, published: int) -> None:
    """Drop the backlog's events from the volume's subscription (the refresh took those
    objects in): wait until all `published` were published (the tap subscription sees them),
    then seek the subscription to now, Pub/Sub's purge. (Pulling them to look would hide them
    from the daemon for an ack deadline.)"""
    from datetime import UTC, datetime

    rig.published(published, timeout=600)
    rig.subscriber.seek(request={"subscription": rig.subscription, "time": datetime.now(UTC)})


def _discovery_round(cat: Any, rig: Any, stream: str, prefix: str, tag: str) -> float:
    names = [f"{prefix}/new/{tag}-{i:02d}.bin" for i in range(NEW_FILES)]
    for name in names:
        rig.put(name, b"new")
    closed = time.time()
    want = {n.split("/", 1)[1] for n in names}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        started = time.time()
        seen = set(cat.read_stream_arrow(stream)["relative_path"].to_pylist())
        if want <= seen:
            return started - closed
        time.sleep(0.02)
    raise TimeoutError(f"{tag}: the {NEW_FILES} new objects never showed in {stream}")


def run_discovery(ctx: Context) -> None:
    """`discovery.gcs.<N>` (module docstring)."""
    if _emulators_missing(ctx, "discovery_gcs"):
        return
    import volume_stream as vs

    n, rounds = DISCOVERY_FILES[ctx.quick], 3 if ctx.quick else 5
    with _Emulators() as rig:
        written_s, _ = timed(lambda: _fill(rig, [f"{p}/old/{i // 1000:02d}/o{i:06d}.bin"
                                                 for p in ("ours", "base") for i in range(n)]))
        _purged(rig, 2 * n)
        warehouse = ctx.path("discovery-gcs-wh")
        cat = vs.connect(warehouse)
        cat.create_volume("vol", f"gs://{rig.bucket_name}/ours/",
                          notification=vs.PubSubNotification(rig.subscription, **NOTE_OPTIONS))
        cat.create_volume("base", f"gs://{rig.bucket_name}/base/")
        refresh_s, _ = timed(lambda: cat.refresh("vol"))
        base_refresh_s, _ = timed(lambda: cat.refresh("base"))
        ours, base = [], []
        with DaemonProcess(ctx.workdir, warehouse, {}, env=dict(os.environ)):
            for r in range(rounds):
                cat.create_stream(f"ours{r}", "vol", mode="APPEND_ONLY")
                ours.append(_discovery_round(cat, rig, f"ours{r}", "ours", f"r{r}"))
        with RefreshPoller(warehouse, "base", env=dict(os.environ)) as poller:
            for r in range(rounds):
                cat.create_stream(f"base{r}", "base", mode="APPEND_ONLY")
                base.append(_discovery_round(cat, rig, f"base{r}", "base", f"r{r}"))
        label = count_label(n)
        ctx.report.add(Figure(
            name=f"discovery.gcs.{label}",
            description=f"last of {NEW_FILES} uploads -> all INSERTs readable, among {label} "
                        "objects of a gs:// volume (daemon on Pub/Sub)",
            value=statistics.median(ours), unit="s", baseline=statistics.median(base),
            baseline_label="GCS-listing refresh poller", target="ratio < 1 (below the poller)",
            passed=statistics.median(ours) < statistics.median(base),
            details={"ours_runs_s": ours, "poller_runs_s": base,
                     "poller_refreshes": poller.refreshes, "objects_written_s": written_s}))
        ctx.report.add(Figure(
            name=f"discovery.gcs.refresh.{label}",
            description=f"first refresh of {label} objects of a gs:// volume (listing + diff "
                        "+ commit)", value=refresh_s, unit="s", baseline=base_refresh_s,
            baseline_label="the same on the second prefix", target="none (information)"))


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.latency_gcs [--quick] [--keep]`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency_gcs",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    args = parser.parse_args(argv)

    def both(ctx: Context) -> None:
        run_latency(ctx, QUICK if args.quick else FULL)
        run_discovery(ctx)

    return run_alone("latency", "GCS + Pub/Sub on the emulators", both, quick=args.quick,
                     keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
