"""Users' own Delta tools on our SQL tables, judged by Delta Spark: a Spark `UPDATE` racing our
SQL `UPDATE` on one row loses no update either way (whichever commits second learns of the
first: ours plans again, Spark's fails with Delta's concurrent-modification error and is run
again, as a user's job would); `OPTIMIZE` changes no record of a table stream; Spark's `VACUUM`
makes a table stream over the removed versions stale; and a table feature delta-rs's reader
refuses (deletion vectors) is refused by name instead of read wrong."""

from __future__ import annotations

import logging
import threading

import pytest

import volume_stream as vs
from tests.interop import judge

#: what Delta Spark raises when another writer committed first (the user runs it again)
CONFLICTS = ("ConcurrentAppend", "ConcurrentDeleteRead", "ConcurrentDeleteDelete",
             "ConcurrentTransaction", "DELTA_CONCURRENT")


@pytest.fixture
def cat(tmp_path, delta_spark):
    catalog = vs.connect(tmp_path / "warehouse", spark=delta_spark)
    catalog.sql("CREATE TABLE c (id INT, n INT)")
    catalog.sql("ALTER TABLE c SET PROPERTIES ('change_tracking' = 'true')")
    catalog.sql("INSERT INTO c VALUES (1, 0), (2, 0)")
    return catalog


def _rows(table, columns=("id", "n")) -> list[tuple]:
    return judge.rows(table, list(columns))


@pytest.mark.slow  # Spark maintenance racing our writers: make soak
def test_spark_update_and_our_update_racing_lose_no_update(cat, delta_spark, caplog):
    """Round by round, our UPDATE and Spark's start together on the same row; every update
    either commits once or is run again, so n ends at the number of updates, each of the values
    0..n is the post-image of exactly one change, and there are still two rows."""
    path = cat.table_path("c")
    rounds = {"ours": 0, "spark": 0, "spark_conflicts": 0}
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    errors: list[BaseException] = []

    def ours() -> None:
        try:
            while go.acquire(timeout=300) and rounds["ours"] >= 0:
                cat.sql("UPDATE c SET n = n + 1 WHERE id = 1")
                rounds["ours"] += 1
                done.release()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            done.release()

    thread = threading.Thread(target=ours, name="our-update")
    thread.start()
    caplog.set_level(logging.INFO, logger="volume_stream.tables.store")
    try:
        for _ in range(4):
            go.release()  # our UPDATE starts as Spark's does
            while True:
                try:
                    delta_spark.sql(f"UPDATE delta.`{path}` SET n = n + 1 WHERE id = 1")
                    rounds["spark"] += 1
                    break
                except Exception as exc:
                    if not any(c in str(exc) for c in CONFLICTS):
                        raise
                    rounds["spark_conflicts"] += 1  # ours committed first: run it again
            assert done.acquire(timeout=300)
            assert not errors, errors
    finally:
        rounds["ours"] = -1 << 30
        go.release()
        thread.join(300)
    assert not errors, errors
    ours_lost = sum("planning the statement again" in r.getMessage() for r in caplog.records)
    print(f"our UPDATEs replanned {ours_lost}x, Spark's run again {rounds['spark_conflicts']}x")
    total = 8
    assert _rows(judge.spark_table(delta_spark, path)) == [(1, total), (2, 0)]
    assert _rows(cat.tables.snapshot("c")) == [(1, total), (2, 0)]
    latest = cat.tables.version("c")
    feed = cat.tables.changes("c", 2, latest)
    post = sorted(r["n"] for r in feed.to_pylist() if r["_change_type"] == "update_postimage")
    assert post == list(range(1, total + 1))  # each increment once, none lost or doubled
    columns = ["id", "n", "_change_type", "_commit_version"]
    assert judge.rows(feed, columns) == \
        judge.rows(judge.spark_changes(delta_spark, path, 2, latest), columns)


@pytest.mark.slow  # Spark maintenance racing our writers: make soak
def test_a_table_stream_across_spark_optimize_and_vacuum(cat, delta_spark):
    path = cat.table_path("c")
    cat.create_stream("s", on_table="c")
    for i in range(3):
        cat.sql(f"INSERT INTO c VALUES ({10 + i}, {i})")
    cat.sql("UPDATE c SET n = 7 WHERE id = 11")
    delta_spark.sql(f"OPTIMIZE delta.`{path}`").collect()  # dataChange=false: no record
    cat.sql("DELETE FROM c WHERE id = 12")
    records = judge.rows(cat.read_stream("s").toArrow(), ["id", "n", "__change_type"])
    assert records == sorted([(10, 0, "INSERT"), (11, 7, "INSERT")], key=repr)
    cat.create_stream("late", on_table="c")
    delta_spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        delta_spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
    finally:
        delta_spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    with pytest.raises(vs.StaleStreamError, match="stream 's' is stale") as stale:
        cat.read_stream("s")
    assert stale.value.offset == 2 and stale.value.oldest > 2
    assert cat.describe_stream("s")["stale"]
    cat.sql("UPDATE c SET n = 8 WHERE id = 10")
    assert judge.rows(cat.read_stream("late").toArrow(), ["id", "n", "__change_type"]) == \
        sorted([(10, 0, "UPDATE_BEFORE"), (10, 8, "UPDATE_AFTER")], key=repr)
    assert _rows(cat.sql("SELECT id, n FROM c").to_arrow()) == \
        _rows(judge.spark_table(delta_spark, path))


def test_deletion_vectors_turned_on_by_spark_are_refused_by_name(cat, delta_spark):
    """delta-rs's reader refuses deletion vectors, and a table's data files read straight would
    bring rows Spark deleted back: our reads of the table name the table and the feature."""
    path = cat.table_path("c")
    cat.sql("INSERT INTO c VALUES (3, 0), (4, 0)")
    delta_spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                    f"('delta.enableDeletionVectors' = 'true')").collect()
    delta_spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3").collect()  # a deletion vector
    for read in (lambda: cat.sql("SELECT * FROM c"), lambda: cat.tables.snapshot("c"),
                 lambda: cat.tables.file_uris("c")):
        with pytest.raises(vs.VolumeStreamError, match="table 'c'.*deletionVectors") as exc:
            read()
        assert path in str(exc.value)
    with pytest.raises(vs.UnsupportedFeatureError) as exc:
        cat.tables.snapshot("c")
    assert exc.value.features == ["deletionVectors"] and exc.value.table == path
