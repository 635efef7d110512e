"""The incremental job through pyspark's own `spark-submit --master local[2]`, as cron, Airflow
or a Kubernetes CronJob would run it: the documented entry script, a spec that creates its
volume and stream, the JSON metrics on stdout, exit 0, and the rows in the Delta target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~30 s on a loaded 2-core machine: spark-submit starts its own JVM
def test_spark_submit_runs_the_job_and_exits_zero(tmp_path):
    data = tmp_path / "drop"
    data.mkdir()
    (data / "web.log").write_text(
        '10.1.1.1 - - [01/Feb/2025:10:00:00 +0000] "GET / HTTP/1.1" 200 512 "-" "probe"\n'
        "garbled line\n")
    (data / "app.jsonl").write_text('{"level": "INFO", "msg": "started"}\n')
    spec = tmp_path / "job.toml"
    spec.write_text(f'''
stream = "incoming"
udf = "{ROOT / "examples" / "log_ingestion.py"}:log_lines"
target = "lines"
refresh = true
until_empty = true
[options]
path_glob = ["*.log", "*.jsonl"]
[create.volume]
name = "drop"
location = "drop"
[create.stream]
show_initial_rows = true
''')
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1"}  # a faster JVM start for tests
    proc = subprocess.run(
        [str(bin_dir / "spark-submit"), "--master", "local[2]",
         "--conf", "spark.ui.enabled=false", str(ROOT / "examples" / "run_job.py"), str(spec),
         "--warehouse", str(tmp_path / "wh")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    # spark-submit merges the Python driver's stderr (our log) into its stdout
    assert "on Spark master local[2]" in proc.stdout + proc.stderr
    (first,) = [json.loads(line) for line in proc.stdout.splitlines()  # until_empty: one batch
                if line.startswith("{")]
    assert (first["files_ok"], first["files_failed"], first["rows_written"]) == (2, 0, 3)
    rows = DeltaTable(str(tmp_path / "wh" / "tables" / "lines")).to_pyarrow_table().to_pylist()
    assert sorted((r["relative_path"], r["format"]) for r in rows) == [
        ("app.jsonl", "json"), ("web.log", "combined"), ("web.log", "unparsed")]
