"""Reading a directory table through a handle left open (issue 12: a stream reader must not
pay a snapshot update per read): `version()` counts the commits after the open handle, and
`changes()` reads them with the handle as it is unless a commit of the range changes the
table's metadata; whatever the writers did, the records equal a freshly opened table's."""

from __future__ import annotations

from datetime import timedelta

from directory_table import DirectoryTable
from directory_table.layout import Layout
from directory_table.table import _STALE_READS
from tests.directory_table.test_maintenance import create_legacy, records
from tests.directory_table.test_rewrite import T0, put, rm

T1 = T0 + timedelta(hours=1)


def fresh(table: DirectoryTable) -> DirectoryTable:
    return DirectoryTable(table.root, table.base_url)


def test_an_open_reader_sees_other_writers_commits_without_updating_its_handle(tmp_path):
    writer = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=4)
    writer.apply([put(f"f{i}", i, T0) for i in range(20)])
    reader = fresh(writer)
    opened = reader.version()
    handle = reader.delta()
    assert handle.version() == opened
    writer.apply([put("f1", 100, T1), put("new", 1, T1)])
    writer.apply([rm("f2", T1)])
    latest = writer.version()
    assert latest == opened + 2 and reader.version() == latest
    got = records(reader.changes(opened, latest))
    assert got == records(fresh(writer).changes(opened, latest))
    assert {(r["relative_path"], r["_change_type"]) for r in got} == {
        ("f1", "update_preimage"), ("f1", "update_postimage"), ("new", "insert"),
        ("f2", "delete")}
    # read with the handle as it was opened: no snapshot update
    assert reader.reader(latest) is handle and handle.version() == opened


def test_a_metadata_commit_in_the_range_brings_the_handle_up_to_date(tmp_path):
    writer = create_legacy(tmp_path / "old")
    writer.apply([put(f"f{i}", i, T0) for i in range(10)])
    reader = fresh(writer)
    before = reader.version()
    assert not reader.reader(before).metadata().configuration.get("volume_stream.buckets")
    migrated = writer.migrate(buckets=4)              # metadata, then the rewrite
    writer.apply([put("f3", 33, T1), put("late", 1, T1)])
    latest = writer.version()
    assert reader.version() == latest
    assert reader.reader(latest).version() == latest  # updated: the range changed metadata
    assert Layout.of(reader.reader(latest)) == Layout(buckets=4, bucketed=True,
                                                      migrated_version=migrated)
    assert records(reader.changes(before, latest)) == records(fresh(writer).changes(before,
                                                                                     latest))


def test_a_handle_far_behind_is_brought_up_to_date(tmp_path):
    writer = DirectoryTable.create(str(tmp_path / "v"), "file:///d/", buckets=2)
    writer.apply([put("a", 0, T0)])
    reader = fresh(writer)
    opened = reader.version()
    for i in range(_STALE_READS + 2):
        writer.apply([put("a", i + 1, T0 + timedelta(seconds=i + 1))])
    latest = writer.version()
    assert reader.version() == latest                 # past the limit: from an updated handle
    assert reader.delta().version() == latest
    got = records(reader.changes(opened, latest))
    assert len(got) == 2 * (_STALE_READS + 2)         # pre- and post-image per overwrite
