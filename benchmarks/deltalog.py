"""deltalog: our own log replay and checkpoint writer (DESIGN §4.8) against delta-rs's.

A directory table's log is written by hand (no data files are needed to read a log): 5,000
files in 16 buckets with path statistics, checkpointed by delta-rs at version 0, then 100
commits each replacing 20 files (a remove and an add per file, as a batch does). Timed, median
of N alternating runs after a warm-up:

1. `deltalog.replay` of the newest version against delta-rs's `DeltaTable(...)` +
   `get_add_actions()` (what the write path used before; delta-rs cannot show deletion vectors).
   Target: ratio <= 3x.
2. `checkpoint.write_checkpoint` of the newest version against delta-rs's `create_checkpoint`
   on an identical copy (delta-rs refuses tables with deletion vectors). Target: ratio <= 3x.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from dataclasses import dataclass

from deltalake import DeltaTable

from benchmarks._context import Context
from benchmarks._report import Figure, count_label, median, timed
from directory_table import checkpoint, deltalog

NAME = "deltalog"
TITLE = "Log replay and checkpoints of our own vs delta-rs's"
MAX_RATIO = 3.0
BUCKETS = 16


@dataclass(frozen=True)
class Sizes:
    files: int
    commits: int
    per_commit: int
    repeats: int


FULL = Sizes(files=5_000, commits=100, per_commit=20, repeats=9)
QUICK = Sizes(files=200, commits=10, per_commit=5, repeats=3)

_SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": n, "type": t, "nullable": True, "metadata": {}}
    for n, t in (("relative_path", "string"), ("size", "long"), ("_bucket", "integer"))]})


def _add(path: str, bucket: int, n: int) -> dict:
    low, high = f"dir{n:07d}/a", f"dir{n:07d}/z"
    stats = {"numRecords": 2000, "minValues": {"relative_path": low},
             "maxValues": {"relative_path": high}, "nullCount": {"relative_path": 0}}
    return {"add": {"path": path, "partitionValues": {"_bucket": str(bucket)}, "size": 130_000,
                    "modificationTime": 1_700_000_000_000, "dataChange": True,
                    "stats": json.dumps(stats)}}


def build(root: str, sizes: Sizes) -> None:
    """The log of a `sizes.files`-file table, its delta-rs checkpoint at 0, then the commits."""
    os.makedirs(f"{root}/_delta_log")
    rnd = random.Random(7)
    live = {f"_bucket={i % BUCKETS}/part-{uuid.UUID(int=rnd.getrandbits(128))}.parquet":
            i % BUCKETS for i in range(sizes.files)}
    first = [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
             {"metaData": {"id": "bench", "format": {"provider": "parquet", "options": {}},
                           "schemaString": _SCHEMA, "partitionColumns": ["_bucket"],
                           "configuration": {}, "createdTime": 1}}]
    first += [_add(p, b, i) for i, (p, b) in enumerate(live.items())]
    _commit(root, 0, first)
    DeltaTable(root).create_checkpoint()
    for v in range(1, sizes.commits + 1):
        actions = []
        for path in rnd.sample(sorted(live), sizes.per_commit):
            bucket = live.pop(path)
            actions.append({"remove": {"path": path, "deletionTimestamp": 1_700_000_000_000,
                                       "dataChange": True}})
            new = f"_bucket={bucket}/part-{uuid.UUID(int=rnd.getrandbits(128))}.parquet"
            live[new] = bucket
            actions.append(_add(new, bucket, v * 1000 + len(actions)))
        _commit(root, v, actions)


def _commit(root: str, version: int, actions: list[dict]) -> None:
    with open(f"{root}/_delta_log/{version:020d}.json", "w") as f:
        f.write("".join(json.dumps(a) + "\n" for a in actions))


def _alternate(repeats: int, ours, theirs) -> tuple[list[float], list[float]]:
    ours(), theirs()  # warm-up
    a, b = [], []
    for _ in range(repeats):
        a.append(timed(ours)[0])
        b.append(timed(theirs)[0])
    return a, b


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    root = str(ctx.path("deltalog", "table"))
    build(root, sizes)
    state = deltalog.replay(root)
    theirs = len(DeltaTable(root).get_add_actions())
    if (state.version, state.files.num_rows) != (sizes.commits, theirs):
        raise AssertionError(f"replay: version {state.version} with {state.files.num_rows} "
                             f"files; delta-rs: {theirs} files")
    label = f"{count_label(sizes.files)} files, a checkpoint and {sizes.commits} commits"
    ours, raw = _alternate(sizes.repeats, lambda: deltalog.replay(root),
                           lambda: DeltaTable(root).get_add_actions())
    ctx.report.add(Figure(
        name="deltalog.replay", description=f"deltalog.replay of the newest version ({label})",
        value=median(ours), unit="s", baseline=median(raw),
        baseline_label="delta-rs DeltaTable() + get_add_actions()",
        target=f"ratio <= {MAX_RATIO:g}x", passed=median(ours) / median(raw) <= MAX_RATIO,
        details={"ours_s": ours, "delta_rs_s": raw}))
    copy = str(ctx.path("deltalog", "copy"))
    shutil.copytree(root, copy)
    ours, raw = _alternate(sizes.repeats, lambda: checkpoint.write_checkpoint(root),
                           lambda: DeltaTable(copy).create_checkpoint())
    ctx.report.add(Figure(
        name="deltalog.checkpoint",
        description=f"checkpoint.write_checkpoint of the newest version ({label})",
        value=median(ours), unit="s", baseline=median(raw),
        baseline_label="delta-rs create_checkpoint() on an identical copy",
        target=f"ratio <= {MAX_RATIO:g}x", passed=median(ours) / median(raw) <= MAX_RATIO,
        details={"ours_s": ours, "delta_rs_s": raw}))
