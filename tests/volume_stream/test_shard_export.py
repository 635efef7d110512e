"""DataX-style export of a change log: windows at exact boundaries, rows per column version,
status-table resume (also after SIGKILL), formats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import volume_stream as vs
from volume_stream.errors import InvalidInputError
from volume_stream.shards.export import CRASH_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def ended(end_ms):
    """end_ms, once the clock has passed it (these tests export with `safety_lag_ms=0`: every
    commit is written before the export starts, none can be in flight)."""
    while time.time() * 1000 <= end_ms:
        time.sleep(0.001)
    return end_ms


def apply(cat, *events, volume="vol"):
    return cat.directory_table(volume).apply(events).version


def ms(cat, volume, version):
    (h,) = [h for h in cat.history(volume) if h["version"] == version]
    return int(h["timestamp"].timestamp() * 1000)


def rows_of(out, fmt="parquet"):
    if fmt == "delta":
        return DeltaTable(str(out)).to_pyarrow_table().to_pylist()
    files = sorted(Path(out).glob(f"part-*.{fmt}"))
    tables = [pq.read_table(f) if fmt == "parquet" else pacsv.read_csv(f) for f in files]
    return [r for t in tables for r in t.to_pylist()]


def key(r):
    return (r["relative_path"], r["version"], r["op_type"] != "DR", r["column_name"] or "")


def test_rows_per_column_version_and_exact_window(cat, data_dir, ev, tmp_path):
    cat.create_volume("vol", data_dir, shards=2)
    apply(cat, ev.put("early.txt", 1))                             # v1: before the window
    apply(cat, ev.put("a.txt", 2))                                 # v2: start (included)
    apply(cat, ev.put("a.txt", 3), ev.rm("early.txt"))             # v3
    apply(cat, ev.put("late.txt", 4))                              # v4: end (excluded)
    a, b = ms(cat, "vol", 2), ms(cat, "vol", 4)
    res = cat.export_changes("vol", safety_lag_ms=0, start_ms=a, end_ms=b, out=tmp_path / "out")
    rows = sorted(rows_of(tmp_path / "out"), key=key)
    t2, t3 = a, ms(cat, "vol", 3)
    cols = ["url", "size", "last_modified_time", "etag"]
    assert [(r["relative_path"], r["column_name"], r["version"], r["op_type"]) for r in rows] == (
        [("a.txt", c, t2, "U") for c in sorted(cols)]
        + [("a.txt", None, t3, "DR")] + [("a.txt", c, t3, "U") for c in sorted(cols)]
        + [("early.txt", None, t3, "DR")])
    sizes = {r["version"]: r["column_value"] for r in rows if r["column_name"] == "size"}
    assert sizes == {t2: "2", t3: "3"}
    assert set(rows[0]) == {"relative_path", "column_name", "version", "column_value", "op_type"}
    assert res.rows == len(rows) == 10 and res.records == 3
    # the window before: only v1
    res = cat.export_changes("vol", safety_lag_ms=0, start_ms=0, end_ms=a, out=tmp_path / "before",
                             export_sequence_info=True)
    before = rows_of(tmp_path / "before")
    assert {r["relative_path"] for r in before} == {"early.txt"} and len(before) == 4
    assert all(r["sequence_info"].startswith("shardId-") for r in before)


def test_status_table_rerun_exports_nothing_new(cat, data_dir, ev, tmp_path):
    cat.create_volume("vol", data_dir, shards=3)
    apply(cat, *[ev.put(f"f{i}") for i in range(20)])
    b = ended(ms(cat, "vol", 1) + 1)
    first = cat.export_changes("vol", safety_lag_ms=0, start_ms=0, end_ms=b, out=tmp_path / "o",
                               status_table="st")
    assert first.rows == 80 and first.windows_written == 3
    again = cat.export_changes("vol", safety_lag_ms=0, start_ms=0, end_ms=b, out=tmp_path / "o",
                               status_table="st")
    assert again.rows == 0 and again.windows_written == 0 and again.windows_skipped == 3
    assert len(rows_of(tmp_path / "o")) == 80
    assert DeltaTable(str(cat.warehouse.root / "export_status" / "st")).version() >= 0


def test_date_csv_and_delta_formats(cat, data_dir, ev, tmp_path):
    cat.create_volume("vol", data_dir)
    apply(cat, ev.put("x.txt", 5))
    hist = cat.history("vol")[0]["timestamp"]
    with pytest.raises(InvalidInputError, match="future"):   # the range must have ended
        cat.export_changes("vol", safety_lag_ms=0, date="20990101", out=tmp_path / "c")
    prev = (hist - __import__("datetime").timedelta(days=1)).strftime("%Y%m%d")
    assert cat.export_changes("vol", safety_lag_ms=0, date=prev, out=tmp_path / "c").rows == 0
    b = ended(ms(cat, "vol", 1) + 1)
    cat.export_changes("vol", safety_lag_ms=0,
                       start_ms=0, end_ms=b, out=tmp_path / "c", format="csv")
    assert sorted(r["column_name"] for r in rows_of(tmp_path / "c", "csv")) == [
        "etag", "last_modified_time", "size", "url"]
    for _ in range(2):  # a re-run without status writes the same delta rows once (app txn)
        cat.export_changes("vol", safety_lag_ms=0,
                           start_ms=0, end_ms=b, out=tmp_path / "d", format="delta")
    assert len(rows_of(tmp_path / "d", "delta")) == 4
    for bad in ({"format": "xml"}, {"max_retries": -1}, {"parallelism": 0}):
        with pytest.raises(InvalidInputError):
            cat.export_changes("vol", safety_lag_ms=0,
                               start_ms=0, end_ms=b, out=tmp_path / "z", **bad)
    with pytest.raises(InvalidInputError):
        cat.export_changes("vol", safety_lag_ms=0, start_ms=5, end_ms=5, out=tmp_path / "z")
    with pytest.raises(InvalidInputError):
        cat.export_changes("vol", safety_lag_ms=0, date="2026-01-01", out=tmp_path / "z")


SCRIPT = """
import json, sys
import volume_stream as vs
cat = vs.connect(sys.argv[1])
res = cat.export_changes("vol", start_ms=0, end_ms=int(sys.argv[2]), out=sys.argv[3],
                         status_table="st", export_sequence_info=True, safety_lag_ms=0)
print(json.dumps(res.as_dict()))
"""


def run_export(tmp_path, wh, end, out, crash_after=None):
    script = tmp_path / "export.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    if crash_after:
        env[CRASH_ENV] = str(crash_after)
    return subprocess.run([sys.executable, str(script), str(wh), str(end), str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)


def test_resume_after_sigkill_without_duplicates(cat, data_dir, ev, tmp_path):
    cat.create_volume("vol", data_dir, shards=4)
    apply(cat, *[ev.put(f"k{i:02d}") for i in range(40)])
    apply(cat, *[ev.put(f"k{i:02d}", 9) for i in range(0, 40, 2)])
    end = ended(ms(cat, "vol", 2) + 1)
    out = tmp_path / "out"
    killed = run_export(tmp_path, cat.warehouse.root, end, out, crash_after=2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    partial = rows_of(out)
    assert 0 < len(partial) < 40 * 4 + 20 * 5
    done = run_export(tmp_path, cat.warehouse.root, end, out)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = rows_of(out)
    clean = cat.export_changes("vol", safety_lag_ms=0,
                               start_ms=0, end_ms=end, out=tmp_path / "clean",
                               export_sequence_info=True)
    expected = rows_of(tmp_path / "clean")
    assert clean.rows == len(expected) == 40 * 4 + 20 * 5
    assert sorted(map(str, map(sorted, (r.items() for r in rows)))) == sorted(
        map(str, map(sorted, (r.items() for r in expected))))
    assert run_export(tmp_path, cat.warehouse.root, end, out).returncode == 0
    assert len(rows_of(out)) == len(expected)


def test_cli_export_and_datax_job_file(cat, data_dir, ev, tmp_path):
    import json

    from typer.testing import CliRunner

    from volume_stream.cli.app import app

    cat.create_volume("vol", data_dir, shards=2)
    apply(cat, ev.put("a.txt"), ev.put("b.txt"))
    end = ended(ms(cat, "vol", 1) + 1)
    wh = ["--warehouse", str(cat.warehouse.root)]
    runner = CliRunner()
    res = runner.invoke(app, ["export", "vol", "--start-ms", "0", "--end-ms", str(end),
                              "--safety-lag-ms", "0",
                              "--out", str(tmp_path / "cli"), "--format", "csv",
                              "--status-table", "cli_status", "--export-sequence-info", *wh])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["rows"] == 8
    assert len(rows_of(tmp_path / "cli", "csv")) == 8
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"configuration": {
        "reader": {"plugin": "otsstream", "parameter": {
            "dataTable": "vol", "statusTable": "job_status", "startTimestampMillis": 0,
            "endTimestampMillis": end, "isExportSequenceInfo": True, "maxRetries": 5,
            "safetyLagMillis": 0}},
        "writer": {"plugin": "parquet", "parameter": {"path": "job_out", "format": "parquet"}},
        "setting": {"speed": {"concurrent": 2, "mbps": 50}, "errorLimit": {"record": 0}}}}))
    res = runner.invoke(app, ["export", "--job", str(job), *wh])
    assert res.exit_code == 0, res.output
    rows = rows_of(tmp_path / "job_out")
    assert len(rows) == 8 and all("sequence_info" in r for r in rows)
    res = runner.invoke(app, ["export", "--job", str(job), *wh])   # finished: nothing new
    assert json.loads(res.stdout.strip().splitlines()[-1])["rows"] == 0
    # the DataX "job.content" form, with a bad reader plugin
    job.write_text(json.dumps({"job": {"content": [{"reader": {"name": "mysqlreader"}}]}}))
    proc = subprocess.run([str(Path(sys.executable).parent / "volume-stream"), "export",
                           "--job", str(job), *wh], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "otsstream" in proc.stderr and "Traceback" not in proc.stderr


def test_spark_engine_one_task_per_shard_matches_threads(tmp_path, data_dir, ev, spark):
    cat = vs.connect(tmp_path / "wh", spark=spark)
    cat.create_volume("vol", data_dir, shards=3)
    apply(cat, *[ev.put(f"s{i:02d}") for i in range(30)])
    apply(cat, *[ev.rm(f"s{i:02d}") for i in range(0, 30, 5)])
    end = ended(ms(cat, "vol", 2) + 1)
    res = cat.export_changes("vol", safety_lag_ms=0, start_ms=0, end_ms=end, out=tmp_path / "spark",
                             engine="spark", status_table="sp", export_sequence_info=True)
    assert res.shards == 3 and res.rows == 30 * 4 + 6 and res.records == 36
    threads = cat.export_changes("vol", safety_lag_ms=0,
                                 start_ms=0, end_ms=end, out=tmp_path / "threads",
                                 export_sequence_info=True)
    assert sorted(map(str, rows_of(tmp_path / "spark"))) == sorted(
        map(str, rows_of(tmp_path / "threads"))) and threads.rows == res.rows
    again = cat.export_changes("vol", safety_lag_ms=0,
                               start_ms=0, end_ms=end, out=tmp_path / "spark",
                               engine="spark", status_table="sp")
    assert again.rows == 0 and again.windows_skipped == 3
    with pytest.raises(InvalidInputError):
        cat.export_changes("vol", safety_lag_ms=0,
                           start_ms=0, end_ms=end, out=tmp_path / "x", engine="ray")
