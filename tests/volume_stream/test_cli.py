"""The `volume-stream` CLI, in-process through typer's runner and once as the real script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from volume_stream.catalog import connect
from volume_stream.cli import app

runner = CliRunner()


def run(*args, ok=True):
    result = runner.invoke(app, list(args))
    if ok:
        assert result.exit_code == 0, result.output + str(result.exception)
    return result


def test_volume_and_stream_admin_and_read(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    wh = ["--warehouse", str(tmp_path / "wh")]
    assert "created volume landing" in run("volume", "create", "landing", str(data), *wh).output
    run("stream", "create", "s", "--on", "landing", *wh)
    run("stream", "create", "ao", "--on", "landing", "--mode", "append_only", *wh)
    refreshed = run("volume", "refresh", "landing", *wh).output
    assert "+1" in refreshed and len(refreshed.splitlines()) == 1  # no progress when piped
    vols = [json.loads(line) for line in
            run("volume", "list", "--json", *wh).output.splitlines()]
    assert vols[0]["name"] == "landing" and vols[0]["files"] == 1
    lines = run("stream", "read", "s", "--json", *wh).output.splitlines()
    (rec,) = [json.loads(line) for line in lines]
    assert rec["relative_path"] == "a.txt" and rec["__change_type"] == "INSERT"
    assert "a.txt" in run("stream", "read", "s", *wh).output  # the table view
    desc = json.loads(run("stream", "describe", "s", "--json", *wh).output)
    assert desc["pending_changes"] == 1 and desc["offset"] == 0 and desc["stale"] is False
    names = [json.loads(x)["name"] for x in run("stream", "list", "--json", *wh).output.splitlines()]
    assert names == ["ao", "s"]
    assert "dropped stream s" in run("stream", "drop", "s", *wh).output
    assert "dropped volume" in run("volume", "drop", "landing", "--cascade", *wh).output


def test_warehouse_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_WAREHOUSE", str(tmp_path / "envwh"))
    data = tmp_path / "d"
    data.mkdir()
    run("volume", "create", "v", str(data))
    assert (tmp_path / "envwh" / "volume-stream.json").exists()


def test_errors_exit_nonzero_with_message(tmp_path):
    wh = str(tmp_path / "wh")
    connect(wh)  # an empty warehouse: reading commands never create one
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "volume-stream"), "stream", "read", "nope",
         "--warehouse", wh], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "stream 'nope' does not exist" in proc.stderr
    bad = runner.invoke(app, ["stream", "create", "s", "--on", "v", "--mode", "x",
                              "--warehouse", wh])
    assert bad.exit_code != 0
