"""Registered tables' names are read-only everywhere, and one broken registration breaks
nothing else (issue 34 items 4, 5, 11).

A pipeline whose target was a registered table's name wrote a Delta table beside the pointer
(`tables/<name>/_delta_log`), invisible to SELECT, which DROP TABLE then deleted; a registered
table whose folder is gone made SHOW TABLES fail for the whole warehouse (Python and CLI).
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli import app
from volume_stream.errors import InvalidInputError, NotFoundError

ROWS = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]})


def delta(path) -> str:
    write_deltalake(str(path), ROWS, configuration={"delta.enableChangeDataFeed": "true"})
    return str(path)


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


@vs.file_udf("n_bytes long")
def size(file: vs.FileRecord):
    return {"n_bytes": file.size}


def test_a_registered_name_is_refused_as_a_pipeline_target(cat, tmp_path):
    lake = delta(tmp_path / "lake")
    cat.register_table("lake", lake)
    cat.register_table("out_errors", delta(tmp_path / "other"))
    (tmp_path / "in").mkdir()
    cat.create_volume("v", tmp_path / "in")
    cat.create_stream("s", "v")
    for target in ("lake", str(tmp_path / "wh" / "tables" / "lake"),
                   f"file://{tmp_path}/wh/tables/lake", "out"):  # out: its errors table
        with pytest.raises(InvalidInputError, match=r"pipeline target '.*': .* is table "
                                                    r"'(lake|out_errors)', registered from "):
            cat.pipeline("s", size, target)
    assert not (tmp_path / "wh" / "tables" / "lake" / "_delta_log").exists()
    assert cat.pipeline("s", size, "fresh").target_uri.endswith("tables/fresh")
    assert cat.pipeline("s", size, str(tmp_path / "elsewhere" / "x-y"))  # not a table name


def test_change_logs_are_listed_past_an_unreadable_registration(cat, tmp_path):
    """ListStreams (`list_change_logs`) lists the readable change logs, not an error, when a
    registered table's folder is gone."""
    from volume_stream.shards import list_change_logs

    cat.register_table("gone", delta(tmp_path / "gone"), key="id")
    cat.register_table("kept", delta(tmp_path / "kept"), key="id")
    before = sorted(name for name, _ in list_change_logs(cat))
    shutil.rmtree(tmp_path / "gone")
    assert before == ["gone", "kept"]
    assert sorted(name for name, _ in list_change_logs(cat)) == ["kept"]


def test_show_tables_lists_an_unreadable_registration_with_the_reason(cat, tmp_path):
    cat.register_table("gone", delta(tmp_path / "gone"))
    cat.register_table("kept", delta(tmp_path / "kept"))
    cat.sql("CREATE TABLE mine (id INT)")
    shutil.rmtree(tmp_path / "gone")
    result = cat.sql("SHOW TABLES")
    rows = {r["name"]: r for r in result.rows}
    assert sorted(rows) == ["gone", "kept", "mine"] and "unreadable" in result.columns
    assert rows["gone"]["path"] == str(tmp_path / "gone") and rows["gone"]["version"] is None
    assert "gone" in rows["gone"]["unreadable"] and str(tmp_path / "gone") in \
        rows["gone"]["unreadable"]
    assert rows["kept"]["unreadable"] is None and rows["kept"]["version"] == 0
    assert result.message == "3 tables (1 unreadable)"
    out = CliRunner().invoke(app, ["sql", "--warehouse", str(tmp_path / "wh"), "--json", "-e",
                                   "SHOW TABLES"])
    assert out.exit_code == 0, out.output
    assert '"name": "gone"' in out.stdout and "Traceback" not in out.output


def test_a_location_with_a_doubled_quote_is_read_as_one_quote(cat, tmp_path, spark):
    """(`spark`: SELECT runs on the session's Spark, started once for all tests.)"""
    folder = tmp_path / "it's"
    folder.mkdir()
    path = delta(folder / "t")
    quoted = path.replace("'", "''")
    assert "registered table t" in cat.sql(f"CREATE TABLE t LOCATION '{quoted}'").message
    assert cat.tables.path("t") == path
    assert cat.sql("SELECT count(*) AS n FROM t").rows == [{"n": 2}]


def test_a_table_location_is_not_called_a_warehouse(cat):
    for location, why in (("memory:///x", "unsupported scheme memory://"),
                          ("oss://bucket/t", "oss:// is not supported"),
                          ("s3:///t", "no bucket")):
        with pytest.raises(InvalidInputError, match=f"table 't': location {location}: {why}") \
                as caught:
            cat.register_table("t", location)
        assert "warehouse" not in str(caught.value)


def test_a_stream_whose_table_was_replaced_is_described_stale(cat, tmp_path):
    cat.sql("CREATE TABLE t (id INT); ALTER TABLE t SET PROPERTIES ('change_tracking' = "
            "'true')")
    cat.create_stream("s", on_table="t")
    cat.sql("CREATE OR REPLACE TABLE t (id INT)")
    info = cat.describe_stream("s")
    assert info["stale"] is True and info["pending_changes"] is None
    assert info["stale_reason"] == ("stream 's': its table 't' was dropped or replaced after "
                                    "the stream was created; recreate the stream (existing "
                                    "tables: t)")
    with pytest.raises(NotFoundError, match=r"^stream 's': its table 't' was dropped"):
        cat.read_stream_arrow("s")
    cat.sql("DROP TABLE t")
    assert cat.describe_stream("s")["stale_reason"].endswith("(existing tables: none)")
    fresh = cat.describe_stream  # a healthy stream says why not, too
    cat.sql("CREATE TABLE u (id INT); ALTER TABLE u SET PROPERTIES ('change_tracking' = "
            "'true')")
    cat.create_stream("ok", on_table="u")
    assert (fresh("ok")["stale"], fresh("ok")["stale_reason"]) == (False, None)


def test_a_stream_whose_volume_was_replaced_is_described_stale(cat, tmp_path):
    (tmp_path / "in").mkdir()
    cat.create_volume("v", tmp_path / "in")
    cat.create_stream("s", "v")
    cat.create_volume("v", tmp_path / "in", replace=True)
    info = cat.describe_stream("s")
    assert info["stale"] is True and info["latest_version"] is None
    assert info["stale_reason"].startswith("stream 's': its volume 'v' was dropped or replaced")
