from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

import volume_stream as vs
from connectors.events import FileEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def catalog(tmp_path, spark):
    return vs.connect(tmp_path / "warehouse", spark=spark)


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def volume(catalog, data_dir):
    catalog.create_volume("vol", data_dir)
    return "vol"


@pytest.fixture
def db(spark, tmp_path):
    """A fresh Spark database under tmp_path, current for the test, dropped after it."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {name} LOCATION '{tmp_path / 'spark-db'}'")
    previous = spark.catalog.currentDatabase()
    spark.catalog.setCurrentDatabase(name)
    yield name
    spark.catalog.setCurrentDatabase(previous)
    spark.sql(f"DROP DATABASE {name} CASCADE")


class Events:
    """Builds events with strictly increasing event times, like a real listener would."""

    def __init__(self):
        self.tick = 0

    def _t(self):
        self.tick += 1
        return T0 + timedelta(seconds=self.tick)

    def put(self, path, size=1, etag=None):
        t = self._t()
        return FileEvent.created(path, size=size, etag=etag or f"e{size}",
                                 last_modified_time=t, event_time=t)

    def rm(self, path):
        return FileEvent.removed(path, event_time=self._t())


@pytest.fixture
def ev():
    return Events()


def rows(table):
    """(change_type, path, size, commit_version) tuples of a records table, sorted."""
    d = table.to_pydict()
    return sorted(zip(d["__change_type"], d["relative_path"], d["size"], d["__commit_version"],
                      strict=True))
