"""Refresh of a bigger tree: the bucket-group diff equals a whole-table diff, progress is
reported with counts, and the CLI shows it only on a terminal."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from rich.console import Console

from connectors.protocols import LISTING_SCHEMA
from volume_stream.cli._progress import refresh_progress
from volume_stream.errors import VolumeStreamError
from volume_stream.volumes import refresh
from volume_stream.volumes.refresh import diff_by_buckets, diff_listing, group_size_for


def _tree(root, n):
    for i in range(n):
        path = root / f"d{i % 7}" / f"e{i % 3}" / f"f{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (i % 5))


def test_refresh_reports_progress_and_diffs_bucket_groups(catalog, data_dir, monkeypatch):
    monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 50)  # groups at this small size
    _tree(data_dir, 300)
    catalog.create_volume("vol", data_dir)
    assert catalog.directory_table("vol").layout().buckets > 1  # several bucket groups
    seen: list[tuple[str, int, int]] = []
    m = catalog.refresh("vol", lambda *a: seen.append(a))
    assert (m.listed, m.inserted) == (300, 300)
    stages = [s for s, *_ in seen]
    assert stages[0] == "listing" and stages[-1] == "committing"
    assert stages.count("diffing") > 1  # one per bucket group
    assert seen[-1] == ("committing", 300, 300)
    assert max(listed for s, listed, _ in seen if s == "listing") == 300

    for i in range(0, 300, 10):  # 30 deletes, 15 rewrites, 2 new files
        (data_dir / f"d{i % 7}" / f"e{i % 3}" / f"f{i:04d}.bin").unlink()
    for i in range(5, 300, 20):
        (data_dir / f"d{i % 7}" / f"e{i % 3}" / f"f{i:04d}.bin").write_bytes(b"longer" * 3)
    (data_dir / "n1").write_bytes(b"1")
    (data_dir / "d0" / "n2").write_bytes(b"2")
    m = catalog.refresh("vol")
    assert (m.listed, m.inserted, m.updated, m.deleted) == (272, 2, 15, 30)
    assert catalog.refresh("vol").version is None
    paths = catalog.directory_table("vol").snapshot(columns=["relative_path"])
    assert paths.num_rows == 272


def test_bucket_group_diff_is_the_whole_diff(catalog, data_dir):
    _tree(data_dir, 120)
    catalog.create_volume("vol", data_dir)
    catalog.refresh("vol")
    table = catalog.directory_table("vol")
    columns = ["relative_path", "size", "etag", "last_modified_time", "_sequencer",
               "_event_time"]
    stored = table.snapshot(columns=columns)
    rows = stored.select(["relative_path", "size", "etag", "last_modified_time"]).to_pylist()
    changed = [dict(r, size=r["size"] + 1) if i % 4 == 0 else r for i, r in enumerate(rows)
               if i % 9] + [{"relative_path": "zz/new", "size": 1, "etag": "e",
                             "last_modified_time": datetime(2026, 1, 1, tzinfo=UTC)}]
    listing = pa.Table.from_pylist(changed, schema=LISTING_SCHEMA)
    now = datetime.now(UTC)
    whole, _ = diff_listing(listing, stored, now)
    buckets = table.layout().buckets
    groups = list(diff_by_buckets(
        listing, lambda g: table.snapshot(columns=columns, buckets=g), buckets, now,
        group_size=5))
    assert len(groups) > 1  # one diff per group of buckets
    grouped = pa.concat_tables([events for events, _ in groups])
    key = ["created", "relative_path", "size", "etag"]
    assert sorted(grouped.select(key).to_pylist(), key=str) == \
        sorted(whole.select(key).to_pylist(), key=str) and whole.num_rows > 20


def test_progress_line_on_a_terminal_only(catalog, data_dir):
    _tree(data_dir, 40)
    catalog.create_volume("vol", data_dir)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with refresh_progress(console) as progress:
        catalog.refresh("vol", progress)
        console.print("still running")  # the live line is redrawn below other output
    text = screen.getvalue()
    assert "listed 40" in text and "changed 40" in text and "committing" in text


def test_group_size_keeps_groups_near_the_row_budget():
    assert group_size_for(10, 128) == 128                    # one group
    assert group_size_for(refresh.ROWS_PER_BUCKET_GROUP * 10, 128) == 13
    assert group_size_for(10**12, 128) == 1


def test_list_workers_option_walks_in_parallel_or_is_refused(catalog, data_dir):
    import pytest

    from volume_stream.errors import InvalidInputError

    _tree(data_dir, 50)
    catalog.create_volume("par", data_dir, list_workers=4)
    assert catalog.refresh("par").inserted == 50
    with pytest.raises(InvalidInputError, match=r"volume 'bad': list_workers must be an "
                                                r"integer >= 1, not 'many'"):
        catalog.create_volume("bad", data_dir, list_workers="many")


def test_same_paths_diff_finds_exactly_the_changed_files(catalog, data_dir):
    _tree(data_dir, 60)
    catalog.create_volume("vol", data_dir)
    catalog.refresh("vol")
    columns = ["relative_path", "size", "etag", "last_modified_time", "_sequencer",
               "_event_time"]
    stored = catalog.directory_table("vol").snapshot(columns=columns)
    rows = stored.select(["relative_path", "size", "etag", "last_modified_time"]).to_pylist()
    rows.reverse()  # another order than the table's
    changed = {r["relative_path"] for r in rows[::4]}
    listing = pa.Table.from_pylist(
        [dict(r, etag="new") if r["relative_path"] in changed else r for r in rows],
        schema=LISTING_SCHEMA)
    events, invalid = diff_listing(listing, stored, datetime.now(UTC))
    assert invalid == 0 and set(events["relative_path"].to_pylist()) == changed
    assert set(events["created"].to_pylist()) == {True}
    assert set(events["etag"].to_pylist()) == {"new"}


def test_a_refresh_at_an_unchanged_version_reuses_the_rows_it_read(catalog, data_dir,
                                                                    tmp_path):
    import volume_stream as vs

    _tree(data_dir, 30)
    catalog.create_volume("vol", data_dir)
    assert catalog.refresh("vol").version == 1
    assert catalog.refresh("vol").version is None  # reads version 1's rows and keeps them
    (data_dir / "d0" / "e0" / "f0000.bin").write_bytes(b"changed!")
    m = catalog.refresh("vol")  # against the kept rows: still finds the change
    assert (m.updated, m.version) == (1, 2)
    (data_dir / "d1" / "e1" / "f0001.bin").unlink()
    other = vs.connect(tmp_path / "warehouse")  # another process commits version 3
    assert other.refresh("vol").deleted == 1
    # version 3 now: rows kept from version 2 would delete the file a second time
    assert catalog.refresh("vol").version is None
    assert catalog.directory_table("vol").version() == 3
    assert catalog.directory_table("vol").snapshot(columns=["relative_path"]).num_rows == 29


def test_a_refresh_stopped_between_its_commits_is_finished_by_the_next(catalog, data_dir,
                                                                       monkeypatch):
    """Differences commit a bucket group at a time; a refresh that fails after its first
    commit leaves a consistent table, and the next refresh commits exactly the rest."""
    from directory_table import DirectoryTable

    monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 50)
    _tree(data_dir, 300)
    catalog.create_volume("vol", data_dir)
    table = catalog.directory_table("vol")
    real_apply, calls = DirectoryTable.apply, []

    def failing_second(self, events, **kw):
        calls.append(len(events))
        if len(calls) == 2:
            raise OSError("disk full")  # the second commit of the refresh never happens
        return real_apply(self, events, **kw)

    monkeypatch.setattr(DirectoryTable, "apply", failing_second)
    with pytest.raises(VolumeStreamError, match="disk full") as failed:
        catalog.refresh("vol")
    assert "'vol'" in str(failed.value)  # names the volume
    monkeypatch.setattr(DirectoryTable, "apply", real_apply)
    first = calls[0]
    assert 0 < first < 300 and table.snapshot(columns=["relative_path"]).num_rows == first
    m = catalog.refresh("vol")
    assert (m.listed, m.inserted, m.updated, m.deleted) == (300, 300 - first, 0, 0)
    assert table.snapshot(columns=["relative_path"]).num_rows == 300
    assert catalog.refresh("vol").version is None
