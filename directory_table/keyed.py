"""The key index of one merge-on-read directory table, kept at the table's version (DESIGN
§4.8): opened or built, caught up from the log, and asked for a batch's stored rows.

The index (`directory_table.keyindex`) is a cache, never the truth. `KeyCache.at(version)`
returns it at exactly `version` or nothing:

* opened from its folder (`<root>/<table id>-<crc32 of its location>`, on a local disk), built from the table's live
  rows when it is missing, damaged, of another table, or ahead of the table: on a thread,
  while batches with few candidate files scan them, so a daemon's
  first batches on a 10M-row table do not wait 7-12 s for it (a batch with more than
  `WAIT_FILES` candidates waits: the rest of the build costs it less than the scan);
* caught up commit by commit when it is behind (another writer committed, or our own commit):
  each commit's newly added data files are read (their live rows are the entries that moved
  or arrived: new images, a compaction's files), and the paths its change feed deletes or
  pre-images leave the index; a commit the index cannot follow that way (one that is gone
  from the log, or changes the table's metadata) makes it rebuild;
* held by one process at a time (an exclusive `flock` on `<folder>.lock`): another process
  writing the same table gets no index and scans the candidate files instead
  (`mor.load`), which gives the same rows.

A lookup whose files the file index does not hold means the index is wrong: it is dropped and
rebuilt, and the batch scans. `KeyCache.check` compares it with the table, for tests.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from directory_table import mor
from directory_table.files import CommitLog, FileEntry, FileIndex
from directory_table.filestore import Store
from directory_table.keyindex import KeyIndex, live_batches
from directory_table.keyindex_store import ENTRY_SCHEMA
from directory_table.layout import Layout
from directory_table.mor import marked_rows
from directory_table.rewrite import Loaded

__all__ = ["KeyCache", "default_root", "key_root"]

log = logging.getLogger(__name__)

#: commits a behind index catches up one by one; further behind, it is rebuilt
MAX_CATCH_UP = 200
#: while the index is being built, a batch with more candidate files than this waits for the
#: build rather than scanning them (~3.5 ms a file at 10M rows; a 10M-row build takes 7-12 s:
#: with every batch scanning, a daemon's first spread batches at 20k events/s took 3-4 s
#: each beside the build and group commit let the next grow to 781k events, p50 10.5 s)
WAIT_FILES = 64


def key_root(table_root: str, configured: str | None = None) -> str:
    """Where a table's key index lives: `configured`, else beside a local table
    (`<root>/key_index`, removed with it), else the machine's temporary folder."""
    if configured:
        return configured
    if table_root.startswith("file://") or "://" not in table_root:
        return f"{table_root.removeprefix('file://')}/key_index"
    return default_root()


def default_root() -> str:
    """Where key indexes live unless the table is told otherwise: the machine's temporary
    folder (a cache: losing it costs a rebuild)."""
    return os.path.join(tempfile.gettempdir(), "volume-stream-key-index")


class KeyCache:
    """The key index of the table at `table_uri`: one per table and process
    (`KeyCache.of`), shared by its `DirectoryTable` objects; `lock` serializes its use."""

    _caches: dict[tuple[str, str], KeyCache] = {}
    _made = threading.Lock()

    def __init__(self, table_uri: str, storage_options: dict[str, str], root: str):
        self.uri, self.options, self.root = table_uri, storage_options, root
        self.index: KeyIndex | None = None
        self._lock_file: int | None = None
        self._folder: Path | None = None
        self.disabled = False
        self.lock = threading.Lock()
        #: a build running in the background, and what it made (`_start_build`)
        self._building: threading.Thread | None = None
        self._built: KeyIndex | None = None
        #: batches planned from the index, and by scanning their candidate files
        self.lookups = self.scans = 0

    @classmethod
    def of(cls, table_uri: str, storage_options: dict[str, str], root: str) -> KeyCache:
        """This process's cache of the table at `table_uri` (its index in `root`)."""
        with cls._made:
            key = (table_uri, root)
            if key not in cls._caches:
                cls._caches[key] = cls(table_uri, storage_options, root)
            return cls._caches[key]

    # ------------------------------------------------------------ keeping it true
    def at(self, dt: DeltaTable, files: FileIndex, changes) -> KeyIndex | None:
        """The index at `files.version` (the version the batch plans on), or None when this
        process cannot hold it. `changes(after, up_to)` is the table's change reader."""
        if self.disabled:
            return None
        try:
            return self._at(dt, files, changes)
        except Exception as exc:  # a cache: never fail a batch for it
            log.warning("key index of %s dropped (%s): batches scan their files until it is "
                        "rebuilt", self.uri, exc)
            self.index = None
            return None

    def _at(self, dt: DeltaTable, files: FileIndex, changes) -> KeyIndex | None:
        table_id = dt.metadata().id
        buckets = Layout.of(dt).buckets
        if self._folder is None and not self._acquire(table_id):
            self.disabled = True
            return None
        assert self._folder is not None
        if self._building is not None:
            if self._building.is_alive():
                return None  # batches scan their candidate files until it is built
            self.index, self._building, self._built = self._built, None, None
        elif self.index is None:
            self.index = KeyIndex.open(self._folder, table_id, buckets)
            if self.index is not None and not self._trusted(self.index):
                self.index = None  # of another lineage of this table (a restored copy)
        index = self.index
        if index is not None and index.version > files.version:
            return None  # another of this process's handles committed since: scan this once
        if index is not None and index.version < files.version \
                and files.version - index.version <= MAX_CATCH_UP:
            log_reader = CommitLog(self.uri, self.options)
            for version in range(index.version + 1, files.version + 1):
                if not self._follow(index, version, log_reader, files, changes):
                    index = None
                    break
        if index is None or index.version != files.version:
            self.index = None
            self._start_build(table_id, buckets, files)
            return None
        self._stamp(index)
        return index

    def _start_build(self, table_id: str, buckets: int, files: FileIndex) -> None:
        """Build the index of `files` (the table's files at their version) on a thread: until
        it is done, batches scan (or wait, `load`), and the first batch after it catches it
        up from the log. The files and their version are taken now: `files` goes on being
        advanced while the thread runs."""
        version = files.version
        entries = sorted(files.files(), key=lambda e: (e.bucket, e.low or "", e.path))

        def build() -> None:
            try:
                self._built = self._build(table_id, buckets, version, entries)
            except Exception as exc:  # a cache: the next batch starts another build
                log.warning("building the key index of %s failed (%s)", self.uri, exc)

        self._building = threading.Thread(target=build, name="key-index-build", daemon=True)
        self._building.start()

    def wait(self) -> None:
        """Until a background build is done (tests; `close`)."""
        if self._building is not None:
            self._building.join()

    def _fingerprint(self, version: int) -> int | None:
        body = CommitLog(self.uri, self.options).commit(version)
        return None if body is None else zlib.crc32(body)

    def _stamp(self, index: KeyIndex) -> None:
        """Record which commit the index's version is (`_trusted` checks it on open): a table
        restored from a copy, or rolled back and written again, reuses version numbers."""
        assert self._folder is not None
        mark = json.dumps({"version": index.version,
                           "commit_crc32": self._fingerprint(index.version)})
        path = self._folder / "commit.json"
        if path.exists() and path.read_text() == mark:
            return
        tmp = self._folder / ".commit.json.tmp"
        tmp.write_text(mark)
        os.replace(tmp, path)

    def _trusted(self, index: KeyIndex) -> bool:
        assert self._folder is not None
        try:
            mark = json.loads((self._folder / "commit.json").read_text())
        except (OSError, ValueError):
            return False
        crc = self._fingerprint(index.version)
        return (mark.get("version") == index.version and crc is not None
                and mark.get("commit_crc32") == crc)

    def _follow(self, index: KeyIndex, version: int, log_reader: CommitLog,
                files: FileIndex, changes) -> bool:
        """Apply commit `version` to `index`; False when it cannot be followed."""
        body = log_reader.commit(version)
        if body is None:
            return False
        actions = [json.loads(line) for line in body.splitlines() if line.strip()]
        if any("metaData" in a or "protocol" in a for a in actions):
            return False
        removed_files = {a["remove"]["path"] for a in actions if "remove" in a}
        new = [a["add"] for a in actions if "add" in a and a["add"]["path"] not in removed_files]
        data_change = any(a[k].get("dataChange", True) for a in actions
                          for k in ("add", "remove") if k in a)
        gone: list[str] = []
        if data_change:
            feed = changes(version - 1, version)
            kinds = feed["_change_type"]
            gone = feed.filter(pc.is_in(kinds, value_set=pa.array(
                ["delete", "update_preimage"]))).column("relative_path").to_pylist()
        entries = []
        for add in new:
            entry = files.entry(add["path"])
            if entry is None:  # added and removed again later: its rows come then
                continue
            entries.append(entry)
        added = pa.concat_tables(list(self._live(entries))) if entries else None
        index.apply(version, gone, added if added is not None else _empty())
        return True

    def record(self, version: int, gone: list[str], written: list[tuple[str, pa.Table]],
               ) -> None:
        """Our own commit of `version`, straight from what it wrote (no file read back):
        `gone` paths left their rows, `written` (data file, rows in file order) holds the
        rows that arrived. Only onto an index at the version before; else the next batch
        catches it up from the log."""
        with self.lock:
            index = self.index
            if index is None or index.version != version - 1:
                return
            added = [rows.select([f.name for f in ENTRY_SCHEMA if f.name not in ("file", "pos")])
                     .append_column("file", pa.array([path] * rows.num_rows, pa.string()))
                     .append_column("pos", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
                     for path, rows in written]
            try:
                index.apply(version, gone, pa.concat_tables(added) if added else _empty())
                self._stamp(index)
            except Exception as exc:  # a cache: the next batch rebuilds it
                log.warning("key index of %s dropped (%s)", self.uri, exc)
                self.index = None

    def _live(self, entries: list[FileEntry]):
        store = Store(self.uri, self.options)
        items = [(e.path, e.bucket, _or_none(marked_rows(e, store))) for e in entries]
        return live_batches(items, store.read)

    def _build(self, table_id: str, buckets: int, version: int, entries: list[FileEntry],
               ) -> KeyIndex:
        rows = sum(e.live_rows or 0 for e in entries)
        log.info("building the key index of %s (%d rows, version %d)", self.uri, rows, version)
        assert self._folder is not None
        return KeyIndex.build(self._folder, table_id, buckets, version, self._live(entries),
                              rows_hint=rows)

    def _acquire(self, table_id: str) -> bool:
        """Hold this table's index folder (False: another process holds it)."""
        # a copy of a table keeps its id: the folder names the location too
        folder = Path(self.root) / f"{table_id}-{zlib.crc32(self.uri.encode()):08x}"
        folder.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{folder}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            log.info("key index %s is held by another process: this one scans", folder)
            return False
        self._lock_file, self._folder = fd, folder
        return True

    def close(self) -> None:
        self.wait()
        if self._lock_file is not None:
            os.close(self._lock_file)  # releases the flock
            self._lock_file = self._folder = self.index = None

    # ------------------------------------------------------------ lookups
    def load(self, dt: DeltaTable, layout: Layout, files: FileIndex,
             by_bucket: dict[int, list[str]], paths: list[str], base_url: str, changes,
             ) -> Loaded:
        """The stored rows of a merge-on-read batch's `paths` (`by_bucket`: the same, by
        bucket): from the index when this process holds it (no data file read), else from
        the candidate files (`mor.load`)."""
        candidates = None
        with self.lock:
            index = self.at(dt, files, changes)
            if index is None and self._building is not None:
                candidates = files.candidates(layout, paths, by_bucket)
                if len(candidates) > WAIT_FILES:  # the rest of the build costs less
                    self.wait()
                    index = self.at(dt, files, changes)
            looked = self.lookup(index, paths, files) if index is not None else None
        if looked is not None:
            found, entries = looked
            loaded = mor.from_index(found, entries, base_url, paths)
            self.lookups += 1
        else:
            self.scans += 1
            if candidates is None:
                candidates = files.candidates(layout, paths, by_bucket)
            entries = [files.entry(c[2]) for c in candidates]
            loaded = mor.load(dt, entries, paths, Store(self.uri, self.options))
        loaded.entries = entries
        return loaded

    def lookup(self, index: KeyIndex, paths: list[str], files: FileIndex,
               ) -> tuple[pa.Table, list[FileEntry]] | None:
        """The stored rows of `paths` with their file (an index into the entries returned)
        and position; None when the index names a file the table does not hold (it is then
        dropped, to be rebuilt)."""
        found = index.lookup(paths)
        names = found["file"].to_pylist()
        unique = sorted(set(names))
        entries = [files.entry(n) for n in unique]
        if any(e is None for e in entries):
            log.warning("key index of %s names a file the table does not hold: rebuilding",
                        self.uri)
            self.index = None
            return None
        number = {n: i for i, n in enumerate(unique)}
        file_of = np.array([number[n] for n in names], dtype=np.int32)
        return found.drop_columns(["file"]).append_column(
            "__file_of", pa.array(file_of, pa.int32())), entries  # type: ignore[return-value]

    def check(self, live: pa.Table) -> list[str]:
        """Where the index disagrees with the table's live rows (`keyindex.check`)."""
        return self.index.check(live) if self.index is not None else ["no key index"]


def _or_none(marked: np.ndarray) -> np.ndarray | None:
    return marked if len(marked) else None


def _empty() -> pa.Table:
    return ENTRY_SCHEMA.empty_table()
