"""stream_read: 1k changes read from a 1M-row and from a 10k-row directory table.

Target: each read under 1 s, and the 1M case at most 2x the 10k case (reading a stream costs
O(changes), never O(files), DESIGN §3). Each table is a volume's directory table filled from a
synthetic template; a stream is created at its latest version, then 1k paths change over four
commits (40% new files, 40% overwrites, 20% deletes, spread over the table), which reads back
as 1.4k change records. Timed, median of 15 runs after a warm-up, the two tables alternating
run by run: `read_stream_arrow` (Arrow path) and `read_stream(...).collect()` (Spark DataFrame
path). Baselines: for the 10k table a full scan of its snapshot (Arrow) and the Arrow read
(Spark); for the 1M table the same read at 10k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import volume_stream as vs
from benchmarks._context import Context
from benchmarks._data import T0, clone_table, created_events, removed_events, table_template
from benchmarks._report import Figure, count_label, median, profile_top, timed
from directory_table import DirectoryTable

NAME = "stream_read"
TITLE = "read a stream's pending changes from a small and a large directory table"
MAX_SECONDS = 1.0
MAX_SCALING = 2.0


@dataclass(frozen=True)
class Sizes:
    small: int
    large: int
    changes: int
    commits: int
    repeats: int


FULL = Sizes(small=10_000, large=1_000_000, changes=1_000, commits=4, repeats=15)
QUICK = Sizes(small=1_000, large=10_000, changes=200, commits=1, repeats=5)



@dataclass
class Reads:
    """One table's stream and its read timings (seconds)."""

    rows: int
    stream: str
    records: int
    arrow_runs: list[float] = field(default_factory=list)
    spark_runs: list[float] = field(default_factory=list)
    snapshot_s: float = 0.0

    @property
    def arrow_s(self) -> float:
        return median(self.arrow_runs)

    @property
    def spark_s(self) -> float:
        return median(self.spark_runs)


#: how each path reads a stream, and its untimed warm-up runs (Spark's first jobs are slow)
READERS: dict[str, tuple[Callable[[vs.Catalog, str], object], int]] = {
    "arrow": (lambda cat, stream: cat.read_stream_arrow(stream), 1),
    "spark": (lambda cat, stream: cat.read_stream(stream).collect(), 3),
}


def apply_changes(table: DirectoryTable, rows: int, changes: int, commits: int) -> int:
    """Change `changes` paths of the table over `commits` commits, each a mix of new files,
    overwrites and deletes; return the number of change records a stream should show."""
    new, over = changes * 2 // 5, changes * 2 // 5
    gone = changes - new - over
    step = rows // (over + gone)
    existing = list(range(0, rows, step))[: over + gone]
    kinds = {"new": list(range(new)), "over": existing[:over], "gone": existing[over:]}
    for c in range(commits):
        when = T0 + timedelta(hours=c + 1)
        part = {k: v[c * len(v) // commits:(c + 1) * len(v) // commits] for k, v in kinds.items()}
        table.apply(created_events(part["new"], when=when, prefix="new")
                    + created_events(part["over"], when=when, size=7)
                    + removed_events(part["gone"], when=when))
    return new + 2 * over + gone


def prepare(ctx: Context, cat: vs.Catalog, rows: int, sizes: Sizes) -> tuple[str, int]:
    """A volume whose table holds `rows` rows, a stream on it, then the changes; return
    (stream name, expected records)."""
    name = f"rows_{rows}"
    location = ctx.data_path(f"stream-read-{rows}")
    location.mkdir(parents=True, exist_ok=True)
    cat.create_volume(name, location)
    table = cat.directory_table(name)
    clone_table(table_template(ctx, rows), Path(table.root), base_url=table.base_url)
    cat.create_stream(f"s_{rows}", on_volume=name)
    expected = apply_changes(cat.directory_table(name), rows, sizes.changes, sizes.commits)
    return f"s_{rows}", expected


def time_reads(cat: vs.Catalog, cases: list[Reads], repeats: int) -> None:
    """Time every read path on every table, alternating tables run by run (A B A B ...), so
    a burst of load from other processes hits all tables alike."""
    for path, (read, warmup) in READERS.items():
        for case in cases:
            for _ in range(warmup):
                read(cat, case.stream)
        for _ in range(repeats):
            for case in cases:
                seconds, _ = timed(lambda c=case, r=read: r(cat, c.stream))
                getattr(case, f"{path}_runs").append(seconds)
    for case in cases:
        table = cat.directory_table(f"rows_{case.rows}")
        case.snapshot_s, _ = timed(lambda t=table: t.snapshot())


def _details(reads: Reads) -> dict:
    return {"table_rows": reads.rows, "records": reads.records,
            "arrow_runs_s": reads.arrow_runs, "spark_runs_s": reads.spark_runs,
            "snapshot_scan_s": reads.snapshot_s}


def report_figures(ctx: Context, small: Reads, large: Reads, sizes: Sizes) -> None:
    report = ctx.report
    changes = f"{count_label(sizes.changes)} changes ({small.records} records)"
    s, lg = count_label(small.rows), count_label(large.rows)
    for path, value_of, small_baseline, small_label in (
        ("arrow", lambda r: r.arrow_s, small.snapshot_s, f"full snapshot scan of {s} rows"),
        ("spark", lambda r: r.spark_s, small.arrow_s, f"Arrow read at {s}"),
    ):
        how = "read_stream_arrow" if path == "arrow" else "read_stream().collect()"
        report.add(Figure(
            name=f"stream_read.{path}.{s}", description=f"{how}: {changes} from {s} rows",
            value=value_of(small), unit="s", baseline=small_baseline,
            baseline_label=small_label, target=f"< {MAX_SECONDS:g} s",
            passed=value_of(small) < MAX_SECONDS, details=_details(small)))
        ratio = value_of(large) / value_of(small)
        report.add(Figure(
            name=f"stream_read.{path}.{lg}", description=f"{how}: {changes} from {lg} rows",
            value=value_of(large), unit="s", baseline=value_of(small),
            baseline_label=f"same read at {s}",
            target=f"< {MAX_SECONDS:g} s and ratio <= {MAX_SCALING:g}x",
            passed=value_of(large) < MAX_SECONDS and ratio <= MAX_SCALING,
            details=_details(large)))
    report.note("large_snapshot_scan_s", large.snapshot_s,
                f"for scale: a full snapshot scan of the {lg}-row table takes "
                f"{large.snapshot_s:.2f} s (an O(files) reader would pay that per read)")


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    cat = vs.connect(ctx.path("stream-read-warehouse"), spark=ctx.spark)
    cases = []
    for rows in (sizes.small, sizes.large):
        seconds, (stream, expected) = timed(lambda r=rows: prepare(ctx, cat, r, sizes))
        records = cat.read_stream_arrow(stream).num_rows
        if records != expected:
            raise AssertionError(f"stream {stream} shows {records} records, expected {expected}")
        cases.append(Reads(rows, stream, records))
        ctx.report.say(f"{count_label(rows)}-row table and its {count_label(sizes.changes)} "
                       f"changes ready in {seconds:.1f} s")
    time_reads(cat, cases, sizes.repeats)
    small, large = cases
    report_figures(ctx, small, large, sizes)
    missed = [f for f in ctx.report.current.figures if f.passed is False]
    if ctx.profile and missed:
        ctx.report.say(f"profile of one read_stream_arrow at {count_label(sizes.large)} rows:")
        for line in profile_top(lambda: cat.read_stream_arrow(large.stream)).splitlines():
            ctx.report.say("    " + line)
