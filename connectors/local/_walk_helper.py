"""The helper process of a local walk (`connectors.local._walk.HelperWalk`); standard library
only, run as `python -I -S _walk_helper.py ROOT` so it starts in milliseconds.

A walk is bound by `lstat` calls, which a second core could run, but threads of one Python
process fight over the GIL at every call (measured: two threads walk slower than one). This
process walks the directories it is sent while the caller walks others.

Protocol on stdin/stdout, little-endian, names as raw bytes (relative to ROOT, '/'-joined):

* request: `<II` length and budget (files), then the directories joined by NUL; length
  0xFFFFFFFF: exit.
* replies to one request, in order: any number of FILES frames, then one DONE frame.
  - FILES `<BI` (1, n), then n `<i` name lengths, the names, n `<q` sizes, n `<q` mtimes (ns),
    n `<i` ETag lengths and the ETags (`f"{mtime_ns:x}-{size:x}"`)
  - DONE `<BI` (2, length), then the directories left unvisited joined by NUL (the request
    is cut after its budget of files so the caller can share out the rest)
  - ERROR `<BI` (3, length), then `<i` errno and the directory that could not be read
"""

from __future__ import annotations

import os
import struct
import sys
from array import array

#: files per FILES frame
CHUNK = 4096
_HEAD = struct.Struct("<BI")
_REQUEST = struct.Struct("<II")


def _read_exact(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = stream.read(n - len(data))
        if not part:
            raise EOFError
        data += part
    return data


class _Chunk:
    def __init__(self) -> None:
        self.names: list[bytes] = []
        self.sizes = array("q")
        self.mtimes = array("q")

    def frame(self) -> bytes:
        # the ETags too (`connectors.local.store._etag`): this process has the spare core
        etags = [b"%x-%x" % pair for pair in zip(self.mtimes, self.sizes, strict=True)]
        return b"".join((_HEAD.pack(1, len(self.names)), array("i", map(len, self.names)).tobytes(),
                         b"".join(self.names), self.sizes.tobytes(), self.mtimes.tobytes(),
                         array("i", map(len, etags)).tobytes(), b"".join(etags)))


def read_entries(entries, prefix, add_name, add_size, add_mtime, add_dir) -> None:
    """The regular files of one open `os.scandir` iterator (closed here): name (`prefix` +
    entry name), size and mtime in ns through the three appenders; subdirectories through
    `add_dir` (None: not recursive). One tight loop with no per-file objects, shared by the
    caller's walk (`_walk._scan_dir`) and this helper's."""
    with entries:
        for entry in entries:
            try:
                if not entry.is_file(follow_symlinks=False):  # most entries are files
                    if add_dir is not None and entry.is_dir(follow_symlinks=False):
                        add_dir(prefix + entry.name)
                    continue
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            add_name(prefix + entry.name)
            add_size(st.st_size)
            add_mtime(st.st_mtime_ns)


def walk(root: bytes, dirs: list[bytes], out, budget: int) -> None:
    """Walk `dirs` (and below) depth first; write FILES frames and one DONE or ERROR."""
    stack = list(reversed(dirs))
    chunk = _Chunk()
    total = counted = 0
    while stack and total < budget:
        rel = stack.pop()
        prefix = rel + b"/" if rel else b""
        try:
            entries = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except PermissionError as exc:
            if chunk.names:
                out.write(chunk.frame())
            bad = os.path.join(root, rel)
            out.write(_HEAD.pack(3, len(bad)) + struct.pack("<i", exc.errno or 13) + bad)
            out.flush()
            return
        read_entries(entries, prefix, chunk.names.append, chunk.sizes.append,
                     chunk.mtimes.append, stack.append)
        total += len(chunk.names) - counted
        counted = len(chunk.names)
        if counted >= CHUNK:
            out.write(chunk.frame())
            chunk = _Chunk()
            counted = 0
    if chunk.names:
        out.write(chunk.frame())
    rest = b"\0".join(reversed(stack))
    out.write(_HEAD.pack(2, len(rest)) + rest)
    out.flush()


def main() -> None:
    root = os.fsencode(sys.argv[1])
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            length, budget = _REQUEST.unpack(_read_exact(inp, _REQUEST.size))
            if length == 0xFFFFFFFF:
                return
            dirs = _read_exact(inp, length).split(b"\0")
        except EOFError:
            return
        walk(root, dirs, out, budget)


if __name__ == "__main__":
    main()
