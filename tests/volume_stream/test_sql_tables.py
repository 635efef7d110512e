"""SQL tables in the warehouse and Table Streams on them (issue 14), through `cat.sql`.

The seed's two cases (yunqi.tech "TABLE STREAM 功能介绍": APPEND_ONLY and STANDARD) run statement
by statement with their expected rows; versions are compared relative to the table's first
version (Delta numbers them from 0).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs
from volume_stream.sql import SqlError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cat(tmp_path, spark, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    catalog = vs.connect(tmp_path / "warehouse", spark=spark)
    yield catalog
    assert sorted(p.name for p in cwd.iterdir()) == []  # no spark-warehouse/, metastore_db/


def run(cat, script):
    """Run a script statement by statement; the last statement's result."""
    result = None
    for statement in vs.sql.statements(script):
        result = vs.sql.run_statement(cat, statement)
    return result


def changes(result, base):
    return [(r["__change_type"], r["__commit_version"] - base, r["id"], r["name"], r["age"])
            for r in result.rows]


def people(cat, table):
    return sorted((r["id"], r["name"], r["age"]) for r in cat.sql(f"SELECT * FROM {table}"))


SETUP = """
CREATE TABLE {t} (id INT, name VARCHAR, age INT);
ALTER TABLE {t} SET PROPERTIES ('change_tracking' = 'true');
CREATE TABLE STREAM {s} ON TABLE {t} WITH PROPERTIES ('TABLE_STREAM_MODE' = '{mode}');
INSERT INTO {t} VALUES (1, 'Alice', 25), (2, 'Bob', 30), (3, 'Charlie', 35);
"""


def test_seed_append_only(cat):
    run(cat, SETUP.format(t="test_append_only", s="append_only_stream", mode="APPEND_ONLY"))
    base = cat.tables.oldest_version("test_append_only")  # the CREATE TABLE
    inserted = [("INSERT", 2, 1, "Alice", 25), ("INSERT", 2, 2, "Bob", 30),
                ("INSERT", 2, 3, "Charlie", 35)]
    assert changes(cat.sql("SELECT * FROM append_only_stream"), base) == inserted
    cols = cat.sql("SELECT * FROM append_only_stream").df.columns
    assert cols == ["__change_type", "__commit_version", "__commit_timestamp", "id", "name", "age"]
    run(cat, """UPDATE test_append_only SET age = age + 5 WHERE id = 1 OR id = 3;
                DELETE FROM test_append_only WHERE id = 2 OR id = 4""")
    # APPEND_ONLY: every insert, unaffected by the later update and delete
    assert changes(cat.sql("SELECT * FROM append_only_stream"), base) == inserted
    assert people(cat, "test_append_only") == [(1, "Alice", 30), (3, "Charlie", 40)]
    # consuming: CREATE TABLE AS SELECT moves the offset; a SELECT never does
    result = cat.sql("CREATE TABLE appended AS SELECT id, name, age FROM append_only_stream")
    assert result.offsets["append_only_stream"]["records"] == 3
    assert cat.sql("SELECT * FROM append_only_stream").rows == []
    assert people(cat, "appended") == [(1, "Alice", 25), (2, "Bob", 30), (3, "Charlie", 35)]


def test_seed_standard_with_merge(cat):
    run(cat, SETUP.format(t="test_standard", s="standard_stream", mode="STANDARD"))
    base = cat.tables.oldest_version("test_standard")
    assert changes(cat.sql("SELECT * FROM standard_stream"), base) == [
        ("INSERT", 2, 1, "Alice", 25), ("INSERT", 2, 2, "Bob", 30),
        ("INSERT", 2, 3, "Charlie", 35)]
    run(cat, """CREATE TABLE target_table (id INT, name VARCHAR, age INT);
                INSERT INTO target_table SELECT id, name, age FROM standard_stream""")
    assert cat.sql("SELECT * FROM standard_stream").rows == []
    cat.sql("UPDATE test_standard SET age = age + 5 WHERE id = 1 OR id = 3")
    assert changes(cat.sql("SELECT * FROM standard_stream"), base) == [
        ("UPDATE_BEFORE", 2, 1, "Alice", 25), ("UPDATE_AFTER", 3, 1, "Alice", 30),
        ("UPDATE_BEFORE", 2, 3, "Charlie", 35), ("UPDATE_AFTER", 3, 3, "Charlie", 40)]
    # several stream rows match one target row; only one clause applies to each
    merge = cat.sql("""
        MERGE INTO target_table AS t USING standard_stream AS s ON t.id = s.id
        WHEN MATCHED AND s.__change_type = 'UPDATE_AFTER' THEN UPDATE SET t.name = s.name,
             t.age = s.age
        WHEN MATCHED AND s.__change_type = 'DELETE' THEN DELETE
        WHEN NOT MATCHED AND s.__change_type = 'INSERT' THEN INSERT VALUES (s.id, s.name, s.age)
    """)
    assert merge.offsets["standard_stream"]["records"] == 4
    assert people(cat, "target_table") == [(1, "Alice", 30), (2, "Bob", 30), (3, "Charlie", 40)]
    assert cat.sql("SELECT * FROM standard_stream").rows == []
    cat.sql("DELETE FROM test_standard WHERE id = 2 OR id = 4")
    # DELETE shows the old image with the version that wrote it
    assert changes(cat.sql("SELECT * FROM standard_stream"), base) == [
        ("DELETE", 2, 2, "Bob", 30)]
    cat.sql("""MERGE INTO target_table t USING standard_stream s ON t.id = s.id
               WHEN MATCHED AND s.__change_type = 'DELETE' THEN DELETE""")
    assert people(cat, "target_table") == [(1, "Alice", 30), (3, "Charlie", 40)]
    # inserted then updated in one range = one INSERT of the latest value; then deleted: none
    run(cat, """INSERT INTO test_standard VALUES (7, 'Gus', 1), (8, 'Hal', 2);
                UPDATE test_standard SET age = 70 WHERE id = 7;
                DELETE FROM test_standard WHERE id = 8""")
    rows = changes(cat.sql("SELECT * FROM standard_stream"), base)
    assert [(r[0], r[2], r[3], r[4]) for r in rows] == [("INSERT", 7, "Gus", 70)]


def test_tables_ddl_describe_show_and_dml(cat):
    run(cat, """
        CREATE TABLE IF NOT EXISTS orders (id BIGINT COMMENT 'order id', customer STRING,
            amount DECIMAL(10, 2), paid BOOLEAN, score DOUBLE, at TIMESTAMP) COMMENT 'orders';
        CREATE TABLE IF NOT EXISTS orders (x INT);
        INSERT INTO orders VALUES (1, 'ann', 10.50, true, 0.5, TIMESTAMP '2024-01-01 00:00:00'),
                                  (2, 'bob', 3.25, false, 1.5, TIMESTAMP '2024-01-02 00:00:00');
        INSERT INTO orders (id, customer) VALUES (3, 'cy');
    """)
    desc = {r["col_name"]: (r["data_type"], r["comment"]) for r in cat.sql("DESCRIBE TABLE orders")}
    assert desc["id"] == ("bigint", "order id") and desc["amount"] == ("decimal(10,2)", None)
    assert desc["at"][0] == "timestamp" and "_vs_row_id" not in desc
    shown = cat.sql("SHOW TABLES").rows
    assert [(r["name"], r["comment"]) for r in shown] == [("orders", "orders")]
    assert cat.sql("SELECT count(*) AS n FROM orders WHERE amount IS NULL").rows == [{"n": 1}]
    cat.sql("UPDATE orders SET amount = amount * 2, paid = true WHERE customer = 'bob'")
    assert cat.sql("SELECT CAST(amount AS STRING) AS a FROM orders WHERE id = 2").rows == [
        {"a": "6.50"}]
    cat.sql("INSERT OVERWRITE orders SELECT * FROM orders WHERE id < 3")
    cat.sql("DELETE FROM orders WHERE id = 1")
    assert cat.sql("SELECT id FROM orders").rows == [{"id": 2}]
    cat.sql("DELETE FROM orders")
    assert cat.sql("SELECT * FROM orders").rows == []
    cat.sql("DROP TABLE orders")
    assert cat.sql("SHOW TABLES").rows == []
    assert cat.sql("DROP TABLE IF EXISTS orders").message == "no table orders"


def test_bad_input_is_named_and_nothing_is_half_written(cat):
    run(cat, """CREATE TABLE t (id INT, name STRING);
                INSERT INTO t VALUES (1, 'a')""")
    version = cat.tables.version("t")
    with pytest.raises(vs.NotFoundError, match=r"table 'nope' does not exist \(existing "
                                               r"tables: t\)"):
        cat.sql("INSERT INTO nope VALUES (1)")
    with pytest.raises(vs.NotFoundError, match=r"table 'nope' does not exist \(existing "
                                               r"tables: t\)"):
        cat.sql("CREATE TABLE STREAM s ON TABLE nope")
    with pytest.raises(vs.InvalidInputError, match="'t' does not have change tracking on"):
        cat.sql("CREATE TABLE STREAM s ON TABLE t WITH PROPERTIES "
                "('TABLE_STREAM_MODE' = 'STANDARD')")
    with pytest.raises(vs.InvalidInputError, match="column 'id'.*type mismatch"):
        cat.sql("INSERT INTO t VALUES ('one', 'b')")
    with pytest.raises(vs.InvalidInputError, match="no column 'nme'"):
        cat.sql("UPDATE t SET nme = 'x'")
    with pytest.raises(vs.NotFoundError, match=r"stream 'nope' does not exist"):
        cat.read_stream_arrow("nope")
    cat.spark.sql("CREATE OR REPLACE TEMPORARY VIEW spark_only AS SELECT 1 AS id")
    try:
        with pytest.raises(vs.InvalidInputError, match="spark_only.*not a Delta table"):
            cat.sql("MERGE INTO spark_only USING t ON spark_only.id = t.id "
                    "WHEN MATCHED THEN DELETE")
    finally:
        cat.spark.catalog.dropTempView("spark_only")
    with pytest.raises(SqlError, match="'t' already exists"):
        cat.sql("CREATE TABLE t AS SELECT 1 AS id")
    assert cat.tables.version("t") == version
    assert cat.sql("SELECT * FROM t").rows == [{"id": 1, "name": "a"}]


def test_python_streams_on_tables_and_show_streams(cat, tmp_path):
    run(cat, """CREATE TABLE t (id INT, name STRING);
                ALTER TABLE t SET PROPERTIES ('change_tracking' = 'true');
                INSERT INTO t VALUES (1, 'a')""")
    cat.create_stream("ts", on_table="t", mode="STANDARD", show_initial_rows=True)
    (tmp_path / "data").mkdir()
    cat.create_volume("v", tmp_path / "data")
    cat.create_stream("vs_", on_volume="v")
    shown = {r["name"]: (r["volume"], r["table"]) for r in cat.sql("SHOW STREAMS")}
    assert shown == {"ts": (None, "t"), "vs_": ("v", None)}
    assert cat.read_stream("ts").count() == 1
    info = cat.describe_stream("ts")
    assert (info["table"], info["pending_changes"], info["stale"]) == ("t", 1, False)
    with pytest.raises(RuntimeError):
        with cat.consume("ts") as batch:
            assert batch.records.num_rows == 1
            raise RuntimeError("the sink failed")
    assert cat.describe_stream("ts")["pending_changes"] == 1  # not moved
    with cat.consume("ts") as batch:
        assert batch.records.column("id").to_pylist() == [1]
    assert cat.describe_stream("ts")["pending_changes"] == 0
    cat.sql("INSERT INTO t VALUES (2, 'b')")
    # a second process in another working directory sees tables, streams and offsets
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import json, sys, volume_stream as vs; cat = vs.connect(sys.argv[1]); "
            "print(json.dumps([[r['name'] for r in cat.sql('SHOW TABLES')], "
            "cat.describe_stream('ts')['offset'], cat.read_stream_arrow('ts')['id'].to_pylist()]))")
    out = subprocess.run([sys.executable, "-c", code, str(cat.warehouse.root)], cwd=elsewhere,
                         capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [["t"], cat.describe_stream("ts")["offset"], [2]]
    assert list(elsewhere.iterdir()) == []


def test_queue_type_local_is_accepted_with_a_note(cat, tmp_path):
    (tmp_path / "landing").mkdir()
    result = cat.sql(f"""CREATE EXTERNAL VOLUME landing LOCATION '{tmp_path / "landing"}'
        NOTIFICATION = (QUEUE_TYPE = 'LOCAL' QUEUE_NAME = 'ignored_queue')""")
    assert "QUEUE_NAME" in result.message and "ignored" in result.message


def test_merge_from_a_query_positional_insert_and_update_star(cat):
    run(cat, """CREATE TABLE m (id INT, who STRING);
                INSERT INTO m VALUES (1, 'old')""")
    cat.sql("""MERGE INTO m USING (SELECT 1 AS k, 'new' AS w UNION ALL SELECT 2, 'two') src
               ON m.id = src.k
               WHEN MATCHED THEN UPDATE SET who = upper(src.w)
               WHEN NOT MATCHED THEN INSERT VALUES (src.k * 10, src.w)""")
    assert sorted((r["id"], r["who"]) for r in cat.sql("SELECT * FROM m")) == [
        (1, "NEW"), (20, "two")]
    with pytest.raises(vs.InvalidInputError, match="2 values for 1 columns"):
        cat.sql("""MERGE INTO m USING (SELECT 3 AS id) s ON m.id = s.id
                   WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id, 'x')""")


def test_failed_writes_leave_stream_offsets_and_retention_makes_streams_stale(cat):
    run(cat, """CREATE TABLE src (id INT, name STRING);
                ALTER TABLE src SET PROPERTIES ('change_tracking' = 'true',
                                                'delta.logRetentionDuration' = 'interval 0 seconds');
                CREATE TABLE STREAM s ON TABLE src WITH PROPERTIES ('TABLE_STREAM_MODE' = 'STANDARD');
                CREATE TABLE dst (id INT, name STRING);
                INSERT INTO src VALUES (1, 'a')""")
    offset = cat.describe_stream("s")["offset"]
    with pytest.raises(vs.InvalidInputError, match="type mismatch"):
        cat.sql("INSERT INTO dst SELECT name, id FROM s")
    with pytest.raises(vs.VolumeStreamError):
        cat.sql("MERGE INTO dst USING s ON dst.id = s.id "
                "WHEN NOT MATCHED THEN INSERT VALUES (s.no_such, s.name)")
    with pytest.raises(vs.InvalidInputError, match="type mismatch"):
        cat.sql("INSERT INTO dst SELECT 'x', name FROM s")
    assert cat.describe_stream("s")["offset"] == offset
    assert cat.sql("SELECT * FROM dst").rows == [] and "dst" in cat.tables.names()
    cat.sql("INSERT INTO src VALUES (2, 'b')")
    cat.apply_retention("src", days=0)
    assert cat.describe_stream("s")["stale"] is True
    with pytest.raises(vs.StaleStreamError, match="'s'"):
        cat.read_stream_arrow("s")
