"""DESIGN §5 stream semantics, every row of the minimal-change table, on real Delta tables."""

from __future__ import annotations

import pytest

from tests.volume_stream.conftest import rows


def apply(catalog, volume, *events):
    return catalog.directory_table(volume).apply(events)


def test_absent_then_present_is_insert(catalog, volume, ev):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt", 3))
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "a.txt", 3, 1)]


def test_present_then_gone_is_delete_with_old_version(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 3))
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("b.txt", 1))
    apply(catalog, volume, ev.rm("a.txt"))
    assert rows(catalog.read_stream_arrow("s")) == [("DELETE", "a.txt", 3, 1),
                                                    ("INSERT", "b.txt", 1, 2)]


def test_changed_is_update_pair_with_each_images_version(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 3))
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt", 4))
    apply(catalog, volume, ev.put("a.txt", 5))
    assert rows(catalog.read_stream_arrow("s")) == [("UPDATE_AFTER", "a.txt", 5, 3),
                                                    ("UPDATE_BEFORE", "a.txt", 3, 1)]


def test_absent_at_both_is_nothing(catalog, volume, ev):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt", 3))
    apply(catalog, volume, ev.rm("a.txt"))
    assert catalog.read_stream_arrow("s").num_rows == 0


def test_equal_at_both_is_nothing(catalog, volume, ev):
    first = ev.put("a.txt", 3, etag="x")
    apply(catalog, volume, first)
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.rm("a.txt"))
    # recreated with exactly the same image
    from connectors.events import FileEvent
    again = FileEvent.created("a.txt", size=3, etag="x",
                              last_modified_time=first.last_modified_time, event_time=ev._t())
    apply(catalog, volume, again)
    assert catalog.read_stream_arrow("s").num_rows == 0


def test_timestamps_are_those_of_the_image(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 3))
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("a.txt", 4))
    hist = {h["version"]: h["timestamp"] for h in catalog.history(volume)}
    d = catalog.read_stream_arrow("s").to_pylist()
    for rec in d:
        assert rec["__commit_timestamp"] == hist[rec["__commit_version"]]


def test_append_only_keeps_inserts_even_if_later_deleted(catalog, volume, ev):
    apply(catalog, volume, ev.put("old.txt", 1))
    catalog.create_stream("s", volume, mode="APPEND_ONLY")
    apply(catalog, volume, ev.put("a.txt", 1))
    apply(catalog, volume, ev.put("a.txt", 2), ev.rm("old.txt"))
    apply(catalog, volume, ev.rm("a.txt"))
    apply(catalog, volume, ev.put("a.txt", 7))
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "a.txt", 1, 2),
                                                    ("INSERT", "a.txt", 7, 5)]


def test_show_initial_rows_standard(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 1), ev.put("b.txt", 2))
    catalog.create_stream("s", volume, show_initial_rows=True)
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "a.txt", 1, 1),
                                                    ("INSERT", "b.txt", 2, 1)]
    apply(catalog, volume, ev.put("c.txt", 3))
    with catalog.consume("s") as batch:
        assert rows(batch.records) == [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1),
                                       ("INSERT", "c.txt", 3, 2)]
    assert catalog.read_stream_arrow("s").num_rows == 0
    apply(catalog, volume, ev.rm("a.txt"))
    assert rows(catalog.read_stream_arrow("s")) == [("DELETE", "a.txt", 1, 1)]


def test_show_initial_rows_append_only(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 1))
    catalog.create_stream("s", volume, mode="append_only", show_initial_rows=True)
    apply(catalog, volume, ev.put("a.txt", 2), ev.put("b.txt", 1))
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "a.txt", 1, 1),
                                                    ("INSERT", "b.txt", 1, 2)]


def test_initial_rows_on_empty_volume_then_consumed_once(catalog, volume, ev):
    catalog.create_stream("s", volume, show_initial_rows=True)
    with catalog.consume("s") as batch:
        assert batch.empty and batch.batch_id == 0
    apply(catalog, volume, ev.put("a.txt", 1))
    with catalog.consume("s") as batch:
        assert batch.batch_id == 1
        assert rows(batch.records) == [("INSERT", "a.txt", 1, 1)]


def test_at_timestamp_starts_at_last_version_at_or_before(catalog, volume, ev):
    apply(catalog, volume, ev.put("a.txt", 1))
    v1_time = catalog.history(volume)[0]["timestamp"]
    apply(catalog, volume, ev.put("b.txt", 1))
    apply(catalog, volume, ev.put("c.txt", 1))
    info = catalog.create_stream("s", volume, at_timestamp=v1_time)
    assert info["offset"] == 1
    assert rows(catalog.read_stream_arrow("s")) == [("INSERT", "b.txt", 1, 2),
                                                    ("INSERT", "c.txt", 1, 3)]
    from datetime import timedelta
    with pytest.raises(ValueError, match="before volume"):
        catalog.create_stream("t", volume, at_timestamp=v1_time - timedelta(days=3650))


def test_read_stream_dataframe_has_contract_columns(catalog, volume, ev, spark):
    catalog.create_stream("s", volume)
    apply(catalog, volume, ev.put("dir/a b+ü.txt", 3))
    df = catalog.read_stream("s")
    assert df.columns == ["relative_path", "url", "size", "last_modified_time", "etag",
                          "__change_type", "__commit_version", "__commit_timestamp"]
    (row,) = df.collect()
    assert row.relative_path == "dir/a b+ü.txt"
    assert row.url.endswith("/data/dir/a b+ü.txt") and row.url.startswith("file:///")
    assert row["__change_type"] == "INSERT"
    # reading never moves the offset
    assert catalog.read_stream("s").count() == 1
    assert catalog.describe_stream("s")["offset"] == 0
