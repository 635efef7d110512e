"""Command line: `python -m benchmarks [--quick] [--only NAME[,NAME]] [--output PATH]`.

Prints every figure as it is measured, then a summary, and writes the JSON summary (default
`.bench/results.json`). The exit status is 0 when every selected benchmark ran (whether or not
its targets were met), 1 when one of them failed with an error, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from importlib.metadata import version

from benchmarks import BENCHMARKS
from benchmarks._context import Context
from benchmarks._report import Report, write_json

DEFAULT_OUTPUT = ".bench/results.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only these benchmarks (repeatable or comma-separated): "
                             f"{', '.join(BENCHMARKS)}")
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes only (seconds, not minutes; used by the smoke test)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help=f"where to write the JSON summary (default {DEFAULT_OUTPUT})")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the measured operation when a target is missed")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch folders (paths are printed)")
    args = parser.parse_args(argv)
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    args.names = [n for n in BENCHMARKS if not names or n in names]
    return args


def environment(ctx: Context) -> dict:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(), "load_avg_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(), "platform": platform.platform(),
        "versions": {p: version(p) for p in ("pyspark", "deltalake", "pyarrow")},
        "workdir": str(ctx.workdir), "datadir": str(ctx.datadir),
    }


def print_header(ctx: Context, env: dict, names: list[str]) -> None:
    cpus, load = env["cpus"], env["load_avg_1_5_15"][0]
    print(f"volume-stream benchmarks ({'quick' if ctx.quick else 'full'}): {', '.join(names)}")
    print(f"python {env['python']}, " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()))
    print(f"{cpus} CPUs, load average {load:.2f} at start"
          + ("  <- other processes are busy: figures may be noisy" if load > 0.5 * cpus else ""))
    print(f"scratch: {ctx.workdir} (tables), {ctx.datadir} (volume files)")
    print("each line: ours | baseline measured in this run | ratio ours/baseline | target")


def run_one(ctx: Context, name: str) -> None:
    module = BENCHMARKS[name]
    section = ctx.report.begin(name, module.TITLE)
    started = time.perf_counter()
    try:
        module.run(ctx)
    except Exception as exc:  # report and carry on with the other benchmarks
        section.error = f"{type(exc).__name__}: {exc}"
        print(f"  ERROR in {name}:\n{traceback.format_exc()}", file=sys.stderr)
    section.seconds = time.perf_counter() - started
    print(f"  ({name} took {section.seconds:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    report = Report(echo=lambda line: print(line, flush=True))
    ctx = Context(report, quick=args.quick, profile=args.profile, keep=args.keep)
    env = environment(ctx)
    print_header(ctx, env, args.names)
    started, started_at = time.perf_counter(), datetime.now(UTC)
    try:
        for name in args.names:
            run_one(ctx, name)
    finally:
        ctx.close()
    seconds = time.perf_counter() - started
    for line in report.summary_lines():
        print(line)
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"total {seconds:.1f} s; load average {load_end[0]:.2f} at the end")
    out = write_json(args.output, {
        "started_at": started_at.isoformat(), "seconds": round(seconds, 3),
        "mode": "quick" if ctx.quick else "full", "benchmarks_run": args.names,
        "environment": {**env, "load_avg_end": load_end}, "counts": report.counts(),
        "benchmarks": report.as_dict(),
    })
    print(f"wrote {out}")
    return 1 if any(s.error for s in report.sections) else 0


if __name__ == "__main__":
    sys.exit(main())
