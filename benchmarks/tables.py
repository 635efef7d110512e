"""tables: Table Streams and DML on warehouse tables (issue 14).

1. STANDARD read: a table of `large` rows (10M full, built in 20 appends of 500k rows so the
   table has 20 files sorted by id) and one of `small` rows (10k), each with change tracking on
   and a STANDARD stream at its latest version; then 1k rows change in three commits (400
   inserted, 400 updated, 200 deleted, the updated and deleted rows clustered so delta-rs
   rewrites one file). Timed, median of N alternating runs after a warm-up: the stream's records
   (`records_between`, what `read_stream_arrow` returns). Target: large <= 2x small (the read
   costs O(changes), not O(rows)).
2. UPDATE of 1k rows (`age = age + 1 WHERE id in a 1k range`) in the large table through
   `TableStore.update` (sqlglot translation, row-version stamping, exact-version commit) vs raw
   `DeltaTable.update` with the same predicate on an identical copy, alternating. Target:
   ratio <= 1.5x.

Set `VS_BENCH_TABLES_LARGE=1000000` to build a 1M-row table instead when 10M is too slow to
build here; the figure's description says which size was measured.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from benchmarks._context import Context
from benchmarks._report import Figure, count_label, median, timed
from volume_stream.tables import Column, TableStore, new_spec, records_between

NAME = "tables"
TITLE = "Table Streams on warehouse tables: STANDARD read scaling, UPDATE vs raw delta-rs"
MAX_SCALING = 2.0
MAX_UPDATE_RATIO = 1.5


@dataclass(frozen=True)
class Sizes:
    small: int
    large: int
    chunk: int
    changes: int
    repeats: int


FULL = Sizes(small=10_000, large=int(os.environ.get("VS_BENCH_TABLES_LARGE", 10_000_000)),
             chunk=500_000, changes=1_000, repeats=9)
QUICK = Sizes(small=1_000, large=20_000, chunk=10_000, changes=100, repeats=3)


def _rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "name": pa.array(np.char.add("n", ids.astype(str))),
                     "age": (ids % 90).astype(np.int32)})


def build(store: TableStore, name: str, rows: int, chunk: int) -> None:
    store.create(name, [Column("id", "BIGINT"), Column("name", "STRING"), Column("age", "INT")])
    for start in range(0, rows, chunk):
        store.insert(name, _rows(start, min(chunk, rows - start)))
    store.set_properties(name, {"change_tracking": "true"})


def change(store: TableStore, name: str, rows: int, changes: int) -> int:
    """400/400/200 per 1k: inserts, updates, deletes; returns the records expected."""
    new, upd = changes * 2 // 5, changes * 2 // 5
    gone = changes - new - upd
    base = rows // 2
    store.insert(name, _rows(rows + 1, new))
    store.update(name, {"age": "age + 1"}, f"id >= {base} AND id < {base + upd}")
    store.delete(name, f"id >= {base + upd} AND id < {base + upd + gone}")
    return new + 2 * upd + gone


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    store = TableStore(ctx.path("tables-warehouse", "tables"))
    specs = {}
    for rows in (sizes.small, sizes.large):
        name = f"t_{rows}"
        seconds, _ = timed(lambda n=name, r=rows: build(store, n, r, sizes.chunk))
        ctx.report.say(f"{count_label(rows)}-row table built in {seconds:.1f} s (not measured)")
        if rows == sizes.large:
            shutil.copytree(store.path(name), store.path("raw_copy"))
        spec = new_spec(store, f"s_{rows}", name)
        expected = change(store, name, rows, sizes.changes)
        got = records_between(store, spec, spec["offset"], store.version(name)).num_rows
        if got != expected:
            raise AssertionError(f"stream on {name} shows {got} records, expected {expected}")
        specs[rows] = (name, spec)
    runs: dict[int, list[float]] = {sizes.small: [], sizes.large: []}
    for name, spec in specs.values():  # warm-up
        records_between(store, spec, spec["offset"], store.version(name))
    for _ in range(sizes.repeats):
        for rows, (name, spec) in specs.items():
            runs[rows].append(timed(lambda n=name, s=spec: records_between(
                store, s, s["offset"], store.version(n)))[0])
    small, large = median(runs[sizes.small]), median(runs[sizes.large])
    lg, sm = count_label(sizes.large), count_label(sizes.small)
    note = "" if sizes.large >= 10_000_000 or ctx.quick else \
        f" (built at {lg}, not 10M: VS_BENCH_TABLES_LARGE)"
    ctx.report.add(Figure(
        name=f"tables.standard_read.{lg}",
        description=f"STANDARD stream read of {count_label(sizes.changes)} changed rows from a "
                    f"{lg}-row table{note}",
        value=large, unit="s", baseline=small, baseline_label=f"same read at {sm}",
        target=f"ratio <= {MAX_SCALING:g}x", passed=large / small <= MAX_SCALING,
        details={"runs_large_s": runs[sizes.large], "runs_small_s": runs[sizes.small]}))
    _update_figure(ctx, store, specs[sizes.large][0], sizes)


def _update_figure(ctx: Context, store: TableStore, name: str, sizes: Sizes) -> None:
    ours, raw = [], []
    n = sizes.changes
    for i in range(sizes.repeats + 1):
        lo = (i * 7919 * n) % max(sizes.large - n, 1)
        where = f"id >= {lo} AND id < {lo + n}"
        t_ours, (_, count) = timed(lambda w=where: store.update(name, {"age": "age + 1"}, w))
        t_raw, metrics = timed(lambda w=where: DeltaTable(store.path("raw_copy")).update(
            updates={'"age"': '"age" + 1'}, predicate=w.replace("id", '"id"')))
        if count != metrics["num_updated_rows"]:
            raise AssertionError(f"ours updated {count} rows, raw {metrics['num_updated_rows']}")
        if i:  # the first pair is a warm-up
            ours.append(t_ours)
            raw.append(t_raw)
    value, baseline = median(ours), median(raw)
    lg = count_label(sizes.large)
    ctx.report.add(Figure(
        name=f"tables.update.{lg}",
        description=f"UPDATE of {count_label(n)} rows in a {lg}-row table (TableStore.update)",
        value=value, unit="s", baseline=baseline,
        baseline_label="raw DeltaTable.update, same predicate, identical copy",
        target=f"ratio <= {MAX_UPDATE_RATIO:g}x", passed=value / baseline <= MAX_UPDATE_RATIO,
        details={"ours_s": ours, "raw_s": raw}))
