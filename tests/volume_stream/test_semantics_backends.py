"""Stream semantics (§5) are the same whatever the volume lives on: each scenario runs on a local
folder (committed by refresh), on moto's S3 (committed by watching SQS), on the local OSS fake
(committed by watching MNS) and on Azurite (committed by watching a Storage Queue), through the drivers of tests/volume_stream/backends.py.
Assertions are on stream records."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import pytest

import volume_stream as vs
from tests.alicloud_fixtures import alicloud_env, mns_server, oss_server, vol  # noqa: F401
from tests.aws_fixtures import aws_env, moto_server, rig  # noqa: F401
from tests.azure_fixtures import azure_env, azure_rig, azurite  # noqa: F401
from tests.volume_stream.backends import AzureDriver, LocalDriver, OssDriver, S3Driver
from tests.volume_stream.conftest import rows


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")  # no Spark needed: Arrow reads only


@pytest.fixture(params=["local", "s3", "oss", "azure"])
def driver(request, cat, tmp_path):
    if request.param == "local":
        (tmp_path / "data").mkdir()
        return LocalDriver(cat, tmp_path / "data")
    if request.param == "s3":
        return S3Driver(cat, request.getfixturevalue("rig"))
    if request.param == "azure":
        return AzureDriver(cat, request.getfixturevalue("azure_rig"))
    request.getfixturevalue("alicloud_env")
    return OssDriver(cat, request.getfixturevalue("vol"))


def test_semantics_insert(cat, driver):
    cat.create_stream("s", "vol")
    driver.put("a.txt", 3)
    assert driver.sync() == 1
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "a.txt", 3, 1)]


def test_semantics_delete_shows_the_old_image_and_version(cat, driver):
    driver.put("a.txt", 3)
    driver.sync()
    cat.create_stream("s", "vol")
    driver.put("b.txt", 1)
    driver.sync()
    driver.rm("a.txt")
    assert driver.sync() == 3
    assert rows(cat.read_stream_arrow("s")) == [("DELETE", "a.txt", 3, 1),
                                                ("INSERT", "b.txt", 1, 2)]


def test_semantics_update_pair_with_each_images_version(cat, driver):
    driver.put("a.txt", 3)
    driver.sync()
    cat.create_stream("s", "vol")
    for size in (4, 5):
        driver.put("a.txt", size)
        driver.sync()
    assert rows(cat.read_stream_arrow("s")) == [("UPDATE_AFTER", "a.txt", 5, 3),
                                                ("UPDATE_BEFORE", "a.txt", 3, 1)]
    history = {h["version"]: h["timestamp"] for h in cat.history("vol")}
    for record in cat.read_stream_arrow("s").to_pylist():
        assert record["__commit_timestamp"] == history[record["__commit_version"]]


def test_semantics_absent_at_both_ends_is_nothing(cat, driver):
    cat.create_stream("s", "vol")
    driver.put("a.txt", 3)
    driver.sync()
    driver.rm("a.txt")
    assert driver.sync() == 2
    assert cat.read_stream_arrow("s").num_rows == 0


def test_semantics_append_only_keeps_inserts(cat, driver):
    driver.put("old.txt", 1)
    driver.sync()
    cat.create_stream("s", "vol", mode="APPEND_ONLY")
    driver.put("a.txt", 1)
    driver.sync()
    driver.put("a.txt", 2)
    driver.rm("old.txt")
    driver.sync()
    driver.rm("a.txt")
    driver.sync()
    driver.put("a.txt", 7)
    assert driver.sync() == 5
    assert rows(cat.read_stream_arrow("s")) == [("INSERT", "a.txt", 1, 2),
                                                ("INSERT", "a.txt", 7, 5)]


def test_semantics_initial_rows(cat, driver, spark):  # consume() builds a Spark DataFrame
    driver.put("a.txt", 1)
    driver.put("b.txt", 2)
    driver.sync()
    cat.create_stream("s", "vol", show_initial_rows=True)
    cat.create_stream("t", "vol", mode="APPEND_ONLY", show_initial_rows=True)
    driver.put("c.txt", 3)
    driver.sync()
    expected = [("INSERT", "a.txt", 1, 1), ("INSERT", "b.txt", 2, 1), ("INSERT", "c.txt", 3, 2)]
    assert rows(cat.read_stream_arrow("s")) == expected
    assert rows(cat.read_stream_arrow("t")) == expected
    with cat.consume("s") as batch:
        assert rows(batch.records) == expected
    driver.rm("a.txt")
    driver.sync()
    assert rows(cat.read_stream_arrow("s")) == [("DELETE", "a.txt", 1, 1)]
