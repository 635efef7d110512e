"""Merge-on-read directory tables (DESIGN §4.8) with Delta Spark as the judge, where both write:
Spark's own DELETE and UPDATE (which write deletion vectors of Spark's making into our files),
REORG TABLE ... APPLY (PURGE), OPTIMIZE and VACUUM, between batches of our writer that mark
rows of the same files. After every step Spark and our readers agree on the rows at every
version and on the change feed of every version; and our DV bytes are read by Spark, Spark's
by us."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from connectors.events import FileEvent
from directory_table import DirectoryTable
from directory_table.deltalog import replay
from directory_table.dv import Descriptor
from directory_table.filestore import Store
from directory_table.schema import BUCKETED_SCHEMA
from tests.interop import judge

T0 = datetime(2026, 1, 1, tzinfo=UTC)
COLUMNS = BUCKETED_SCHEMA.names
CDF_COLUMNS = [*COLUMNS, *judge.CDF_META]


class Writer:
    """Our batches, with increasing event times."""

    def __init__(self, table: DirectoryTable):
        self.table, self.tick = table, 0

    def apply(self, puts=(), removes=()) -> int:
        events = []
        for path in puts:
            self.tick += 1
            t = T0 + timedelta(seconds=self.tick)
            events.append(FileEvent.created(path, size=self.tick, etag=f"e{self.tick}",
                                            last_modified_time=t, event_time=t))
        for path in removes:
            self.tick += 1
            events.append(FileEvent.removed(path, event_time=T0 + timedelta(seconds=self.tick)))
        version = self.table.apply(events).version
        assert version is not None
        return version


def _agree(spark, table: DirectoryTable, since: int = 0) -> None:
    """Spark reads our rows at every version after `since` and the change feed of each."""
    latest = table.version()
    theirs = judge.spark_versions(spark, table.path, range(since, latest + 1))
    for v, found in theirs.items():
        assert judge.rows(found, COLUMNS) == \
            judge.rows(table.snapshot(v, columns=COLUMNS), COLUMNS), f"version {v}"
    whole = judge.spark_changes(spark, table.path, since, latest)
    for v in range(since + 1, latest + 1):
        assert judge.rows(judge.changes_by_version(whole, v - 1, v), CDF_COLUMNS) == \
            judge.rows(table.changes(v - 1, v), CDF_COLUMNS), f"version {v}"


def _dv_files(table: DirectoryTable) -> dict[str, Descriptor]:
    state = replay(table.path, None, table.version())
    return {p: Descriptor.of(d) for p, d in state.deletion_vectors().items()}


@pytest.fixture
def table(tmp_path):
    table = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=2)
    writer = Writer(table)
    writer.apply(puts=[f"d{i % 3}/f{i:03d}" for i in range(300)])
    return table, writer


def test_our_deletion_vectors_are_read_by_spark(delta_spark, table):
    table, writer = table
    writer.apply(puts=["d0/f000", "d1/f001", "new"], removes=["d2/f002"])   # inline DVs
    writer.apply(puts=[f"d1/f{i:03d}" for i in range(1, 300, 3)],           # a DV file
                 removes=[f"d0/f{i:03d}" for i in range(3, 300, 6)])
    writer.apply(puts=[f"d1/f{i:03d}" for i in range(1, 300, 6)])           # DVs merged
    kinds = {d.storage_type for d in _dv_files(table).values()}
    assert kinds == {"i", "u"}, kinds
    assert table.file_count() == 300 - 1 - 50 + 1
    _agree(delta_spark, table)


def test_spark_and_our_writer_take_turns_on_the_same_files(delta_spark, table):
    table, writer = table
    path = table.path
    writer.apply(puts=["d0/f000"], removes=["d1/f001"])
    delta_spark.sql(f"DELETE FROM delta.`{path}` WHERE relative_path IN "
                    "('d0/f003', 'd1/f004', 'd2/f005')").collect()
    marked = _dv_files(table)
    assert marked and all(d.cardinality for d in marked.values())
    # Spark's DV of a file is unioned with ours: its rows stay deleted, ours join them
    writer.apply(puts=["d0/f006", "d0/f003-again"], removes=["d1/f007", "d2/f008"])
    delta_spark.sql(f"UPDATE delta.`{path}` SET size = size + 1000 "
                    "WHERE relative_path LIKE 'd2/f01%'").collect()
    writer.apply(puts=["d2/f011", "d2/f012"], removes=["d2/f013"])
    _agree(delta_spark, table)
    snapshot = table.snapshot()
    gone = pa.array(["d0/f003", "d1/f004", "d2/f005", "d1/f007", "d2/f013"])
    assert snapshot.filter(pc.is_in(snapshot["relative_path"], value_set=gone)).num_rows == 0
    before = table.version()
    delta_spark.sql(f"REORG TABLE delta.`{path}` APPLY (PURGE)").collect()
    assert not _dv_files(table)  # every marked row purged: no DV left
    writer.apply(puts=["d0/f020", "d1/f021"], removes=["d2/f022"])
    delta_spark.sql(f"OPTIMIZE delta.`{path}`").collect()
    writer.apply(puts=["d0/f023"], removes=["d1/f024"])
    _agree(delta_spark, table, since=before)
    delta_spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        delta_spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
    finally:
        delta_spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    writer.apply(puts=["d0/f026"], removes=["d1/f027"])
    assert judge.rows(judge.spark_table(delta_spark, path), COLUMNS) == \
        judge.rows(table.snapshot(columns=COLUMNS), COLUMNS)


def test_a_dv_whose_bytes_fail_their_checksum_is_refused(table):
    table, writer = table
    writer.apply(puts=[f"d1/f{i:03d}" for i in range(1, 300, 3)])
    entry, descriptor = next((p, d) for p, d in _dv_files(table).items()
                             if d.storage_type == "u")
    assert entry
    store = Store(table.path, {})
    name = descriptor.file
    with open(f"{table.path}/{name}", "r+b") as f:
        f.seek((descriptor.offset or 0) + 6)
        byte = f.read(1)
        f.seek((descriptor.offset or 0) + 6)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ValueError, match="fails its checksum"):
        descriptor.rows(store.read_range)
