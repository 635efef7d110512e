"""Versions whose files a VACUUM removed while their log entries stayed.

Our own retention (`maintenance.apply_retention`, delta-rs's vacuum) drops old log entries with
the files, so the oldest kept version is the oldest log entry (`DirectoryTable.oldest_version`).
Delta Spark's `VACUUM` (and delta-rs's with a short retention) deletes data files no longer in
the latest snapshot and every `_change_data/` file older than its retention, but keeps the log:
the versions are still listed and no longer readable. A read that meets a missing file is
turned into `VersionsGone`, carrying the oldest version from which a range still reads
(`oldest_readable`: the newest commit of the range that needs a missing file), so a stream
raises `StaleStreamError` rather than an I/O error — and never returns records without them.

    try:
        table.changes(a, b)
    except VersionsGone as exc:
        exc.oldest   # ranges (oldest, b] read
"""

from __future__ import annotations

import json
from urllib.parse import unquote

from pyarrow import fs as pafs

from directory_table.files import CommitLog
from directory_table.storage import filesystem_for

__all__ = ["VersionsGone", "is_missing_file", "needed_files", "oldest_readable"]

_MISSING = ("not found", "no such file", "does not exist")


class VersionsGone(FileNotFoundError):
    """Files of versions after `oldest` up to the read's end were removed (a VACUUM)."""

    def __init__(self, path: str, after: int, up_to: int, oldest: int):
        self.path, self.after, self.up_to, self.oldest = path, after, up_to, oldest
        super().__init__(
            f"the Delta table {path} no longer has the files of version {oldest} (a VACUUM "
            f"removed them; its log still lists them): versions ({after}, {up_to}] cannot be "
            f"read, ranges from version {oldest} on can")


def is_missing_file(exc: BaseException) -> bool:
    """Whether a delta-rs / pyarrow read error says a data or change file is not there."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, FileNotFoundError):
            return True
        text = str(seen).lower()
        if ("object at location" in text or ".parquet" in text) and any(
                m in text for m in _MISSING):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def needed_files(body: bytes) -> list[str]:
    """The files (relative to the table) a change data feed reads for one commit: its `cdc`
    files if it has any, else its data-changing `add` and `remove` files."""
    actions = [json.loads(line) for line in body.splitlines() if line.strip()]
    cdc = [a["cdc"]["path"] for a in actions if "cdc" in a]
    if cdc:
        return [unquote(p) for p in cdc]
    return [unquote(a[k]["path"]) for a in actions for k in ("add", "remove")
            if k in a and a[k].get("dataChange", True)]


def oldest_readable(path: str, after: int, up_to: int,
                    storage_options: dict[str, str] | None = None) -> int:
    """The oldest version `o` in [after, up_to] such that (o, up_to] reads: the newest commit
    of (after, up_to] whose log entry or needed files are gone, else `after`."""
    log = CommitLog(path, storage_options)
    fs, base = filesystem_for(path, storage_options)
    for version in range(up_to, after, -1):
        body = log.commit(version)
        if body is None:
            return version
        files = needed_files(body)
        if files and any(info.type == pafs.FileType.NotFound
                         for info in fs.get_file_info([f"{base}/{f}" for f in files])):
            return version
    return after
