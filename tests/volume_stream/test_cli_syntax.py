"""Syntax errors in `volume-stream sql` (issue 22): every one is found without Spark, said in our
words (never sqlglot's classes or tokens) and points at the position; `help` prints our help.
Real `volume-stream` processes whose SPARK_HOME points nowhere (a Spark start would fail) and
whose Spark log must stay unwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs

CLI = str(Path(sys.executable).parent / "volume-stream")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    root = tmp_path_factory.mktemp("syntax")
    (root / "data").mkdir()
    cat = vs.connect(root / "wh")
    cat.create_volume("vol", root / "data")
    cat.create_stream("s", "vol")
    return root / "wh"


def sql(tmp_path: Path, warehouse: Path, text: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOLUME_STREAM_")}
    env.update({"VOLUME_STREAM_SPARK_LOG": str(tmp_path / "spark.log"),
                "SPARK_HOME": str(tmp_path / "no-spark-here")})
    proc = subprocess.run([CLI, "sql", "--warehouse", str(warehouse), "-e", text],
                          capture_output=True, text=True, env=env, timeout=120)
    assert not (tmp_path / "spark.log").exists(), "Spark was started"
    return proc


@pytest.mark.parametrize(("text", "where", "says"), [
    ("SHOW VOLUMEZ", "line 1, column 6", "did you mean VOLUMES?"),
    ("hello world", "line 1, column 1", "'hello' does not start a SQL statement"),
    ("SELEC relative_path FROM s", "line 1, column 1", "did you mean SELECT?"),
    ("SELECT 1 *", "line 1, column 11", "expected an expression after '*'"),
    ("SELECT (", "line 1, column 9", "ends after '('"),
    ("SELECT relative_path FROM", "line 1, column 26",
     "expected a table name after 'FROM', found the end of the statement"),
    ("SELECT * FROM s WHERE", "line 1, column 22", "expected a condition after 'WHERE'"),
    ("SELECT a,", "line 1, column 10", "ends after ','"),
    ("SHOW STREAMS;\nSELECT a b c FROM s", "line 2, column 12", "unexpected 'c'"),
    ("WITH x AS SELECT 1", "line 1, column 11", "expected '(', found 'SELECT'"),
])
def test_syntax_errors_are_ours_and_need_no_spark(tmp_path, warehouse, text, where, says):
    proc = sql(tmp_path, warehouse, text)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"error: syntax error at {where}: "), proc.stderr
    assert says in first, proc.stderr
    assert proc.stderr.rstrip().endswith("^"), proc.stderr  # the caret under the position
    for internal in ("<class", "<Token", "TokenType", "sqlglot", "Traceback", "PARSE_SYNTAX"):
        assert internal not in proc.stderr, proc.stderr


def test_help_prints_our_help(tmp_path, warehouse):
    proc = sql(tmp_path, warehouse, "help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CREATE STREAM s ON VOLUME v" in proc.stdout and "SHOW VOLUMES" in proc.stdout
    assert proc.stderr == ""
