"""Spark starts only when a command needs it (issue 17): a SQL syntax error, DDL with --udf and
`volume-stream run` with nothing pending finish without it, in real `volume-stream` processes
whose SPARK_HOME points nowhere (so a Spark start would fail) and whose Spark log stays
unwritten; a query that needs Spark keeps Spark's own output out of the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import volume_stream as vs
from volume_stream.errors import SqlSyntaxError

CLI = str(Path(sys.executable).parent / "volume-stream")
REPO = Path(__file__).resolve().parents[2]


def run(tmp_path, *args, spark=False):
    env = {**os.environ, "VOLUME_STREAM_SPARK_LOG": str(tmp_path / "spark.log"),
           "PYTHONPATH": str(REPO)}
    env.pop("VOLUME_STREAM_VERBOSE", None)
    if not spark:
        env["SPARK_HOME"] = str(tmp_path / "no-spark-here")
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def warehouse(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data)
    cat.refresh("vol")
    cat.create_stream("idle", "vol")                          # nothing pending
    cat.create_stream("s", "vol", show_initial_rows=True)     # one INSERT pending
    return tmp_path / "wh"


def test_syntax_errors_and_ddl_need_no_spark(tmp_path, warehouse):
    w = ["--warehouse", str(warehouse)]
    bad = run(tmp_path, "sql", *w, "-e", "SHOW STREAMS;\nSELECT relative_path\n  FROM s WHERE (")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "error: syntax error at line 3, column" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and "idle" not in bad.stdout  # nothing ran
    typo = run(tmp_path, "sql", *w, "-e", "SELEC relative_path FROM s")
    assert typo.returncode == 1 and "syntax error at line 1" in typo.stderr, typo.stderr
    ddl = run(tmp_path, "sql", *w, "--udf", "shout=tests.volume_stream.test_sql_cli:shout",
              "-e", "CREATE STREAM t ON VOLUME vol; DESCRIBE STREAM t")
    assert ddl.returncode == 0, ddl.stdout + ddl.stderr
    assert not (tmp_path / "spark.log").exists()  # no JVM was launched


def test_run_with_nothing_pending_needs_no_spark(tmp_path, warehouse):
    (tmp_path / "udf.py").write_text(textwrap.dedent("""
        import volume_stream as vs

        @vs.file_udf("n long")
        def size(file):
            return {"n": file.size}
    """))
    spec = tmp_path / "job.toml"
    spec.write_text('stream = "idle"\nudf = "udf.py:size"\ntarget = "sizes"\n')
    proc = run(tmp_path, "run", str(spec), "--warehouse", str(warehouse), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '"files_seen": 0' in proc.stdout
    assert not (tmp_path / "spark.log").exists()


def test_a_syntax_error_in_python_starts_no_spark(tmp_path, warehouse):
    cat = vs.connect(warehouse)
    with pytest.raises(SqlSyntaxError) as info:
        cat.sql("SELECT relative_path\n  FROM s WHERE (")
    assert info.value.line == 2
    assert not cat.spark_started


def test_a_query_keeps_sparks_output_out_of_the_terminal(tmp_path, warehouse):
    proc = run(tmp_path, "sql", "--warehouse", str(warehouse), "--json", "-e",
               "SELECT relative_path FROM s", spark=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == '{"relative_path": "a.txt"}'
    assert "WARN" not in proc.stderr and "log4j" not in proc.stderr, proc.stderr
    assert (tmp_path / "spark.log").read_text()  # ...it went to the Spark log instead


@pytest.mark.parametrize("ddl", [
    "n long", "format string, width int, height int",
    "a boolean, b tinyint, c smallint, d bigint, e float, f double, g date, h timestamp, "
    "i timestamp_ntz, j binary, k decimal(12, 3), l decimal, `odd name` string",
    "tags array<string>, attrs map<string, bigint>, box struct<x:int, y: double, z string>",
    "nested array<struct<k:string,v:array<map<string,int>>>>",
])
def test_udf_schemas_parse_without_the_jvm_as_spark_does(ddl, spark):
    from pyspark.sql.types import StructType

    from volume_stream.pipelines.udf import parse_simple_ddl

    assert parse_simple_ddl(ddl) == StructType.fromDDL(ddl)


@pytest.mark.parametrize("ddl", ["a int NOT NULL", "a string COMMENT 'x'", "a varchar(3)",
                                 "a interval day", "", "a", "a int,", "1a int"])
def test_other_udf_schemas_are_left_to_spark(ddl):
    from volume_stream.pipelines.udf import parse_simple_ddl

    assert parse_simple_ddl(ddl) is None
