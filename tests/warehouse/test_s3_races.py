"""Two processes racing commits on one S3 warehouse (moto in its own process): streams
created, events applied, offsets consumed. Nothing is lost, nothing is applied or consumed
twice, also when one writer is SIGKILLed again and again. This rests on delta-rs's
conditional PUT (If-None-Match), which moto honours."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import volume_stream as vs
from tests.s3_warehouse_fixtures import child_env

ROOT = Path(__file__).resolve().parents[2]


def racer(uri: str, name: str, n: int, endpoint: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "tests.warehouse.racer", uri, name, str(n)],
                            cwd=ROOT, env=child_env(endpoint), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def lines(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def setup(uri: str, tmp_path: Path) -> vs.Catalog:
    cat = vs.connect(uri)
    cat.create_volume("v", str(tmp_path))
    cat.create_stream("shared", on_volume="v")
    return cat


def check_consumed(cat: vs.Catalog, steps: list[dict], *, complete: bool) -> None:
    """Reported consumptions never overlap; with `complete`, they plus what is still pending
    cover every applied file exactly once."""
    ranges = sorted((s["start"], s["end"]) for s in steps if s["step"] == "consume")
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end <= start, f"two consumers moved the offset over the same versions: {ranges}"
    offset = cat.describe_stream("shared")["offset"]
    assert all(end <= offset for _, end in ranges)
    if complete:
        paths = [p for s in steps if s["step"] == "consume" for p in s["paths"]]
        paths += cat.read_stream_arrow("shared")["relative_path"].to_pylist()
        applied = sorted(s["path"] for s in steps if s["step"] == "apply")
        assert sorted(paths) == applied  # each file consumed exactly once


def test_two_processes_racing_lose_nothing_and_duplicate_nothing(s3_env, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/wh"
    cat = setup(uri, tmp_path)
    n = 12
    procs = [racer(uri, name, n, s3_env) for name in ("a", "b")]
    steps = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, (out[-1000:], err[-3000:])
        steps += lines(out)
    streams = {s["name"] for s in cat.list_streams()}
    assert streams >= {f"s_{x}_{i}" for x in "ab" for i in range(n)}  # no stream lost
    snapshot = cat.directory_table("v").snapshot()
    assert sorted(snapshot["relative_path"].to_pylist()) == \
        sorted(f"{x}/{i}.txt" for x in "ab" for i in range(n))
    versions = [s["version"] for s in steps if s["step"] == "apply"]
    assert sorted(versions) == list(range(1, 2 * n + 1))  # one version per apply, none shared
    check_consumed(cat, steps, complete=True)


@pytest.mark.slow  # writer processes SIGKILLed mid-commit, three rounds: make soak
def test_a_writer_killed_during_commits_leaves_a_consistent_warehouse(s3_env, s3_bucket,
                                                                     tmp_path):
    uri = f"s3://{s3_bucket}/wh"
    setup(uri, tmp_path)
    steady = racer(uri, "steady", 10, s3_env)
    steps: list[dict] = []
    for round_ in range(3):
        victim = racer(uri, f"k{round_}", 50, s3_env)
        seen: list[dict] = []
        deadline = time.monotonic() + 300
        while len(seen) < 4 + round_ and time.monotonic() < deadline:  # kill mid-run
            line = victim.stdout.readline()
            if not line:
                break
            seen += lines(line)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        victim.stdout.close()
        victim.stderr.close()
        steps += seen
    out, err = steady.communicate(timeout=600)
    assert steady.returncode == 0, err[-3000:]
    steps += lines(out)
    again = vs.connect(uri)  # the catalog and the table are readable after the kills
    stored = set(again.directory_table("v").snapshot()["relative_path"].to_pylist())
    assert {s["path"] for s in steps if s["step"] == "apply"} <= stored  # nothing lost
    names = {s["name"] for s in again.list_streams()}
    assert {s["name"] for s in steps if s["step"] == "stream"} <= names
    history = again.history("v")
    assert [h["version"] for h in history] == list(range(len(history) - 1, -1, -1))
    check_consumed(again, steps, complete=False)
