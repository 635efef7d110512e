"""Helpers of the `scale` benchmark: the copy-on-write floor of a commit, the events of local
batches, and templates grown by `DirectoryTable.apply` in chunks.

The **copy-on-write floor** of a commit is what rewriting exactly the data files it replaced
costs with plain pyarrow: read each removed file whole (`pq.read_table`) and write it again
(`pq.write_table`, snappy, as Delta's files are), one file after another, on a copy that still
has them (Delta never deletes a data file at commit). A writer cannot do less for the same
files; `scale.batch10k` compares a batch's own time with it.

    removed = removed_files(table.path, version)
    floor_s, rows = cow_floor(table.path, removed, scratch)
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq

from benchmarks._data import FILES_PER_FOLDER, T0, created_events
from connectors.events import FileEvent
from directory_table import DirectoryTable

__all__ = ["cow_floor", "folder_batch", "grow_by_apply", "removed_files"]


def removed_files(table_path: str, version: int) -> list[str]:
    """The data files (paths relative to the table) that commit `version` removed."""
    entry = Path(table_path) / "_delta_log" / f"{version:020d}.json"
    out = []
    for line in entry.read_text().splitlines():
        action = json.loads(line)
        if "remove" in action:
            out.append(unquote(action["remove"]["path"]))
    return out


def cow_floor(table_path: str, files: list[str], scratch: Path) -> tuple[float, int]:
    """Seconds to read each of `files` whole and write it again with plain pyarrow, and the
    rows they hold."""
    scratch.mkdir(parents=True, exist_ok=True)
    rows = 0
    started = time.perf_counter()
    for i, f in enumerate(files):
        table = pq.read_table(Path(table_path) / f)
        pq.write_table(table, scratch / f"{i}.parquet", compression="snappy")
        rows += table.num_rows
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return seconds, rows


def folder_batch(rows: int, size: int, round_: int) -> list[FileEvent]:
    """`size` events as a real bucket makes them: half overwrite every file of a few existing
    folders (a folder uploaded again), half create the files of new folders."""
    when = T0 + timedelta(hours=1000 + round_)  # newer than every other batch of the run
    half = size // 2
    folders = max(1, rows // FILES_PER_FOLDER)
    first = (round_ * 7919 * FILES_PER_FOLDER) % (folders * FILES_PER_FOLDER)
    first -= first % FILES_PER_FOLDER  # whole folders
    first = min(first, max(0, rows - half))
    overwrites = created_events(range(first, first + half), when=when, size=11 + round_)
    new = [FileEvent.created(f"fresh{round_:03d}-{i // FILES_PER_FOLDER:03d}/g{i:07d}.bin",
                             size=5, last_modified_time=when, etag=f"g{i:x}", event_time=when)
           for i in range(half)]
    return overwrites + new


def grow_by_apply(root: Path, rows: int, chunk: int, base_url: str) -> None:
    """A directory table of `rows` template paths grown by `apply` in `chunk`-event commits
    (as a volume fed by events grows), built under a temporary name and renamed."""
    tmp = root.with_name(root.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    table = DirectoryTable.create(str(tmp), base_url)
    for start in range(0, rows, chunk):
        table.apply(created_events(range(start, min(rows, start + chunk))))
    tmp.rename(root)
