"""apply: a batch of 10k events into a 1M-row directory table (target >= 20k events/s).

Two batches: a mix (5k new paths + 5k overwrites of existing paths, spread over the table) and
inserts only (10k new paths). Ours is `DirectoryTable.apply(events)`: newest event per path,
lookup of the stored rows, planning, tombstone check, one Delta commit. The baseline is the raw
delta-rs write of the same rows with no planning: `write_deltalake(mode="append")` for inserts,
`DeltaTable.merge(...).when_matched_update_all().when_not_matched_insert_all()` for the mix.
Each run starts from a fresh copy of the same template table; the median of the runs is shown.
A fresh copy has no key index (DESIGN §4.8): its first batch scans the files its overwrites
touch while the index is built on a thread. `apply.mix.warm` is the same batch on a copy whose
index is built and caught up first (a running daemon's state).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks._context import Context
from benchmarks._data import T0, clone_table, created_events, ready, table_template
from benchmarks._report import Figure, count_label, median, profile_top, timed
from connectors.events import FileEvent
from directory_table.layout import Layout, for_layout
from directory_table.schema import TABLE_SCHEMA, TS

NAME = "apply"
TITLE = "a batch of events into a large directory table"
TARGET_EVENTS_PER_S = 20_000


@dataclass(frozen=True)
class Sizes:
    table_rows: int
    batch: int
    repeats: int


FULL = Sizes(table_rows=1_000_000, batch=10_000, repeats=3)
QUICK = Sizes(table_rows=10_000, batch=1_000, repeats=1)



def mix_batch(sizes: Sizes) -> list[FileEvent]:
    """Half new paths, half overwrites of existing paths spread evenly over the table."""
    when = T0 + timedelta(hours=1)
    half = sizes.batch // 2
    step = sizes.table_rows // half
    return (created_events(range(half), when=when, prefix="new")
            + created_events(range(0, half * step, step), when=when, size=7))


def insert_batch(sizes: Sizes) -> list[FileEvent]:
    return created_events(range(sizes.batch), when=T0 + timedelta(hours=1), prefix="new")


def raw_rows(events: list[FileEvent], version: int, layout: Layout | None = None) -> pa.Table:
    """The rows `apply` would write for `events`, built without any planning (with their
    `_bucket` when `layout` is bucketed)."""
    n = len(events)
    rows = pa.table({
        "relative_path": [e.relative_path for e in events],
        "url": ["file:///bench/" + e.relative_path for e in events],
        "size": pa.array([e.size for e in events], pa.int64()),
        "last_modified_time": pa.array([e.last_modified_time for e in events], TS),
        "etag": pa.array([e.etag for e in events], pa.string()),
        "_sequencer": pa.nulls(n, pa.string()),
        "_event_time": pa.array([e.event_time for e in events], TS),
        "_image_version": pa.array([version] * n, pa.int64()),
        "_image_timestamp": pa.array([T0] * n, TS),
    }, schema=TABLE_SCHEMA)
    return rows if layout is None else for_layout(rows, layout)


def raw_append(path: str, rows: pa.Table) -> None:
    write_deltalake(path, rows, mode="append")


def raw_merge(path: str, rows: pa.Table) -> None:
    (
        DeltaTable(path).merge(rows, "t.relative_path = s.relative_path", source_alias="s",
                               target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


class Runner:
    """Times ours and the raw write of one batch on fresh copies of the template."""

    def __init__(self, ctx: Context, template: Path, sizes: Sizes):
        self.ctx = ctx
        self.template = template
        self.sizes = sizes
        self._copies = 0

    def fresh_table(self):
        self._copies += 1
        return clone_table(self.template, self.ctx.path(f"apply-{self._copies}"))

    def ours(self, events: list[FileEvent], warm: bool = False) -> tuple[float, dict]:
        runs, result = [], None
        for _ in range(self.sizes.repeats):
            table = self.fresh_table()
            if warm:
                ready(table)
            seconds, result = timed(lambda t=table: t.apply(events))
            runs.append(seconds)
        return median(runs), {"runs_s": runs, "inserted": result.inserted,
                              "updated": result.updated, "ignored": result.ignored}

    def raw(self, events: list[FileEvent], write: Callable[[str, pa.Table], None]
            ) -> tuple[float, dict]:
        runs = []
        for _ in range(self.sizes.repeats):
            table = self.fresh_table()
            rows = raw_rows(events, table.version() + 1, table.layout())
            seconds, _ = timed(lambda p=table.path, r=rows: write(p, r))
            runs.append(seconds)
        return median(runs), {"runs_s": runs}

    def profile(self, events: list[FileEvent]) -> str:
        table = self.fresh_table()
        return profile_top(lambda: table.apply(events))


def _figure(ctx: Context, case: str, description: str, events: list[FileEvent],
            ours: tuple[float, dict], raw: tuple[float, dict], raw_label: str) -> Figure:
    n = len(events)
    ours_rate, raw_rate = n / ours[0], n / raw[0]
    target_met = ours_rate >= TARGET_EVENTS_PER_S
    return ctx.report.add(Figure(
        name=f"apply.{case}", description=description, value=ours_rate, unit="events/s",
        baseline=raw_rate, baseline_label=raw_label,
        target=f">= {TARGET_EVENTS_PER_S:,} events/s", passed=target_met,
        details={"events": n, "ours_seconds": ours[0], "raw_seconds": raw[0],
                 "ours": ours[1], "raw": raw[1]}))


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    report = ctx.report
    seconds, template = timed(lambda: table_template(ctx, sizes.table_rows))
    report.note("table_rows", sizes.table_rows,
                f"template table of {sizes.table_rows:,} rows ready in {seconds:.1f} s "
                f"(built once per run, or reused); {sizes.repeats} run(s) per figure, median")
    runner = Runner(ctx, template, sizes)
    rows, batch = count_label(sizes.table_rows), count_label(sizes.batch)
    cases = [
        ("mix", f"{batch} events ({count_label(sizes.batch // 2)} new + "
                f"{count_label(sizes.batch // 2)} overwrites) into {rows} rows",
         mix_batch(sizes), raw_merge, "raw delta-rs merge"),
        ("inserts", f"{batch} new paths into {rows} rows", insert_batch(sizes), raw_append,
         "raw delta-rs append"),
    ]
    mix = cases[0]
    cases.append(("mix.warm", mix[1] + ", its key index ready", *mix[2:]))
    for case, description, events, write, raw_label in cases:
        figure = _figure(ctx, case, description, events,
                         runner.ours(events, warm=case.endswith(".warm")),
                         runner.raw(events, write), raw_label)
        if ctx.profile and not figure.passed:
            report.say(f"profile of one apply ({case}), top entries by cumulative time:")
            for line in runner.profile(events).splitlines():
                report.say("    " + line)
