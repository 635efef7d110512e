"""The key index of a directory table (DESIGN §4.8): relative_path → (data file, row position
in it, the stored columns), so a batch's plan and before-images read no data file.

It is a cache of the table, never the truth: tagged with the table version it reflects
(`version`), kept on a local disk in a folder of its own, and rebuilt from the table's live
rows (`build`) when it is missing, damaged, of another table, or behind in a way the caller
cannot catch up by `apply`.

    index = KeyIndex.open(folder, table_id, buckets)
    if index is None or index.version != table_version:
        index = KeyIndex.build(folder, table_id, buckets, table_version, live_rows)
    found = index.lookup(paths)                   # relative_path, file, pos, _bucket, columns
    index.apply(new_version, removed_paths, added_rows)

Layout (`directory_table.keyindex_store`): per partition (the table's bucket, or for a big
table a finer hash split of it) a base run, a Parquet file sorted by path in small row groups,
with the first path of each row group held in memory; a delta of the entries changed since,
in memory and in one small file per `apply`, consulted first; a manifest naming what is
current. When the delta holds more than `max_delta` entries, the partitions with the most
entries are merged into new base runs.

One process writes a folder at a time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from directory_table.keyindex_store import (
    DELTA_SCHEMA,
    ENTRY_SCHEMA,
    PART_ROWS,
    SPARSE_STRIDE,
    VALUE_COLUMNS,
    Manifest,
    RunFiles,
    conform,
    live_batches,
    partitions_of,
    read_delta,
    read_manifest,
    remove_orphans,
    spill_build,
    write_delta,
    write_manifest,
    write_run,
)

__all__ = ["LOOKUP_SCHEMA", "KeyIndex", "live_batches"]

log = logging.getLogger(__name__)

KEY = "relative_path"
#: what `lookup` returns
LOOKUP_SCHEMA = pa.schema([*list(ENTRY_SCHEMA)[:3], pa.field("_bucket", pa.int32()),
                           *list(ENTRY_SCHEMA)[3:]])
#: delta entries (over all partitions) beyond which `apply` merges partitions into their runs
MAX_DELTA = 500_000
#: memory a build holds before it spills rows to per-partition files
BUILD_MEMORY = 256 * 1024 * 1024
_DELETED = -1


class KeyIndex:
    """An open key index; see the module docstring."""

    def __init__(self, folder: Path, manifest: Manifest, max_delta: int = MAX_DELTA,
                 sparse_stride: int = SPARSE_STRIDE, durable: bool = True) -> None:
        self.folder = folder
        self._m = manifest
        #: delta entries beyond which `apply` merges partitions into their base runs
        self.max_delta = max_delta
        #: rows between two paths of the sparse index of the runs this index writes
        self.sparse_stride = sparse_stride
        #: fsync each file before the manifest naming it (off: a power loss, not a process
        #: crash, may leave a manifest naming torn files, which `open` then refuses)
        self.durable = durable
        self._runs: list[RunFiles | None] = [
            RunFiles.open(folder, r["name"]) if r["name"] else None for r in manifest.runs]
        #: per partition: path -> seq << 32 | row in that apply's entries, or _DELETED
        self._delta: list[dict[str, int]] = [{} for _ in range(manifest.parts)]
        #: seq -> that apply's added entries (ENTRY_SCHEMA)
        self._chunks: dict[int, pa.Table] = {}
        for seq, name, _ in manifest.deltas:
            self._replay(seq, read_delta(folder, name))

    # ------------------------------------------------------------ open / build
    @classmethod
    def open(cls, folder: str | Path, table_id: str, buckets: int, *,
             max_delta: int = MAX_DELTA, sparse_stride: int = SPARSE_STRIDE,
             durable: bool = True) -> KeyIndex | None:
        """The index kept in `folder`, or None when there is none, it is damaged, or it is of
        another table or bucket count (the caller then builds one). The caller compares
        `version` with the table's."""
        folder = Path(folder)
        try:
            manifest = read_manifest(folder)
            if manifest.table_id != table_id or manifest.buckets != buckets:
                log.info("key index %s is of table %s (%d buckets): not used", folder,
                         manifest.table_id, manifest.buckets)
                return None
            return cls(folder, manifest, max_delta, sparse_stride, durable)
        except FileNotFoundError:
            return None
        except Exception as exc:  # any damage means: build it again
            log.warning("key index %s cannot be read (%s): it will be rebuilt", folder, exc)
            return None

    @classmethod
    def build(cls, folder: str | Path, table_id: str, buckets: int, version: int,
              batches: Iterable[pa.RecordBatch | pa.Table], *, rows_hint: int | None = None,
              max_delta: int = MAX_DELTA, sparse_stride: int = SPARSE_STRIDE,
              memory: int = BUILD_MEMORY, grouped: bool = False, durable: bool = True,
              ) -> KeyIndex:
        """A new index of `version` from the table's live rows: `batches` hold relative_path,
        _bucket, file, pos and the value columns (`live_batches` makes them from data files).
        `rows_hint` (the table's row count) splits buckets of more than `PART_ROWS` rows into
        finer partitions. `grouped`: the batches come bucket by bucket (each bucket's rows
        together), so each bucket is written when the next starts instead of being held or
        spilled; rows of each bucket in path order (its files in order of their smallest
        path, files not overlapping) spare the sort. Whatever was in `folder` is replaced
        (atomically)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        splits = max(1, math.ceil((rows_hint or 0) / max(1, buckets) / PART_ROWS))
        runs = spill_build(folder, batches, buckets, splits, memory, durable, grouped,
                           sparse_stride)
        manifest = Manifest(table_id, buckets, splits, version, 0, runs, [])
        write_manifest(folder, manifest, durable)
        remove_orphans(folder, manifest)
        return cls(folder, manifest, max_delta, sparse_stride, durable)

    # ------------------------------------------------------------ reads
    @property
    def version(self) -> int:
        return self._m.version

    @property
    def table_id(self) -> str:
        return self._m.table_id

    @property
    def delta_size(self) -> int:
        return sum(len(d) for d in self._delta)

    def stats(self) -> dict:
        """What the index holds: per partition its run's rows, run file and delta entries;
        the delta files kept and the entries they and memory hold."""
        return {"version": self._m.version, "buckets": self._m.buckets,
                "splits": self._m.splits, "runs": [r["name"] for r in self._m.runs],
                "rows": [r["rows"] for r in self._m.runs],
                "delta": [len(d) for d in self._delta],
                "delta_files": len(self._m.deltas),
                "kept_entries": sum(t.num_rows for t in self._chunks.values())}

    def lookup(self, paths: Iterable[str]) -> pa.Table:
        """The entries of those of `paths` the table holds (LOOKUP_SCHEMA), sorted by path."""
        wanted = sorted(set(paths))
        parts = partitions_of(wanted, self._m.parts)
        by_part: dict[int, list[str]] = {}
        for p, part in zip(wanted, parts, strict=True):
            by_part.setdefault(part, []).append(p)
        found, refs = [], []
        for part, ps in by_part.items():
            delta, rest = self._delta[part], []
            for p in ps:
                ref = delta.get(p)
                if ref is None:
                    rest.append(p)
                elif ref != _DELETED:
                    refs.append(ref)
            run = self._runs[part]
            if rest and run is not None:
                found.append(run.find(rest))
        found.extend(self._take(refs))
        if not found:
            return LOOKUP_SCHEMA.empty_table()
        return self._with_bucket(pa.concat_tables(found)).sort_by(KEY)

    def rows(self) -> Iterable[pa.Table]:
        """Every entry, one table per partition (LOOKUP_SCHEMA, sorted by path)."""
        for part, run in enumerate(self._runs):
            rows = conform(self._partition(part, run))
            bucket = pa.array([part % self._m.buckets] * rows.num_rows, pa.int32())
            yield rows.add_column(3, LOOKUP_SCHEMA.field("_bucket"), bucket).sort_by(KEY)

    def check(self, live_rows: pa.Table) -> list[str]:
        """Where the index disagrees with the table's live rows (relative_path, file, pos and
        the value columns): one line per disagreeing path, empty when they agree."""
        table = conform(live_rows)
        problems = [f"{dup}: more than one live row in the table"
                    for dup in _duplicates(table[KEY])]
        # partition by partition, so no more than one partition of the index is in memory
        if self._m.splits == 1 and "_bucket" in live_rows.schema.names:
            parts = live_rows["_bucket"].to_numpy()
        else:
            parts = np.array(partitions_of(table[KEY].to_pylist(), self._m.parts), np.int64)
        order = np.argsort(parts, kind="stable")
        table, parts = table.take(pa.array(order)), parts[order]
        bounds = np.searchsorted(parts, np.arange(self._m.parts + 1))
        for part, run in enumerate(self._runs):
            mine = conform(self._partition(part, run))
            theirs = table.slice(bounds[part], bounds[part + 1] - bounds[part])
            problems.extend(_disagreements(mine, theirs))
        return sorted(problems)

    # ------------------------------------------------------------ writes
    def apply(self, version: int, removed_paths: Iterable[str], added: pa.Table, *,
              maintain: bool = True) -> None:
        """Record the commit of `version`: `removed_paths` left the table (deleted, or
        overwritten and also in `added`), `added` holds the new rows (relative_path, file,
        pos and the value columns). Durable when it returns; a crash before leaves the index
        at its previous version. `maintain=False` leaves merging to a later `maintain()`
        (e.g. between batches)."""
        if version <= self._m.version:
            raise ValueError(f"key index is at version {self._m.version}; cannot apply "
                             f"version {version}")
        added = conform(added)
        new_paths = added[KEY].to_pylist()
        gone = sorted(set(removed_paths) - set(new_paths))
        parts = self._m.parts
        removed = conform(pa.table({KEY: pa.array(gone, pa.string())}))
        entries = pa.concat_tables([_entries(added, parts, False),
                                    _entries(removed, parts, True)])
        seq = self._m.seq + 1
        name = write_delta(self.folder, seq, entries, self.durable)
        manifest = Manifest(self._m.table_id, self._m.buckets, self._m.splits, version, seq,
                            self._m.runs, [*self._m.deltas, [seq, name, entries.num_rows]])
        write_manifest(self.folder, manifest, self.durable)
        self._m = manifest
        self._replay(seq, entries)
        if maintain:
            self.maintain()

    def maintain(self) -> int:
        """While the delta holds more than `max_delta` entries, merge the partition holding
        the most; then, while the delta files kept hold more than twice that many entries,
        merge the partition keeping the oldest of them (one that changed long ago and little
        would otherwise keep every later file). Returns how many partitions were merged."""
        merged = 0
        while self.delta_size > self.max_delta:
            self.merge(max(range(self._m.parts), key=lambda p: len(self._delta[p])))
            merged += 1
        while sum(n for _, _, n in self._m.deltas) > 2 * self.max_delta:
            pinning = [p for p in range(self._m.parts) if self._delta[p]]
            if not pinning:  # only partitions with nothing to merge keep the files
                self._settle(list(self._m.runs), None)
                break
            self.merge(min(pinning, key=lambda p: self._m.runs[p]["merged_seq"]))
            merged += 1
        return merged

    def merge(self, part: int) -> None:
        """Fold partition `part`'s delta into a new base run."""
        rows = self._partition(part, self._runs[part])
        run = write_run(self.folder, part, rows, self.durable, self.sparse_stride)
        runs = list(self._m.runs)
        runs[part] = run
        self._settle(runs, part)

    def _settle(self, runs: list[dict], part: int | None) -> None:
        """Replace the manifest with `runs` (partition `part`'s run just written from its
        delta): every partition without delta entries holds every apply so far as it is, and
        delta files every partition holds are dropped."""
        runs = [{**r, "merged_seq": self._m.seq} if p == part or not self._delta[p] else r
                for p, r in enumerate(runs)]
        floor = min(r["merged_seq"] for r in runs)
        deltas = [d for d in self._m.deltas if d[0] > floor]
        manifest = Manifest(self._m.table_id, self._m.buckets, self._m.splits, self._m.version,
                            self._m.seq, runs, deltas)
        write_manifest(self.folder, manifest, self.durable)
        self._m = manifest
        if part is not None:
            name = runs[part]["name"]
            self._runs[part] = RunFiles.open(self.folder, name) if name else None
            self._delta[part] = {}
        for seq in [s for s in self._chunks if s <= floor]:
            del self._chunks[seq]
        remove_orphans(self.folder, manifest)

    # ------------------------------------------------------------ internals
    def _replay(self, seq: int, entries: pa.Table) -> None:
        """Take one apply's entries into the in-memory delta (skipping partitions whose run
        already holds them); later entries of a path win."""
        merged = np.array([r["merged_seq"] for r in self._m.runs], dtype=np.int64)
        dead = entries["deleted"].to_numpy()
        self._chunks[seq] = entries.filter(pa.array(~dead)).select(ENTRY_SCHEMA.names)
        parts = entries["_part"].to_numpy()
        refs = np.where(dead, _DELETED, (seq << 32) | (np.cumsum(~dead) - 1))
        keep = np.flatnonzero(merged[parts] < seq)
        keep = keep[np.argsort(parts[keep], kind="stable")]  # by partition, in order
        paths = entries[KEY].take(pa.array(keep)).to_pylist()
        parts, refs = parts[keep], refs[keep].tolist()
        edges = [0, *(np.flatnonzero(np.diff(parts)) + 1).tolist(), len(keep)]
        for start, end in zip(edges, edges[1:], strict=False):
            if end > start:
                self._delta[int(parts[start])].update(zip(paths[start:end], refs[start:end],
                                                          strict=True))

    def _take(self, refs: list[int]) -> list[pa.Table]:
        by_seq: dict[int, list[int]] = {}
        for ref in refs:
            by_seq.setdefault(ref >> 32, []).append(ref & 0xFFFFFFFF)
        return [self._chunks[seq].take(pa.array(rows, pa.int64()))
                for seq, rows in by_seq.items()]

    def _partition(self, part: int, run: RunFiles | None) -> pa.Table:
        """All current entries of one partition (ENTRY_SCHEMA but `file` dictionary-encoded,
        unordered)."""
        delta = self._delta[part]
        tables = [run.read()] if run is not None else []
        if delta and tables:
            changed = pa.array(list(delta), pa.string())
            tables[0] = tables[0].filter(pc.invert(pc.is_in(tables[0][KEY], value_set=changed)))
        for t in self._take([r for r in delta.values() if r != _DELETED]):
            tables.append(t.set_column(1, "file", pc.dictionary_encode(t["file"])))
        if not tables:
            return conform(ENTRY_SCHEMA.empty_table(), file_dictionary=True)
        return pa.concat_tables(tables)

    def _with_bucket(self, rows: pa.Table) -> pa.Table:
        bucket = pa.array(partitions_of(rows[KEY].to_pylist(), self._m.buckets), pa.int32())
        return rows.add_column(3, LOOKUP_SCHEMA.field("_bucket"), bucket)


def _entries(rows: pa.Table, parts: int, deleted: bool) -> pa.Table:
    """`rows` (ENTRY_SCHEMA) as delta entries (DELTA_SCHEMA)."""
    part = pa.array(partitions_of(rows[KEY].to_pylist(), parts), pa.int32())
    flag = pa.array([deleted] * rows.num_rows, pa.bool_())
    return pa.Table.from_arrays([*rows.columns, part, flag], schema=DELTA_SCHEMA)


def _duplicates(keys: pa.ChunkedArray) -> list[str]:
    counts = pc.value_counts(keys)
    return sorted(counts.field("values").filter(pc.greater(counts.field("counts"), 1))
                  .to_pylist())


def _disagreements(mine: pa.Table, theirs: pa.Table) -> list[str]:
    """One line per path where two sets of entries (ENTRY_SCHEMA) differ."""
    joined = mine.join(theirs, KEY, join_type="full outer", left_suffix=".index",
                       right_suffix=".table", coalesce_keys=True)
    cols = ["file", "pos", *VALUE_COLUMNS]
    bad = pc.invert(pc.and_(pc.is_valid(joined["pos.index"]), pc.is_valid(joined["pos.table"])))
    for c in cols:
        a, b = joined[f"{c}.index"], joined[f"{c}.table"]
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
        bad = pc.or_(bad, pc.invert(pc.fill_null(same, False)))
    problems = []
    for row in joined.filter(bad).to_pylist():
        path = row[KEY]
        if row["pos.index"] is None:
            problems.append(f"{path}: in the table, not in the index")
        elif row["pos.table"] is None:
            problems.append(f"{path}: in the index, not in the table")
        else:
            diffs = [f"{c} {row[c + '.index']!r} != {row[c + '.table']!r}" for c in cols
                     if row[c + ".index"] != row[c + ".table"]]
            problems.append(f"{path}: index and table differ: {', '.join(diffs)}")
    return problems
