"""Records of one shard between two versions, from the directory table's change data feed.

`DirectoryTable.changes(a, b, buckets=shard.buckets)` gives the CDF rows of the shard's buckets
only (O(changes)); if the table was re-bucketed after the change log was made (a migration of a
pre-bucket table), the rows are read whole and kept by the change log's own bucket count. Per version and key the old image (delete / update_preimage) and the new one
(insert / update_postimage) are paired into one record: INSERT (new only), REMOVE (old only),
MODIFY (both; a rewrite that changes no public column — Delta shows it as delete + insert — is
no change and gives no record, as DynamoDB writes none for a no-op put). Records are ordered by
(version, key); the row of a sequence number is the record's index in its version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from directory_table import DirectoryTable
from directory_table.layout import bucket_of
from directory_table.schema import PUBLIC_COLUMNS
from volume_stream.shards.model import Record, Shard, sequence_number

__all__ = ["CommitTimes", "shard_records"]

_OLD = frozenset(("delete", "update_preimage"))
_COMMIT_TS_KEY = "volume_stream.commit_timestamp"


class CommitTimes:
    """The commit time of each version, read from its Delta log entry once and cached."""

    def __init__(self, table: DirectoryTable, limit: int = 100_000):
        self.table, self.limit = table, limit
        self._cache: dict[int, datetime] = {}
        path = f"{table.path}/_delta_log"
        if "://" in path:
            self._fs, self._base = pafs.FileSystem.from_uri(path)
        else:
            self._fs, self._base = pafs.LocalFileSystem(), path

    def __call__(self, version: int) -> datetime:
        when = self._cache.get(version)
        if when is None:
            when = self._read(version)
            if len(self._cache) >= self.limit:
                self._cache.clear()
            self._cache[version] = when
        return when

    def _read(self, version: int) -> datetime:
        with self._fs.open_input_stream(f"{self._base}/{version:020d}.json") as f:
            text = f.read().decode()
        for line in text.splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info is not None:
                if info.get(_COMMIT_TS_KEY):
                    return datetime.fromisoformat(info[_COMMIT_TS_KEY])
                return datetime.fromtimestamp(info["timestamp"] / 1000, UTC)
        return datetime.fromtimestamp(0, UTC)


def _images_differ(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(old[c] != new[c] for c in PUBLIC_COLUMNS)


#: attribute names of an image plus its fixed-size values (size 8, time 32 as text)
_IMAGE_FIXED = sum(len(c) for c in PUBLIC_COLUMNS) + 8 + 32
_KEY_FIXED = len("relative_path")


def _size(path: str, *images: dict[str, Any] | None) -> int:
    """Approximate bytes of a record as DynamoDB counts them (names plus values)."""
    total = _KEY_FIXED + len(path)
    for image in images:
        if image:
            total += (_IMAGE_FIXED + len(image["relative_path"]) + len(image["url"] or "")
                      + len(image["etag"] or ""))
    return total


def shard_records(table: DirectoryTable, shard: Shard, after: int, up_to: int, view_type: str,
                  commit_time: Callable[[int], datetime]) -> list[Record]:
    """The shard's records of versions (after, up_to], in sequence-number order."""
    if up_to <= after:
        return []
    if not shard.hash_buckets or shard.hash_buckets == table.layout().buckets:
        cdf = table.changes(after, up_to, buckets=shard.buckets)
    else:  # the table was re-bucketed (migrated) after the change log was made
        cdf = table.changes(after, up_to)
        keep = [shard.bucket_lo <= bucket_of(p, shard.hash_buckets) < shard.bucket_hi
                for p in cdf["relative_path"].to_pylist()]
        cdf = cdf.filter(pa.array(keep, pa.bool_()))
    if cdf.num_rows == 0:
        return []
    cols = cdf.select([*PUBLIC_COLUMNS, "_change_type", "_commit_version"]).to_pydict()
    pairs: dict[tuple[int, str], list[dict[str, Any] | None]] = {}
    paths, kinds, versions = cols["relative_path"], cols["_change_type"], cols["_commit_version"]
    for i in range(len(paths)):
        slot = pairs.setdefault((versions[i], paths[i]), [None, None])
        slot[0 if kinds[i] in _OLD else 1] = {c: cols[c][i] for c in PUBLIC_COLUMNS}
    out: list[Record] = []
    keep_old = view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE")
    keep_new = view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
    row, current = 0, None
    for (version, path) in sorted(pairs):
        old, new = pairs[(version, path)]
        if old is not None and new is not None:
            if not _images_differ(old, new):
                continue
            event = "MODIFY"
        else:
            event = "INSERT" if new is not None else "REMOVE"
        if version != current:
            row, current = 0, version
        old_kept = old if keep_old else None
        new_kept = new if keep_new else None
        key = {"relative_path": path}
        out.append(Record(
            sequence_number=sequence_number(version, row), event_name=event, key=key,
            old_image=old_kept, new_image=new_kept, commit_version=version,
            commit_timestamp=commit_time(version), shard_id=shard.shard_id,
            size_bytes=_size(path, old_kept, new_kept)))
        row += 1
    return out
