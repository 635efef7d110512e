"""Smoke test of `python -m benchmarks`: the quick sizes of `apply` and `stream_read` run in a
subprocess, print one ratio line per figure with its target and PASS/MISS, and write the JSON
summary to `.bench/results.json` under the working directory. Whether targets are met is not
checked here (that is what the full run reports)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"^\[(PASS|MISS|INFO)\] (\S+): .+\n\s+ours .+ \| .+ \| ratio (\d+\.\d+x|n/a)"
                    r" \| target .+$", re.MULTILINE)


def run_quick(cwd: Path, *only: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", ",".join(only)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_quick_apply_and_stream_read(tmp_path):
    proc = run_quick(tmp_path, "apply", "stream_read")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    figures = {m.group(2): (m.group(1), m.group(3)) for m in FIGURE.finditer(proc.stdout)}
    assert {"apply.mix", "apply.inserts"} <= set(figures), proc.stdout
    assert {name for name in figures if name.startswith("stream_read.arrow.")}, proc.stdout
    assert {name for name in figures if name.startswith("stream_read.spark.")}, proc.stdout
    assert all(status in ("PASS", "MISS") for status, _ in figures.values()), proc.stdout
    assert all(ratio.endswith("x") for _, ratio in figures.values()), proc.stdout
    assert "=== summary" in proc.stdout

    summary = json.loads((tmp_path / ".bench" / "results.json").read_text())
    assert summary["mode"] == "quick"
    assert summary["benchmarks_run"] == ["apply", "stream_read"]
    for name in ("apply", "stream_read"):
        section = summary["benchmarks"][name]
        assert section["error"] is None
        assert section["figures"]
        for fig in section["figures"]:
            assert fig["value"] > 0 and fig["baseline"] > 0
            assert fig["ratio"] == fig["value"] / fig["baseline"]
            assert fig["status"] in ("PASS", "MISS") and fig["target"]
    assert sum(summary["counts"].values()) == len(figures)


def test_unknown_benchmark_is_rejected(tmp_path):
    proc = run_quick(tmp_path, "nope")
    assert proc.returncode == 2
    assert "unknown benchmark" in proc.stderr


def test_quick_tables(tmp_path):
    proc = run_quick(tmp_path, "tables")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = {m.group(2): m.group(1) for m in FIGURE.finditer(proc.stdout)}
    assert {n.split(".")[1] for n in figures} == {"standard_read", "update"}, proc.stdout
    assert set(figures.values()) <= {"PASS", "MISS"}


def test_quick_keyindex(tmp_path):
    proc = run_quick(tmp_path, "keyindex")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = {m.group(2): m.group(1) for m in FIGURE.finditer(proc.stdout)}
    assert set(figures) == {"keyindex.rebuild", "keyindex.rebuild.cpu", "keyindex.rebuild.rss",
                            "keyindex.lookup2k",
                            "keyindex.apply2k", "keyindex.merge", "keyindex.apply2k.sustained",
                            "keyindex.reopen"}, proc.stdout
    assert set(figures.values()) <= {"PASS", "MISS", "INFO"}
