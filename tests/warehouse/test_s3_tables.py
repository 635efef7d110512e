"""SQL tables and table streams on an S3 warehouse (moto's server in its own process): the same
statements as on a local warehouse, every table under `<warehouse>/tables/` in the bucket,
nothing on local disk, Spark reading them without hadoop-aws, and two processes writing one
table at once losing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import volume_stream as vs
from tests.s3_warehouse_fixtures import child_env, s3_client
from volume_stream._datasource_table import TableSource, table_records
from volume_stream.datasource import SourceOptions
from volume_stream.errors import CommitConflictError, NotFoundError
from volume_stream.tables import Column
from volume_stream.tables import store as tstore

ROOT = Path(__file__).resolve().parents[2]


def keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder: a `Path("s3://...")` leaking to local disk would land here."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


def rows(result) -> list[dict]:
    return [dict(r) for r in result.rows]


def test_sql_tables_and_table_streams_on_s3(s3_env, s3_bucket, cwd, spark):
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri, spark=spark)
    cat.sql("""
        CREATE TABLE people (id INT COMMENT 'key', name VARCHAR, age INT);
        ALTER TABLE people SET PROPERTIES ('change_tracking' = 'true');
        CREATE TABLE STREAM people_changes ON TABLE people
          WITH PROPERTIES ('TABLE_STREAM_MODE' = 'STANDARD');
        INSERT INTO people VALUES (1, 'Alice', 25), (2, 'Bob', 30), (3, 'Carol', 35);
        UPDATE people SET age = age + 5 WHERE id = 1;
        DELETE FROM people WHERE id = 2;
    """)
    assert cat.tables.path("people") == f"{uri}/tables/people"
    stored = keys(s3_env, s3_bucket, "wh/tables/")
    assert any(k.startswith("wh/tables/people/_delta_log/") for k in stored)
    assert any(k.endswith(".parquet") for k in stored)
    assert [r["name"] for r in rows(cat.sql("SHOW TABLES"))] == ["people"]
    described = rows(cat.sql("DESCRIBE TABLE people"))
    assert [(r["col_name"], r["comment"]) for r in described][0] == ("id", "key")

    # SELECT: Spark gets the snapshot as Arrow from delta-rs (no hadoop-aws, no s3:// read)
    got = rows(cat.sql("SELECT id, name, age FROM people ORDER BY id"))
    assert got == [{"id": 1, "name": "Alice", "age": 30}, {"id": 3, "name": "Carol", "age": 35}]
    changes = rows(cat.sql("SELECT __change_type, id, age FROM people_changes ORDER BY id"))
    assert changes == [{"__change_type": "INSERT", "id": 1, "age": 30},
                       {"__change_type": "INSERT", "id": 3, "age": 35}]

    # a copy fed by MERGE from the stream; the stream's offset moves with the commit
    cat.sql("""
        CREATE TABLE people_copy (id INT, name VARCHAR, age INT);
        MERGE INTO people_copy t USING people_changes s ON t.id = s.id
          WHEN MATCHED AND s.__change_type = 'UPDATE_AFTER' THEN UPDATE SET t.age = s.age
          WHEN MATCHED AND s.__change_type = 'DELETE' THEN DELETE
          WHEN NOT MATCHED AND s.__change_type = 'INSERT' THEN INSERT VALUES (s.id, s.name, s.age);
    """)
    assert rows(cat.sql("SELECT id, age FROM people_copy ORDER BY id")) == \
        [{"id": 1, "age": 30}, {"id": 3, "age": 35}]
    assert rows(cat.sql("SELECT * FROM people_changes")) == []
    cat.sql("UPDATE people SET age = 40 WHERE id = 3")
    with cat.consume("people_changes") as batch:
        kinds = sorted(batch.df.select("__change_type").toPandas()["__change_type"])
    assert kinds == ["UPDATE_AFTER", "UPDATE_BEFORE"]

    # CTAS and INSERT ... SELECT between tables on S3; the Spark data source reads the records
    cat.sql("CREATE TABLE adults AS SELECT id, name FROM people WHERE age >= 35")
    cat.sql("INSERT INTO adults SELECT id + 10, name FROM people")
    assert sorted(r["id"] for r in rows(cat.sql("SELECT id FROM adults"))) == [3, 11, 13]
    # what the data source does on the driver and on an executor (Spark's Python workers here
    # were started before the test's AWS environment, as a cluster's would lack it)
    source = TableSource(SourceOptions.parse({"warehouse": uri, "table": "people"}))
    part = source.partition(0, source.table.version(), "APPEND_ONLY")
    assert part.root == f"{uri}/tables" and "AWS_SECRET_ACCESS_KEY" not in part.options
    assert sorted(table_records(part)["id"].to_pylist()) == [1, 2, 3]

    # a second process sees the tables and the stream
    code = (f"import json, volume_stream as vs; c = vs.connect({uri!r}); "
            "print(json.dumps([c.tables.names(), "
            "c.tables.snapshot('people').sort_by('id')['age'].to_pylist()]))")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(s3_env), cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == \
        [["adults", "people", "people_copy"], [30, 40]]

    # DROP and CREATE OR REPLACE remove the objects of the old table
    cat.sql("DROP TABLE adults")
    assert keys(s3_env, s3_bucket, "wh/tables/adults/") == []
    cat.sql("CREATE OR REPLACE TABLE people_copy (k BIGINT)")
    assert [f.name for f in cat.tables.schema("people_copy")] == ["k"]
    with pytest.raises(NotFoundError, match="adults"):
        cat.tables.open("adults")
    assert sorted(p.name for p in cwd.rglob("*")) == []  # nothing on local disk


def test_two_processes_writing_s3_tables_lose_nothing(s3_env, s3_bucket, cwd):
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri)
    cat.tables.create("t", [Column("writer", "STRING"), Column("i", "INT")])
    cat.tables.create("c", [Column("k", "INT"), Column("n", "INT")])
    cat.tables.insert("c", pa.table({"k": [1], "n": [0]}))
    n = 8
    procs = [subprocess.Popen([sys.executable, "-m", "tests.warehouse.table_racer", uri, name,
                               str(n)], env=child_env(s3_env), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    reported = [json.loads(line) for out, _ in outs for line in out.splitlines()]
    versions = [r["version"] for r in reported]
    assert len(versions) == 2 * n and len(set(versions)) == 2 * n  # one commit each
    table = cat.tables.snapshot("t", hidden=True)
    assert sorted(zip(table["writer"].to_pylist(), table["i"].to_pylist(), strict=True)) == \
        sorted((w, i) for w in ("a", "b") for i in range(n))
    assert len(set(table["_vs_row_id"].to_pylist())) == 2 * n
    assert cat.tables.version("t") == 2 * n
    assert cat.tables.snapshot("c")["n"].to_pylist() == [2 * n]  # no update was lost
    assert sorted(p.name for p in cwd.rglob("*")) == []


def test_lost_races_end_in_a_commit_conflict_naming_the_table(s3_env, s3_bucket, monkeypatch):
    cat = vs.connect(f"s3://{s3_bucket}/wh")
    cat.sql("CREATE TABLE t (i INT)")
    other = vs.connect(f"s3://{s3_bucket}/wh").tables
    monkeypatch.setattr(tstore, "_ATTEMPTS", 2)
    def write(dt, version, props):
        # another writer takes every version this one stamps, so each attempt loses
        other.insert("t", pa.table({"i": [version]}))
        return tstore.write_deltalake(dt, pa.table({"i": [0], "_vs_row_id": [0],
                                                    "_vs_row_version": [version]}),
                                      mode="append", commit_properties=props)

    with pytest.raises(CommitConflictError, match=f"s3://{s3_bucket}/wh/tables/t"):
        cat.tables._commit("t", write)
    assert sorted(cat.tables.snapshot("t")["i"].to_pylist()) == [1, 2]


@pytest.mark.parametrize("given", ["environment", "storage_options"])
def test_an_http_endpoint_works_without_aws_allow_http(s3_env, s3_bucket, monkeypatch, given):
    """delta-rs refuses http:// unless AWS_ALLOW_HTTP is set; an http:// endpoint says it."""
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    options = None
    if given == "storage_options":
        monkeypatch.delenv("AWS_ENDPOINT_URL")
        options = {"AWS_ENDPOINT_URL": s3_env}
    cat = vs.connect(f"s3://{s3_bucket}/wh", storage_options=options)
    cat.tables.create("t", [Column("id", "INT")])
    cat.tables.insert("t", pa.table({"id": pa.array([1, 2], pa.int32())}))
    assert sorted(r["id"] for r in cat.tables.snapshot("t").to_pylist()) == [1, 2]
