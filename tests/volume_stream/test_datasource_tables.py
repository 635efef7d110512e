"""The Structured Streaming source over a Table Stream: `.option("table", ...)`."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException

from volume_stream.datasource import register


@pytest.fixture(scope="module", autouse=True)
def source(spark):
    register(spark)


@pytest.mark.slow
def test_table_source_available_now_and_batch(spark, catalog, tmp_path):
    catalog.sql("CREATE TABLE t (id INT, name STRING)")
    catalog.sql("ALTER TABLE t SET PROPERTIES ('change_tracking' = 'true')")
    start = catalog.tables.version("t")
    catalog.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    catalog.sql("UPDATE t SET name = 'z' WHERE id = 1")
    wh = str(catalog.warehouse.root)

    def load(**options):
        reader = spark.readStream.format("volume_stream").option("warehouse", wh)
        for key, value in {"table": "t", **options}.items():
            reader = reader.option(key, str(value))
        return reader.load()

    df = load(startingVersion=start + 1)
    assert df.columns == ["__change_type", "__commit_version", "__commit_timestamp", "id", "name"]
    query = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True)
             .start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    rows = sorted((r["__change_type"], r["id"], r["name"])
                  for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert rows == [("INSERT", 1, "z"), ("INSERT", 2, "b")]
    batch = (spark.read.format("volume_stream").option("warehouse", wh).option("table", "t")
             .option("mode", "APPEND_ONLY").option("startingVersion", start + 1).load())
    assert sorted((r["id"], r["name"]) for r in batch.collect()) == [(1, "a"), (2, "b")]


def test_table_source_bad_options(spark, catalog):
    wh = str(catalog.warehouse.root)
    catalog.sql("CREATE TABLE plain (id INT)")
    for options, message in (({"table": "nope"}, "table 'nope' does not exist"),
                             ({"table": "plain"}, "does not have change tracking on"),
                             ({"table": "plain", "volume": "v"}, "not both")):
        reader = spark.readStream.format("volume_stream").option("warehouse", wh)
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(PySparkException, match=message):
            reader.load()
