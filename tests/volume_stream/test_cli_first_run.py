"""What a new user meets first on the command line: read-only commands create nothing, errors
are one line without a traceback, `watch` stops cleanly on SIGTERM, a UDF module in the current
folder imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import volume_stream as vs

SCRIPT = str(Path(sys.executable).parent / "volume-stream")


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "VOLUME_STREAM_WAREHOUSE"}
    return subprocess.run([SCRIPT, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args", [
    ("volume", "list"),
    ("stream", "list", "--json"),
    ("stream", "read", "x"),
    ("stream", "describe", "x"),
    ("volume", "refresh", "landing"),
    ("watch", "landing", "--until-idle"),
    ("sql", "-e", "SHOW TABLES; SELECT 1"),
])
def test_read_only_commands_create_no_warehouse(tmp_path, args):
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"no volume-stream warehouse at {tmp_path / 'warehouse'}" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_an_explicit_missing_warehouse_is_not_created(tmp_path):
    missing = tmp_path / "nonexistent"
    proc = cli("stream", "read", "x", "--warehouse", str(missing), cwd=tmp_path)
    assert proc.returncode == 1 and not missing.exists()
    assert f"no volume-stream warehouse at {missing}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_creating_commands_still_create_it(tmp_path):
    (tmp_path / "data").mkdir()
    proc = cli("volume", "create", "landing", "data", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "warehouse" / "volume-stream.json").exists()
    listed = cli("volume", "list", "--json", cwd=tmp_path)
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["landing"]


def test_watch_stops_cleanly_on_sigterm(tmp_path):
    (tmp_path / "data").mkdir()
    assert cli("volume", "create", "landing", "data", cwd=tmp_path).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "VOLUME_STREAM_WAREHOUSE"}
    proc = subprocess.Popen([SCRIPT, "watch", "landing"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # wait until it listens: it says so once its start refresh is done
        deadline = time.monotonic() + 120
        seen = ""
        while "listening for events" not in seen and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen += line
        assert "listening for events" in seen, seen
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["refreshes"] == 1 and summary["applied"] == 0
    assert "Traceback" not in stderr


def test_sql_udfs_load_from_the_current_and_the_script_folder(tmp_path):
    """`--udf NAME=module:function` finds `module` beside the user or beside the SQL file,
    without PYTHONPATH, and Spark's workers run it."""
    (tmp_path / "my_udfs.py").write_text("def shout(text):\n    return text.upper() + '!'\n")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "helpers.py").write_text("def twice(text):\n    return text * 2\n")
    (tmp_path / "jobs" / "q.sql").write_text("SELECT shout('hi') AS a, twice('ho') AS b;\n")
    vs.connect(tmp_path / "warehouse")  # a script that only reads needs a warehouse
    proc = cli("sql", "jobs/q.sql", "--json", "--udf", "shout=my_udfs:shout",
               "--udf", "twice=helpers:twice", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [{"a": "HI!", "b": "hoho"}]


def test_drop_if_exists_without_a_warehouse_is_a_no_op(tmp_path):
    from typer.testing import CliRunner

    from volume_stream.cli import app

    wh = ["--warehouse", str(tmp_path / "wh")]
    for kind in ("volume", "stream"):
        result = CliRunner().invoke(app, [kind, "drop", "x", "--if-exists", *wh])
        assert result.exit_code == 0 and f"no {kind} x" in result.output, result.output
    assert not (tmp_path / "wh").exists()


def test_watch_until_idle_counts_what_its_catch_up_committed(tmp_path):
    """The catch-up refresh's changes and version are in the summary (it said applied: 0,
    versions: [] although the refresh had committed every file)."""
    (tmp_path / "data").mkdir()
    for i in range(30):
        (tmp_path / "data" / f"f{i}.txt").write_text("x")
    assert cli("volume", "create", "landing", "data", cwd=tmp_path).returncode == 0
    proc = cli("watch", "landing", "--until-idle", "--timeout", "60", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["refreshes"] == 1 and summary["refreshed"] == 30, summary
    assert summary["versions"] == [1], summary
    assert "30 files changed" in proc.stderr
