"""interop: volume-stream against Delta Lake's own Spark connector on the same tables (issue 23).

Lines (full sizes; `--quick` uses a 200k-row table and fewer repeats):
- `interop.cdf_read`: 1k changes (40% new files, 40% overwrites, 20% deletes over 4 commits)
  in a 10M-row directory table, read by our `read_stream(...).collect()` against Delta Spark's
  `readChangeFeed` of the same versions `.collect()`ed; target ours <= 1x. Median of several
  runs after warm-ups, the two alternating.
- `interop.merge10`: a 10-event batch (5 new + 5 overwrites spread over the table) committed
  by `DirectoryTable.apply` into the 10M-row table, against the same 10 rows applied by a
  Spark Delta `MERGE` (on `_bucket` and `relative_path`, so Spark prunes to the touched
  buckets) into a copy of the same table (the "Spark-maintained" way); target ours <= 0.2x.
  Each round different paths; the MERGE's source is a cached 10-row view, not timed.

The tables are the `scale` benchmark's templates (cached under `.bench/scale/`), worked on as
hard-linked copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import volume_stream as vs
from benchmarks._context import Context
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.apply import raw_rows
from benchmarks.scale import link_copy, mix, template
from benchmarks.stream_read import apply_changes
from directory_table import DEFAULT_BUCKETS
from directory_table.layout import Layout

NAME = "interop"
TITLE = "volume-stream against Delta Lake's Spark connector: change reads and 10-row commits"
MAX_READ_RATIO = 1.0
MAX_MERGE_RATIO = 0.2


@dataclass(frozen=True)
class Sizes:
    rows: int
    changes: int
    commits: int
    repeats: int


FULL = Sizes(rows=10_000_000, changes=1_000, commits=4, repeats=5)
QUICK = Sizes(rows=200_000, changes=1_000, commits=4, repeats=3)


def _collect_ours(cat: vs.Catalog, stream: str) -> int:
    return len(cat.read_stream(stream).collect())


def _collect_spark(spark, path: str, after: int, up_to: int) -> int:
    return len(spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", after + 1).option("endingVersion", up_to)
               .load(path).collect())


def run_cdf_read(ctx: Context, sizes: Sizes, root: Path) -> None:
    spark = ctx.spark
    cat = vs.connect(ctx.path("interop-warehouse"), spark=spark)
    location = ctx.data_path("interop-volume")
    location.mkdir(parents=True, exist_ok=True)
    cat.create_volume("big", location)
    table = cat.directory_table("big")
    link_copy(root, Path(table.root))
    table = cat.directory_table("big")
    start = table.version()
    cat.create_stream("s", on_volume="big")
    expected = apply_changes(table, sizes.rows, sizes.changes, sizes.commits)
    end = table.version()
    path = cat.table_path(volume="big")
    spark_rows = _collect_spark(spark, path, start, end)
    ours_rows = _collect_ours(cat, "s")
    if ours_rows != expected:
        raise AssertionError(f"read_stream shows {ours_rows} records, expected {expected}")
    ours, theirs = [], []
    for r in range(sizes.repeats + 2):                 # two warm-up rounds
        o, _ = timed(lambda: _collect_ours(cat, "s"))
        t, _ = timed(lambda: _collect_spark(spark, path, start, end))
        if r >= 2:
            ours.append(o)
            theirs.append(t)
    value, baseline = median(ours), median(theirs)
    ctx.report.add(Figure(
        name="interop.cdf_read",
        description=f"read_stream().collect(): {count_label(sizes.changes)} changes "
                    f"({ours_rows} records) from {count_label(sizes.rows)} rows",
        value=value, unit="s", baseline=baseline,
        baseline_label=f"Delta Spark readChangeFeed().collect() of the same versions "
                       f"({spark_rows} CDF rows)",
        target=f"<= {MAX_READ_RATIO:g}x", passed=value <= MAX_READ_RATIO * baseline,
        details={"ours_runs_s": ours, "spark_runs_s": theirs, "records": ours_rows,
                 "cdf_rows": spark_rows}))


def run_merge10(ctx: Context, sizes: Sizes, root: Path) -> None:
    spark = ctx.spark
    ours_t = link_copy(root, ctx.path("interop-ours"))
    spark_t = link_copy(root, ctx.path("interop-spark"))
    layout = Layout(buckets=DEFAULT_BUCKETS, bucketed=True)
    ours, theirs = [], []
    for r in range(sizes.repeats + 1):                 # round 0 warms up
        events = mix(sizes.rows, 10, 1000 + r)
        o, result = timed(lambda e=events: ours_t.apply(e))
        assert result.inserted == 5 and result.updated == 5, result
        rows = raw_rows(events, spark_t.version() + 1, layout)
        spark.createDataFrame(rows).cache().createOrReplaceTempView("interop_src")
        spark.sql("SELECT count(*) FROM interop_src").collect()
        t, _ = timed(lambda: spark.sql(
            f"MERGE INTO delta.`{spark_t.path}` t USING interop_src s "
            f"ON t._bucket = s._bucket AND t.relative_path = s.relative_path "
            f"WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").collect())
        spark.catalog.dropTempView("interop_src")
        if r:
            ours.append(o)
            theirs.append(t)
    value, baseline = median(ours), median(theirs)
    ctx.report.add(Figure(
        name="interop.merge10",
        description=f"10 events (5 new + 5 overwrites) committed into {count_label(sizes.rows)}"
                    f" rows",
        value=value, unit="s", baseline=baseline,
        baseline_label="the same 10 rows by a Spark Delta MERGE into a copy",
        target=f"<= {MAX_MERGE_RATIO:g}x", passed=value <= MAX_MERGE_RATIO * baseline,
        details={"ours_runs_s": ours, "spark_runs_s": theirs}))


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    seconds, root = timed(lambda: template(ctx, sizes.rows, DEFAULT_BUCKETS))
    ctx.report.say(f"{count_label(sizes.rows)}-row template ready in {seconds:.1f} s")
    run_cdf_read(ctx, sizes, root)
    run_merge10(ctx, sizes, root)

