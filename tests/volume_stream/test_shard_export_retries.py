"""`max_retries` of the DataX-style export, with real transient storage errors: a warehouse on
S3 (moto's server, own process) read through the fault-injecting proxy (own process too:
delta-rs must not talk to a server in the test's process) failing a share of requests with
500 InternalError / 503 SlowDown. delta-rs's own retries are off (`max_retries: 0` in the
storage options), so every fault reaches the exporter, which classifies it with
`connectors.errors.is_transient` and retries the step."""

# ruff: noqa: F811  (pytest fixtures imported from tests.s3_warehouse_fixtures, used as arguments)
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import volume_stream as vs
from directory_table.errors import storage_transient
from tests.fakes.faulty_proxy_process import FaultyProxyProcess
from tests.s3_warehouse_fixtures import child_env, moto_process, s3_bucket, s3_env  # noqa: F401
from volume_stream.errors import VolumeStreamError, WarehouseError

FAULTS = ("error500", "slowdown503")


def rows_of(out: Path) -> list[tuple]:
    files = sorted(out.glob("part-*.parquet"))
    return sorted((tuple(r.values()) for f in files for r in pq.read_table(f).to_pylist()),
                  key=repr)


def through(proxy: FaultyProxyProcess, uri: str) -> vs.Catalog:
    """The warehouse as a process behind the proxy sees it (delta-rs not retrying itself)."""
    return vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint,
                                            "max_retries": "0"})


@pytest.fixture
def s3_volume(s3_env, s3_bucket, tmp_path, ev):
    """A volume on an S3 warehouse with inserts, an overwrite and a delete; (uri, end_ms)."""
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri)
    (tmp_path / "data").mkdir()
    cat.create_volume("vol", str(tmp_path / "data"))
    table = cat.directory_table("vol")
    table.apply([ev.put(f"f{i}.txt", i + 1) for i in range(3)])
    table.apply([ev.put("f0.txt", 10), ev.rm("f1.txt"), ev.put("g.txt", 5)])
    end = int(time.time() * 1000) + 1
    while time.time() * 1000 <= end:  # the range has ended
        time.sleep(0.001)
    return uri, cat, end


def test_export_outlives_transient_faults_exactly(s3_env, s3_volume, tmp_path):
    uri, cat, end = s3_volume
    clean = cat.export_changes("vol", safety_lag_ms=0,
                               start_ms=0, end_ms=end, out=tmp_path / "clean")
    assert clean.records == 6 and clean.retries == 0
    # seed 9 fails the 5th, 49th and 91st requests after `resume` (then more), whatever they are
    with FaultyProxyProcess(s3_env, rate=0.02, faults=FAULTS, seed=9, paused=True) as proxy:
        faulty = through(proxy, uri)
        proxy.resume()
        res = faulty.export_changes("vol", safety_lag_ms=0,
                                    start_ms=0, end_ms=end, out=tmp_path / "faulty",
                                    status_table="export_status", max_retries=30)
        counts = proxy.counts()
    assert counts.get("error500", 0) + counts.get("slowdown503", 0) > 0
    assert res.retries > 0                         # the exporter outlived some of them
    assert (res.records, res.rows) == (clean.records, clean.rows)
    assert rows_of(tmp_path / "faulty") == rows_of(tmp_path / "clean")  # no dup, none missing
    # the status table (on S3, written through the proxy) says the range is done
    again = cat.export_changes("vol", safety_lag_ms=0,
                               start_ms=0, end_ms=end, out=tmp_path / "faulty",
                               status_table="export_status")
    assert again.rows == 0 and again.windows_skipped >= 1
    assert rows_of(tmp_path / "faulty") == rows_of(tmp_path / "clean")


@pytest.mark.slow  # exports through the fault proxy in real CLI processes: make soak
def test_persisting_faults_without_retries_fail_naming_the_range(s3_env, s3_volume, tmp_path):
    uri, cat, end = s3_volume
    with FaultyProxyProcess(s3_env, rate=1.0, faults=FAULTS, seed=1, paused=True) as proxy:
        faulty = through(proxy, uri)
        proxy.resume()
        with pytest.raises(WarehouseError) as info:
            faulty.export_changes("vol", safety_lag_ms=0,
                                  start_ms=0, end_ms=end, out=tmp_path / "out",
                                  max_retries=0)
    assert isinstance(info.value, VolumeStreamError)
    message = str(info.value)
    assert "'vol'" in message and f"[0, {end}) ms" in message  # volume or table
    assert "after 0 retries" in message and "transient" in message
    assert storage_transient(info.value.__cause__)  # what the proxy sent: a 500 or a 503
    assert not list((tmp_path / "out").glob("part-*"))  # nothing half-written


def export_cli(uri: str, proxy: FaultyProxyProcess, out: Path, end: int, retries: int
               ) -> subprocess.CompletedProcess:
    """`volume-stream export` in its own process, its warehouse seen through the proxy (the
    status table named after `out`)."""
    env = child_env(proxy.endpoint)
    env["VOLUME_STREAM_STORAGE_OPTIONS"] = json.dumps({"AWS_ENDPOINT_URL": proxy.endpoint,
                                                      "max_retries": "0"})
    return subprocess.run(
        [str(Path(sys.executable).parent / "volume-stream"), "export", "multi", "--warehouse",
         uri, "--start-ms", "0", "--end-ms", str(end), "--out", str(out), "--status-table",
         f"status_{out.name}", "--max-retries", str(retries), "--safety-lag-ms", "0"],
        capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow  # exports through the fault proxy in real CLI processes: make soak
def test_the_cli_retries_then_a_failed_run_resumes_without_loss_or_duplicates(
        s3_env, s3_bucket, tmp_path, ev):
    """Issue 25 item 3: `--max-retries N` outlives injected 500/503s; a run with
    `--max-retries 0` fails on the first one (exit 1, one line naming what failed), and
    running it again once the faults are over resumes from the status table: every row once.
    Four shards, so a failed run may have finished some of them, which the next run skips."""
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri)
    (tmp_path / "data").mkdir()
    cat.create_volume("multi", str(tmp_path / "data"), shards=4)
    table = cat.directory_table("multi")
    table.apply([ev.put(f"d/{i}.txt", i + 1) for i in range(24)])
    table.apply([ev.put(f"d/{i}.txt", 100) for i in range(0, 24, 3)] + [ev.rm("d/1.txt")])
    end = int(time.time() * 1000) + 1
    while time.time() * 1000 <= end:  # the range has ended
        time.sleep(0.001)
    clean = cat.export_changes("multi", safety_lag_ms=0, start_ms=0, end_ms=end,
                               out=tmp_path / "clean")
    assert clean.records == 24 + 9
    with FaultyProxyProcess(s3_env, rate=0.05, faults=FAULTS, seed=3, paused=True) as proxy:
        proxy.resume()
        retried = export_cli(uri, proxy, tmp_path / "retried", end, retries=30)
        assert retried.returncode == 0, retried.stderr
        totals = json.loads(retried.stdout.strip().splitlines()[-1])
        assert totals["retries"] > 0 and totals["records"] == clean.records
        assert rows_of(tmp_path / "retried") == rows_of(tmp_path / "clean")

        failed = export_cli(uri, proxy, tmp_path / "again", end, retries=0)
        assert failed.returncode == 1 and "Traceback" not in failed.stderr
        # a failed step names the volume; opening the warehouse (before any export step,
        # not retried by the export) names the warehouse
        assert ("'multi'" in failed.stderr and "after 0 retries" in failed.stderr) or \
            f"warehouse {uri}" in failed.stderr, failed.stderr
        proxy.pause()                                # the faults are over: run it again
        resumed = export_cli(uri, proxy, tmp_path / "again", end, retries=0)
        assert resumed.returncode == 0, resumed.stderr
        counts = proxy.counts()
    assert counts.get("error500", 0) + counts.get("slowdown503", 0) > 0
    assert rows_of(tmp_path / "again") == rows_of(tmp_path / "clean")   # none lost, no dup
