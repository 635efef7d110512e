"""`volume-stream sql`: -e TEXT, a FILE, stdin, --json, --udf, errors with line and column, the
interactive loop, and the real script (DDL alone never starts Spark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from volume_stream.cli import app
from volume_stream.cli.sql import load_udf, repl

runner = CliRunner()


def shout(text: str) -> str:
    """A UDF for --udf (importable by Spark's Python workers)."""
    return text.upper() + "!"


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_text("hello")
    return folder


def sql(*args, input=None, ok=True):
    result = runner.invoke(app, ["sql", *args], input=input)
    if ok:
        assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def test_execute_file_and_stdin(tmp_path, data):
    wh = ["--warehouse", str(tmp_path / "wh")]
    out = sql("-e", f"CREATE EXTERNAL VOLUME v LOCATION '{data}'; ALTER VOLUME v REFRESH", *wh)
    assert "created volume v" in out.output and "refreshed v: listed 1, +1" in out.output
    script = tmp_path / "streams.sql"
    script.write_text("-- two streams\nCREATE STREAM s ON VOLUME v;\n"
                      "CREATE STREAM t ON VOLUME v WITH PROPERTIES ('TABLE_STREAM_MODE' = "
                      "'APPEND_ONLY');\n")
    assert "created stream t on v (APPEND_ONLY)" in sql(str(script), *wh).output
    listed = sql("--json", *wh, input="SHOW STREAMS;\n").stdout.splitlines()
    assert [json.loads(line)["name"] for line in listed] == ["s", "t"]
    assert "v" in sql("-", *wh, input="SHOW VOLUMES").output


def test_errors_exit_1_with_line_and_column(tmp_path, data):
    wh = ["--warehouse", str(tmp_path / "wh")]
    script = tmp_path / "bad.sql"
    script.write_text(f"CREATE EXTERNAL VOLUME v LOCATION '{data}';\n"
                      "CREATE STREAM s ON VOLUME v\n  WITH PROPERTIES ('TABLE_STREAM_MODE' 'x');\n"
                      "CREATE STREAM never ON VOLUME v;\n")
    bad = sql(str(script), *wh, ok=False)
    assert bad.exit_code == 1
    assert "syntax error at line 3, column 40: after TABLE_STREAM_MODE: expected '=', found" in bad.stderr
    assert "[PARSE" not in bad.stderr  # rich markup is escaped, nothing swallowed
    assert "0 streams" in sql("-e", "SHOW STREAMS", *wh).output
    missing = sql(str(tmp_path / "missing.sql"), *wh, ok=False)
    assert missing.exit_code == 1 and "cannot read" in missing.stderr
    both = sql(str(script), "-e", "SHOW VOLUMES", *wh, ok=False)
    assert both.exit_code != 0


def test_queries_print_rows_and_udfs_load_from_modules(tmp_path, data, db):
    wh = ["--warehouse", str(tmp_path / "wh")]
    sql("-e", f"CREATE EXTERNAL VOLUME v LOCATION '{data}'; CREATE STREAM s ON VOLUME v;"
              f"ALTER VOLUME v REFRESH", *wh)
    udf = ["--udf", "shout=tests.volume_stream.test_sql_cli:shout"]
    out = sql("--json", *udf, *wh, "-e", "SELECT relative_path, shout(relative_path) AS loud "
                                         "FROM s")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"relative_path": "a.txt", "loud": "A.TXT!"}]
    assert "offsets unchanged" in out.stderr
    limited = sql(*wh, "--limit", "1", "-e", "SELECT id FROM range(3)")
    assert "SELECT: ok (first 1 row shown)" in limited.output
    bad = sql("--udf", "shout=tests.volume_stream.nope:shout", *wh, "-e", "SHOW VOLUMES", ok=False)
    assert bad.exit_code == 1 and "cannot load" in bad.stderr
    with pytest.raises(Exception, match="NAME=module:function"):
        load_udf("shout")


def test_interactive_loop_runs_complete_statements_and_carries_on(catalog, data, capsys):
    lines = iter([f"CREATE EXTERNAL VOLUME v LOCATION '{data}'", ";",
                  "SHOW", "  VOLUMES;", "DROP STREAM nope;", "SHOW STREAMS", ";", "exit"])
    prompts = []

    def read_line(prompt):
        prompts.append(prompt)
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    failures = repl(catalog, read_line)
    captured = capsys.readouterr()
    assert failures == 1
    assert "created volume v" in captured.out and "1 volume\n" in captured.out
    assert "0 streams" in captured.out
    assert "stream 'nope' does not exist" in captured.err
    assert prompts[:3] == ["volume-stream> ", "            -> ", "volume-stream> "]
    assert "end statements with ';'" in captured.err  # the banner
    assert repl(catalog, lambda prompt: "quit") == 0


def test_ctrl_c_at_the_prompt_clears_the_statement_and_carries_on(catalog, capsys):
    lines = iter(["SHOW", KeyboardInterrupt, "SHOW VOLUMES;", "exit"])

    def read_line(prompt):
        line = next(lines)
        if line is KeyboardInterrupt:
            raise KeyboardInterrupt
        return line

    assert repl(catalog, read_line) == 0  # 'SHOW' was cleared, not joined to the next line
    captured = capsys.readouterr()
    assert "(cleared; exit, quit or Ctrl-D leaves)" in captured.err
    assert "0 volumes" in captured.out


def test_the_real_script_runs_ddl_without_spark(tmp_path, data):
    exe = Path(sys.executable).parent / "volume-stream"
    proc = subprocess.run(
        [str(exe), "sql", "--warehouse", str(tmp_path / "wh"), "-e",
         f"CREATE EXTERNAL VOLUME v LOCATION '{data}'; SHOW VOLUMES"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "created volume v" in proc.stdout and "1 volume\n" in proc.stdout
    assert "SparkContext" not in proc.stderr and "log4j" not in proc.stderr
