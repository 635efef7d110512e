"""keyindex: the key index of a directory table (`directory_table.keyindex`) at 10M rows.

Lines (full size: the `scale` benchmark's 10M-row, 16-bucket template, cached under
`.bench/scale/`; `--quick`: its 200k-row one):
- `keyindex.rebuild`: the index built from the table's data files (every file read with
  pyarrow through `live_batches`, bucket by bucket), rows/s, in a process of its own so its
  peak RSS is its own; against reading the same files alone. Target >= 1M rows/s.
- `keyindex.rebuild.cpu` (INFO): the same rate per CPU second of each process (the wall rate
  depends on the machine's load and its disk: the index writes ~90 bytes a row).
- `keyindex.rebuild.rss`: that process's peak RSS, against the read-only process's; target
  <= 1 GiB.
- `keyindex.lookup2k`: `lookup` of 2,000 existing paths spread over the table (median of
  several sets), against finding the same rows in the table's data files as the write path
  does without an index (`touched_files` + `read_matching`). Target < 0.3 s.
- `keyindex.apply2k`: `apply` of a 2,000-change commit (1,000 overwrites, 500 deletes, 500 new
  paths; median of several, no merge among them), against writing and fsyncing the same
  entries as one Arrow file (its floor). Target < 0.1 s.
- `keyindex.merge` (INFO): folding the largest partition's delta into a new base run.
- `keyindex.apply2k.sustained` (INFO): the mean 2,000-change apply once the delta is at its
  bound (`MAX_DELTA`), the merges it triggers included.
- `keyindex.reopen` (INFO): `KeyIndex.open` with a delta of `MAX_DELTA` entries (what a restart
  costs at worst), against `open` right after a merge of everything. (`--quick` uses a bound
  of 50k entries for these last two.)

    python -m benchmarks --only keyindex [--quick]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from benchmarks._context import Context
from benchmarks._data import existing_path
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.scale import template
from directory_table.keyindex import MAX_DELTA, KeyIndex, live_batches
from directory_table.keyindex_store import VALUE_COLUMNS
from directory_table.layout import Layout, read_matching, touched_files
from directory_table.schema import TS

NAME = "keyindex"
TITLE = "the key index: rebuild, lookup and apply at 10M rows"
BUCKETS = 16
GIB = 1024 ** 3
READ_COLUMNS = ["relative_path", *VALUE_COLUMNS]


def data_files(table_path: str) -> list[tuple[str, int]]:
    """(data file, bucket) of the table, bucket by bucket, each bucket's in order of their
    smallest path (what lets a build skip its sort)."""
    actions = pa.table(DeltaTable(table_path).get_add_actions(flatten=True))
    files = zip(actions["partition._bucket"].to_pylist(),
                actions["min.relative_path"].to_pylist(), actions["path"].to_pylist(),
                strict=True)
    return [(path, bucket) for bucket, _, path in sorted(files)]


def child(mode: str, table_path: str, folder: str) -> dict:
    """Run in a fresh process: build the index (`build`) or only read the files (`read`)."""
    root = Path(table_path)
    files = data_files(table_path)

    def read(path: str) -> pa.Table:
        # a ParquetFile read of a small file costs half the CPU of pq.read_table (no dataset)
        return pq.ParquetFile(root / path, pre_buffer=True).read(columns=READ_COLUMNS,
                                                                  use_threads=False)

    started = time.perf_counter()
    rows = 0
    if mode == "build":
        meta = DeltaTable(table_path)
        index = KeyIndex.build(folder, meta.metadata().id, BUCKETS, meta.version(),
                               live_batches([(f, b, None) for f, b in files], read),
                               grouped=True)
        rows = sum(index.stats()["rows"])
    else:
        with ThreadPoolExecutor(2) as pool:
            rows = sum(t.num_rows for t in pool.map(read, [f for f, _ in files]))
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds": seconds, "rows": rows, "rss": usage.ru_maxrss * 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def run_child(mode: str, table_path: Path, folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "benchmarks.keyindex", mode, str(table_path),
                          str(folder)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def disk_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def spread_paths(rows: int, k: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [existing_path(int(i)) for i in rng.choice(rows, k, replace=False)]


def commit(rows: int, round_: int, k: int = 2000) -> tuple[list[str], pa.Table]:
    """A commit of `k` changes: k/2 overwrites and k/4 deletes of spread existing paths,
    k/4 new paths; (removed paths, added rows)."""
    old = spread_paths(rows, k * 3 // 4, 1000 + round_)
    new = [f"new{round_}/n{i:06d}.bin" for i in range(k // 4)]
    written = old[: k // 2] + new
    n = len(written)
    when = pa.array([time.time_ns() // 1000] * n, pa.int64()).cast(TS)
    added = pa.table({
        "relative_path": written, "file": [f"_bucket=0/part-new-{round_}.parquet"] * n,
        "pos": np.arange(n, dtype=np.int64), "size": np.arange(n, dtype=np.int64),
        "last_modified_time": when, "etag": [f"n{round_}-{i}" for i in range(n)],
        "_sequencer": pa.nulls(n, pa.string()), "_event_time": when,
        "_image_version": pa.array([round_ + 2] * n, pa.int64()), "_image_timestamp": when})
    return old, added


def arrow_floor(folder: Path, added: pa.Table) -> float:
    """Seconds to write `added` as one Arrow file and fsync it."""
    path = folder / "floor.arrow"
    started = time.perf_counter()
    with pa.ipc.new_file(path, added.schema) as w:
        w.write_table(added)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def run(ctx: Context) -> None:
    from benchmarks.scale import FULL, QUICK

    report = ctx.report
    rows = (QUICK if ctx.quick else FULL).large
    seconds, root = timed(lambda: template(ctx, rows, BUCKETS))
    table_path = root / "directory"
    big = count_label(rows)
    report.say(f"template of {big} rows ready in {seconds:.1f} s")
    folder = ctx.path("index")

    read = run_child("read", table_path, folder)
    built = run_child("build", table_path, folder)
    rate, read_rate = built["rows"] / built["seconds"], read["rows"] / read["seconds"]
    report.add(Figure(
        name="keyindex.rebuild", description=f"index built from the {big}-row table's files",
        value=rate, unit="rows/s", baseline=read_rate, baseline_label="reading the files alone",
        target=">= 1M rows/s", passed=rate >= 1e6,
        details={"build": built, "read": read, "disk_bytes": disk_bytes(folder)}))
    report.add(Figure(
        name="keyindex.rebuild.cpu", description="the same per CPU second of its process "
        "(threads included; the wall rate depends on the load and the disk)",
        value=built["rows"] / built["cpu_s"], unit="rows/s", baseline=read["rows"] /
        read["cpu_s"], baseline_label="reading the files alone", target="(info)",
        passed=None))
    report.add(Figure(
        name="keyindex.rebuild.rss", description="peak RSS of the rebuilding process",
        value=built["rss"] / GIB, unit="GiB", baseline=read["rss"] / GIB,
        baseline_label="of the read-only process", target="<= 1 GiB",
        passed=built["rss"] <= GIB))
    report.note("disk_bytes", disk_bytes(folder),
                f"index on disk: {disk_bytes(folder) / 2**20:.0f} MiB for {big} rows")

    dt = DeltaTable(str(table_path))
    opened, index = timed(lambda: KeyIndex.open(folder, dt.metadata().id, BUCKETS))
    report.note("open_s", opened, f"opened in {opened * 1000:.0f} ms (no delta)")
    lookups, lookup_cpu = [], []
    for seed in range(7):
        paths = spread_paths(rows, 2000, seed)
        cpu = time.process_time()
        seconds, found = timed(lambda p=paths: index.lookup(p))
        lookup_cpu.append(time.process_time() - cpu)
        assert found.num_rows == 2000, found.num_rows
        lookups.append(seconds)
    layout = Layout.of(dt)
    paths = spread_paths(rows, 2000, 99)
    cols = ["relative_path", *VALUE_COLUMNS]
    base_s, base_found = timed(lambda: read_matching(
        dt, touched_files(dt, layout, paths), paths, cols))
    assert base_found.num_rows == 2000
    report.add(Figure(
        name="keyindex.lookup2k", description=f"lookup of 2,000 spread paths in {big} rows",
        value=median(lookups), unit="s", baseline=base_s,
        baseline_label="read from the touched data files", target="< 0.3 s",
        passed=median(lookups) < 0.3, details={"runs_s": lookups, "cpu_s": lookup_cpu}))

    applies, floors, apply_cpu = [], [], []
    version = index.version
    for round_ in range(5 if ctx.quick else 15):
        removed, added = commit(rows, round_)
        version += 1
        cpu = time.process_time()
        applies.append(timed(lambda r=removed, a=added, v=version: index.apply(v, r, a))[0])
        apply_cpu.append(time.process_time() - cpu)
        floors.append(arrow_floor(ctx.workdir, added))
    report.add(Figure(
        name="keyindex.apply2k", description="apply of a 2,000-change commit (no merge)",
        value=median(applies), unit="s", baseline=median(floors),
        baseline_label="its entries written to one fsynced Arrow file", target="< 0.1 s",
        passed=median(applies) < 0.1, details={"runs_s": applies, "cpu_s": apply_cpu}))

    delta = index.stats()["delta"]
    part = delta.index(max(delta))
    merge_s, _ = timed(lambda: index.merge(part))
    part_rows = index.stats()["rows"][part]
    report.add(Figure(
        name="keyindex.merge", description=f"merge of one partition ({count_label(part_rows)} "
        "rows) with its delta", value=merge_s, unit="s", baseline=median(applies),
        baseline_label="one apply", target="(info)", passed=None))

    # fill the delta to its bound in big commits, then time a restart
    filled = 0
    bound = 50_000 if ctx.quick else MAX_DELTA  # --quick: a smaller bound, same steps
    index.max_delta = bound
    while index.delta_size < bound * 0.95 and filled < 40:
        removed, added = commit(rows, 100 + filled, k=min(40_000, bound // 10))
        version += 1
        index.apply(version, removed, added)
        filled += 1
    # at the bound: every apply may merge a partition (the one with the most entries)
    sustained, merges = [], 0
    for round_ in range(200, 200 + (10 if ctx.quick else 30)):
        removed, added = commit(rows, round_)
        version += 1
        names = index.stats()["runs"]
        sustained.append(timed(lambda r=removed, a=added, v=version: index.apply(v, r, a))[0])
        merges += sum(a != b for a, b in zip(names, index.stats()["runs"], strict=True))
    report.add(Figure(
        name="keyindex.apply2k.sustained", description="2,000-change applies with the delta "
        f"at its bound ({count_label(bound)}), merges included ({merges} in "
        f"{len(sustained)})", value=sum(sustained) / len(sustained), unit="s",
        baseline=median(applies), baseline_label="an apply without merge", target="(info)",
        passed=None, details={"runs_s": sustained, "merges": merges}))
    delta = index.delta_size
    reopen_s, reopened = timed(lambda: KeyIndex.open(folder, dt.metadata().id, BUCKETS,
                                                     max_delta=bound))
    assert reopened.version == version
    clean_s, _ = timed(lambda: KeyIndex.open(folder, dt.metadata().id, BUCKETS,
                                             max_delta=10**9))
    for p in range(BUCKETS):
        reopened.merge(p)
    merged_s, _ = timed(lambda: KeyIndex.open(folder, dt.metadata().id, BUCKETS))
    report.add(Figure(
        name="keyindex.reopen", description=f"open with a delta of {count_label(delta)} "
        "entries", value=reopen_s, unit="s", baseline=merged_s,
        baseline_label="open with none", target="(info)", passed=None,
        details={"delta_entries": delta, "second_open_s": clean_s}))


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:4])))
