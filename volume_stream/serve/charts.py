"""The status page's charts: commits and events per minute, pending changes over time and
commit latency, as plain series the page draws with uPlot (DESIGN §8.3).

Two sources. The tables' history gives every volume's commits (their times are kept per
(table, version) by `StatusSource`, so a chart costs no read of its own). A `Timeline` holds
what only a running process knows, sampled over time in memory: the daemon records its
counters (events received and applied, commits, the commit-latency histogram) and the pending
changes of its streams at every statistics pass; without a daemon, `StatusSource` records the
pending changes it computed for each page. A timeline keeps the last day (the last hour at
every sample, the hours before at one a minute); a restart starts it again (Prometheus and
the Grafana dashboard keep the long view). The page shows one of `RANGES` (`?range=6h`).

    timeline = Timeline()
    timeline.record({"pending": 12, "events_received": 340})
    charts(commit_times, timeline, now=time.time())   # {"minutes": [...], "commits": [...], ...}
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from volume_stream.errors import InvalidInputError

__all__ = ["DEFAULT_RANGE", "RANGES", "Timeline", "charts", "quantile", "range_seconds"]

MINUTE = 60
#: the time ranges the page offers (`?range=`), in seconds, and the one it shows by default
RANGES = {"15m": 900, "1h": 3600, "6h": 6 * 3600, "24h": 24 * 3600}
DEFAULT_RANGE = "1h"
#: the buckets (points) of a per-bucket chart: over an hour, one a minute
STEPS = 60
#: minutes the per-minute charts cover by default
WINDOW_MINUTES = 60
#: two pending-changes samples further apart than this have a gap between them (nobody
#: sampled: the page was closed), not a line
GAP_S = 150.0
#: the latency histogram's bucket counters are recorded as "commit_seconds_bucket:<le>"
BUCKET_PREFIX = "commit_seconds_bucket:"


class Timeline:
    """Samples of counters and gauges (name -> number) over the last `window_s` seconds.

    Samples are thinned to about one per `min_gap_s` (several open pages polling every 2 s,
    or a daemon's statistics pass every 0.2 s, keep no more); those older than `fine_s` to
    about one per `coarse_gap_s` (a day of samples is ~3,000, not 43,000). Thread-safe.

    Example:
        >>> t = Timeline()
        >>> t.record({"pending": 3})
        >>> [v["pending"] for _, v in t.points()]
        [3]
    """

    def __init__(self, window_s: float = RANGES["24h"], min_gap_s: float = 2.0,
                 clock: Callable[[], float] = time.time, fine_s: float = WINDOW_MINUTES * MINUTE,
                 coarse_gap_s: float = MINUTE) -> None:
        self.window_s, self.min_gap_s, self.clock = window_s, min_gap_s, clock
        self.fine_s, self.coarse_gap_s = fine_s, coarse_gap_s
        self._points: deque[tuple[float, dict[str, float]]] = deque()
        self._coarse: deque[tuple[float, dict[str, float]]] = deque()
        self._lock = threading.Lock()

    @staticmethod
    def _add(points: deque, at: float, values: Mapping[str, float], gap: float) -> None:
        """Append a sample; one closer than `gap` to the sample before the last replaces the
        last, carrying its other values (counters keep their latest value)."""
        if len(points) >= 2 and at - points[-2][0] < gap:
            points[-1] = (at, {**points[-1][1], **values})
        else:
            points.append((at, dict(values)))

    def record(self, values: Mapping[str, float], at: float | None = None) -> None:
        """Add a sample (now unless `at`). One closer than `min_gap_s` to the sample before
        the last replaces the last, carrying its other values: counters keep every increase
        (their latest value is kept), and the samples stay at least `min_gap_s` apart but for
        the newest."""
        at = self.clock() if at is None else at
        with self._lock:
            points, coarse = self._points, self._coarse
            self._add(points, at, values, self.min_gap_s)
            while points and points[0][0] < at - min(self.fine_s, self.window_s):
                old_at, old = points.popleft()
                if old_at >= at - self.window_s:
                    self._add(coarse, old_at, old, self.coarse_gap_s)
            while coarse and coarse[0][0] < at - self.window_s:
                coarse.popleft()

    def points(self) -> list[tuple[float, dict[str, float]]]:
        """The samples kept, oldest first: (unix time, values)."""
        with self._lock:
            return [*self._coarse, *self._points]


def range_seconds(name: str | None) -> int:
    """The seconds of a time range the page offers (`RANGES`; None: the default)."""
    if name is None or name == "":
        return RANGES[DEFAULT_RANGE]
    if name not in RANGES:
        raise InvalidInputError(f"unknown time range {name!r}; choose one of "
                                f"{', '.join(RANGES)}")
    return RANGES[name]


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The `q` quantile of a cumulative histogram {upper bound: count}, interpolated inside
    the bucket as Prometheus' `histogram_quantile` does; None when it is empty."""
    bounds = sorted(buckets)
    if not bounds or not buckets[bounds[-1]]:
        return None
    rank, below, lower = q * buckets[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bound: its value is all we know
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        below, lower = count, bound
    return lower


class _Buckets:
    """`STEPS` buckets of `step` seconds, the last holding `now`."""

    def __init__(self, now: float, span_s: float):
        self.step = span_s / STEPS
        self.start = (now // self.step - (STEPS - 1)) * self.step

    def of(self, t: float) -> int:
        """The bucket of time `t` (outside 0..STEPS-1: outside the range)."""
        return int((t - self.start) // self.step)


def charts(histories: Iterable[tuple[list[datetime], bool]], timeline: Timeline | None, *,
           now: float, span_s: float = RANGES[DEFAULT_RANGE]) -> dict[str, Any]:
    """The page's chart data over the last `span_s` seconds: per-bucket series (`STEPS`
    buckets of `step_s`: a minute each over an hour) and the pending samples.

    `histories` holds, per volume, the commit times read from its directory table's history
    and whether they are all of them (a busy table's last 200 commits may not reach back an
    hour: the buckets before its oldest one read are then unknown). Per-bucket series hold
    None for a bucket nothing tells (the line has a gap, not a false zero); the pending
    samples hold a None between two samples more than `GAP_S` apart (nobody sampled then:
    the line breaks rather than draw a steady climb). `from`/`to` are the range every chart
    spans, whatever its samples cover.
    """
    b = _Buckets(now, span_s)
    minutes = [b.start + i * b.step for i in range(STEPS)]
    commits: list[int | None] = [0] * STEPS
    known_from = 0
    for times, complete in histories:
        for when in times:
            i = b.of(when.timestamp())
            if 0 <= i < STEPS:
                commits[i] = (commits[i] or 0) + 1
        if not complete and times:
            known_from = max(known_from, b.of(min(times).timestamp()) + 1)
    for i in range(min(known_from, STEPS)):
        commits[i] = None
    points = timeline.points() if timeline is not None else []
    received, applied = _per_bucket(points, b, ("events_received", "events_applied"))
    latency_mean, latency_p95 = _latency(points, b)
    pending_times: list[float] = []
    pending: list[float | None] = []
    for t, v in points:
        if "pending" not in v or t < b.start:
            continue
        if pending_times and t - pending_times[-1] > GAP_S:
            pending_times.append(round((pending_times[-1] + t) / 2, 1))
            pending.append(None)
        pending_times.append(round(t, 1))
        pending.append(v["pending"])
    return {
        "range": next((k for k, v in RANGES.items() if v == span_s), f"{span_s:g}s"),
        "step_s": b.step,
        "from": b.start,
        "to": b.start + STEPS * b.step,
        "minutes": minutes,
        "commits": commits,
        "events_received": received,
        "events_applied": applied,
        "latency_mean_s": latency_mean,
        "latency_p95_s": latency_p95,
        "pending_times": pending_times,
        "pending": pending,
        "sampled": bool(points),
        "daemon": any("events_received" in v for _, v in points),
    }


def _deltas(points: list[tuple[float, dict[str, float]]], key: str
            ) -> list[tuple[float, float]]:
    """(time, increase since the previous sample holding `key`) for a counter."""
    out, previous = [], None
    for t, values in points:
        if key not in values:
            continue
        value = values[key]
        if previous is not None:
            out.append((t, max(value - previous, 0.0)))  # a counter never goes down
        previous = value
    return out


def _per_bucket(points: list[tuple[float, dict[str, float]]], b: _Buckets,
                keys: tuple[str, ...]) -> list[list[float | None]]:
    """Each counter's increase per bucket; None for buckets without a sample."""
    series = []
    for key in keys:
        values: list[float | None] = [None] * STEPS
        for t, delta in _deltas(points, key):
            i = b.of(t)
            if 0 <= i < STEPS:
                values[i] = (values[i] or 0.0) + delta
        series.append(values)
    return series


def _latency(points: list[tuple[float, dict[str, float]]], b: _Buckets
             ) -> tuple[list[float | None], list[float | None]]:
    """Mean and p95 commit latency per bucket, from the histogram's increases."""
    sums = dict(_deltas_by_bucket(points, b, "commit_seconds_sum"))
    counts = dict(_deltas_by_bucket(points, b, "commit_seconds_count"))
    bounds = sorted({k for _, v in points for k in v if k.startswith(BUCKET_PREFIX)},
                    key=lambda k: float(k[len(BUCKET_PREFIX):]))
    per_bucket = {k: dict(_deltas_by_bucket(points, b, k)) for k in bounds}
    mean: list[float | None] = [None] * STEPS
    p95: list[float | None] = [None] * STEPS
    for i, count in counts.items():
        if count:
            mean[i] = round(sums.get(i, 0.0) / count, 4)
            histogram = {float(k[len(BUCKET_PREFIX):]): per_bucket[k].get(i, 0.0)
                         for k in bounds}
            value = quantile(0.95, histogram)
            p95[i] = None if value is None else round(value, 4)
    return mean, p95


def _deltas_by_bucket(points: list[tuple[float, dict[str, float]]], b: _Buckets, key: str
                      ) -> Iterable[tuple[int, float]]:
    totals: dict[int, float] = {}
    for t, delta in _deltas(points, key):
        i = b.of(t)
        if 0 <= i < STEPS:
            totals[i] = totals.get(i, 0.0) + delta
    return totals.items()
