"""Users' Delta tables, written by Delta Lake's own Spark connector, registered in a warehouse
(`cat.register_table`, `CREATE TABLE t LOCATION '...'`) and streamed (issue 23 item 4): the
seed's STANDARD and APPEND_ONLY cases on a table with deletion vectors that Spark updates,
deletes from and merges into; column mapping with partitions; what DROP does (unregisters,
never deletes the user's files); writes refused."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from tests.interop import judge
from volume_stream.errors import InvalidInputError
from volume_stream.tables import registered

CDF = "'delta.enableChangeDataFeed' = 'true'"
DV = "'delta.enableDeletionVectors' = 'true'"
CM = "'delta.columnMapping.mode' = 'name'"
SEED_ROWS = "(1, 'Alice', 20), (2, 'Bob', 25), (3, 'Charlie', 30), (4, 'David', 35), (5, 'Eve', 40)"
MERGE_SEED = ("MERGE INTO {consume} target USING {stream} source_stream "
              "ON target.id = source_stream.id "
              "WHEN MATCHED AND source_stream.__change_type = 'UPDATE_AFTER' "
              "THEN UPDATE SET target.age = source_stream.age, target.name = source_stream.name "
              "WHEN MATCHED AND source_stream.__change_type = 'DELETE' THEN DELETE "
              "WHEN NOT MATCHED AND source_stream.__change_type = 'INSERT' "
              "THEN INSERT VALUES (source_stream.id, source_stream.name, source_stream.age)")


def spark_table(spark, path, props: str, partitioned: bool = False) -> str:
    part = "PARTITIONED BY (age)" if partitioned else ""
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT, name STRING, age INT) USING DELTA {part} "
              f"TBLPROPERTIES ({props})")
    return str(path)


def records(cat, stream) -> list[tuple]:
    return [(r["__change_type"], r["__commit_version"], r["id"], r["name"], r["age"])
            for r in cat.read_stream_arrow(stream).to_pylist()]


@pytest.fixture
def cat(tmp_path, delta_spark):
    return vs.connect(tmp_path / "warehouse", spark=delta_spark)


def test_seed_standard_case_on_a_dv_table_updated_and_merged_by_spark(cat, delta_spark,
                                                                       tmp_path):
    t = spark_table(delta_spark, tmp_path / "lake" / "people", f"{CDF}, {DV}")
    run = delta_spark.sql
    cat.sql(f"CREATE TABLE people LOCATION '{t}' TBLPROPERTIES ('key' = 'id')")
    assert registered.needs_spark(DeltaTable(t)) == {"deletionVectors"}
    cat.sql("CREATE TABLE STREAM s ON TABLE people WITH PROPERTIES "
            "('TABLE_STREAM_MODE' = 'STANDARD')")
    run(f"INSERT INTO delta.`{t}` VALUES {SEED_ROWS}")                     # version 1
    cat.sql("CREATE TABLE consume (id INT, name VARCHAR, age INT)")
    cat.sql("INSERT INTO consume SELECT id, name, age FROM s")
    assert records(cat, "s") == []
    run(f"UPDATE delta.`{t}` SET age = age + 5 WHERE id = 1 OR id = 3")      # version 2
    # an old image carries the version that replaced it (docs/spark-delta.md)
    assert records(cat, "s") == [("UPDATE_BEFORE", 2, 1, "Alice", 20),
                                 ("UPDATE_AFTER", 2, 1, "Alice", 25),
                                 ("UPDATE_BEFORE", 2, 3, "Charlie", 30),
                                 ("UPDATE_AFTER", 2, 3, "Charlie", 35)]
    cat.sql(MERGE_SEED.format(consume="consume", stream="s"))
    assert records(cat, "s") == []
    run(f"DELETE FROM delta.`{t}` WHERE id = 2 OR id = 4")                  # version 3: DVs
    assert records(cat, "s") == [("DELETE", 3, 2, "Bob", 25), ("DELETE", 3, 4, "David", 35)]
    cat.sql(MERGE_SEED.format(consume="consume", stream="s"))
    run(f"MERGE INTO delta.`{t}` t USING (SELECT 5 id, 'Eve' name, 41 age UNION ALL "
        f"SELECT 6, 'Fay', 50) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET * "
        f"WHEN NOT MATCHED THEN INSERT *")                                  # version 4
    assert records(cat, "s") == [("UPDATE_BEFORE", 4, 5, "Eve", 40),
                                 ("UPDATE_AFTER", 4, 5, "Eve", 41), ("INSERT", 4, 6, "Fay", 50)]
    cat.sql(MERGE_SEED.format(consume="consume", stream="s"))
    assert records(cat, "s") == []
    ours = judge.rows(cat.tables.snapshot("consume"), ["id", "name", "age"])
    assert ours == judge.rows(judge.spark_table(delta_spark, t), ["id", "name", "age"])
    assert ours == [(1, "Alice", 25), (3, "Charlie", 35), (5, "Eve", 41), (6, "Fay", 50)]


def test_seed_append_only_case_on_a_dv_table(cat, delta_spark, tmp_path):
    t = spark_table(delta_spark, tmp_path / "lake" / "events", f"{CDF}, {DV}")
    cat.register_table("test_table", t)                   # no key: APPEND_ONLY needs none
    with pytest.raises(InvalidInputError, match="no key"):
        cat.create_stream("std", on_table="test_table")
    cat.create_stream("test_stream", on_table="test_table", mode="APPEND_ONLY")
    delta_spark.sql(f"INSERT INTO delta.`{t}` VALUES {SEED_ROWS}")
    inserted = [("INSERT", 1, *row) for row in ((1, "Alice", 20), (2, "Bob", 25),
                (3, "Charlie", 30), (4, "David", 35), (5, "Eve", 40))]
    assert sorted(records(cat, "test_stream")) == inserted   # no key: in no set order
    for statement in ("UPDATE delta.`{t}` SET age = age + 5 WHERE id = 1 OR id = 3",
                      "DELETE FROM delta.`{t}` WHERE id = 2 OR id = 4"):
        delta_spark.sql(statement.format(t=t))
        assert sorted(records(cat, "test_stream")) == inserted


def test_column_mapping_and_partitions_read_through_delta_spark(cat, delta_spark, tmp_path):
    t = spark_table(delta_spark, tmp_path / "lake" / "mapped", f"{CDF}, {CM}", partitioned=True)
    delta_spark.sql(f"INSERT INTO delta.`{t}` VALUES {SEED_ROWS}")
    delta_spark.sql(f"ALTER TABLE delta.`{t}` RENAME COLUMN name TO who")   # physical != logical
    cat.register_table("mapped", t, key=["id"])
    assert registered.needs_spark(DeltaTable(t)) == {"columnMapping"}
    cat.create_stream("m", on_table="mapped", show_initial_rows=True)
    start = [(r["__change_type"], r["id"], r["who"]) for r in
             cat.read_stream_arrow("m").to_pylist()]
    assert sorted(start) == [("INSERT", 1, "Alice"), ("INSERT", 2, "Bob"),
                             ("INSERT", 3, "Charlie"), ("INSERT", 4, "David"),
                             ("INSERT", 5, "Eve")]
    with cat.consume("m"):
        pass
    delta_spark.sql(f"UPDATE delta.`{t}` SET age = 99 WHERE id = 2")      # moves partitions
    got = [(r["__change_type"], r["id"], r["who"], r["age"]) for r in
           cat.read_stream_arrow("m").to_pylist()]
    assert got == [("UPDATE_BEFORE", 2, "Bob", 25), ("UPDATE_AFTER", 2, "Bob", 99)]
    assert cat.sql("SELECT who FROM mapped WHERE age = 99").rows == [{"who": "Bob"}]
    assert cat.table_path("mapped") == t


def test_drop_unregisters_and_never_deletes_the_users_files(cat, delta_spark, tmp_path):
    t = spark_table(delta_spark, tmp_path / "lake" / "keep", f"{CDF}, {DV}")
    delta_spark.sql(f"INSERT INTO delta.`{t}` VALUES {SEED_ROWS}")
    before = sorted(os.listdir(t))
    cat.register_table("keep", t, key="id")
    for statement in ("INSERT INTO keep VALUES (9, 'x', 1)", "UPDATE keep SET age = 0",
                      "DELETE FROM keep", "ALTER TABLE keep SET PROPERTIES ('key' = 'name')"):
        with pytest.raises(InvalidInputError, match=f"registered from {t}"):
            cat.sql(statement)
    with pytest.raises(InvalidInputError, match="registered from"):
        cat.apply_retention("keep", days=0)
    assert "dropped table keep" in cat.sql("DROP TABLE keep").message
    assert cat.tables.names() == [] and sorted(os.listdir(t)) == before
    assert len(judge.spark_table(delta_spark, t)) == 5
    # registered again, then replaced by a warehouse table of the same name: still untouched
    cat.register_table("keep", t)
    cat.sql("CREATE OR REPLACE TABLE keep (id INT)")
    assert cat.table_path("keep") != t and sorted(os.listdir(t)) == before
    assert len(judge.spark_table(delta_spark, t)) == 5
