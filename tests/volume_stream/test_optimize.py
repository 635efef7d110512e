"""`Catalog.optimize` and `volume-stream volume optimize`: compaction and the migration of a
pre-bucket directory table, with a stream reading the same records across both."""

from __future__ import annotations

import shutil

from deltalake import DeltaTable
from typer.testing import CliRunner

import volume_stream as vs
from directory_table.schema import TABLE_SCHEMA, TOMBSTONE_SCHEMA
from volume_stream.cli import app


def _legacy(table) -> None:
    """Replace a volume's (empty) directory table by one in the pre-bucket layout."""
    for path in (table.path, table.tombstones_path):
        shutil.rmtree(path)
    DeltaTable.create(table.path, schema=TABLE_SCHEMA, name="directory",
                      configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable.create(table.tombstones_path, schema=TOMBSTONE_SCHEMA)


def _records(cat, stream):
    rows = cat.read_stream_arrow(stream).to_pylist()
    return sorted((r["relative_path"], r["__change_type"], r["size"]) for r in rows)


def test_optimize_migrates_and_compacts_without_changing_stream_records(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("v", data)
    table = cat.directory_table("v")
    _legacy(table)
    cat.create_stream("s", on_volume="v")
    for i in range(5):                                   # five commits, old layout
        (data / f"f{i}.txt").write_text("x" * (i + 1))
        cat.refresh("v")
    (data / "f0.txt").unlink()
    cat.refresh("v")
    before = _records(cat, "s")
    assert not table.layout().bucketed
    result = cat.optimize("v")
    assert result.migrated_version is not None and table.layout().bucketed
    assert _records(cat, "s") == before
    (data / "new.txt").write_text("n")
    cat.refresh("v")
    assert _records(cat, "s") == sorted(before + [("new.txt", "INSERT", 1)])
    assert cat.optimize("v", migrate=False).migrated_version is None


def test_cli_volume_optimize(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("hello")
    wh = ["--warehouse", str(tmp_path / "wh")]
    runner = CliRunner()
    assert runner.invoke(app, ["volume", "create", "v", str(data), *wh]).exit_code == 0
    assert runner.invoke(app, ["volume", "refresh", "v", *wh]).exit_code == 0
    result = runner.invoke(app, ["volume", "optimize", "v", *wh])
    assert result.exit_code == 0, result.output
    assert "optimized v:" in result.output and "checkpoint at version" in result.output
    missing = runner.invoke(app, ["volume", "optimize", "nope", *wh])
    assert missing.exit_code != 0 and "Traceback" not in missing.output
