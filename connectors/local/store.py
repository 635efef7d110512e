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
from typing import IO

import pyarrow as pa

from connectors.errors import ObjectNotFoundError
from connectors.events import InvalidPathError, validate_relative_path
from connectors.protocols import LISTING_SCHEMA, Lister, ObjectReader

__all__ = ["LocalLister", "LocalReader", "content_etag", "file_url", "list_local"]

logger = logging.getLogger("connectors.local")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
# Characters `_check_key` rejects in a name; surrogates stand for undecodable bytes.
_SUSPECT = re.compile(r"[\x00-\x1f\x7f\\\ud800-\udfff]")

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


def _scan_dir(root: str, rel_dir: str, *, recursive: bool, strict: bool,
              ) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """One directory of a walk: its regular files as `(key, lstat)`, and its sub-directories
    (keys) when `recursive`. See `_scan` for what is skipped and what raises."""
    path = os.path.join(root, rel_dir) if rel_dir else root
    prefix = rel_dir + "/" if rel_dir else ""
    files: list[tuple[str, os.stat_result]] = []
    subdirs: list[str] = []
    try:
        entries = os.scandir(path)
    except (FileNotFoundError, NotADirectoryError):
        return files, subdirs
    except PermissionError as exc:
        if strict:
            raise PermissionError(exc.errno, "cannot list directory of local volume",
                                  path) from exc
        logger.warning("cannot list %s: %s", path, exc)
        return files, subdirs
    with entries:
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        subdirs.append(prefix + entry.name)
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            files.append((prefix + entry.name, st))
    return files, subdirs


def _scan(root: str, top: str = "", *, recursive: bool, strict: bool,
          workers: int = 1) -> Iterator[tuple[str, os.stat_result]]:
    """Yield `(key, lstat)` for the regular files under `root/top` (`top` a '/'-key, '' = root).

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
        files, subdirs = _scan_dir(root, stack.pop(), recursive=recursive, strict=strict)
        stack.extend(subdirs)
        yield from files


def _scan_parallel(root: str, top: str, *, strict: bool,
                   workers: int) -> Iterator[tuple[str, os.stat_result]]:
    with ThreadPoolExecutor(workers, thread_name_prefix="scan") as pool:
        running: set[Future] = {pool.submit(_scan_dir, root, top, recursive=True,
                                            strict=strict)}
        waiting: list[str] = []
        try:
            while running:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    files, subdirs = future.result()
                    waiting.extend(subdirs)
                    # keep the pool busy, but hold at most a few directories' files at once
                    while waiting and len(running) < 2 * workers:
                        running.add(pool.submit(_scan_dir, root, waiting.pop(), recursive=True,
                                                strict=strict))
                    yield from files
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
        mtimes: list[int] = []
        etags: list[str] = []
        for key, st in _scan(root, recursive=self.recursive, strict=True,
                             workers=self.workers):
            try:
                # Keys joined from scandir names never have empty, '.' or '..' segments, so
                # only names with suspect characters need the full (slower) validation.
                if _SUSPECT.search(key):
                    _check_key(key)
            except InvalidPathError as exc:
                self.malformed += 1
                if self.malformed <= 10:
                    logger.warning("skipping %s: %s", os.path.join(root, key), exc)
                continue
            if self.hash_content:
                try:
                    etag = content_etag(os.path.join(root, key))
                except FileNotFoundError:
                    continue  # deleted since the scan
                except OSError as exc:
                    self.malformed += 1
                    logger.warning("skipping %s: cannot read it to hash: %s",
                                   os.path.join(root, key), exc)
                    continue
            else:
                etag = _etag(st)
            paths.append(key)
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns // 1000)
            etags.append(etag)
            if len(paths) >= self.batch_size:
                yield _listing_batch(paths, sizes, mtimes, etags)
                paths, sizes, mtimes, etags = [], [], [], []
        if paths:
            yield _listing_batch(paths, sizes, mtimes, etags)
        if self.malformed:
            logger.warning("skipped %d files with unsafe names under %s", self.malformed, root)


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
