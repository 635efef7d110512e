"""Issue 34 item 15, through the real command: `ui` on a taken port says `error:` and exits 2
(as the daemon does), `watch nosuch` says nothing of watching, a type mismatch reads "an INT",
usage lines name arguments NAME (not `{name}`), and `--version` imports neither Spark's Python
side, pyarrow, numpy nor delta-rs."""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import sys

import pyarrow as pa
import pytest
import typer.main
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli import app


def cli(*args, cwd=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLUME_STREAM_")}
    return subprocess.run([sys.executable, "-m", "volume_stream.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def warehouse(tmp_path):
    (tmp_path / "data").mkdir()
    vs.connect(tmp_path / "wh").create_volume("land", tmp_path / "data")
    return str(tmp_path / "wh")


def test_ui_on_a_taken_port_says_error_and_exits_2(warehouse):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("ui", "--listen", f"127.0.0.1:{port}", "--warehouse", warehouse)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot serve on 127.0.0.1:{port}: it is already in use")
    assert "--listen" in line and proc.stdout == ""


def test_watch_of_an_unknown_volume_says_only_the_error(warehouse):
    proc = cli("watch", "nosuch", "--warehouse", warehouse, "--timeout", "5")
    assert proc.returncode == 1
    assert "watching" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error:") and "nosuch" in line and "land" in line


def test_a_type_mismatch_reads_with_its_article(tmp_path):
    cat = vs.connect(tmp_path / "wh")
    cat.sql("CREATE TABLE t (n INT, s STRING)")
    with pytest.raises(vs.InvalidInputError) as info:
        cat.tables.insert("t", pa.table({"n": ["x"], "s": ["y"]}))
    assert "cannot store a STRING value in an INT column" in str(info.value)
    with pytest.raises(vs.InvalidInputError) as info:
        cat.tables.insert("t", pa.table({"n": pa.array([1], pa.int32()), "s": [1]}))
    assert "cannot store an INT value in a STRING column" in str(info.value) or \
        "cannot store a BIGINT value in a STRING column" in str(info.value)


def _commands(group, path=()):
    for name, command in sorted(group.commands.items()):
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


def test_usage_lines_name_arguments_in_capitals():
    runner = CliRunner()
    commands = list(_commands(typer.main.get_command(app)))
    assert ("volume", "create") in commands and ("watch",) in commands
    for command in commands:
        res = runner.invoke(app, [*command, "--help"])
        assert res.exit_code == 0, command
        usage = res.output.splitlines()[0]
        assert "{" not in usage and "}" not in usage, usage
    usage = runner.invoke(app, ["volume", "create", "--help"]).output.splitlines()[0]
    assert usage.endswith("volume create [OPTIONS] NAME LOCATION")
    assert runner.invoke(app, ["sql", "--help"]).output.splitlines()[0].endswith("[FILE]")


def test_version_loads_no_heavy_module():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "volume_stream.cli",
                           "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == f"volume-stream {vs.__version__}\n"
    imported = {line.split("|")[-1].strip().split(".")[0]
                for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert imported and not imported & {"pyarrow", "numpy", "pyspark", "deltalake", "typer",
                                        "rich", "directory_table"}, imported
    assert vs.__version__ == importlib.metadata.version("volume-stream")
    # the full app answers the same
    assert CliRunner().invoke(app, ["--version"]).output == proc.stdout
