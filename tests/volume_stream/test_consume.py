"""Consuming: offsets move only on success, racing consumers conflict, stale streams error."""

from __future__ import annotations

import threading

import pytest

import volume_stream as vs
from tests.volume_stream.conftest import rows


def apply(catalog, volume, *events):
    return catalog.directory_table(volume).apply(events)


def test_offset_moves_only_when_block_succeeds(catalog, volume, ev):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    with pytest.raises(RuntimeError, match="sink failed"):
        with catalog.consume("s") as batch:
            assert (batch.start_version, batch.end_version, batch.batch_id) == (0, 1, 0)
            raise RuntimeError("sink failed")
    assert catalog.describe_stream("s")["offset"] == 0
    # the retry sees the same range and the same batch id
    with catalog.consume("s") as batch:
        assert (batch.start_version, batch.end_version, batch.batch_id) == (0, 1, 0)
        assert rows(batch.records) == [("INSERT", "a.txt", 1, 1)]
        assert batch.df.count() == 1
    info = catalog.describe_stream("s")
    assert info["offset"] == 1 and info["batch_id"] == 1 and info["pending_changes"] == 0


def test_consume_pins_range_at_start(catalog, volume, ev):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    with catalog.consume("s") as batch:
        apply(catalog, volume, ev.put("b.txt"))  # lands after the pin
        assert batch.end_version == 1
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "b.txt", 1, 2)]


def test_two_consumers_racing_one_gets_conflict(catalog, volume, ev):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    other = vs.connect(catalog.warehouse.root, spark=catalog.spark)
    outcomes = []
    barrier = threading.Barrier(2)

    def consume(cat):
        try:
            with cat.consume("s"):
                barrier.wait(timeout=30)
            outcomes.append("ok")
        except vs.ConsumeConflictError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=consume, args=(c,)) for c in (catalog, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 2 and outcomes.count("ok") == 1
    (conflict,) = [o for o in outcomes if o != "ok"]
    assert "another consumer committed first" in conflict and "'s'" in conflict
    info = catalog.describe_stream("s")
    assert info["offset"] == 1 and info["batch_id"] == 1  # moved exactly once


def test_empty_consume_does_not_move_or_conflict(catalog, volume):
    catalog.create_stream("s", volume)
    with catalog.consume("s") as batch:
        assert batch.empty
    assert catalog.describe_stream("s")["batch_id"] == 0


def test_stale_stream_errors_with_offset_and_oldest(catalog, data_dir, ev):
    catalog.create_volume("short", data_dir, data_retention_days=0)
    catalog.create_stream("s", "short")
    for i in range(3):
        apply(catalog, "short", ev.put(f"f{i}.txt"))
    kept = catalog.apply_retention("short")
    assert kept["oldest_version"] == 3
    with pytest.raises(vs.StaleStreamError) as err:
        catalog.read_stream_arrow("s")
    assert "'s'" in str(err.value) and "version 0" in str(err.value) and "3" in str(err.value)
    with pytest.raises(vs.StaleStreamError):
        with catalog.consume("s"):
            pass
    assert catalog.describe_stream("s")["stale"] is True
    # a new stream works from the kept versions on
    catalog.create_stream("fresh", "short", show_initial_rows=True)
    assert len(rows(catalog.read_stream_arrow("fresh"))) == 3
    apply(catalog, "short", ev.put("later.txt"))
    catalog.create_stream("t", "short", replace=True)
    assert catalog.read_stream_arrow("t").num_rows == 0


def test_state_persists_across_connect(catalog, volume, ev, spark):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    with catalog.consume("s"):
        pass
    again = vs.connect(catalog.warehouse.root, spark=spark)
    assert [v["name"] for v in again.list_volumes()] == ["vol"]
    assert again.describe_stream("s")["offset"] == 1


def test_retry_after_failure_gets_exactly_the_pinned_range(catalog, volume, ev):
    """A batch id names one range: a file arriving between a failure and its retry is not
    folded into the retried batch (a sink skipping batch ids it already wrote would lose it)."""
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    with pytest.raises(RuntimeError):
        with catalog.consume("s") as batch:
            assert (batch.start_version, batch.end_version, batch.batch_id) == (0, 1, 0)
            raise RuntimeError("sink failed after writing batch 0")
    apply(catalog, volume, ev.put("b.txt"))  # arrives before the retry
    info = catalog.describe_stream("s")
    assert info["offset"] == 0 and info["batch_id"] == 0
    with catalog.consume("s") as batch:  # the retry: batch 0 is still (0, 1]
        assert (batch.start_version, batch.end_version, batch.batch_id) == (0, 1, 0)
        assert rows(batch.records) == [("INSERT", "a.txt", 1, 1)]
    with catalog.consume("s") as batch:  # the next batch takes the rest
        assert (batch.start_version, batch.end_version, batch.batch_id) == (1, 2, 1)
        assert rows(batch.records) == [("INSERT", "b.txt", 1, 2)]
    with catalog.consume("s") as batch:
        assert batch.empty and batch.batch_id == 2
    assert catalog.describe_stream("s")["offset"] == 2


def test_sql_retry_keeps_the_pinned_range(catalog, volume, ev, db):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt"))
    catalog.spark.sql("CREATE TABLE sink (relative_path STRING) USING parquet")
    with pytest.raises(vs.VolumeStreamError):
        catalog.sql("INSERT INTO sink SELECT relative_path FROM s WHERE no_such_column = 1")
    apply(catalog, volume, ev.put("b.txt"))
    result = catalog.sql("INSERT INTO sink SELECT relative_path FROM s")
    assert result.offsets["s"]["end"] == 1 and result.offsets["s"]["batch_id"] == 0
    result = catalog.sql("INSERT INTO sink SELECT relative_path FROM s")
    assert result.offsets["s"]["end"] == 2 and result.offsets["s"]["batch_id"] == 1
    got = sorted(r[0] for r in catalog.spark.sql("SELECT relative_path FROM sink").collect())
    assert got == ["a.txt", "b.txt"]
