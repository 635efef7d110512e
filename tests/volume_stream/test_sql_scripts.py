"""Scripts are parsed whole before any statement runs; the user's temp views are never
touched; a read-only script never creates a warehouse (issue 34 items 11, 12, 15)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from volume_stream.cli import app
from volume_stream.errors import SqlSyntaxError

runner = CliRunner()


def test_a_syntax_error_anywhere_in_a_script_runs_nothing(catalog):
    script = ("CREATE TABLE people (id INT);\nINSERT INTO people VALUES (1);\n"
              "SELECT * FROM people WHERE")
    with pytest.raises(SqlSyntaxError, match="line 3, column 27: expected a condition after "
                                             "'WHERE'"):
        catalog.sql(script)
    assert catalog.tables.names() == []  # the CREATE TABLE did not run
    with pytest.raises(SqlSyntaxError, match="line 2"):
        catalog.sql("CREATE STREAM s ON VOLUME v;\nCREATE STREAM ON VOLUME v")
    assert catalog.list_streams() == []


def test_a_statement_sqlglot_cannot_read_is_a_syntax_error_once_spark_runs(catalog):
    catalog.sql("CREATE TABLE people (id INT); INSERT INTO people VALUES (1)")  # Spark runs
    assert catalog.spark_started
    for script in ("SELECT * FROM people WHERE", "SELECT 1; SELECT * FROM people WHERE"):
        with pytest.raises(SqlSyntaxError, match="expected a condition after 'WHERE'") as caught:
            catalog.sql(script)
        assert "does not exist" not in str(caught.value)
    assert catalog.sql("SELECT * FROM people").rows == [{"id": 1}]


def test_reading_a_warehouse_table_leaves_the_users_temp_view_alone(catalog):
    catalog.sql("CREATE TABLE src2 (id INT); INSERT INTO src2 VALUES (1), (2)")
    catalog.spark.createDataFrame([(7,)], "x INT").createOrReplaceTempView("src2")
    try:
        assert catalog.sql("SELECT count(*) AS n FROM src2").rows == [{"n": 2}]
        catalog.sql("CREATE TABLE copy AS SELECT id FROM src2 WHERE id > 1")
        catalog.sql("INSERT INTO copy SELECT s.id FROM src2 s")
        catalog.sql("MERGE INTO copy t USING src2 s ON t.id = s.id WHEN NOT MATCHED THEN "
                    "INSERT *")
        assert sorted(r["id"] for r in catalog.sql("SELECT * FROM copy").rows) == [1, 2, 2]
        assert catalog.spark.table("src2").collect()[0].x == 7  # the user's view, untouched
        views = catalog.spark.sql("SHOW VIEWS").collect()
        assert [v.viewName for v in views if v.isTemporary] == ["src2"]  # ours were dropped
    finally:
        catalog.spark.catalog.dropTempView("src2")


@pytest.mark.parametrize("statement", ["SHOW TABLES", "SELECT 1", "DESCRIBE TABLE t",
                                       "SHOW VOLUMES; SHOW STREAMS"])
def test_a_read_only_script_never_creates_a_warehouse(tmp_path, statement):
    typo = tmp_path / "wherehouse"
    result = runner.invoke(app, ["sql", "--warehouse", str(typo), "-e", statement])
    assert result.exit_code == 1
    assert f"no volume-stream warehouse at {typo}" in result.output
    assert not typo.exists()


def test_a_script_that_creates_makes_the_warehouse(tmp_path):
    where = tmp_path / "new"
    result = runner.invoke(app, ["sql", "--warehouse", str(where), "-e",
                                 "CREATE TABLE t (id INT); SHOW TABLES"])
    assert result.exit_code == 0, result.output
    assert (where / "tables" / "t" / "_delta_log").is_dir()
