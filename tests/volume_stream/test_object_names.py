"""No object name leaves the warehouse: every DDL/DML statement, Python call and CLI command
that takes a name refuses '..', '/', absolute paths, NUL and over-long names with a clear error,
and nothing on disk (the warehouse, a volume's files, a folder beside the warehouse) changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from volume_stream.errors import InvalidInputError, VolumeStreamError
from volume_stream.tables import Column, TableStore
from volume_stream.warehouse.location import Location

BAD_NAMES = ["../_catalog", "../volumes", "../../victim", "a/b", "/tmp/vs_abs", "x\0y", "a" * 200,
             "..", ".", "a.b", "a b", "-x", ""]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def world(tmp_path, catalog, data_dir):
    (data_dir / "keep.txt").write_text("data")
    catalog.create_volume("vol", data_dir)
    catalog.refresh("vol")
    catalog.create_stream("s", "vol")
    catalog.sql("CREATE TABLE people (id INT, name STRING)")
    catalog.sql("INSERT INTO people VALUES (1, 'a')")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("do not delete")
    return tmp_path


STATEMENTS = [
    "CREATE TABLE `{n}` (id INT)",
    "CREATE OR REPLACE TABLE `{n}` (id INT)",
    "CREATE TABLE IF NOT EXISTS `{n}` (id INT)",
    "CREATE OR REPLACE TABLE `{n}` AS SELECT 1 AS id",
    "DROP TABLE `{n}`",
    "DROP TABLE IF EXISTS `{n}`",
    "INSERT INTO `{n}` VALUES (1)",
    "INSERT OVERWRITE `{n}` SELECT 1",
    "UPDATE `{n}` SET id = 1",
    "DELETE FROM `{n}`",
    "DELETE FROM `{n}` WHERE id = 1",
    "MERGE INTO `{n}` AS t USING people AS s ON t.id = s.id WHEN MATCHED THEN DELETE",
    "ALTER TABLE `{n}` SET TBLPROPERTIES ('change_tracking' = 'true')",
    "CREATE EXTERNAL VOLUME `{n}` LOCATION = '{data}'",
    "DROP VOLUME `{n}`",
    "CREATE STREAM `{n}` ON VOLUME vol",
    "CREATE TABLE STREAM `{n}` ON TABLE people",
    "DROP STREAM `{n}`",
    "CREATE STORAGE CONNECTION `{n}` TYPE = S3 ENDPOINT = 'http://x' REGION = 'r'",
]


@pytest.mark.parametrize("statement", STATEMENTS)
def test_sql_refuses_every_name_that_leaves_the_warehouse(world, catalog, data_dir, statement):
    before = _tree(world)
    for name in BAD_NAMES:
        text = statement.format(n=name.replace("`", "``"), data=data_dir)
        with pytest.raises(VolumeStreamError):
            catalog.sql(text)
        assert _tree(world) == before, (text, set(_tree(world)) ^ set(before))
    assert catalog.tables.snapshot("people").num_rows == 1
    assert [v["name"] for v in catalog.list_volumes()] == ["vol"]


def test_python_calls_refuse_bad_names(world, catalog, data_dir):
    before = _tree(world)
    store: TableStore = catalog.tables
    for name in BAD_NAMES:
        calls = [
            lambda name=name: store.create(name, [Column("id", "INT")], replace=True),
            lambda name=name: store.drop(name, if_exists=True),
            lambda name=name: store.insert(name, pa.table({"id": [1]})),
            lambda name=name: store.delete(name),
            lambda name=name: store.open(name),
            lambda name=name: catalog.create_volume(name, data_dir),
            lambda name=name: catalog.drop_volume(name, if_exists=True),
            lambda name=name: catalog.create_stream(name, "vol"),
            lambda name=name: catalog.drop_stream(name, if_exists=True),
        ]
        for call in calls:
            with pytest.raises(VolumeStreamError):
                call()
        assert _tree(world) == before, name
    with pytest.raises(InvalidInputError, match="invalid table name 'aaaa.*200 characters"):
        store.create("a" * 200, [Column("id", "INT")])


def test_a_pipeline_target_name_cannot_climb_out(world, catalog):
    for target in ("../victim", "../../victim", "x/../../victim", "x\0y"):
        with pytest.raises(VolumeStreamError):
            catalog.pipeline("s", lambda path: {"n": 1}, target)


def test_the_storage_layer_refuses_parts_that_leave_the_root(tmp_path):
    loc = Location.parse(tmp_path / "wh")
    for part in ("..", "../x", "a/../../x", "x\0"):
        with pytest.raises(InvalidInputError, match="would leave"):
            loc.join(part)
        with pytest.raises(InvalidInputError):
            loc.delete_tree(part)
    with pytest.raises(InvalidInputError, match="whole"):
        loc.delete_tree("")
    assert loc.join("/tables") == str(tmp_path / "wh" / "tables")


def test_the_cli_refuses_a_name_that_leaves_the_warehouse(world):
    warehouse = world / "warehouse"
    before = _tree(world)
    for text in ("DROP TABLE `../_catalog`", "CREATE OR REPLACE TABLE `../../victim` (id INT)"):
        done = subprocess.run(
            [sys.executable, "-m", "volume_stream.cli", "sql", "--warehouse", str(warehouse),
             "-e", text], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "invalid table name" in done.stderr
        assert "Traceback" not in done.stderr
    assert _tree(world) == before
