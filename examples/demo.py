"""End-to-end demo on the embedded default: a local folder volume, local Spark, a local warehouse.

    make demo                      # or: python examples/demo.py [--workdir DIR]

Without --workdir it works in a temporary folder and removes it at the end; with --workdir the
folder (data and warehouse) stays, for trying the CLI on it.

It writes files into a fresh folder, backfills them with `refresh`, then lets the inotify
listener pick up an overwrite, a delete and a new file; prints what a STANDARD and an
APPEND_ONLY stream return (the UPDATE_BEFORE/UPDATE_AFTER pair and the DELETE are visible in
the first, only INSERTs in the second), consumes both, and shows they are empty afterwards.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import volume_stream as vs

COLUMNS = ["relative_path", "size", "__change_type", "__commit_version", "__commit_timestamp"]


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where to put the data folder and the warehouse (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="volume-stream-demo-"))
    try:
        run(workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {time.monotonic() - started:.1f}s")
    print(try_next(args.workdir), flush=True)


def try_next(workdir: Path | None) -> str:
    """What to run next. `volume-stream` lives in the virtual environment's bin folder, which
    is not on PATH until the environment is activated: say so, with the real paths."""
    bin_dir = Path(sys.executable).parent
    found = shutil.which("volume-stream")
    lines = [""]
    if found and Path(found).resolve() == (bin_dir / "volume-stream").resolve():
        lines.append("Next:")
    else:
        where = os.path.relpath(bin_dir)
        lines += [f"Next (volume-stream is in {where}, which is not on PATH until you activate "
                  f"the environment; or type {where}/volume-stream):", f"  . {where}/activate"]
    lines.append("  volume-stream --help")
    if workdir is None:
        lines.append("  python examples/demo.py --workdir /tmp/vs-demo   # keeps its warehouse")
    else:
        lines.append(f"  volume-stream stream describe changes --warehouse {workdir / 'warehouse'}")
    return "\n".join(lines)


def run(workdir: Path) -> None:
    data, warehouse = workdir / "landing", workdir / "warehouse"
    data.mkdir(parents=True, exist_ok=True)

    say(f"warehouse {warehouse}, volume folder {data}")
    for name in ["logs/app-1.log", "logs/app-2.log", "images/cat.jpg", "readme.txt"]:
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text(f"first version of {name}\n")

    cat = vs.connect(warehouse)
    cat.create_volume("landing", data, replace=True)
    m = cat.refresh("landing")
    say(f"refresh backfilled {m.inserted} existing files as version {m.version}")
    cat.create_stream("changes", on_volume="landing", replace=True)
    cat.create_stream("arrivals", on_volume="landing", mode="APPEND_ONLY", replace=True)
    say("created streams 'changes' (STANDARD) and 'arrivals' (APPEND_ONLY) at version "
        f"{cat.describe_stream('changes')['offset']}")

    say("watching: overwrite readme.txt, delete logs/app-1.log, add images/dog.jpg")
    watcher = cat.watcher("landing")
    with watcher.listener:
        (data / "readme.txt").write_text("second, longer version of readme.txt\n")
        (data / "logs/app-1.log").unlink()
        tmp = workdir / "dog.jpg.part"
        tmp.write_bytes(b"\xff\xd8 not really a jpeg")
        tmp.rename(data / "images/dog.jpg")  # rename into place: appears complete
        time.sleep(0.5)
        metrics = watcher.run(until_idle=True, timeout=30)
    say(f"listener committed versions {metrics.versions} ({metrics.applied} changes)")

    for stream in ("changes", "arrivals"):
        mode = cat.describe_stream(stream)["mode"]
        say(f"stream '{stream}' ({mode}): pending change records")
        cat.read_stream(stream).select(COLUMNS).orderBy("__commit_version", "relative_path",
                                                        "__change_type").show(truncate=False)

    for stream in ("changes", "arrivals"):
        with cat.consume(stream) as batch:
            n = batch.df.count()
        say(f"consumed {n} record{'' if n == 1 else 's'} of '{stream}' as batch {batch.batch_id} "
            f"(versions {batch.start_version}..{batch.end_version}); pending now: "
            f"{cat.describe_stream(stream)['pending_changes']}")



if __name__ == "__main__":
    main()
