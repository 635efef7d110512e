"""The `volume_stream` Structured Streaming source: offsets are directory-table versions, Spark's
own checkpoint holds them, and a parquet file sink gets every change record exactly once across
availableNow and processingTime triggers, restarts, a failed write and a crash between the
sink's commit and the checkpoint's."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from volume_stream.datasource import register


@pytest.fixture(scope="module", autouse=True)
def source(spark):
    register(spark)


@pytest.fixture
def wh(catalog, volume):
    return str(catalog.warehouse.root)


def apply(catalog, *events):
    return catalog.directory_table("vol").apply(events)


def load(spark, wh, **options):
    reader = spark.readStream.format("volume_stream").option("warehouse", wh)
    for key, value in {"volume": "vol", **options}.items():
        reader = reader.option(key, str(value))
    return reader.load()


def start(df, tmp_path, **trigger):
    return (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "chk")).trigger(**trigger).start())


def run_available_now(spark, wh, tmp_path, **options):
    query = start(load(spark, wh, **options), tmp_path, availableNow=True)
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def output(spark, tmp_path):
    """(change, path, size, version) of what the sink committed, duplicates kept."""
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    return sorted((r["__change_type"], r["relative_path"], r["size"], r["__commit_version"])
                  for r in rows)


# Each streaming query start launches Spark's Python data-source runner and a micro-batch
# execution (a few seconds on a quiet machine): the two tests below start three queries each
# and can pass 30 s on a loaded one.
@pytest.mark.slow
def test_available_now_in_bounded_batches_then_restart_from_checkpoint(spark, catalog, wh, ev,
                                                                         tmp_path, data_dir):
    apply(catalog, ev.put("a.jpg", 1))
    apply(catalog, ev.put("b.jpg", 2), ev.put("c.jpg", 3))
    opts = {"mode": "APPEND_ONLY", "maxFilesPerTrigger": 2}
    # at most 2 files per micro-batch, at version granularity: v1 | v2
    assert run_available_now(spark, wh, tmp_path, **opts) == [1, 2]
    first = output(spark, tmp_path)
    assert first == [("INSERT", "a.jpg", 1, 1), ("INSERT", "b.jpg", 2, 2),
                     ("INSERT", "c.jpg", 3, 2)]
    apply(catalog, ev.put("a.jpg", 10), ev.rm("b.jpg"), ev.put("e.jpg", 5))
    assert run_available_now(spark, wh, tmp_path, **opts) == [1]  # only the new insert
    assert output(spark, tmp_path) == sorted(first + [("INSERT", "e.jpg", 5, 3)])
    # the volume replaced under the checkpoint: a clear error, not a silent re-read
    catalog.drop_volume("vol")
    catalog.create_volume("vol", data_dir)
    query = start(load(spark, wh, **opts), tmp_path, availableNow=True)
    with pytest.raises(PySparkException, match="dropped or replaced"):
        query.awaitTermination(120)


def test_processing_time_trigger_standard_mode_survives_a_restart(spark, catalog, wh, ev,
                                                                   tmp_path):
    apply(catalog, ev.put("old.txt", 9))  # before the query: skipped by startingVersion=latest
    df = load(spark, wh, startingVersion="latest")
    query = start(df, tmp_path, processingTime="200 milliseconds")
    try:
        query.processAllAvailable()  # the query has fixed its starting version
        apply(catalog, ev.put("a.txt", 1), ev.put("b.txt", 2))
        query.processAllAvailable()
        apply(catalog, ev.put("c.txt", 3))
        query.processAllAvailable()
    finally:
        query.stop()
    assert output(spark, tmp_path) == [("INSERT", "a.txt", 1, 2), ("INSERT", "b.txt", 2, 2),
                                       ("INSERT", "c.txt", 3, 3)]
    # changes while the query is down are picked up from its checkpoint on restart
    apply(catalog, ev.put("a.txt", 7), ev.rm("b.txt"))
    query = start(load(spark, wh, startingVersion="latest"), tmp_path,
                  processingTime="200 milliseconds")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert output(spark, tmp_path) == [
        ("DELETE", "b.txt", 2, 2), ("INSERT", "a.txt", 1, 2), ("INSERT", "b.txt", 2, 2),
        ("INSERT", "c.txt", 3, 3), ("UPDATE_AFTER", "a.txt", 7, 4),
        ("UPDATE_BEFORE", "a.txt", 1, 2)]


@pytest.mark.slow
def test_a_failed_write_and_a_crash_before_the_checkpoint_lose_and_duplicate_nothing(
        spark, catalog, wh, ev, tmp_path):
    flag = tmp_path / "sink-is-down"

    @F.udf("string")
    def sink_check(path):
        import os

        if os.path.exists(flag) and path == "poison.txt":
            raise OSError("sink unavailable while writing " + path)
        return path

    def query():
        df = load(spark, wh).repartition(2, "relative_path")
        return start(df.withColumn("checked", sink_check("relative_path")), tmp_path,
                     availableNow=True)

    # 1. the write of the first batch fails part-way (one task fails, the other may have written)
    apply(catalog, *(ev.put(f"f{i}.txt", i) for i in range(6)), ev.put("poison.txt", 99))
    flag.touch()
    q = query()
    with pytest.raises(PySparkException, match="sink unavailable"):
        q.awaitTermination(120)
    flag.unlink()
    q = query()
    q.awaitTermination(120)
    assert q.exception() is None
    # 2. a crash after the sink committed the batch but before the checkpoint recorded it
    for name in ("0", ".0.crc"):  # as if the driver died before writing them
        (tmp_path / "chk" / "commits" / name).unlink()
    q = query()
    q.awaitTermination(120)
    assert q.exception() is None
    expected = [("INSERT", f"f{i}.txt", i, 1) for i in range(6)] + [("INSERT", "poison.txt", 99, 1)]
    assert output(spark, tmp_path) == sorted(expected)


def test_batch_reads_and_starting_points(spark, catalog, wh, ev):
    apply(catalog, ev.put("a.txt", 1))
    time.sleep(0.05)
    between = datetime.now(UTC)
    time.sleep(0.05)
    apply(catalog, ev.put("b.txt", 2))
    apply(catalog, ev.put("a.txt", 3))

    def read(**options):
        reader = spark.read.format("volume_stream").option("warehouse", wh).option("volume", "vol")
        for key, value in options.items():
            reader = reader.option(key, str(value))
        return sorted((r["__change_type"], r["relative_path"], r["__commit_version"])
                      for r in reader.load().collect())

    assert read() == [("INSERT", "a.txt", 3), ("INSERT", "b.txt", 2)]
    assert read(mode="APPEND_ONLY") == [("INSERT", "a.txt", 1), ("INSERT", "b.txt", 2)]
    assert read(startingVersion=2, endingVersion=2) == [("INSERT", "b.txt", 2)]
    assert read(startingTimestamp=between.isoformat()) == [
        ("INSERT", "b.txt", 2), ("UPDATE_AFTER", "a.txt", 3), ("UPDATE_BEFORE", "a.txt", 1)]
    assert read(startingVersion="latest") == []


@pytest.mark.parametrize("options, message", [
    ({"volume": "nope"}, r"volume 'nope' does not exist \(existing volumes: vol\)"),
    ({"mode": "FAST"}, "mode must be STANDARD or APPEND_ONLY"),
    ({"maxFilesPerTrigger": 0}, "maxFilesPerTrigger must be >= 1"),
    ({"startingVersion": 1, "startingTimestamp": "2026-01-01"}, "not both"),
    ({"startingTimestamp": "yesterday"}, "not an ISO timestamp"),
    ({"colour": "blue"}, r"unknown volume_stream options \['colour'\]"),
    ({"warehouse": "/nonexistent/wh"}, "is not a volume-stream warehouse"),
])
def test_bad_options_fail_when_the_query_is_defined(spark, wh, options, message):
    with pytest.raises(PySparkException, match=message):
        load(spark, wh, **options)
