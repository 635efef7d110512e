"""Leave a command-line process without running native libraries' teardown.

delta-rs (and pyarrow's thread pools under it) can abort the interpreter *after* the work is done
("terminate called without an active exception", SIGABRT): background threads of the native
runtime still run while static destructors execute at exit (delta-io/delta-rs#2184). Threaded
scans made it frequent and are single-threaded now; a rare abort remained under heavy load. A
command's result is its output and its exit code, so the entry point (`volume-stream`) runs the
Python exit handlers (`atexit`: temp folders, logging), flushes what it wrote and ends with
`os._exit`, which skips the native teardown that follows them. Library code never calls this.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__ = ["exit_process"]


def exit_process(code: int | str | None) -> None:
    """Flush stdout/stderr and logging, then end the process with `code` (SystemExit rules:
    None is 0, an int is itself, anything else is printed and gives 1)."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()  # what a normal exit runs first (incl. logging.shutdown)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(status)
