"""filesize: which data file size suits which table size (issue 26, item 3).

For each table size (`--quick`: 10k and 200k rows; full: 10k, 1M and 10M) and each file size
(rows per data file: 2k, the default `delta.targetFileSize` of 128 KiB; 8k; 32k) a template
with 16 buckets is bulk-written and three kinds of batch are timed on a copy:

- `batch10`: 10 events (5 new paths, 5 overwrites spread over the table), median of a few;
- `local`: 2k (full: 10k) events over 10 folders (5 overwritten whole, 5 new);
- `spread`: 2k (full: 10k) events, half overwrites spread over the whole table, half new,
  next to its copy-on-write floor (plain pyarrow reading and writing the same files).

Every figure is INFO: seconds per batch at that file size, against the same batch at the
default size (2k rows) in the same run. `docs/DESIGN.md` §4.7 records what the figures led to.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable, write_deltalake

from benchmarks._context import Context
from benchmarks._data import BASE_URL
from benchmarks._floor import cow_floor, folder_batch, removed_files
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.scale import APPEND_ROWS, CACHE, TEMPLATE_FORMAT, link_copy, mix, template_rows
from directory_table import DEFAULT_BUCKETS, DirectoryTable
from directory_table.commitfile import ROW_BYTES

NAME = "filesize"
TITLE = "data file size against table size: 10-event, local and spread batches"

ROWS_PER_FILE = (2_048, 8_192, 32_768)


@dataclass(frozen=True)
class Sizes:
    tables: tuple[int, ...]
    batch: int
    repeats: int


FULL = Sizes(tables=(10_000, 1_000_000, 10_000_000), batch=10_000, repeats=5)
QUICK = Sizes(tables=(10_000, 200_000), batch=2_000, repeats=3)


def sized_template(ctx: Context, rows: int, rows_per_file: int) -> Path:
    """A bulk-written template of `rows` rows whose files hold about `rows_per_file` rows."""
    root = CACHE / f"v{TEMPLATE_FORMAT}-{rows}-b{DEFAULT_BUCKETS}-r{rows_per_file}"
    if (root / "directory" / "_delta_log").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = root.with_name(root.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)

    def build() -> None:
        table = DirectoryTable.create(str(tmp), BASE_URL, buckets=DEFAULT_BUCKETS,
                                      target_file_size=rows_per_file * ROW_BYTES)
        for start in range(0, rows, APPEND_ROWS):
            write_deltalake(table.path, template_rows(start, min(rows, start + APPEND_ROWS),
                                                      DEFAULT_BUCKETS), mode="append",
                            target_file_size=rows_per_file * ROW_BYTES)
        tmp.rename(root)

    seconds, _ = timed(build)
    files = len(DeltaTable(str(root / "directory")).file_uris())
    ctx.report.say(f"built {root.name} in {seconds:.1f} s: {files:,} files")
    return root


def measure(ctx: Context, rows: int, rows_per_file: int, sizes: Sizes) -> dict[str, float]:
    table = link_copy(sized_template(ctx, rows, rows_per_file),
                      ctx.path(f"fs-{rows}-{rows_per_file}"))
    files = len(table.delta().file_uris())
    runs = []
    for r in range(sizes.repeats + 1):
        seconds, _ = timed(lambda i=r: table.apply(mix(rows, 10, i)))
        if r:
            runs.append(seconds)
    local_s, result = timed(lambda: table.apply(folder_batch(rows, min(sizes.batch, rows // 2),
                                                             1)))
    local_files = len(removed_files(table.path, result.version))
    spread_s, result = timed(lambda: table.apply(mix(rows, sizes.batch, 200)))
    removed = removed_files(table.path, result.version)
    floor_s, _ = cow_floor(table.path, removed, ctx.path(f"fs-floor-{rows}-{rows_per_file}"))
    return {"files": files, "batch10": median(runs), "local": local_s,
            "local_files": local_files, "spread": spread_s, "spread_files": len(removed),
            "floor": floor_s}


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    report = ctx.report
    for rows in sizes.tables:
        results = {rpf: measure(ctx, rows, rpf, sizes) for rpf in ROWS_PER_FILE}
        base = results[ROWS_PER_FILE[0]]
        for rpf, res in results.items():
            report.say(f"{count_label(rows)} rows, {rpf:,} rows/file ({res['files']:,} files): "
                       f"batch10 {res['batch10'] * 1e3:.0f} ms, local "
                       f"{res['local']:.2f} s ({res['local_files']} files), spread "
                       f"{res['spread']:.2f} s ({res['spread_files']} files; floor "
                       f"{res['floor']:.2f} s)")
            for kind in ("batch10", "local", "spread"):
                report.add(Figure(
                    name=f"filesize.{count_label(rows)}.{kind}.r{rpf}",
                    description=f"{kind} batch into {count_label(rows)} rows, files of "
                                f"{rpf:,} rows",
                    value=res[kind], unit="s", baseline=base[kind],
                    baseline_label=f"same with {ROWS_PER_FILE[0]:,}-row files",
                    target="none (information)", passed=None, details=res))
