"""Table Stream change records (STANDARD / APPEND_ONLY) keyed by the hidden row id."""

from __future__ import annotations

import pyarrow as pa
import pytest

from volume_stream.errors import InvalidInputError, NotFoundError, StaleStreamError
from volume_stream.tables import Column, TableStore, check_table, new_spec, records_between


def people(ids, names, ages):
    return pa.table({"id": pa.array(ids, pa.int32()), "name": names,
                     "age": pa.array(ages, pa.int32())})


@pytest.fixture
def store(tmp_path):
    s = TableStore(tmp_path / "tables")
    s.create("t", [Column("id", "INT"), Column("name", "STRING"), Column("age", "INT")])
    s.set_properties("t", {"change_tracking": "true"})
    return s


def read(store, spec, *, since=None):
    a = spec["offset"] if since is None else since
    out = records_between(store, spec, a, store.version("t"))
    assert out.column_names[:3] == ["__change_type", "__commit_version", "__commit_timestamp"]
    return [(r["__change_type"], r["__commit_version"], r["id"], r["name"], r["age"])
            for r in out.to_pylist()]


def test_seed_standard_and_append_only(store):
    std, app = new_spec(store, "s", "t"), new_spec(store, "a", "t", mode="APPEND_ONLY")
    v_ins, _ = store.insert("t", people([1, 2, 3], ["Alice", "Bob", "Charlie"], [25, 30, 35]))
    assert read(store, std) == [("INSERT", v_ins, 1, "Alice", 25), ("INSERT", v_ins, 2, "Bob", 30),
                                ("INSERT", v_ins, 3, "Charlie", 35)]
    mid = store.version("t")
    v_up, _ = store.update("t", {"age": "age + 5"}, "id = 1 OR id = 3")
    v_del, _ = store.delete("t", "id = 2 OR id = 4")
    # inserted then updated in the range: one INSERT of the latest image; then deleted: nothing
    assert read(store, std) == [("INSERT", v_up, 1, "Alice", 30),
                                ("INSERT", v_up, 3, "Charlie", 40)]
    # APPEND_ONLY: every insert, unaffected by later updates and deletes
    assert read(store, app) == [("INSERT", v_ins, 1, "Alice", 25), ("INSERT", v_ins, 2, "Bob", 30),
                                ("INSERT", v_ins, 3, "Charlie", 35)]
    # from after the insert: UPDATE_BEFORE carries the old image's version, DELETE likewise
    assert read(store, std, since=mid) == [
        ("UPDATE_BEFORE", v_ins, 1, "Alice", 25), ("UPDATE_AFTER", v_up, 1, "Alice", 30),
        ("UPDATE_BEFORE", v_ins, 3, "Charlie", 35), ("UPDATE_AFTER", v_up, 3, "Charlie", 40),
        ("DELETE", v_ins, 2, "Bob", 30)]
    assert v_del == v_up + 1


def test_duplicate_rows_stay_distinct(store):
    store.insert("t", people([1, 1], ["dup", "dup"], [1, 1]))
    spec = new_spec(store, "s", "t")
    v_del, _ = store.delete("t", "age = 1")
    v_ins, _ = store.insert("t", people([1], ["dup"], [1]))
    out = read(store, spec)
    assert sorted(out) == sorted([("DELETE", v_del - 1, 1, "dup", 1),
                                  ("DELETE", v_del - 1, 1, "dup", 1),
                                  ("INSERT", v_ins, 1, "dup", 1)])


def test_update_back_to_old_value_nets_to_nothing(store):
    store.insert("t", people([1], ["a"], [10]))
    spec = new_spec(store, "s", "t")
    store.update("t", {"age": "age + 1"})
    store.update("t", {"age": "age - 1"})
    assert read(store, spec) == []


def test_several_updates_give_one_before_and_one_after(store):
    v0, _ = store.insert("t", people([1, 2], ["a", "b"], [10, 20]))
    spec = new_spec(store, "s", "t")
    store.update("t", {"age": "age + 1"}, "id = 1")
    store.update("t", {"name": "'z'"}, "id = 1")
    v3, _ = store.update("t", {"age": "age * 2"}, "id = 1")
    assert read(store, spec) == [("UPDATE_BEFORE", v0, 1, "a", 10),
                                 ("UPDATE_AFTER", v3, 1, "z", 22)]


def test_show_initial_rows(store):
    v0, _ = store.insert("t", people([1], ["a"], [1]))
    std = new_spec(store, "s", "t", show_initial_rows=True)
    app = new_spec(store, "p", "t", mode="APPEND_ONLY", show_initial_rows=True)
    v1, _ = store.insert("t", people([2], ["b"], [2]))
    assert read(store, std) == [("INSERT", v0, 1, "a", 1), ("INSERT", v1, 2, "b", 2)]
    assert read(store, app) == [("INSERT", v0, 1, "a", 1), ("INSERT", v1, 2, "b", 2)]


def test_stream_needs_change_tracking(tmp_path):
    s = TableStore(tmp_path / "tables")
    s.create("plain", [Column("id", "INT")])
    with pytest.raises(InvalidInputError, match="'plain' does not have change tracking on"):
        new_spec(s, "s", "plain")
    with pytest.raises(NotFoundError, match="'nope'"):
        new_spec(s, "s", "nope")
    with pytest.raises(InvalidInputError, match="invalid mode"):
        new_spec(s, "s", "plain", mode="SOMETIMES")


def test_replaced_table_is_reported(store):
    spec = new_spec(store, "s", "t")
    store.create("t", [Column("id", "INT")], replace=True)
    with pytest.raises(NotFoundError, match="dropped or replaced"):
        check_table(store, spec)


def test_stale_after_retention(store):
    store.set_properties("t", {"delta.logRetentionDuration": "interval 0 seconds"})
    spec = new_spec(store, "s", "t")
    for i in range(3):
        store.insert("t", people([i], ["x"], [i]))
    store.apply_retention("t", 0)
    assert store.oldest_version("t") > spec["offset"]
    with pytest.raises(StaleStreamError, match="'s'.*oldest kept version"):
        read(store, spec)


def test_catalog_and_cli_list_table_streams(tmp_path):
    """No Spark: a table stream through the catalog and the CLI's stream list/read."""
    import json

    from typer.testing import CliRunner

    import volume_stream as vs
    from volume_stream.cli import app

    cat = vs.connect(tmp_path / "wh")
    cat.tables.create("t", [Column("id", "INT"), Column("name", "STRING"), Column("age", "INT")])
    cat.tables.set_properties("t", {"change_tracking": "true"})
    cat.create_stream("ts", on_table="t")
    cat.tables.insert("t", people([1], ["a"], [2]))
    with pytest.raises(InvalidInputError, match="exactly one of on_volume= or on_table="):
        cat.create_stream("x")
    wh = ["--warehouse", str(tmp_path / "wh")]
    out = CliRunner().invoke(app, ["stream", "list", "--json", *wh])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [(r["name"], r["volume"], r["table"]) for r in rows] == [("ts", None, "t")]
    out = CliRunner().invoke(app, ["stream", "read", "ts", "--json", *wh])
    assert out.exit_code == 0, out.output
    assert [json.loads(x)["id"] for x in out.output.splitlines()] == [1]
    assert cat.drop_stream("ts") is True


def test_table_stream_retry_gets_exactly_the_pinned_range(tmp_path):
    """Table streams are pinned like volume streams: a consume that fails leaves its range and
    batch id recorded; a row inserted before the retry goes to the next batch."""
    import volume_stream as vs

    cat = vs.connect(tmp_path / "wh")
    cat.tables.create("t", [Column("id", "INT"), Column("name", "STRING"), Column("age", "INT")])
    cat.tables.set_properties("t", {"change_tracking": "true"})
    cat.create_stream("ts", on_table="t")
    start = cat.describe_stream("ts")["offset"]
    v1, _ = cat.tables.insert("t", people([1], ["a"], [1]))
    with pytest.raises(RuntimeError):
        with cat.consume("ts") as batch:
            assert (batch.start_version, batch.end_version, batch.batch_id) == (start, v1, 0)
            raise RuntimeError("sink failed after writing batch 0")
    info = cat.describe_stream("ts")
    assert (info["offset"], info["batch_id"], info["pinned_end"]) == (start, 0, v1)
    v2, _ = cat.tables.insert("t", people([2], ["b"], [2]))  # arrives before the retry
    with cat.consume("ts") as batch:  # the retry: batch 0 is still (start, v1]
        assert (batch.start_version, batch.end_version, batch.batch_id) == (start, v1, 0)
        assert batch.records["id"].to_pylist() == [1]
    with cat.consume("ts") as batch:  # the next batch takes the rest
        assert (batch.start_version, batch.end_version, batch.batch_id) == (v1, v2, 1)
        assert batch.records["id"].to_pylist() == [2]
    with cat.consume("ts") as batch:
        assert batch.empty and batch.batch_id == 2
    info = cat.describe_stream("ts")
    assert (info["offset"], info["batch_id"], info["pinned_end"]) == (v2, 2, None)
    assert "pinned" not in cat.list_streams()[0]
