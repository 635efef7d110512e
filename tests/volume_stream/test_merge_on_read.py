"""Merge-on-read volumes (DESIGN §4.8) through the public API, CLI and SQL: new volumes' tables
have deletion vectors where the warehouse is local or S3, `deletion_vectors=False` keeps
copy-on-write, an existing table is upgraded in place with the same change records before and
after, and bad values are refused naming the option."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import volume_stream as vs
from directory_table.deltalog import replay
from directory_table.protocol import has_deletion_vectors
from volume_stream.cli import app

runner = CliRunner()


def _records(cat, name):
    return sorted((r["relative_path"], r["__change_type"], r["size"])
                  for r in cat.read_stream(name).toArrow().to_pylist())


def _marked(cat, volume) -> int:
    table = cat.directory_table(volume)
    return len(replay(table.path, None, table.version()).deletion_vectors())


def test_new_volumes_are_merge_on_read_unless_told(catalog, data_dir):
    catalog.create_volume("mor", data_dir)
    catalog.create_volume("cow", data_dir, deletion_vectors=False)
    assert has_deletion_vectors(catalog.directory_table("mor").delta())
    assert not has_deletion_vectors(catalog.directory_table("cow").delta())
    with pytest.raises(vs.InvalidInputError, match="deletion_vectors must be true or false"):
        catalog.create_volume("bad", data_dir, deletion_vectors="yes")


def test_upgrade_keeps_the_records_and_marks_rows_from_then_on(catalog, data_dir):
    for i in range(6):
        (data_dir / f"f{i}.txt").write_text("x" * i)
    catalog.create_volume("v", data_dir, deletion_vectors=False)
    catalog.create_stream("s", on_volume="v")
    catalog.refresh("v")
    (data_dir / "f1.txt").write_text("changed")
    (data_dir / "f2.txt").unlink()
    catalog.refresh("v")
    before = _records(catalog, "s")
    version = catalog.upgrade_volume("v")
    assert version == catalog.directory_table("v").version()
    assert catalog.upgrade_volume("v") is None
    assert _records(catalog, "s") == before  # the upgrade commit changes no row
    assert _marked(catalog, "v") == 0
    (data_dir / "f3.txt").write_text("changed again")
    (data_dir / "f4.txt").unlink()
    catalog.refresh("v")
    assert _marked(catalog, "v") >= 1  # rows marked, not rewritten
    # the stream started at version 0: each live file once, as an INSERT of its latest image
    assert _records(catalog, "s") == [("f0.txt", "INSERT", 0), ("f1.txt", "INSERT", 7),
                                      ("f3.txt", "INSERT", 13), ("f5.txt", "INSERT", 5)]
    table = catalog.directory_table("v")
    feed = table.changes(table.version() - 1, table.version()).to_pylist()
    assert sorted((r["relative_path"], r["_change_type"]) for r in feed) == [
        ("f3.txt", "update_postimage"), ("f3.txt", "update_preimage"), ("f4.txt", "delete")]
    assert sorted(r["relative_path"] for r in
                  catalog.directory_table("v").snapshot().to_pylist()) == \
        ["f0.txt", "f1.txt", "f3.txt", "f5.txt"]


def test_cli_and_sql_choose_and_upgrade(tmp_path, data_dir, catalog):
    wh = str(tmp_path / "warehouse")
    result = runner.invoke(app, ["volume", "create", "c", str(data_dir), "--no-deletion-vectors",
                                 "--warehouse", wh])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["volume", "upgrade", "c", "--warehouse", wh])
    assert result.exit_code == 0 and "upgraded to deletion vectors at version 1" in \
        result.output, result.output
    result = runner.invoke(app, ["volume", "upgrade", "nosuch", "--warehouse", wh])
    assert isinstance(result.exception, vs.NotFoundError) and "nosuch" in str(result.exception)
    catalog.sql(f"CREATE EXTERNAL VOLUME q LOCATION '{data_dir}' DELETION_VECTORS = FALSE")
    assert not has_deletion_vectors(catalog.directory_table("q").delta())
    message = catalog.sql("ALTER VOLUME q SET DELETION_VECTORS = TRUE").message
    assert "deletion vectors on at version 1" in message
    assert has_deletion_vectors(catalog.directory_table("q").delta())
    with pytest.raises(vs.SqlError, match="DELETION_VECTORS = TRUE only"):
        catalog.sql("ALTER VOLUME q SET DELETION_VECTORS = FALSE")
    with pytest.raises(vs.SqlError, match="DELETION_VECTORS takes TRUE or FALSE"):
        catalog.sql(f"CREATE EXTERNAL VOLUME r LOCATION '{data_dir}' DELETION_VECTORS = 'x'")
