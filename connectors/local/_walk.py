"""Walking a local volume (`connectors.local.store.LocalLister`, the pending-file scans).

`_scan` yields a tree's regular files a directory at a time (`_Dir`, plain columns, no
per-file objects). A big walk is shared with one helper process (`_HelperWalk`,
`_walk_helper.py`): `lstat` dominates a walk and releases the GIL, but threads of one process
fight over the GIL at every call (measured: two scanning threads are slower than one), while
two processes walk twice as fast. The helper starts once the walk has seen `HELPER_AFTER`
entries with directories left to share, takes the shallowest pending directories (the bottom
half of the pending stack: the biggest sub-trees left), walks up to `BUDGET` files below them
and hands back the rest. Its files arrive as `_Files` (Arrow paths, NumPy sizes and mtimes). A helper that cannot start or
dies gives its directories back: the caller walks them itself, nothing is lost or listed twice.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from connectors.local._walk_helper import read_entries

__all__ = ["HELPER_AFTER", "_Dir", "_Files", "_HelperWalk", "_scan", "_scan_dir"]

logger = logging.getLogger("connectors.local")

#: entries (files and folders) walked before the helper process is started
HELPER_AFTER = 100_000
#: files the helper walks per request before it hands the directories left back (small: the
#: caller shares them out; a round trip costs far less than walking 1k files)
BUDGET = 4096
_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_walk_helper.py")
_HEAD = struct.Struct("<BI")
_WAKE = object()


class _Dir(NamedTuple):
    """The regular files of one directory, as columns, and its sub-directories (keys)."""

    paths: list[str]
    sizes: list[int]
    mtimes_ns: list[int]
    subdirs: list[str]


class _Files(NamedTuple):
    """Files walked by the helper: keys (an Arrow string array, or a list of str holding
    undecodable names as surrogates), sizes, mtimes in ns and ETags (mtime and size)."""

    paths: pa.Array | list[str]
    sizes: np.ndarray
    mtimes_ns: np.ndarray
    etags: pa.Array


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
    read_entries(entries, prefix, found.paths.append, found.sizes.append,
                 found.mtimes_ns.append, found.subdirs.append if recursive else None)
    return found


def _scan(root: str, top: str = "", *, recursive: bool, strict: bool,
          workers: int = 1, helper: bool = False) -> Iterator[_Dir | _Files]:
    """Yield the regular files under `root/top` (`top` a '/'-key, '' = root), a directory at
    a time (`_Dir`: keys, sizes, mtimes in ns), and with `helper` also `_Files` walked by the
    helper process (module docstring).

    Symlinks and special files are skipped. A directory that vanishes mid-walk is skipped; one
    that cannot be read raises `PermissionError` when `strict` (a refresh must not mistake it
    for an empty directory and delete its rows), else it is logged and skipped. With
    `workers > 1` sub-directories are scanned on a pool of threads; the files are the same,
    their order is not.
    """
    if workers > 1 and recursive:
        yield from _scan_parallel(root, top, strict=strict, workers=workers)
        return
    if helper and recursive:
        yield from _HelperWalk(root, top, strict).run()
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


class _HelperDied(Exception):
    pass


class _HelperWalk:
    """One walk shared with a helper process (module docstring)."""

    def __init__(self, root: str, top: str, strict: bool) -> None:
        self.root, self.strict = root, strict
        self.pending: list[str] = [top]    # a stack: the caller pops the top, the helper the
        self.lock = threading.Lock()       # bottom
        self.busy = False
        self.results: queue.Queue[Any] = queue.Queue()
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self.budget = BUDGET

    def start(self) -> None:
        """Start the helper now (the caller knows the walk is big): it takes the top
        directory while the caller does other work."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, name="walk-helper", daemon=True)
            self.thread.start()

    def close(self) -> None:
        """Stop the helper (also when the walk was never iterated)."""
        self._close()

    def run(self) -> Iterator[_Dir | _Files]:
        seen = 0
        try:
            while True:
                while not self.results.empty():
                    item = self._item(self.results.get_nowait())
                    if item is not None:
                        yield item
                with self.lock:
                    rel = self.pending.pop() if self.pending else None
                    busy = self.busy
                if rel is None:
                    if not busy:
                        if self.results.empty():
                            return
                        continue
                    item = self._item(self.results.get())
                    if item is not None:
                        yield item
                    continue
                found = _scan_dir(self.root, rel, recursive=True, strict=self.strict)
                if found.subdirs:
                    with self.lock:
                        self.pending.extend(found.subdirs)
                    self.wake.set()
                seen += len(found.paths) + len(found.subdirs)
                if self.thread is None and seen >= HELPER_AFTER and len(self.pending) > 1:
                    self.start()
                yield found
        finally:
            self._close()

    def _item(self, item: Any) -> _Files | None:
        if isinstance(item, BaseException):
            raise item
        return None if item is _WAKE else item

    def _close(self) -> None:
        self.stop.set()
        self.wake.set()
        if self.thread is None or not self.thread.is_alive():
            return
        with self.lock:
            busy = self.busy
        if busy and self.proc is not None:
            self.proc.kill()  # the walk was abandoned mid-request: unblock the reader
        # not joined: the thread ends the helper and reaps it on its own (a daemon thread)

    # ------------------------------------------------------------------ the helper's side
    def _serve(self) -> None:
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", _HELPER, self.root],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            logger.info("local walk goes on alone: no helper process (%s)", exc)
            return
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - never leave the caller waiting
            with self.lock:
                self.busy = False
            self.results.put(exc)
        finally:
            self._end_helper()

    def _loop(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                # the bottom half of the stack: the shallowest directories, the most work
                take = self.pending[:max(1, len(self.pending) // 2)] if self.pending else []
                del self.pending[:len(take)]
                self.busy = bool(take)
            if not take:
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            try:
                files, rest = self._request(take)
            except _HelperDied as exc:
                with self.lock:
                    self.pending[0:0] = take  # walked again by the caller
                    self.busy = False
                if not self.stop.is_set():
                    logger.warning("local walk goes on alone: %s", exc)
                self.results.put(_WAKE)
                return
            except PermissionError as exc:
                with self.lock:
                    self.busy = False
                self.results.put(exc)
                return
            for item in files:
                self.results.put(item)
            with self.lock:
                self.pending[0:0] = rest
                self.busy = False
            self.results.put(_WAKE)

    def _request(self, dirs: list[str]) -> tuple[list[_Files], list[str]]:
        """Walk `dirs` (up to the helper's budget): their files, and the directories left."""
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        payload = b"\0".join(os.fsencode(d) for d in dirs)
        try:
            self.proc.stdin.write(struct.pack("<II", len(payload), self.budget) + payload)
            self.proc.stdin.flush()
            files: list[_Files] = []
            out = self.proc.stdout
            while True:
                kind, n = _HEAD.unpack(_exact(out, _HEAD.size))
                if kind == 1:
                    files.append(_decode(out, n))
                elif kind == 2:
                    rest = _exact(out, n)
                    return files, [os.fsdecode(d) for d in rest.split(b"\0")] if rest else []
                elif kind == 3:
                    (code,) = struct.unpack("<i", _exact(out, 4))
                    path = os.fsdecode(_exact(out, n))
                    if not self.strict:  # only refreshes walk with the helper: strict
                        raise _HelperDied(f"cannot list {path}")
                    raise PermissionError(code or errno.EACCES,
                                          "cannot list directory of local volume", path)
                else:
                    raise _HelperDied(f"bad frame {kind}")
        except (PermissionError, _HelperDied):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever broke, the caller walks on alone
            raise _HelperDied(f"helper process failed: {exc!r}") from exc

    def _end_helper(self) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin:
                proc.stdin.write(struct.pack("<II", 0xFFFFFFFF, 0))
                proc.stdin.flush()
        except OSError:
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exact(stream: Any, n: int) -> bytes:
    data = stream.read(n) if n else b""
    if len(data) != n:
        raise _HelperDied(f"helper output ended ({len(data)} of {n} bytes)")
    return data


def _strings(stream: Any, n: int) -> tuple[np.ndarray, bytes, pa.Array]:
    """n `<i` lengths and the strings: (offsets, bytes, the Arrow array, not validated)."""
    lengths = np.frombuffer(_exact(stream, 4 * n), dtype="<i4")
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = _exact(stream, int(offsets[-1]))
    return offsets, data, pa.StringArray.from_buffers(n, pa.py_buffer(offsets),
                                                      pa.py_buffer(data))


def _decode(stream: Any, n: int) -> _Files:
    offsets, names, paths = _strings(stream, n)
    sizes = np.frombuffer(_exact(stream, 8 * n), dtype="<i8")
    mtimes = np.frombuffer(_exact(stream, 8 * n), dtype="<i8")
    etags = _strings(stream, n)[2]  # ASCII
    try:
        paths.validate(full=True)
    except pa.ArrowInvalid:  # undecodable bytes in a name: the caller checks every key
        paths = [os.fsdecode(names[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return _Files(paths, sizes, mtimes, etags)
