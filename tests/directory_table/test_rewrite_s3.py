"""The rewrite write path on S3 (moto's server in its own process): files through boto3, the
commit as a conditional PUT; same results as the delta-rs merge path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from directory_table import DirectoryTable
from tests.directory_table.test_rewrite import put, rm, rows
from tests.s3_warehouse_fixtures import s3_client

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_rewrite_on_s3_matches_merge(s3_bucket, s3_env, threads, rewrite_path):
    tables = {}
    for name, mode in (("merge", None), ("rewrite", 1)):
        tables[name] = DirectoryTable.create(f"s3://{s3_bucket}/{name}", "s3://data/", buckets=3)
        tables[name].rewrite_min_events = mode
    batches = [
        [put(f"f{i:02d}", 1, T0) for i in range(30)],
        [put(f"f{i:02d}", 2, T0 + timedelta(seconds=1)) for i in range(0, 30, 4)]
        + [rm("f03", T0 + timedelta(seconds=1)), put("g1", 1, T0 + timedelta(seconds=1))],
        [put("f03", 9, T0), put("f05", 7, T0 + timedelta(seconds=2))],  # stale + update
    ]
    for events in batches:
        a = tables["merge"].apply(events)
        b = tables["rewrite"].apply(events)
        assert (a.version, a.inserted, a.updated, a.deleted, a.ignored) == (
            b.version, b.inserted, b.updated, b.deleted, b.ignored)
        assert rows(tables["merge"].snapshot()) == rows(tables["rewrite"].snapshot())
        assert rows(tables["merge"].changes(a.version - 1, a.version)) == rows(
            tables["rewrite"].changes(b.version - 1, b.version))
    keys = [o["Key"] for o in s3_client(s3_env).list_objects_v2(
        Bucket=s3_bucket, Prefix="rewrite/directory/_change_data/")["Contents"]]
    assert keys


def test_rewrite_on_s3_loses_a_race_and_replans(s3_bucket, s3_env, rewrite_path):
    root = f"s3://{s3_bucket}/vol"
    first = DirectoryTable.create(root, "s3://data/", buckets=2)
    first.apply([put(f"f{i}", 1, T0) for i in range(10)])
    slow = DirectoryTable(root, "s3://data/")
    slow.delta()  # its handle is at version 1
    first.apply([put("f1", 5, T0 + timedelta(seconds=1))])  # version 2 taken by another writer
    # the slow writer's first attempt targets version 2: the conditional PUT is refused and it
    # plans again at version 3 (its handle is brought up to date)
    r = slow.apply([put("f2", 6, T0 + timedelta(seconds=1)), put("f1", 4, T0)])
    assert (r.version, r.updated, r.ignored) == (3, 1, 1)
    sizes = dict(zip(*(slow.snapshot().to_pydict()[c] for c in ("relative_path", "size")),
                     strict=True))
    assert (sizes["f1"], sizes["f2"]) == (5, 6)
