"""Test data for the benchmarks: synthetic `FileEvent`s, pre-built directory tables, and real
small files on disk.

Large directory tables are built by applying synthetic CREATED events in chunks (no real files
needed) and kept as a per-run template folder, so several benchmarks (and several repeats of
one) start from identical copies instead of rebuilding 1M rows each time.

    events = created_events(range(0, 1000), when=T0)
    template = table_template(ctx, 1_000_000)
    table = clone_table(template, ctx.path("copy"))
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks._context import Context
from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.keyed import KeyCache, key_root

__all__ = [
    "T0",
    "clone_table",
    "created_events",
    "existing_path",
    "file_event",
    "fill_table",
    "removed_events",
    "table_template",
    "write_files",
    "write_tree",
]

#: event/modification time of every synthetic row of a template table
T0 = datetime(2025, 1, 1, tzinfo=UTC)
BASE_URL = "file:///bench/"
CHUNK = 200_000
FILES_PER_FOLDER = 1000


def existing_path(i: int) -> str:
    """The relative path of row `i` of a template table (and of file `i` of a tree)."""
    return f"d{i // FILES_PER_FOLDER:04d}/f{i:07d}.bin"


def created_events(indices: Iterable[int], *, when: datetime = T0, size: int = 100,
                   prefix: str | None = None) -> list[FileEvent]:
    """CREATED events for template paths (or `prefix/n{i}.bin` paths when `prefix` is given)."""
    return [
        FileEvent.created(existing_path(i) if prefix is None else f"{prefix}/n{i:07d}.bin",
                          size=size + i % 97, last_modified_time=when, etag=f"e{i:x}-{size}",
                          event_time=when)
        for i in indices
    ]


def removed_events(indices: Iterable[int], *, when: datetime) -> list[FileEvent]:
    return [FileEvent.removed(existing_path(i), event_time=when) for i in indices]


def fill_table(table: DirectoryTable, rows: int, *, chunk: int = CHUNK) -> None:
    """Apply `rows` synthetic CREATED events to an empty table, `chunk` per commit."""
    for start in range(0, rows, chunk):
        table.apply(created_events(range(start, min(rows, start + chunk))))


def table_template(ctx: Context, rows: int) -> Path:
    """A directory table root with `rows` synthetic rows, built once per run and size."""

    def build() -> Path:
        root = ctx.path(f"template-{rows}")
        fill_table(DirectoryTable.create(str(root), BASE_URL), rows)
        return root

    return ctx.cached(("template", rows), build)


def clone_table(template: Path, root: Path, base_url: str = BASE_URL) -> DirectoryTable:
    """Copy a template table's folders to `root` (replacing what is there) and open it."""
    table = DirectoryTable(str(root), base_url)
    for src, dest in ((template / "directory", table.path),
                      (template / "tombstones", table.tombstones_path)):
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)
    return table


def write_files(folder: Path, names: Iterable[str], payload: bytes = b"x\n") -> None:
    """Write small files into `folder` (which must exist), each created, written and closed."""
    for name in names:
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, payload)
        finally:
            os.close(fd)


def write_tree(root: Path, files: int) -> None:
    """`files` tiny files under `root`, in sub-folders of `FILES_PER_FOLDER` (`existing_path`)."""
    root.mkdir(parents=True, exist_ok=True)
    for start in range(0, files, FILES_PER_FOLDER):
        folder = root / existing_path(start).split("/")[0]
        folder.mkdir(exist_ok=True)
        stop = min(files, start + FILES_PER_FOLDER)
        write_files(folder, (existing_path(i).split("/")[1] for i in range(start, stop)))


def file_event(root: Path, relative_path: str) -> FileEvent:
    """A CREATED event describing a file as it is on disk now (what the local listener emits)."""
    st = os.lstat(root / relative_path)
    mtime = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=st.st_mtime_ns // 1000)
    return FileEvent.created(relative_path, size=st.st_size, last_modified_time=mtime,
                             etag=f"{st.st_mtime_ns:x}-{st.st_size:x}", source_id="bench")


def ready(table: DirectoryTable) -> None:
    """Bring a fresh copy to a running daemon's state before it is measured: its file index
    and key index built (the key index on a thread, DESIGN §4.8: waited for here). A
    one-off cost, not the measured one."""
    table.apply([])  # no commit
    dt = table.delta()
    KeyCache.of(dt.table_uri, table.storage_options,
                key_root(table.root, table.key_index_root)).wait()
