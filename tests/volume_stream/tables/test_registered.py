"""Registering a user's Delta table (`tables.registered`) without Spark: bad locations are
refused with errors naming the location, names and locations go through the warehouse's checks,
and a table delta-rs reads (no deletion vectors, no column mapping) streams without Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import volume_stream as vs
from volume_stream.errors import (
    AlreadyExistsError,
    ConfigError,
    InvalidInputError,
    VolumeStreamError,
)

ROWS = pa.table({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"]})


def delta(path, *, cdf: bool = True) -> str:
    write_deltalake(str(path), ROWS, configuration={"delta.enableChangeDataFeed": "true"}
                    if cdf else None)
    return str(path)


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def test_bad_locations_are_refused_naming_the_location(cat, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(InvalidInputError, match=f"{missing} does not exist"):
        cat.register_table("t", missing)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.csv").write_text("1\n")
    with pytest.raises(InvalidInputError, match=f"{plain} is not a Delta table"):
        cat.register_table("t", plain)
    no_cdf = delta(tmp_path / "no_cdf", cdf=False)
    with pytest.raises(InvalidInputError, match=f"{no_cdf} has no change data feed.*"
                                                f"enableChangeDataFeed = true"):
        cat.register_table("t", no_cdf)
    with pytest.raises(InvalidInputError, match="inside the warehouse"):
        cat.register_table("t", tmp_path / "wh" / "tables" / "x")
    with pytest.raises(InvalidInputError, match="table 't': location oss://bucket/t: oss://"):
        cat.register_table("t", "oss://bucket/t")
    good = delta(tmp_path / "good")
    with pytest.raises(InvalidInputError, match="invalid table name"):
        cat.register_table("../escape", good)
    with pytest.raises(InvalidInputError, match="key column.*nope"):
        cat.register_table("t", good, key="nope")
    with pytest.raises(InvalidInputError, match="LOCATION is empty"):
        cat.sql("CREATE TABLE t LOCATION ''")
    assert cat.tables.names() == []
    assert all(isinstance(e, VolumeStreamError) for e in (InvalidInputError(""), ConfigError("")))


def test_a_reader_feature_nothing_reads_is_refused_naming_it(cat, tmp_path):
    path = delta(tmp_path / "future")
    log = tmp_path / "future" / "_delta_log" / "00000000000000000001.json"
    log.write_text(json.dumps({"protocol": {
        "minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["quantumRows"],
        "writerFeatures": ["quantumRows", "changeDataFeed"]}}) + "\n")
    with pytest.raises(InvalidInputError, match=f"{path} needs reader feature.*quantumRows"):
        cat.register_table("t", path)


def test_registered_table_streams_through_delta_rs_and_drop_keeps_it(cat, tmp_path):
    path = delta(tmp_path / "lake")
    assert cat.register_table("lake", path, key="id")
    with pytest.raises(AlreadyExistsError):
        cat.register_table("lake", path)
    assert not cat.register_table("lake", path, if_not_exists=True)
    cat.create_stream("s", on_table="lake")
    dt = DeltaTable(path)
    dt.update({"name": "'z'"}, predicate="id = 2")
    write_deltalake(path, pa.table({"id": pa.array([3], pa.int32()), "name": ["c"]}),
                    mode="append")
    got = [(r["__change_type"], r["__commit_version"], r["id"], r["name"])
           for r in cat.read_stream_arrow("s").to_pylist()]
    assert got == [("UPDATE_BEFORE", 1, 2, "b"), ("UPDATE_AFTER", 1, 2, "z"),
                   ("INSERT", 2, 3, "c")]
    assert cat.describe_stream("s")["pending_changes"] == 3
    assert [r["name"] for r in cat.sql("SHOW TABLES").rows] == ["lake"]
    cat.sql("DROP TABLE lake")
    assert DeltaTable(path).version() == 2 and len(DeltaTable(path).to_pyarrow_table()) == 3
    with pytest.raises(VolumeStreamError, match="dropped or replaced"):
        cat.read_stream_arrow("s")
