"""sustain: the daemon keeps up with a sustained event rate by group commit (issue 26).

A feeder thread offers spread overwrites (existing paths drawn at random over the whole table)
and new files, half and half, in messages of `per_message` events, at a fixed rate to the
daemon's per-volume loop (`VolumeRunner`, the same object `volume-stream daemon` runs, with
its metrics) over the in-package `MemoryListener` queue, on a copy of the `scale` template
(10M rows; `--quick`: 200k). The event→commit latency of each message is its acknowledgement
time (the runner acknowledges right after the commit that holds it) minus the time it was
sent; a message still unacknowledged when the run ends (the drain after the feeder stops is
bounded) counts with its age then, a lower bound.

The messages are made before the clock starts: a queue's messages exist before the daemon
receives them, and making them on the feeder thread would take a share of the GIL from the
daemon being measured.

Lines:
- `sustain.rate20k`: 20k events/s for 120 s (`--quick`: 20 s). PASS when the daemon keeps up:
  the backlog when the feeder stops (events waiting on the queue, not yet received: what SQS
  counts as visible messages) is at most one batch (the largest the daemon began committing
  while the feeder ran: the drain's batches take what waited, so they prove nothing), and
  the last backlog samples do not grow. The events of the batch committing at that moment are printed
  beside it (waiting + committing is what is not acknowledged yet). Reported against the
  offered rate (ratio = events committed per second / offered); p50/p99 latency and batch
  sizes in the line's details. Merge-on-read (DESIGN §4.8) also needs the p50 latency under
  5 s to PASS.
- `sustain.rate2k`: 2k events/s for 60 s (`--quick`: 15 s): PASS when the p50 latency is
  below 2 s and the p99 below 5 s (the baseline printed is that 2 s).
- `sustain.batch2k`: one spread batch of 2k events applied alone against its copy-on-write
  floor (plain pyarrow reading and writing exactly the files whose rows it marks,
  `_floor.cow_floor`): on a large table such a batch touches a large share of the data files,
  and a copy-on-write commit cannot go under that floor; merge-on-read (DESIGN §4.8) must, to
  <= 0.25x.
"""

from __future__ import annotations

import gc
import random
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks._context import Context
from benchmarks._data import T0, existing_path, ready
from benchmarks._floor import cow_floor, removed_files
from benchmarks._report import Figure, count_label
from benchmarks.scale import link_copy, peak_rss_gib, template
from connectors.events import FileEvent
from connectors.memory import MemoryListener
from directory_table import DEFAULT_BUCKETS
from volume_stream.config.daemon import DaemonTuning, VolumeConfig
from volume_stream.daemon.metrics import DaemonMetrics
from volume_stream.daemon.volume_runner import VolumeRunner
from volume_stream.volumes.watcher import VolumeWatcher

NAME = "sustain"
TITLE = "daemon throughput and latency under a sustained event rate (group commit)"


@dataclass(frozen=True)
class Sizes:
    rows: int
    fast_rate: int
    fast_s: float
    slow_rate: int
    slow_s: float
    per_message: int


FULL = Sizes(rows=10_000_000, fast_rate=20_000, fast_s=120, slow_rate=2_000, slow_s=60,
             per_message=100)
QUICK = Sizes(rows=200_000, fast_rate=20_000, fast_s=20, slow_rate=2_000, slow_s=15,
              per_message=100)


class TimedListener(MemoryListener):
    """A `MemoryListener` that remembers when each message was sent and acknowledged."""

    def __init__(self) -> None:
        super().__init__("sustain")
        self.sent_at: dict[str, float] = {}
        self.acked_at: dict[str, float] = {}

    def send(self, *events: FileEvent, message_id: str | None = None) -> str:
        now = time.monotonic()
        mid = super().send(*events, message_id=message_id)
        self.sent_at[mid] = now
        return mid

    def ack(self, handles) -> None:
        super().ack(handles)
        now = time.monotonic()
        for h in handles:
            self.acked_at.setdefault(h, now)

    def pending_events(self, per_message: int) -> int:
        """Events not acknowledged yet: waiting on the queue or received (in flight)."""
        with self._cond:
            return len(self._messages) * per_message

    def waiting_events(self, per_message: int) -> int:
        """Events waiting on the queue, not received yet (the queue's backlog, as SQS counts
        its visible messages): what the next batch will take."""
        with self._cond:
            return sum(not m.in_flight for m in self._messages.values()) * per_message


class SizedWatcher(VolumeWatcher):
    """A `VolumeWatcher` that remembers the size of each batch it commits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes: list[int] = []
        self.seconds: list[float] = []
        self.began: list[float] = []  # `time.monotonic()` when each commit began

    def commit(self, events):
        started = time.perf_counter()
        self.began.append(time.monotonic())
        result = super().commit(events)
        self.seconds.append(round(time.perf_counter() - started, 3))
        self.sizes.append(len(events))
        return result


class Feeder(threading.Thread):
    """Offers `rate` events/s for `seconds`: half overwrites spread over `rows` existing rows,
    half new files spread over the table's folders.

    The messages are made before the clock starts (`__init__`): a queue's messages exist
    before the daemon receives them, and making ~20k `FileEvent`s a second on the feeder
    thread (~16 us each) would take a share of the GIL from the daemon it measures."""

    def __init__(self, listener: TimedListener, rows: int, rate: int, seconds: float,
                 per_message: int, seed: int, tag: str):
        super().__init__(name=f"sustain-feeder-{tag}", daemon=True)
        self.listener, self.rate, self.seconds = listener, rate, seconds
        self.sent = 0
        self.behind_s = 0.0  # how far the feeder itself fell behind its schedule (GIL, load)
        self.messages = _messages(rows, int(rate * seconds), per_message, random.Random(seed),
                                  tag)

    def run(self) -> None:
        began = time.monotonic()
        for mid, events in self.messages:
            self.listener.send(*events, message_id=mid)  # already stamped: not copied
            self.sent += len(events)
            lag = began + self.sent / self.rate - time.monotonic()
            if lag > 0:
                time.sleep(lag)
            else:
                self.behind_s = -lag


def _messages(rows: int, total: int, per_message: int, rng: random.Random, tag: str,
              ) -> list[tuple[str, tuple[FileEvent, ...]]]:
    """`total` events in messages of `per_message`: odd events overwrite an existing row drawn
    at random, even ones create a file in a random folder."""
    when = T0 + timedelta(days=3)
    out = []
    n = 0
    while n < total:
        mid = f"{tag}-{n}"
        events = []
        for _ in range(per_message):
            n += 1
            if n % 2:
                path = existing_path(rng.randrange(rows))
            else:
                folder = rng.randrange(max(1, rows // 1000))
                path = f"d{folder:04d}/{tag}{n:08d}.bin"
            events.append(FileEvent.created(path, size=n % 1000, etag=f"s{n:x}",
                                            last_modified_time=when + timedelta(
                                                microseconds=n), event_time=when,
                                            source_id=mid))
        out.append((mid, tuple(events)))
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_rate(ctx: Context, table_root: Path, rows: int, rate: int, seconds: float,
             per_message: int, tag: str) -> dict[str, Any]:
    """One sustained run on a fresh copy of the template; the figures as a dict."""
    table = link_copy(table_root, ctx.path(f"sustain-{tag}"))
    # its file index and key index built first, as a running daemon has them (its start
    # refresh builds them): a one-off cost, not the sustained one
    ready(table)
    listener = TimedListener()
    watcher = SizedWatcher(table, listener, lambda p: True, lambda **kw: None)
    stop = threading.Event()
    metrics = DaemonMetrics()
    cfg = VolumeConfig(refresh_on_start=False, refresh_interval_s=0, optimize_interval_s=0,
                       poll_s=0.2, max_wait_s=0.5)
    runner = VolumeRunner("sustain", cfg, lambda name: watcher, metrics, DaemonTuning(),
                          ctx.path(f"dlq-{tag}"), stop)
    feeder = Feeder(listener, rows, rate, seconds, per_message, seed=zlib.crc32(tag.encode()),
                    tag=tag)
    # the messages made in advance stand for a queue outside the process: out of the garbage
    # collector's sight, as they would be (millions of events scanned by each full collection)
    gc.collect()
    gc.freeze()
    runner.start()
    backlog: list[int] = []
    unacked: list[int] = []
    started = time.monotonic()
    feeder.start()
    while feeder.is_alive():
        feeder.join(1.0)
        backlog.append(listener.waiting_events(per_message))
        unacked.append(listener.pending_events(per_message))
    fed_s = time.monotonic() - started
    at_end = listener.waiting_events(per_message)
    unacked_at_end = listener.pending_events(per_message)
    # let it drain (bounded), to measure every message's latency
    deadline = time.monotonic() + max(60.0, seconds)
    while listener.pending_events(per_message) and time.monotonic() < deadline:
        time.sleep(0.1)
    drained_s = time.monotonic() - started
    ended = time.monotonic()
    stop.set()
    runner.join(900)  # it finishes the batch it holds (a commit of a large table)
    gc.unfreeze()
    reg = metrics.registry
    batches = reg.get_sample_value("volume_stream_batch_events_count", {"volume": "sustain"}) or 0
    events = reg.get_sample_value("volume_stream_batch_events_sum", {"volume": "sustain"}) or 0
    commit_s = reg.get_sample_value("volume_stream_commit_seconds_sum", {"volume": "sustain"})
    sizes = watcher.sizes
    # a message never acknowledged counts with its age when the run ended: a lower bound
    latencies = [listener.acked_at.get(m, ended) - sent for m, sent in listener.sent_at.items()]
    return {"rate": rate, "seconds": seconds, "fed": feeder.sent, "fed_s": round(fed_s, 2),
            "feeder_behind_s": round(feeder.behind_s, 2), "backlog_at_end": at_end,
            "unacked_at_end": unacked_at_end, "backlog_samples": backlog,
            "unacked_samples": unacked, "drained_s": round(drained_s, 2),
            "committed_per_s": events / fed_s if fed_s else 0.0,
            "batches": int(batches), "events": int(events),
            "mean_commit_s": (commit_s or 0) / batches if batches else None,
            "batch_p50": _quantile(sizes, 0.5), "batch_max": max(sizes, default=0),
            # the batches the daemon was committing while the feeder ran (the drain's batches,
            # which take what waited at the end, left out)
            "batch_max_fed": max((n for n, t in zip(sizes, watcher.began, strict=False)
                                  if t < started + fed_s), default=0),
            "batch_sizes": sizes, "commit_s": watcher.seconds,
            "latency_p50_s": _quantile(latencies, 0.5), "latency_p99_s": _quantile(latencies, 0.99),
            "unacked_messages": len(set(listener.sent_at) - set(listener.acked_at)),
            "model": runner.model.as_dict()}


def spread_batch_floor(ctx: Context, table_root: Path, rows: int, size: int,
                       per_message: int) -> dict[str, Any]:
    """One batch of `size` events as the feeder makes them, applied alone to a fresh copy of
    the template (its file index built first, as a running daemon has it), and the
    copy-on-write floor of that commit: plain pyarrow reading and writing exactly the data
    files it replaced (`_floor.cow_floor`)."""
    table = link_copy(table_root, ctx.path(f"sustain-floor-{size}"))
    ready(table)  # the file and key indexes built (a running daemon has them); no commit
    events = [e for _, message in _messages(rows, size, per_message,
                                            random.Random(size), "floor") for e in message]
    started = time.perf_counter()
    result = table.apply(events)
    seconds = time.perf_counter() - started
    removed = removed_files(table.path, result.version) if result.version is not None else []
    floor_s, floor_rows = cow_floor(table.path, removed, ctx.path(f"sustain-floor-{size}-cow"))
    files = len(table.delta().file_uris())
    return {"events": size, "seconds": round(seconds, 3), "files_rewritten": len(removed),
            "files_after": files, "rows_rewritten": floor_rows, "floor_s": round(floor_s, 3),
            "ratio": round(seconds / floor_s, 3) if floor_s else None}


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    report = ctx.report
    root = template(ctx, sizes.rows, DEFAULT_BUCKETS)
    rows = count_label(sizes.rows)
    fast = run_rate(ctx, root, sizes.rows, sizes.fast_rate, sizes.fast_s, sizes.per_message,
                    "fast")
    report.say(f"{fast['rate']:,} events/s for {fast['seconds']:g} s: {fast['fed']:,} offered "
               f"in {fast['fed_s']:.1f} s, {fast['batches']} batches (p50 {fast['batch_p50']:,},"
               f" max {fast['batch_max']:,}, {fast['batch_max_fed']:,} while fed; mean commit "
               f"{fast['mean_commit_s'] or 0:.2f}"
               f" s), backlog at the end {fast['backlog_at_end']:,} waiting + "
               f"{fast['unacked_at_end'] - fast['backlog_at_end']:,} in the batch committing, "
               f"latency p50 {fast['latency_p50_s']:.2f} s / p99 {fast['latency_p99_s']:.2f} s;"
               f" backlog max {max(fast['backlog_samples'] or [0]):,}")
    # a long commit lets the backlog rise and fall: growth means the last third of the run
    # peaks well above the middle third
    samples = fast["backlog_samples"]
    third = len(samples) // 3
    growing = third > 0 and max(samples[2 * third:]) > 2 * max(samples[third:2 * third]) + \
        sizes.per_message
    kept_up = fast["backlog_at_end"] <= max(fast["batch_max_fed"], sizes.per_message) \
        and not growing
    report.add(Figure(
        name="sustain.rate20k",
        description=f"spread overwrites + new files offered at {fast['rate']:,} events/s for "
                    f"{fast['seconds']:g} s into {rows} rows (p50/p99 latency "
                    f"{fast['latency_p50_s']:.2f}/{fast['latency_p99_s']:.2f} s, batches p50 "
                    f"{fast['batch_p50']:,} max {fast['batch_max_fed']:,} while fed; backlog "
                    f"at the end "
                    f"{fast['backlog_at_end']:,} waiting, {fast['unacked_at_end']:,} with the "
                    f"batch committing)",
        value=fast["committed_per_s"], unit="events/s", baseline=float(fast["rate"]),
        baseline_label="offered rate", target="keeps up: backlog at the end <= one batch, "
        "not growing; p50 latency < 5 s", passed=kept_up and fast["latency_p50_s"] < 5.0,
        details=fast))
    # what one spread batch of the slow rate's second's worth costs on its own, against the
    # copy-on-write floor of the files it rewrites: the latency the slow rate cannot go under
    floor = spread_batch_floor(ctx, root, sizes.rows, sizes.slow_rate, sizes.per_message)
    report.say(f"a spread {floor['events']:,}-event batch alone: {floor['seconds']:.2f} s, "
               f"rewrote {floor['files_rewritten']:,} data files ({floor['rows_rewritten']:,} "
               f"rows); their copy-on-write floor (plain pyarrow read + write) "
               f"{floor['floor_s']:.2f} s")
    slow = run_rate(ctx, root, sizes.rows, sizes.slow_rate, sizes.slow_s, sizes.per_message,
                    "slow")
    report.say(f"{slow['rate']:,} events/s for {slow['seconds']:g} s: {slow['batches']} batches "
               f"(p50 {slow['batch_p50']:,}, max {slow['batch_max']:,}), latency p50 "
               f"{slow['latency_p50_s']:.2f} s / p99 {slow['latency_p99_s']:.2f} s")
    report.add(Figure(
        name="sustain.rate2k",
        description=f"p50 event->commit latency at {slow['rate']:,} events/s into {rows} rows "
                    f"(p99 {slow['latency_p99_s']:.2f} s, batches p50 {slow['batch_p50']:,}; "
                    f"one spread {floor['events']:,}-event batch {floor['seconds']:.2f} s, its "
                    f"copy-on-write floor {floor['floor_s']:.2f} s)",
        value=slow["latency_p50_s"], unit="s", baseline=2.0, baseline_label="target 2 s",
        target="p50 < 2 s and p99 < 5 s",
        passed=slow["latency_p50_s"] < 2.0 and slow["latency_p99_s"] < 5.0,
        details={**slow, "spread_batch_floor": floor}))
    report.add(Figure(
        name="sustain.batch2k",
        description=f"one spread {floor['events']:,}-event batch alone into {rows} rows "
                    f"(merge-on-read: marks rows of {floor['files_rewritten']:,} files)",
        value=floor["seconds"], unit="s", baseline=floor["floor_s"],
        baseline_label=f"copy-on-write floor: pyarrow read+write of those files "
                       f"({floor['rows_rewritten']:,} rows)",
        target="<= 0.25x the floor", passed=floor["seconds"] <= 0.25 * floor["floor_s"],
        details=floor))
    report.note("peak_rss_gib", peak_rss_gib(), f"peak RSS of this run {peak_rss_gib():.2f} GiB")
