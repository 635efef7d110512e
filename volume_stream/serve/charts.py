"""The status page's charts: commits and events per minute, pending changes over time and
commit latency, as plain series the page draws with uPlot (DESIGN §8.3).

Two sources. The tables' history gives every volume's commits (their times are kept per
(table, version) by `StatusSource`, so a chart costs no read of its own). A `Timeline` holds
what only a running process knows, sampled over time in memory: the daemon records its
counters (events received and applied, commits, the commit-latency histogram) and the pending
changes of its streams at every statistics pass; without a daemon, `StatusSource` records the
pending changes it computed for each page. A timeline keeps the last hour; a restart starts
it again (Prometheus and the Grafana dashboard keep the long view).

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

__all__ = ["Timeline", "charts", "quantile"]

MINUTE = 60
#: minutes the per-minute charts cover
WINDOW_MINUTES = 60
#: the latency histogram's bucket counters are recorded as "commit_seconds_bucket:<le>"
BUCKET_PREFIX = "commit_seconds_bucket:"


class Timeline:
    """Samples of counters and gauges (name -> number) over the last `window_s` seconds.

    Samples are thinned to about one per `min_gap_s` (several open pages polling every 2 s,
    or a daemon's statistics pass every 0.2 s, keep no more). Thread-safe.

    Example:
        >>> t = Timeline()
        >>> t.record({"pending": 3})
        >>> [v["pending"] for _, v in t.points()]
        [3]
    """

    def __init__(self, window_s: float = WINDOW_MINUTES * MINUTE, min_gap_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.window_s, self.min_gap_s, self.clock = window_s, min_gap_s, clock
        self._points: deque[tuple[float, dict[str, float]]] = deque()
        self._lock = threading.Lock()

    def record(self, values: Mapping[str, float], at: float | None = None) -> None:
        """Add a sample (now unless `at`). One closer than `min_gap_s` to the sample before
        the last replaces the last, carrying its other values: counters keep every increase
        (their latest value is kept), and the samples stay at least `min_gap_s` apart but for
        the newest."""
        at = self.clock() if at is None else at
        with self._lock:
            points = self._points
            if len(points) >= 2 and at - points[-2][0] < self.min_gap_s:
                points[-1] = (at, {**points[-1][1], **values})
            else:
                points.append((at, dict(values)))
            while points and points[0][0] < at - self.window_s:
                points.popleft()

    def points(self) -> list[tuple[float, dict[str, float]]]:
        """The samples kept, oldest first: (unix time, values)."""
        with self._lock:
            return list(self._points)


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


def _minute_of(t: float, start: float) -> int:
    return int((t - start) // MINUTE)


def charts(histories: Iterable[tuple[list[datetime], bool]], timeline: Timeline | None, *,
           now: float) -> dict[str, Any]:
    """The page's chart data: per-minute series over the last hour and the pending samples.

    `histories` holds, per volume, the commit times read from its directory table's history
    and whether they are all of them (a busy table's last 200 commits may not reach back an
    hour: the minutes before its oldest one read are then unknown). Per-minute series hold
    None for a minute nothing tells (the line has a gap, not a false zero).
    """
    start = (now // MINUTE - (WINDOW_MINUTES - 1)) * MINUTE
    minutes = [start + i * MINUTE for i in range(WINDOW_MINUTES)]
    commits: list[int | None] = [0] * WINDOW_MINUTES
    known_from = 0
    for times, complete in histories:
        for when in times:
            i = _minute_of(when.timestamp(), start)
            if 0 <= i < WINDOW_MINUTES:
                commits[i] = (commits[i] or 0) + 1
        if not complete and times:
            known_from = max(known_from, _minute_of(min(times).timestamp(), start) + 1)
    for i in range(min(known_from, WINDOW_MINUTES)):
        commits[i] = None
    points = timeline.points() if timeline is not None else []
    received, applied = _per_minute(points, start, ("events_received", "events_applied"))
    latency_mean, latency_p95 = _latency(points, start)
    pending = [(t, v["pending"]) for t, v in points if "pending" in v and t >= start]
    return {
        "minutes": minutes,
        "commits": commits,
        "events_received": received,
        "events_applied": applied,
        "latency_mean_s": latency_mean,
        "latency_p95_s": latency_p95,
        "pending_times": [round(t, 1) for t, _ in pending],
        "pending": [v for _, v in pending],
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


def _per_minute(points: list[tuple[float, dict[str, float]]], start: float,
                keys: tuple[str, ...]) -> list[list[float | None]]:
    """Each counter's increase per minute; None for minutes without a sample."""
    series = []
    for key in keys:
        values: list[float | None] = [None] * WINDOW_MINUTES
        for t, delta in _deltas(points, key):
            i = _minute_of(t, start)
            if 0 <= i < WINDOW_MINUTES:
                values[i] = (values[i] or 0.0) + delta
        series.append(values)
    return series


def _latency(points: list[tuple[float, dict[str, float]]], start: float
             ) -> tuple[list[float | None], list[float | None]]:
    """Mean and p95 commit latency per minute, from the histogram's increases."""
    sums = dict(_deltas_by_minute(points, start, "commit_seconds_sum"))
    counts = dict(_deltas_by_minute(points, start, "commit_seconds_count"))
    bounds = sorted({k for _, v in points for k in v if k.startswith(BUCKET_PREFIX)},
                    key=lambda k: float(k[len(BUCKET_PREFIX):]))
    per_bucket = {k: dict(_deltas_by_minute(points, start, k)) for k in bounds}
    mean: list[float | None] = [None] * WINDOW_MINUTES
    p95: list[float | None] = [None] * WINDOW_MINUTES
    for i, count in counts.items():
        if count:
            mean[i] = round(sums.get(i, 0.0) / count, 4)
            histogram = {float(k[len(BUCKET_PREFIX):]): per_bucket[k].get(i, 0.0)
                         for k in bounds}
            value = quantile(0.95, histogram)
            p95[i] = None if value is None else round(value, 4)
    return mean, p95


def _deltas_by_minute(points: list[tuple[float, dict[str, float]]], start: float, key: str
                      ) -> Iterable[tuple[int, float]]:
    totals: dict[int, float] = {}
    for t, delta in _deltas(points, key):
        i = _minute_of(t, start)
        if 0 <= i < WINDOW_MINUTES:
            totals[i] = totals.get(i, 0.0) + delta
    return totals.items()
