"""scale: a directory table at 10M rows costs per write what it costs at 10k (issue 12).

Lines (full sizes; `--quick` uses 10k/200k rows and fewer commits):
- `scale.batch10`: a 10-event batch (5 new + 5 overwrites spread over the table) into the
  10M-row table, against the same kind of batch into a 10k-row table (same bucket count);
  target <= 2x. Median of several batches, each a different set of paths, on one copy.
- `scale.batch10.grown`: the same, on tables grown by `DirectoryTable.apply` in 250k-event
  chunks (`--quick`: 50k) rather than bulk-written; target <= 2x.
- `scale.batch10k`: 10k events (5k new + 5k overwrites spread) into 10M rows, against the
  copy-on-write floor of that commit measured in the same run (plain pyarrow reading and
  writing exactly the files whose rows it marks, `benchmarks._floor`); target <= 0.3x
  (merge-on-read, DESIGN §4.8: the batch writes deletion vectors, not those files).
  `scale.batch10k.rate` (INFO) prints its events/s against a raw delta-rs merge of the same
  rows into an unpartitioned copy of the table (the layout of tables before buckets).
- `scale.local10k`: 10k events over a few folders (every file of 5 existing folders
  overwritten, 5 new folders) into 10M rows: >= 20k events/s, and the files it rewrites.
- `scale.read1k`: `changes()` of a commit of 1k new paths, from the 10M-row table against the
  10k-row one; target <= 2x.
- `scale.optimize`: 5,000 one-event commits into a 10k-row table, then `optimize()`: data files
  per bucket <= 8 and the table's load time (`DeltaTable(path)`) <= 2x that of a freshly
  written, compacted copy of the same rows.

The 10M-row templates are built by bulk `write_deltalake` appends (2M rows per append, sorted
by bucket and path) and cached under `.bench/scale/` across runs; each run works on a copy
that hard-links the template's data files (Delta never rewrites a data file) and copies its log.
"""

from __future__ import annotations

import os
import resource
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from benchmarks._context import Context
from benchmarks._data import BASE_URL, T0, created_events, existing_path
from benchmarks._floor import cow_floor, folder_batch, grow_by_apply, removed_files
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.apply import raw_merge, raw_rows
from connectors.events import FileEvent
from directory_table import DEFAULT_BUCKETS, DirectoryTable
from directory_table.layout import bucket_array
from directory_table.maintenance import files_per_bucket
from directory_table.schema import BUCKETED_SCHEMA, TABLE_SCHEMA, TS

NAME = "scale"
TITLE = "directory table writes, reads and upkeep at 10M rows"
CACHE = Path(".bench/scale")
#: bump when the template's content or layout changes
TEMPLATE_FORMAT = 2  # 2: merge-on-read tables (deletion vectors, DESIGN §4.8)
APPEND_ROWS = 2_000_000


@dataclass(frozen=True)
class Sizes:
    large: int
    small: int
    big_batch: int
    read_changes: int
    commits: int
    repeats: int
    grown_chunk: int


FULL = Sizes(large=10_000_000, small=10_000, big_batch=10_000, read_changes=1_000,
             commits=5_000, repeats=7, grown_chunk=250_000)
QUICK = Sizes(large=200_000, small=10_000, big_batch=2_000, read_changes=1_000, commits=200,
              repeats=3, grown_chunk=50_000)


# ---------------------------------------------------------------- templates
def template_rows(start: int, stop: int, buckets: int | None) -> pa.Table:
    """Rows `start..stop` of a template, as `fill_table`'s CREATED events store them."""
    paths = [existing_path(i) for i in range(start, stop)]
    n = stop - start
    table = pa.table({
        "relative_path": pa.array(paths, pa.string()),
        "url": pa.array([BASE_URL + p for p in paths], pa.string()),
        "size": pa.array([100 + i % 97 for i in range(start, stop)], pa.int64()),
        "last_modified_time": pa.array([T0] * n, TS),
        "etag": pa.array([f"e{i:x}-100" for i in range(start, stop)], pa.string()),
        "_sequencer": pa.nulls(n, pa.string()),
        "_event_time": pa.array([T0] * n, TS),
        "_image_version": pa.array([1] * n, pa.int64()),
        "_image_timestamp": pa.array([T0] * n, TS),
    }).cast(TABLE_SCHEMA)
    if buckets is None:
        return table
    table = table.append_column("_bucket", bucket_array(paths, buckets)).cast(BUCKETED_SCHEMA)
    return table.sort_by([("_bucket", "ascending"), ("relative_path", "ascending")])


def build_template(root: Path, rows: int, buckets: int | None) -> None:
    """A directory table root with `rows` template rows (`buckets=None`: unpartitioned, the
    pre-bucket layout), written in bulk appends."""
    tmp = root.with_name(root.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    table = DirectoryTable.create(str(tmp), BASE_URL, buckets=buckets or 1)
    if buckets is None:  # the pre-bucket layout: a plain, unpartitioned directory table
        shutil.rmtree(table.path)
        DeltaTable.create(table.path, schema=TABLE_SCHEMA, name="directory",
                          configuration={"delta.enableChangeDataFeed": "true"})
    for start in range(0, rows, APPEND_ROWS):
        write_deltalake(table.path, template_rows(start, min(rows, start + APPEND_ROWS), buckets),
                        mode="append")
    tmp.rename(root)


def template(ctx: Context, rows: int, buckets: int | None) -> Path:
    """The cached template of `rows` rows (built once, kept in `.bench/scale/`)."""
    layout = f"b{buckets}" if buckets else "flat"
    root = CACHE / f"v{TEMPLATE_FORMAT}-{rows}-{layout}"
    if not (root / "directory" / "_delta_log").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        seconds, _ = timed(lambda: build_template(root, rows, buckets))
        ctx.report.say(f"built template {root.name} in {seconds:.1f} s (cached for later runs)")
    return root


def link_copy(template_root: Path, root: Path) -> DirectoryTable:
    """A working copy of a template: data files hard-linked, logs copied."""

    def copy(src: str, dst: str) -> str:
        if "_delta_log" in Path(src).parts:
            return shutil.copy2(src, dst)
        try:
            os.link(src, dst)
            return dst
        except OSError:
            return shutil.copy2(src, dst)

    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(template_root, root, copy_function=copy)
    return DirectoryTable(str(root), BASE_URL)


# ---------------------------------------------------------------- batches
def mix(rows: int, size: int, round_: int) -> list[FileEvent]:
    """`size` events: half new paths, half overwrites spread evenly over `rows` rows; each
    `round_` picks other paths."""
    when = T0 + timedelta(hours=1 + round_)
    half = size // 2
    step = max(1, rows // half)
    offset = (round_ * 7919) % step
    new = created_events(range(round_ * half, (round_ + 1) * half), when=when,
                         prefix=f"new{round_}")
    return new + created_events(range(offset, offset + half * step, step), when=when,
                                size=7 + round_)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


# ---------------------------------------------------------------- figures
def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    report = ctx.report
    buckets = DEFAULT_BUCKETS
    report.note("buckets", buckets, f"{buckets} buckets (the default of a new table)")
    seconds, (large_t, small_t) = timed(lambda: (template(ctx, sizes.large, buckets),
                                                 template(ctx, sizes.small, buckets)))
    report.note("templates_s", seconds, f"templates ready in {seconds:.1f} s; peak RSS "
                f"{peak_rss_gib():.2f} GiB")
    large = link_copy(large_t, ctx.path("large"))
    small = link_copy(small_t, ctx.path("small"))
    big, little = count_label(sizes.large), count_label(sizes.small)

    runs = batch10_runs({"large": (large, sizes.large), "small": (small, sizes.small)},
                        sizes.repeats)
    ratio_target = 2.0
    lg, sm = median(runs["large"]), median(runs["small"])
    report.add(Figure(
        name="scale.batch10", description=f"10 events (5 new + 5 overwrites) into {big} rows",
        value=lg, unit="s", baseline=sm, baseline_label=f"same into {little} rows",
        target=f"<= {ratio_target:g}x the {little} case", passed=lg <= ratio_target * sm,
        details={"large_runs_s": runs["large"], "small_runs_s": runs["small"]}))

    run_grown(ctx, sizes)
    run_spread(ctx, sizes, large)
    run_local(ctx, sizes, large)

    # change reads: one commit of 1k new paths in each table
    reads = {}
    for key, table in (("large", large), ("small", small)):
        table.apply(created_events(range(sizes.read_changes), when=T0 + timedelta(days=1),
                                   prefix="read"))
        v = table.version()
        table.changes(v - 1, v)
        reads[key] = median([timed(lambda t=table, v=v: t.changes(v - 1, v))[0]
                             for _ in range(sizes.repeats)])
    report.add(Figure(
        name="scale.read1k",
        description=f"changes() of {count_label(sizes.read_changes)} new paths from {big} rows",
        value=reads["large"], unit="s", baseline=reads["small"],
        baseline_label=f"same from {little} rows", target="<= 2x the small case",
        passed=reads["large"] <= 2 * reads["small"]))

    run_optimize(ctx, sizes, small_t, buckets)
    report.note("peak_rss_gib", peak_rss_gib(), f"peak RSS of this run {peak_rss_gib():.2f} GiB")


def batch10_runs(tables: dict[str, tuple[DirectoryTable, int]], repeats: int,
                 ) -> dict[str, list[float]]:
    """10-event batches into each table, alternating, different paths each round."""
    runs: dict[str, list[float]] = {key: [] for key in tables}
    for r in range(repeats + 1):
        for key, (table, rows) in tables.items():
            seconds, result = timed(lambda t=table, n=rows, i=r: t.apply(mix(n, 10, i)))
            assert result.updated == 5 and result.inserted == 5, result
            if r:                                       # round 0 warms up
                runs[key].append(seconds)
    return runs


def grown_template(ctx: Context, rows: int, chunk: int) -> Path:
    root = CACHE / f"v{TEMPLATE_FORMAT}-{rows}-grown{chunk}"
    if not (root / "directory" / "_delta_log").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        seconds, _ = timed(lambda: grow_by_apply(root, rows, chunk, BASE_URL))
        ctx.report.say(f"grew template {root.name} by apply in {seconds:.1f} s (cached)")
    return root


def run_grown(ctx: Context, sizes: Sizes) -> None:
    """`scale.batch10` on tables grown by `apply` in chunks."""
    large = link_copy(grown_template(ctx, sizes.large, sizes.grown_chunk), ctx.path("glarge"))
    small = link_copy(grown_template(ctx, sizes.small, sizes.grown_chunk), ctx.path("gsmall"))
    runs = batch10_runs({"large": (large, sizes.large), "small": (small, sizes.small)},
                        sizes.repeats)
    lg, sm = median(runs["large"]), median(runs["small"])
    ctx.report.add(Figure(
        name="scale.batch10.grown",
        description=f"10 events into {count_label(sizes.large)} rows grown by apply in "
                    f"{count_label(sizes.grown_chunk)}-event chunks",
        value=lg, unit="s", baseline=sm,
        baseline_label=f"same into {count_label(sizes.small)} rows grown by apply",
        target="<= 2x the small case", passed=lg <= 2 * sm,
        details={"large_runs_s": runs["large"], "small_runs_s": runs["small"],
                 "files_large": len(large.delta().file_uris()),
                 "files_small": len(small.delta().file_uris())}))


def run_spread(ctx: Context, sizes: Sizes, large: DirectoryTable) -> None:
    """`scale.batch10k`: a spread batch against its copy-on-write floor (and a raw merge)."""
    report, big = ctx.report, count_label(sizes.large)
    files_before = len(large.delta().file_uris())
    events = mix(sizes.large, sizes.big_batch, 100)
    ours_s, result = timed(lambda: large.apply(events))
    removed = removed_files(large.path, result.version)
    floor_s, floor_rows = cow_floor(large.path, removed, ctx.path("floor"))
    report.add(Figure(
        name="scale.batch10k",
        description=f"{count_label(sizes.big_batch)} events (half new, half overwrites spread) "
                    f"into {big} rows: marks rows of {len(removed):,} of {files_before:,} "
                    f"files ({floor_rows:,} rows)",
        value=ours_s, unit="s", baseline=floor_s,
        baseline_label="copy-on-write floor: pyarrow read+write of the same files",
        target="<= 0.3x the floor", passed=ours_s <= 0.3 * floor_s,
        details={"ours_s": ours_s, "floor_s": floor_s, "files_rewritten": len(removed),
                 "files_before": files_before, "rows_rewritten": floor_rows,
                 "updated": result.updated, "inserted": result.inserted}))
    flat = link_copy(template(ctx, sizes.large, None), ctx.path("flat"))
    rows = raw_rows(events, flat.version() + 1)
    raw_s, _ = timed(lambda: raw_merge(flat.path, rows))
    report.add(Figure(
        name="scale.batch10k.rate",
        description=f"{count_label(sizes.big_batch)} spread events into {big} rows, as a rate",
        value=len(events) / ours_s, unit="events/s", baseline=len(events) / raw_s,
        baseline_label=f"raw delta-rs merge into unpartitioned {big}",
        target="none (information)", passed=None, details={"ours_s": ours_s, "raw_s": raw_s}))


def run_local(ctx: Context, sizes: Sizes, large: DirectoryTable) -> None:
    """`scale.local10k`: whole folders overwritten and new folders, into the large table."""
    files_before = len(large.delta().file_uris())
    runs, rewritten = [], []
    for r in range(3):
        events = folder_batch(sizes.large, sizes.big_batch, r)
        seconds, result = timed(lambda e=events: large.apply(e))
        assert result.updated + result.inserted == len(events), result
        runs.append(len(events) / seconds)
        rewritten.append(len(removed_files(large.path, result.version)))
    rate = median(runs)
    ctx.report.add(Figure(
        name="scale.local10k",
        description=f"{count_label(sizes.big_batch)} events over 10 folders (5 overwritten "
                    f"whole, 5 new) into {count_label(sizes.large)} rows: rewrites "
                    f"{max(rewritten)} of {files_before:,} files",
        value=rate, unit="events/s", baseline=20_000.0, baseline_label="target 20k events/s",
        target=">= 20,000 events/s", passed=rate >= 20_000,
        details={"rates": runs, "files_rewritten": rewritten, "files_before": files_before}))


def run_optimize(ctx: Context, sizes: Sizes, small_t: Path, buckets: int) -> None:
    report = ctx.report
    table = link_copy(small_t, ctx.path("churn"))
    seconds, _ = timed(lambda: [table.apply([e]) for e in
                                created_events(range(sizes.commits), when=T0 + timedelta(days=2),
                                               prefix="one")])
    report.say(f"{sizes.commits:,} one-event commits in {seconds:.1f} s")
    before = max(files_per_bucket(table.delta()).values())
    opt_s, result = timed(lambda: table.optimize())
    per_bucket = max(files_per_bucket(table.delta()).values())
    # a fresh copy of the same rows, written at once and compacted
    fresh = DirectoryTable.create(str(ctx.path("fresh")), BASE_URL, buckets=buckets)
    rows = table.snapshot(columns=BUCKETED_SCHEMA.names)
    write_deltalake(fresh.path, rows.sort_by([("_bucket", "ascending"),
                                              ("relative_path", "ascending")]), mode="append")
    fresh.optimize()

    # alternating, so both see the same background load
    loads: dict[str, list[float]] = {table.path: [], fresh.path: []}
    for _ in range(sizes.repeats * 3):
        for path, runs in loads.items():
            runs.append(timed(lambda p=path: DeltaTable(p))[0])
    ours, base = median(loads[table.path]), median(loads[fresh.path])
    report.add(Figure(
        name="scale.optimize",
        description=f"load time after {count_label(sizes.commits)} one-event commits + "
                    f"optimize() (files per bucket {before} -> {per_bucket}, optimize "
                    f"{opt_s:.1f} s)",
        value=ours, unit="s", baseline=base, baseline_label="freshly compacted copy",
        target="<= 2x, and <= 8 files per bucket",
        passed=ours <= 2 * base and per_bucket <= 8,
        details={"files_per_bucket_before": before, "files_per_bucket_after": per_bucket,
                 "optimize_s": opt_s, "optimize": result.__dict__}))
