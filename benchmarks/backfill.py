"""backfill: `refresh` of a 1M-file local tree against a raw `os.scandir` walk of it (issue 12).

The tree (1,000 folders of 1,000 empty files; `--quick`: 100 of 200) is built once under
`.bench/backfill/` and kept across runs (1M empty files take minutes and 1M inodes: the size
is cut to what the file system's free inodes allow, and the line says so). Lines:

- `backfill.refresh`: a refresh of the volume once its directory table is up to date (what
  every healing refresh and a listing poller pay), against the baseline: a plain serial
  `os.scandir` walk of the same tree that stats every file (the least a listing must do).
  Target <= 1.5x. Median of 3, alternating.
- `backfill.first`: the first refresh (backfill) of the tree into an empty directory table,
  against the same walk (information).

    python -m benchmarks --only backfill [--quick]
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from benchmarks._context import Context
from benchmarks._report import Figure, count_label, median, timed

NAME = "backfill"
TITLE = "refresh of a 1M-file local tree vs a raw os.scandir walk"
CACHE = Path(".bench/backfill")
FULL = (1000, 1000)   # folders, files per folder
QUICK = (100, 200)
TARGET = 1.5
REPEATS = 3


def build_tree(folders: int, per_folder: int) -> tuple[Path, str]:
    """The cached tree (built once); its size may be cut to the free inodes."""
    note = ""
    free = os.statvfs(CACHE.parent if CACHE.parent.exists() else ".").f_favail
    want = folders * (per_folder + 1)
    if free < 2 * want:
        per_folder = max(1, free // (2 * folders) - 1)
        note = f" (cut to {folders * per_folder:,} files: {free:,} free inodes)"
    root = CACHE / f"tree-{folders}x{per_folder}"
    done = CACHE / f"{root.name}.complete"  # outside the tree: not one of its files
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        for d in range(folders):
            folder = root / f"d{d:04d}"
            folder.mkdir(parents=True)
            base = os.fspath(folder)
            for i in range(per_folder):
                os.close(os.open(f"{base}/f{i:05d}.bin", os.O_CREAT | os.O_WRONLY, 0o644))
        done.touch()
    return root, note


def raw_walk(root: Path) -> int:
    """Serial `os.scandir` walk, stat of every file: the baseline."""
    count = 0
    stack = [os.fspath(root)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    entry.stat(follow_symlinks=False)
                    count += 1
    return count


def run(ctx: Context) -> None:
    import volume_stream as vs

    folders, per_folder = QUICK if ctx.quick else FULL
    seconds, (root, note) = timed(lambda: build_tree(folders, per_folder))
    files = raw_walk(root)
    ctx.report.note("tree", files, f"tree of {files:,} files ready in {seconds:.1f} s{note}")
    cat = vs.connect(ctx.path("backfill-wh"))
    cat.create_volume("vol", root)
    walk_s = median([timed(lambda: raw_walk(root))[0] for _ in range(REPEATS)])
    first_s, first = timed(lambda: cat.refresh("vol"))
    assert first.inserted == files, first
    label = count_label(files)
    ctx.report.add(Figure(
        name="backfill.first", description=f"first refresh (backfill) of a {label}-file tree{note}",
        value=first_s, unit="s", baseline=walk_s, baseline_label="raw os.scandir walk",
        target="none (information)", passed=None,
        details={"inserted": first.inserted, "version": first.version}))
    runs: dict[str, list[float]] = {"refresh": [], "walk": []}
    for _ in range(REPEATS):
        t, m = timed(lambda: cat.refresh("vol"))
        assert m.version is None and m.listed == files, m
        runs["refresh"].append(t)
        runs["walk"].append(timed(lambda: raw_walk(root))[0])
    ours, base = median(runs["refresh"]), median(runs["walk"])
    ctx.report.add(Figure(
        name="backfill.refresh",
        description=f"refresh of an up-to-date {label}-file local volume{note}",
        value=ours, unit="s", baseline=base, baseline_label="raw os.scandir walk",
        target=f"<= {TARGET:g}x", passed=ours <= TARGET * base,
        details={"runs_s": runs, "started": time.time()}))
