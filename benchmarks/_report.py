"""Shared timing and reporting helpers for the benchmarks.

Every benchmark produces `Figure`s: one measured value next to a baseline measured in the same
run, their ratio (always value / baseline), the target as text and whether it is met
(`passed` is None for figures that have no target and are shown for information). A `Report`
prints each figure as one line when it is added and collects them for the JSON summary.

    report = Report()
    t = median_seconds(lambda: table.apply(events), repeats=3)
    report.add(Figure("apply.mix", "10k events", ours=..., baseline=..., ...))
"""

from __future__ import annotations

import cProfile
import io
import json
import math
import os
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Figure",
    "count_label",
    "Report",
    "fmt_value",
    "median",
    "median_seconds",
    "profile_top",
    "timed",
    "write_json",
]

#: status words printed in front of each figure line
PASS, MISS, INFO = "PASS", "MISS", "INFO"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Run `fn` once; return (seconds, its result)."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def median(values: list[float]) -> float:
    """The median of the finite values (inf when there are none: every attempt timed out)."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.inf


def median_seconds(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> tuple[float,
                                                                                       list[float]]:
    """Run `fn` `warmup` times untimed, then `repeats` times; return (median, all timings)."""
    for _ in range(warmup):
        fn()
    runs = [timed(fn)[0] for _ in range(repeats)]
    return median(runs), runs


def profile_top(fn: Callable[[], Any], limit: int = 15) -> str:
    """Run `fn` under cProfile; return the top `limit` entries by cumulative time as text."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("cumulative").print_stats(limit)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    # drop pstats' preamble up to the column header
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:])


def count_label(n: int) -> str:
    """A count in short form: 500, 1k, 1.5k, 10k, 1M."""
    for size, suffix in ((1_000_000, "M"), (1000, "k")):
        if n >= size:
            return f"{n / size:g}{suffix}"
    return str(n)


def fmt_value(value: float | None, unit: str) -> str:
    """A value in base units (seconds, events/s, rows...) in a readable form."""
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return "timed out"
    if unit == "s":
        if value < 1:
            return f"{value * 1000:.1f} ms"
        return f"{value:.2f} s"
    if value >= 100 or value == int(value):
        return f"{value:,.0f} {unit}"
    return f"{value:.2f} {unit}"


@dataclass
class Figure:
    """One measured value against its same-run baseline.

    `ratio` is `value / baseline`. `passed` is True/False when the figure has a target, None
    when it is shown for information only.
    """

    name: str
    description: str
    value: float | None
    unit: str
    baseline: float | None
    baseline_label: str
    target: str
    passed: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.baseline is None or not self.baseline:
            return None
        if not (math.isfinite(self.value) and math.isfinite(self.baseline)):
            return None
        return self.value / self.baseline

    @property
    def status(self) -> str:
        return INFO if self.passed is None else (PASS if self.passed else MISS)

    def line(self) -> str:
        ratio = "n/a" if self.ratio is None else f"{self.ratio:.3f}x"
        return (f"[{self.status}] {self.name}: {self.description}\n"
                f"       ours {fmt_value(self.value, self.unit)}"
                f" | {self.baseline_label} {fmt_value(self.baseline, self.unit)}"
                f" | ratio {ratio}"
                f" | target {self.target}")

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["status"] = self.status
        for key in ("value", "baseline", "ratio"):
            if isinstance(data[key], float) and not math.isfinite(data[key]):
                data[key] = None  # JSON has no inf; a timeout shows as null
        return data


@dataclass
class Section:
    """What one benchmark produced."""

    name: str
    figures: list[Figure] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None


class Report:
    """Collects and prints the figures of a run, benchmark by benchmark."""

    def __init__(self, echo: Callable[[str], None] = print) -> None:
        self.sections: list[Section] = []
        self._echo = echo

    def begin(self, name: str, title: str) -> Section:
        section = Section(name)
        self.sections.append(section)
        self._echo(f"\n=== {name}: {title}")
        return section

    @property
    def current(self) -> Section:
        return self.sections[-1]

    def add(self, figure: Figure) -> Figure:
        self.current.figures.append(figure)
        self._echo(figure.line())
        return figure

    def note(self, key: str, value: Any, text: str | None = None) -> None:
        """Record a value for the JSON summary; print `text` (if given) as an info line."""
        self.current.notes[key] = value
        if text:
            self._echo(f"  - {text}")

    def say(self, text: str) -> None:
        self._echo(f"  {text}")

    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures]

    def counts(self) -> dict[str, int]:
        statuses = [f.status for f in self.figures()]
        return {s.lower(): statuses.count(s) for s in (PASS, MISS, INFO)}

    def summary_lines(self) -> list[str]:
        lines = ["", "=== summary"]
        for f in self.figures():
            ratio = "n/a" if f.ratio is None else f"{f.ratio:.3f}x"
            lines.append(f"[{f.status}] {f.name:<34} {fmt_value(f.value, f.unit):>18}"
                         f"  ratio {ratio:>8}  target {f.target}")
        for s in self.sections:
            if s.error:
                lines.append(f"[ERROR] {s.name}: {s.error}")
        c = self.counts()
        lines.append(f"{c['pass']} PASS, {c['miss']} MISS, {c['info']} INFO")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            s.name: {"seconds": round(s.seconds, 3), "error": s.error, "notes": s.notes,
                     "figures": [f.as_dict() for f in s.figures]}
            for s in self.sections
        }


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> Path:
    """Write `data` as indented JSON, creating the parent folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return out
