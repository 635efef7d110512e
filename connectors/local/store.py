"""Local directories as volumes: the lister and the reader (DESIGN §4.3).

`LocalLister` walks a volume with `os.scandir`; `LocalReader` opens files by relative path,
checked to stay inside the root. Symlinks are skipped everywhere, so a volume never reaches
outside its root through a link; non-regular files (fifos, sockets, devices) too. ETags are
`f"{st_mtime_ns:x}-{st_size:x}"`, the same in events (`connectors.local.listener`) and
listings: a change is a new size or a new modification time. A rewrite with the same size whose
mtime was put back is invisible to both; `hash_content=True` makes the ETag a hash of the
bytes instead (`content_etag`), at the cost of reading every file listed.

    >>> rows = sum(b.num_rows for b in list_local("/data/in"))   # doctest: +SKIP
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import ObjectNotFoundError
from connectors.events import InvalidPathError, validate_relative_path
from connectors.protocols import LISTING_SCHEMA, Lister, ObjectReader

__all__ = ["LocalLister", "LocalReader", "content_etag", "file_url", "list_local"]

logger = logging.getLogger("connectors.local")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# Characters `_check_key` rejects in a name; surrogates stand for undecodable bytes.
_SUSPECT = re.compile(r"[\x00-\x1f\x7f\\\ud800-\udfff]")
#: the same class for Arrow (RE2) on valid UTF-8 (surrogates cannot reach an Arrow string)
_SUSPECT_RE2 = r"[\x00-\x1f\x7f\\]"

def file_url(root: str | Path, relative_path: str = "") -> str:
    """The `file://` URL of a file of a local volume (or of the root itself), no percent-encoding.

    Example:
        >>> file_url("/data/in", "a b/c+d.txt")
        'file:///data/in/a b/c+d.txt'
        >>> file_url("/data/in/")
        'file:///data/in/'
    """
    base = os.path.abspath(os.fspath(root)).replace(os.sep, "/")
    if not base.endswith("/"):
        base += "/"
    if relative_path:
        validate_relative_path(relative_path)
    return "file://" + ("" if base.startswith("/") else "/") + base + relative_path


def _mtime(st: os.stat_result) -> datetime:
    # exact to the microsecond, unlike datetime.fromtimestamp(float)
    return _EPOCH + timedelta(microseconds=st.st_mtime_ns // 1000)


def _etag(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


def content_etag(path: str) -> str:
    """The ETag of a file's bytes (BLAKE2b, 128 bits), for volumes with `hash_content`."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "b2-" + digest.hexdigest()


def _check_key(relative_path: str) -> str:
    """Validate a key built from file names: `validate_relative_path` plus valid UTF-8."""
    validate_relative_path(relative_path)
    try:
        relative_path.encode("utf-8")
    except UnicodeEncodeError as exc:  # undecodable bytes in a name come back as surrogates
        raise InvalidPathError(f"relative path is not valid UTF-8: {relative_path!r}") from exc
    return relative_path


def _check_root(root: str | Path) -> str:
    """Return the absolute, symlink-resolved root or raise a clear error naming it."""
    path = os.path.realpath(os.fspath(root))
    if not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "local volume root does not exist", os.fspath(root))
    if not os.path.isdir(path):
        raise NotADirectoryError(errno.ENOTDIR, "local volume root is not a directory",
                                 os.fspath(root))
    if not os.access(path, os.R_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "local volume root is not readable", os.fspath(root))
    return path


class _Dir(NamedTuple):
    """The regular files of one directory, as columns, and its sub-directories (keys)."""

    paths: list[str]
    sizes: list[int]
    mtimes_ns: list[int]
    subdirs: list[str]


def _scan_dir(root: str, rel_dir: str, *, recursive: bool, strict: bool) -> _Dir:
    """One directory of a walk (see `_scan` for what is skipped and what raises); one tight
    loop with no per-file objects, since a refresh walks millions of files."""
    path = os.path.join(root, rel_dir) if rel_dir else root
    prefix = rel_dir + "/" if rel_dir else ""
    found = _Dir([], [], [], [])
    try:
        entries = os.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        return found
    except PermissionError as exc:
        if strict:
            raise PermissionError(exc.errno, "cannot list directory of local volume",
                                  path) from exc
        logger.warning("cannot list %s: %s", path, exc)
        return found
    add_path, add_size, add_mtime = found.paths.append, found.sizes.append, found.mtimes_ns.append
    add_dir = found.subdirs.append
    with entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        add_dir(prefix + entry.name)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            add_path(prefix + entry.name)
            add_size(st.st_size)
            add_mtime(st.st_mtime_ns)
    return found


def _scan(root: str, top: str = "", *, recursive: bool, strict: bool,
          workers: int = 1) -> Iterator[_Dir]:
    """Yield the regular files under `root/top` (`top` a '/'-key, '' = root), a directory at
    a time (`_Dir`: keys, sizes, mtimes in ns).

    Symlinks and special files are skipped. A directory that vanishes mid-walk is skipped; one
    that cannot be read raises `PermissionError` when `strict` (a refresh must not mistake it
    for an empty directory and delete its rows), else it is logged and skipped. With
    `workers > 1` sub-directories are scanned on a pool of threads (`os.scandir` and `lstat`
    release the GIL, so a cold or network disk is read in parallel); the files are the same,
    their order is not.
    """
    if workers > 1 and recursive:
        yield from _scan_parallel(root, top, strict=strict, workers=workers)
        return
    stack = [top]
    while stack:
        found = _scan_dir(root, stack.pop(), recursive=recursive, strict=strict)
        stack.extend(found.subdirs)
        yield found


def _scan_parallel(root: str, top: str, *, strict: bool, workers: int) -> Iterator[_Dir]:
    with ThreadPoolExecutor(workers, thread_name_prefix="scan") as pool:
        running: set[Future] = {pool.submit(_scan_dir, root, top, recursive=True,
                                            strict=strict)}
        waiting: list[str] = []
        try:
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    found = future.result()
                    waiting.extend(found.subdirs)
                    # keep the pool busy, but hold at most a few directories' files at once
                    while waiting and len(running) < 2 * workers:
                        running.add(pool.submit(_scan_dir, root, waiting.pop(), recursive=True,
                                                strict=strict))
                    yield found
        finally:
            for future in running:
                future.cancel()


class LocalLister(Lister):
    """List every file of a local volume (`Lister`) with an `os.scandir` walk.

    Symlinks and special files are skipped; names that are not safe keys (control characters,
    backslashes, undecodable bytes) are skipped with a warning and counted in `malformed`.

    Args:
        root: The volume's directory.
        recursive: List nested files too; else only direct children.
        batch_size: Rows per RecordBatch.
        hash_content: ETags are `content_etag` hashes of the bytes (every file is read), not
            mtime and size; a file that cannot be read is skipped and counted in `malformed`.
        workers: Threads scanning sub-directories at once (1: one serial walk); the rows are
            the same, in another order.

    Raises (from `list`, at once):
        FileNotFoundError / NotADirectoryError / PermissionError: naming the root; a
        sub-directory that cannot be read raises `PermissionError` while iterating.

    Example:
        >>> batches = LocalLister("/data/in", recursive=False).list()        # doctest: +SKIP
        >>> table = pa.Table.from_batches(batches, schema=LISTING_SCHEMA)   # doctest: +SKIP
    """

    def __init__(self, root: str | Path, recursive: bool = True, batch_size: int = 50_000,
                 hash_content: bool = False, workers: int = 1) -> None:
        if batch_size < 1 or workers < 1:
            raise ValueError(f"need batch_size >= 1 and workers >= 1: {batch_size}, {workers}")
        self.workers = workers
        self.root = os.fspath(root)
        self.recursive = recursive
        self.batch_size = batch_size
        self.hash_content = hash_content
        self.malformed = 0

    def __repr__(self) -> str:
        return f"LocalLister({self.root!r}, recursive={self.recursive})"

    def list(self) -> Iterator[pa.RecordBatch]:
        """Yield the volume's files in `LISTING_SCHEMA`, only non-empty batches."""
        root = _check_root(self.root)
        self.malformed = 0
        return self._batches(root)

    def _batches(self, root: str) -> Iterator[pa.RecordBatch]:
        paths: list[str] = []
        sizes: list[int] = []
        mtimes_ns: list[int] = []
        for found in _scan(root, recursive=self.recursive, strict=True, workers=self.workers):
            paths.extend(found.paths)
            sizes.extend(found.sizes)
            mtimes_ns.extend(found.mtimes_ns)
            if len(paths) >= self.batch_size:
                for start in range(0, len(paths) - self.batch_size + 1, self.batch_size):
                    end = start + self.batch_size
                    batch = self._batch(root, paths[start:end], sizes[start:end],
                                        mtimes_ns[start:end])
                    if batch.num_rows:
                        yield batch
                rest = len(paths) - len(paths) % self.batch_size
                paths, sizes, mtimes_ns = paths[rest:], sizes[rest:], mtimes_ns[rest:]
        if paths:
            batch = self._batch(root, paths, sizes, mtimes_ns)
            if batch.num_rows:
                yield batch
        if self.malformed:
            logger.warning("skipped %d files with unsafe names under %s", self.malformed, root)

    def _batch(self, root: str, paths: list[str], sizes: list[int],
               mtimes_ns: list[int]) -> pa.RecordBatch:
        """One batch, validating keys in bulk: keys joined from scandir names never have
        empty, '.' or '..' segments, so only names with suspect characters (control
        characters, backslashes, undecodable bytes) need the full check, and Arrow finds them
        (undecodable bytes make the string array fail: then every key is checked)."""
        path_array: pa.Array | None = None
        try:
            path_array = pa.array(paths, pa.string())
            suspect = pc.match_substring_regex(path_array, _SUSPECT_RE2)
            bad = [i for i, flag in enumerate(suspect.to_pylist()) if flag] \
                if pc.any(suspect).as_py() else []
        except UnicodeEncodeError:
            bad = [i for i, key in enumerate(paths) if _SUSPECT.search(key)]
        skip = set()
        for i in bad:
            try:
                _check_key(paths[i])
            except InvalidPathError as exc:
                skip.add(i)
                self.malformed += 1
                if self.malformed <= 10:
                    logger.warning("skipping %s: %s", os.path.join(root, paths[i]), exc)
        if skip:
            keep = [i for i in range(len(paths)) if i not in skip]
            paths = [paths[i] for i in keep]
            sizes = [sizes[i] for i in keep]
            mtimes_ns = [mtimes_ns[i] for i in keep]
        if self.hash_content:
            return self._hashed_batch(root, paths, sizes, mtimes_ns)
        etags = [f"{m:x}-{n:x}" for m, n in zip(mtimes_ns, sizes, strict=True)]  # `_etag`
        if skip or path_array is None:
            path_array = pa.array(paths, pa.string())
        return pa.RecordBatch.from_arrays(
            [path_array, pa.array(sizes, pa.int64()), _microseconds(mtimes_ns),
             pa.array(etags, pa.string())], schema=LISTING_SCHEMA)

    def _hashed_batch(self, root: str, paths: list[str], sizes: list[int],
                      mtimes_ns: list[int]) -> pa.RecordBatch:
        keep: list[int] = []
        etags: list[str] = []
        for i, key in enumerate(paths):
            try:
                etags.append(content_etag(os.path.join(root, key)))
            except FileNotFoundError:
                continue  # deleted since the scan
            except OSError as exc:
                self.malformed += 1
                logger.warning("skipping %s: cannot read it to hash: %s",
                               os.path.join(root, key), exc)
                continue
            keep.append(i)
        return _listing_batch([paths[i] for i in keep], [sizes[i] for i in keep],
                              [mtimes_ns[i] // 1000 for i in keep], etags)


def _microseconds(mtimes_ns: list[int]) -> pa.Array:
    """`st_mtime_ns // 1000` as UTC timestamps (floor division, also before 1970)."""
    ns = pa.array(mtimes_ns, pa.int64())
    if mtimes_ns and min(mtimes_ns) < 0:
        return pa.array([m // 1000 for m in mtimes_ns], pa.int64()).cast(_TIMESTAMP)
    return pc.divide(ns, 1000).cast(_TIMESTAMP)


def _listing_batch(paths: list[str], sizes: list[int], mtimes: list[int],
                   etags: list[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array(paths, pa.string()), pa.array(sizes, pa.int64()),
         pa.array(mtimes, _TIMESTAMP), pa.array(etags, pa.string())],
        schema=LISTING_SCHEMA,
    )


def list_local(root: str | Path, *, recursive: bool = True) -> Iterator[pa.RecordBatch]:
    """List a local volume in `LISTING_SCHEMA` batches (see `LocalLister`); root errors raise now.

    Example:
        >>> rows = sum(b.num_rows for b in list_local("/data/in"))   # doctest: +SKIP
    """
    return LocalLister(root, recursive=recursive).list()


class LocalReader(ObjectReader):
    """Read files of a local volume by relative path (`ObjectReader`); pickles as just its root.

    Paths are validated ('..', leading '/', ... raise `InvalidPathError`) and must resolve
    inside the root, so a symlink cannot lead a pipeline outside the volume. A missing file
    raises `ObjectNotFoundError` (a `FileNotFoundError`).

    Example:
        >>> reader = LocalReader("/data/in")                      # doctest: +SKIP
        >>> with reader.open("2024/cat.jpg") as f:                # doctest: +SKIP
        ...     header = f.read(16)
    """

    def __init__(self, root: str | Path) -> None:
        self.root = os.path.abspath(os.fspath(root))

    def __repr__(self) -> str:
        return f"LocalReader({self.root!r})"

    def url(self, relative_path: str) -> str:
        return file_url(self.root, relative_path)

    def path(self, relative_path: str) -> str:
        """The absolute path of `relative_path`, checked to stay inside the root."""
        validate_relative_path(relative_path)
        if relative_path.endswith("/"):
            raise InvalidPathError(f"not a file path: {relative_path!r}")
        path = os.path.join(self.root, *relative_path.split("/"))
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if os.path.commonpath([real_root, real]) != real_root:
            raise InvalidPathError(f"{relative_path!r} resolves outside the volume {self.root!r}")
        return path

    def open(self, relative_path: str) -> IO[bytes]:
        """Open a file as a buffered binary stream.

        Raises:
            InvalidPathError: the path is unsafe or leaves the root.
            ObjectNotFoundError: the file does not exist.
        """
        path = self.path(relative_path)
        try:
            return open(path, "rb")
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no such file in local volume: {path}") from exc

    def read_range(self, relative_path: str, start: int, length: int) -> bytes:
        """Read up to `length` bytes from offset `start` (fewer at the end, b"" past it).

        Example:
            >>> LocalReader("/data/in").read_range("a.png", 0, 4)   # doctest: +SKIP
            b'\\x89PNG'
        """
        if start < 0 or length < 0:
            raise ValueError(f"start and length must be >= 0: {start}, {length}")
        with self.open(relative_path) as f:
            f.seek(start)
            return f.read(length)
