"""mor: what merge-on-read costs its readers, and what compaction gives back (DESIGN §4.8).

A merge-on-read table accumulates deletion vectors and small per-batch image files; a snapshot
read merges them in. Lines (full: the 10M-row `scale` template and 1,000 batches; `--quick`:
200k rows and 100 batches), each batch 20 spread overwrites and 5 deletes:

- `mor.snapshot`: `snapshot()` after the batches, against a compacted copy of the same rows
  (written sorted in one go, no DV); target <= 1.5x.
- `mor.snapshot.compacted`: the same read after our `optimize()` (purge and fold), against the
  same copy; target <= 1.1x. Its details give optimize's time and the files before and after.
"""

from __future__ import annotations

import random
from datetime import timedelta

from deltalake import write_deltalake

from benchmarks._context import Context
from benchmarks._data import BASE_URL, T0, created_events, existing_path
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.scale import link_copy, template
from connectors.events import FileEvent
from directory_table import DEFAULT_BUCKETS, DirectoryTable
from directory_table.deltalog import replay
from directory_table.schema import BUCKETED_SCHEMA

NAME = "mor"
TITLE = "merge-on-read: snapshot reads after many DV batches, and after compaction"


def _batches(table: DirectoryTable, rows: int, count: int) -> float:
    rng = random.Random(4)
    started = timed(lambda: None)[0]
    seconds = started
    for k in range(count):
        when = T0 + timedelta(days=3, seconds=k)
        picks = rng.sample(range(rows), 25)
        events = created_events(picks[:20], when=when, size=100 + k) + [
            FileEvent.removed(existing_path(i), event_time=when) for i in picks[20:]]
        seconds += timed(lambda e=events: table.apply(e))[0]
    return seconds


def _reads(tables: list[DirectoryTable], repeats: int) -> list[float]:
    """Median snapshot time of each table, reads alternating (the same background load)."""
    runs: list[list[float]] = [[] for _ in tables]
    for _ in range(repeats):
        for table, out in zip(tables, runs, strict=True):
            out.append(timed(lambda t=table: t.snapshot(columns=BUCKETED_SCHEMA.names))[0])
    return [median(r) for r in runs]


def run(ctx: Context) -> None:
    rows, count, repeats = (200_000, 100, 3) if ctx.quick else (10_000_000, 1_000, 3)
    report = ctx.report
    table = link_copy(template(ctx, rows, DEFAULT_BUCKETS), ctx.path("mor"))
    apply_s = _batches(table, rows, count)
    state = replay(table.path, None, table.version())
    files_before, marked = state.files.num_rows, len(state.deletion_vectors())
    report.say(f"{count:,} batches of 25 spread events into {count_label(rows)} rows in "
               f"{apply_s:.1f} s; {files_before:,} files, {marked:,} with a deletion vector")
    compacted = DirectoryTable.create(str(ctx.path("mor-copy")), BASE_URL,
                                      buckets=DEFAULT_BUCKETS)
    live = table.snapshot(columns=BUCKETED_SCHEMA.names)
    write_deltalake(compacted.path, live.sort_by([("_bucket", "ascending"),
                                                  ("relative_path", "ascending")]),
                    mode="append")
    del live
    ours, base = _reads([table, compacted], repeats)
    report.add(Figure(
        name="mor.snapshot",
        description=f"snapshot of {count_label(rows)} rows after {count:,} merge-on-read "
                    f"batches ({files_before:,} files, {marked:,} with a DV)",
        value=ours, unit="s", baseline=base, baseline_label="a compacted copy of the rows",
        target="<= 1.5x", passed=ours <= 1.5 * base,
        details={"files": files_before, "with_dv": marked, "apply_s": apply_s}))
    optimize_s, result = timed(lambda: table.optimize())
    state = replay(table.path, None, table.version())
    ours, base = _reads([table, compacted], repeats)
    report.add(Figure(
        name="mor.snapshot.compacted",
        description=f"the same after optimize() ({optimize_s:.1f} s: {files_before:,} -> "
                    f"{state.files.num_rows:,} files, {len(state.deletion_vectors()):,} "
                    f"with a DV)",
        value=ours, unit="s", baseline=base, baseline_label="a compacted copy of the rows",
        target="<= 1.1x", passed=ours <= 1.1 * base,
        details={"optimize_s": optimize_s, "files_after": state.files.num_rows,
                 "optimize": {k: v for k, v in result.__dict__.items() if k != "tombstones"}}))
