"""One file's history in a volume, for the status page's search (DESIGN §8.3).

`file_history(table, volume, path, commit_times)` answers three questions about a path:

- which versions changed it, and what the directory table's change feed says of each
  (`changes`: `insert`, `update_preimage`, `update_postimage`, `delete`);
- what its row was at each of those versions, read by time travel (`rows`: the table as of
  version N, the path's bucket only; absent once deleted);
- which change records a stream reading one commit at a time got from it (`records`:
  `INSERT`, `UPDATE_BEFORE`/`UPDATE_AFTER`, `DELETE`, the rules of `streams.changes`).

The change feed is read for the path's bucket only, over the kept versions; time travel reads
at most `MAX_VERSIONS` versions (the newest). A path that matches nothing lists up to
`MAX_MATCHES` paths of the latest version containing the text, so a search for part of a name
finds the file.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from directory_table.layout import Layout
from volume_stream.errors import InvalidInputError, converted
from volume_stream.streams.changes import standard_changes

__all__ = ["MAX_MATCHES", "MAX_VERSIONS", "file_history"]

#: versions of a path's row read by time travel (the newest ones)
MAX_VERSIONS = 50
#: paths listed when a search matches no path exactly
MAX_MATCHES = 20

_ROW = ("relative_path", "url", "size", "last_modified_time", "etag", "_image_version")
_CDF = ("_commit_version", "_change_type", "size", "last_modified_time", "etag", "url")
_CHANGE_ORDER = {"delete": 0, "update_preimage": 1, "update_postimage": 2, "insert": 3}


def file_history(table: Any, volume: str, path: str,
                 commit_times: dict[int, str | None]) -> dict[str, Any]:
    """Every change of `path` in the volume's kept versions, its row at each of them (time
    travel), the stream records they made, and its row now (see the module docstring). The
    path is taken as given, spaces included (a leading `/` is dropped when no path of the
    volume starts with it).

    `commit_times` maps versions to their ISO commit times (the caller's kept history).

    Raises:
        InvalidInputError: an empty path.
        VolumeStreamError: the table could not be read (named after the volume).
    """
    if not path:
        raise InvalidInputError("give the file's path relative to the volume, e.g. a/b.csv")
    found = _history(table, volume, path, commit_times)
    if path.startswith("/") and not found["versions"] and not found["exists"]:
        # "/a.txt" for a.txt, unless a path of the volume really starts with "/"
        return file_history(table, volume, path.lstrip("/"), commit_times)
    return found


def _history(table: Any, volume: str, path: str,
             commit_times: dict[int, str | None]) -> dict[str, Any]:
    """`file_history` of exactly `path` (" a.txt" and "a.txt" are two files)."""
    with converted(f"volume {volume!r}"):
        latest, oldest = table.version(), table.oldest_version()
        bucket = table.layout().bucket_of(path)
        cdf = (table.changes(max(oldest - 1, 0), latest, buckets=[bucket]) if latest > 0
               else None)
        now = _row_of(table.snapshot(latest, buckets=[bucket]), path)
        mine = (cdf.filter(pc.equal(cdf["relative_path"], pa.scalar(path)))
                if cdf is not None and cdf.num_rows else None)
        changes: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        if mine is not None and mine.num_rows:
            keep = [c for c in _CDF if c in mine.column_names]
            changes = sorted(mine.select(keep).to_pylist(),
                             key=lambda r: (r.get("_commit_version") or 0,
                                            _CHANGE_ORDER.get(r.get("_change_type"), 9)))
            for version in sorted(set(mine["_commit_version"].to_pylist())):
                one = mine.filter(pc.equal(mine["_commit_version"], version))
                records += [{"read_at": version, **r}
                            for r in standard_changes(one).to_pylist()]
        versions = sorted({r["_commit_version"] for r in changes})
        rows = [{"version": v, "committed": commit_times.get(v),
                 "row": _row_of(_as_of(table, v, path), path)}
                for v in versions[-MAX_VERSIONS:]]
        matches = [] if changes or now else _matches(table, latest, path)
    for r in changes:
        r["_commit_timestamp"] = commit_times.get(r["_commit_version"])
    return {"volume": volume, "path": path, "latest_version": latest,
            "oldest_version": oldest, "exists": now is not None, "current": now,
            "versions": versions, "changes": changes, "rows": rows,
            "rows_omitted": max(len(versions) - MAX_VERSIONS, 0),
            "records": records, "matches": matches}


def _as_of(table: Any, version: int, path: str) -> pa.Table:
    """The path's bucket as of `version` (time travel; the bucket count of that version)."""
    bucket = Layout.of(table.delta(version)).bucket_of(path)
    return table.snapshot(version, buckets=[bucket])


def _row_of(rows: pa.Table, path: str) -> dict[str, Any] | None:
    found = rows.filter(pc.equal(rows["relative_path"], pa.scalar(path)))
    if not found.num_rows:
        return None
    return {k: v for k, v in found.slice(0, 1).to_pylist()[0].items() if k in _ROW}


def _matches(table: Any, version: int, text: str) -> list[str]:
    """Up to `MAX_MATCHES` paths of `version` containing `text` (case-insensitive)."""
    paths = table.snapshot(version, columns=["relative_path"])["relative_path"]
    hits = paths.filter(pc.match_substring(paths, text, ignore_case=True))
    return sorted(hits.to_pylist())[:MAX_MATCHES]
