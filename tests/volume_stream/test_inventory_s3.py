"""Backfill from S3 Inventory reports (issue 26 item 4) against moto's server over HTTP.

Reports are written in AWS's exact formats (`tests.inventory_fixtures`) to a destination bucket
on moto; the volume reads them through its own S3 connector options. A refresh from a report
must leave the directory table as a listing of the same objects would, under the volume's
prefix only; events newer than the report win over it.
"""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import volume_stream as vs
from tests.aws_fixtures import AwsRig, aws_env, make_rig, moto_server, rig  # noqa: F401
from tests.inventory_fixtures import (
    from_s3_listing,
    from_s3_versions,
    md5,
    s3_put,
    write_report,
)
from tests.volume_stream.test_daemon import config, metric, wait_for
from tests.volume_stream.test_s3_volume import add_volume, set_notifications, watch
from volume_stream.daemon import Daemon

PUBLIC = ["relative_path", "size", "etag", "last_modified_time"]
#: awkward keys: URL-encoded in CSV reports (space as '+', a literal '+' as %2B)
KEYS = ["in/a.txt", "in/sub/b c.csv", "in/plus+sign.bin", "in/ünï/çödé.txt", "in/100%.txt",
        "in/q?x=1&y=2.json", "in/deep/er/f.txt", "in/folder/", "other/outside.txt", "top.txt"]


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")


@pytest.fixture
def dest(rig: AwsRig) -> str:
    name = f"inv-{uuid.uuid4().hex[:12]}"
    rig.s3.create_bucket(Bucket=name)
    return name


def table(cat, name: str) -> list[dict]:
    snap = cat.directory_table(name).snapshot(columns=PUBLIC)
    return sorted(snap.to_pylist(), key=lambda r: r["relative_path"])


def put_keys(rig: AwsRig, keys=KEYS) -> None:
    for i, key in enumerate(keys):
        rig.put(key, b"x" * (i + 1))


def report(rig: AwsRig, dest: str, created: datetime | None = None, **kw) -> str:
    objects = kw.pop("objects", None)
    if objects is None:
        objects = from_s3_listing(rig.s3, rig.bucket)
    key = write_report(s3_put(rig.s3, dest), source=rig.bucket, destination=dest,
                       created=created or datetime.now(UTC), objects=objects, **kw)
    return f"s3://{dest}/{key}"


def two_volumes(cat, rig: AwsRig) -> None:
    add_volume(cat, rig, "listed")
    add_volume(cat, rig, "backfilled")


@pytest.mark.parametrize("fmt,files", [("CSV", 1), ("CSV", 3), ("Parquet", 2)])
def test_a_report_backfills_what_a_listing_would(cat, rig, dest, fmt, files):
    put_keys(rig)
    two_volumes(cat, rig)
    uri = report(rig, dest, fmt=fmt, files=files)
    listed = cat.refresh("listed")
    m = cat.refresh("backfilled", inventory=uri)
    assert (m.listed, m.inserted, m.deleted) == (listed.listed, listed.inserted, 0) == (7, 7, 0)
    assert m.inventory_created is not None and listed.inventory_created is None
    assert table(cat, "backfilled") == table(cat, "listed")
    assert {r["relative_path"] for r in table(cat, "backfilled")} == {
        "a.txt", "sub/b c.csv", "plus+sign.bin", "ünï/çödé.txt", "100%.txt", "q?x=1&y=2.json",
        "deep/er/f.txt"}
    again = cat.refresh("backfilled", inventory=uri)  # the same report again: nothing to do
    assert (again.version, again.listed) == (None, 7)


def test_a_report_reconciles_a_stale_table_as_a_listing_would(cat, rig, dest):
    put_keys(rig)
    two_volumes(cat, rig)
    cat.refresh("listed")
    cat.refresh("backfilled")
    set_notifications(rig, False)  # changes nobody hears of
    rig.put("in/a.txt", b"rewritten")
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/sub/b c.csv")
    rig.put("in/new.txt", b"new")
    uri = report(rig, dest, fmt="Parquet", created=datetime.now(UTC) + timedelta(seconds=1))
    listed = cat.refresh("listed")
    m = cat.refresh("backfilled", inventory=uri)
    assert (m.inserted, m.updated, m.deleted) == (listed.inserted, listed.updated,
                                                  listed.deleted) == (1, 1, 1)
    assert table(cat, "backfilled") == table(cat, "listed")


def test_a_versioned_report_keeps_latest_versions_only(cat, rig, dest):
    rig.s3.put_bucket_versioning(Bucket=rig.bucket,
                                 VersioningConfiguration={"Status": "Enabled"})
    put_keys(rig)
    rig.put("in/a.txt", b"second version")  # a.txt has a non-latest version
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/deep/er/f.txt")  # a delete marker
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/q?x=1&y=2.json")
    rig.put("in/q?x=1&y=2.json", b"back after its delete marker")
    objects = from_s3_versions(rig.s3, rig.bucket)
    assert any(o.get("IsDeleteMarker") for o in objects)
    assert any(not o["IsLatest"] for o in objects)
    two_volumes(cat, rig)
    cat.refresh("listed")
    for fmt in ("CSV", "Parquet"):
        uri = report(rig, dest, objects=objects, versioned=True, fmt=fmt, files=2,
                     config=f"versions-{fmt}")
        cat.refresh("backfilled", inventory=uri)
        assert table(cat, "backfilled") == table(cat, "listed")
    paths = {r["relative_path"]: r["size"] for r in table(cat, "backfilled")}
    assert "deep/er/f.txt" not in paths
    assert (paths["a.txt"], paths["q?x=1&y=2.json"]) == (14, 28)


def test_events_newer_than_the_report_win(cat, rig, dest):
    """The report is older than the table's newest events: what they did stays."""
    add_volume(cat, rig)
    put_keys(rig, ["in/kept.txt", "in/rewritten.txt", "in/deleted.txt", "in/gone.txt"])
    watch(cat)
    set_notifications(rig, False)  # before the report: a delete and a create nobody hears of
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/gone.txt")
    rig.put("in/missed.txt", b"missed")
    created = datetime.now(UTC)
    uri = report(rig, dest, created=created)  # lists kept, rewritten, deleted, missed
    set_notifications(rig, True)
    rig.put("in/rewritten.txt", b"rewritten after the report")
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/deleted.txt")
    rig.put("in/created-after.txt", b"after")
    rig.s3.delete_object(Bucket=rig.bucket, Key="in/created-after.txt")
    rig.put("in/created-after.txt", b"after, again")
    watch(cat)
    before = {r["relative_path"]: r for r in table(cat, "vol")}
    assert "deleted.txt" not in before and "gone.txt" in before
    m = cat.refresh("vol", inventory=uri)
    after = {r["relative_path"]: r for r in table(cat, "vol")}
    assert (m.inserted, m.updated, m.deleted) == (1, 0, 1)  # missed.txt in, gone.txt out
    assert sorted(after) == ["created-after.txt", "kept.txt", "missed.txt", "rewritten.txt"]
    assert after["rewritten.txt"] == before["rewritten.txt"]  # not undone by the report
    assert after["created-after.txt"]["size"] == len(b"after, again")
    # the table now holds what a listing of the bucket finds (events stamp times to the ms,
    # listings to the second: the times differ)
    add_volume(cat, rig, "listed")
    cat.refresh("listed")
    images = lambda name: [(r["relative_path"], r["size"], r["etag"])  # noqa: E731
                           for r in table(cat, name)]
    assert images("vol") == images("listed")


def test_keys_created_after_the_report_are_not_deleted(cat, rig, dest):
    add_volume(cat, rig)
    uri = report(rig, dest, objects=[{"Key": "in/old.txt", "Size": 3, "ETag": "e" * 32,
                                      "LastModifiedDate": datetime.now(UTC)}],
                 created=datetime.now(UTC))
    put_keys(rig, ["in/n1.txt", "in/n2/n3.txt"])
    watch(cat)
    m = cat.refresh("vol", inventory=uri)
    assert (m.inserted, m.deleted) == (1, 0)
    assert [r["relative_path"] for r in table(cat, "vol")] == ["n1.txt", "n2/n3.txt", "old.txt"]


def test_a_delete_the_report_implies_is_dated_at_the_report(cat, rig, dest):
    """A file the report misses is deleted with a tombstone of the report's time: an older
    event redelivered later cannot bring it back, a newer one can."""
    add_volume(cat, rig)
    rig.put("in/x.txt", b"x")
    watch(cat)
    created = datetime.now(UTC)  # after x.txt's event
    empty = report(rig, dest, objects=[], created=created)
    m = cat.refresh("vol", inventory=empty)
    assert (m.listed, m.deleted) == (0, 1) and table(cat, "vol") == []
    tomb = cat.directory_table("vol").tombstones().to_pyarrow_dataset().to_table().to_pylist()
    assert [(t["relative_path"], t["_event_time"]) for t in tomb] == [
        ("x.txt", created.replace(microsecond=created.microsecond // 1000 * 1000))]


def test_an_empty_report(cat, rig, dest):
    add_volume(cat, rig)
    for files in (0, 1):  # no data file at all; one holding no row
        uri = report(rig, dest, objects=[], files=files, config=f"empty{files}")
        m = cat.refresh("vol", inventory=uri)
        assert (m.listed, m.inserted, m.deleted, m.version) == (0, 0, 0, None)


def test_the_newest_report_under_a_prefix(cat, rig, dest):
    put_keys(rig, ["in/old.txt"])
    old = datetime.now(UTC) - timedelta(days=1)
    report(rig, dest, created=old)
    put_keys(rig, ["in/new.txt"])
    uri = report(rig, dest, created=old + timedelta(hours=23))
    other = from_s3_listing(rig.s3, rig.bucket)  # another bucket's newer report: not ours
    write_report(s3_put(rig.s3, dest), source="someone-else", destination=dest,
                 created=datetime.now(UTC), objects=other)
    add_volume(cat, rig)
    for prefix in (f"s3://{dest}/reports", f"s3://{dest}/reports/", f"s3://{dest}"):
        m = cat.refresh("vol", inventory=prefix)
        assert m.inventory_created.replace(microsecond=0) == (old + timedelta(hours=23)
                                                              ).replace(microsecond=0)
    assert [r["relative_path"] for r in table(cat, "vol")] == ["new.txt", "old.txt"]
    assert uri.endswith("manifest.json")
    with pytest.raises(vs.InventoryError, match=r"no inventory report of bucket .* under s3://"):
        cat.refresh("vol", inventory=f"s3://{dest}/nothing-here/")


def _refused(cat, uri: str, match: str) -> None:
    version = cat.directory_table("vol").version()
    with pytest.raises(vs.InventoryError, match=match) as info:
        cat.refresh("vol", inventory=uri)
    assert isinstance(info.value, vs.SourceError) and "volume 'vol'" in str(info.value)
    assert cat.directory_table("vol").version() == version  # nothing committed


def test_checksum_mismatches_are_refused(cat, rig, dest):
    put_keys(rig)
    add_volume(cat, rig)
    uri = report(rig, dest, files=2)
    key = uri.split("/", 3)[3]
    manifest = rig.s3.get_object(Bucket=dest, Key=key)["Body"].read()
    files = json.loads(manifest)["files"]
    data_key = files[1]["key"]
    data = rig.s3.get_object(Bucket=dest, Key=data_key)["Body"].read()

    rig.s3.put_object(Bucket=dest, Key=data_key, Body=bytes([data[0] ^ 1]) + data[1:])
    _refused(cat, uri, rf"s3://{dest}/{data_key} does not match its MD5checksum")
    rig.s3.put_object(Bucket=dest, Key=data_key, Body=data[:-5])  # truncated
    _refused(cat, uri, rf"s3://{dest}/{data_key} has {len(data) - 5} bytes, .* says "
                       rf"{len(data)}: truncated")
    rig.s3.put_object(Bucket=dest, Key=data_key, Body=data)
    checksum = key.replace("manifest.json", "manifest.checksum")
    rig.s3.put_object(Bucket=dest, Key=checksum, Body=b"0" * 32)
    _refused(cat, uri, rf"s3://{dest}/{key} does not match .*manifest.checksum")
    rig.s3.delete_object(Bucket=dest, Key=checksum)
    _refused(cat, uri, r"manifest.checksum does not exist")
    assert cat.directory_table("vol").version() == 0


def test_a_manifest_naming_a_missing_data_file_is_refused(cat, rig, dest):
    put_keys(rig)
    add_volume(cat, rig)
    uri = report(rig, dest, files=3)
    manifest = rig.s3.get_object(Bucket=dest, Key=uri.split("/", 3)[3])["Body"].read()
    missing = json.loads(manifest)["files"][2]["key"]
    rig.s3.delete_object(Bucket=dest, Key=missing)
    _refused(cat, uri, rf"s3://{dest}/{missing}, listed in .*manifest.json, could not be read")


def test_bad_reports_and_urls(cat, rig, dest):
    add_volume(cat, rig)
    other = write_report(s3_put(rig.s3, dest), source="another-bucket", destination=dest,
                         created=datetime.now(UTC), objects=[])
    _refused(cat, f"s3://{dest}/{other}", r"an inventory of bucket 'another-bucket', not of")
    with pytest.raises(vs.InvalidInputError, match=r"expected an s3:// URL"):
        cat.refresh("vol", inventory=f"oss://{dest}/x/manifest.json")
    with pytest.raises(vs.SourceError, match=r"does not exist"):
        cat.refresh("vol", inventory=f"s3://{dest}/no/such/manifest.json")


def test_cli_refresh_from_a_report(tmp_path, rig, dest):
    warehouse = tmp_path / "wh"
    cat = vs.connect(warehouse)
    put_keys(rig)
    add_volume(cat, rig)
    uri = report(rig, dest, created=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    script = str(Path(sys.executable).parent / "volume-stream")
    ok = subprocess.run([script, "volume", "refresh", "vol", "--inventory", uri, "--warehouse",
                         str(warehouse)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("refreshed vol from the inventory of 2026-01-02 03:04:05 UTC: "
                                "listed 7, +7 ~0 -0 (version 1,")
    key = uri.split("/", 3)[3]
    rig.s3.put_object(Bucket=dest, Key=key.replace(".json", ".checksum"), Body=b"f" * 32)
    bad = subprocess.run([script, "volume", "refresh", "vol", "--inventory", uri, "--warehouse",
                          str(warehouse)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    actual = md5(rig.s3.get_object(Bucket=dest, Key=key)["Body"].read())
    checksum = f"s3://{dest}/{key.replace('.json', '.checksum')}"
    assert bad.stderr.strip().splitlines() == [
        f"error: volume 'vol': {uri} does not match {checksum} (MD5 {actual}, expected "
        f"{'f' * 32}): refusing the inventory"]


def test_the_daemon_backfills_from_the_newest_report_at_start(tmp_path, rig, dest):
    cat = vs.connect(tmp_path / "wh")
    put_keys(rig)
    add_volume(cat, rig)
    report(rig, dest, fmt="Parquet")
    other = make_rig(rig.endpoint)  # a volume of its own queue, whose report is incomplete
    bad = write_report(s3_put(rig.s3, dest), source=other.bucket, destination=dest,
                       created=datetime.now(UTC), objects=[], prefix="broken")
    rig.s3.delete_object(Bucket=dest, Key=bad.replace(".json", ".checksum"))
    add_volume(cat, other, "other")
    cfg = config(tmp_path, volumes={
        "vol": {"inventory": f"s3://{dest}/reports/", "refresh_interval_s": 0, "poll_s": 0.2},
        "other": {"inventory": f"s3://{dest}/broken/", "refresh_interval_s": 0,
                  "poll_s": 0.2}})
    try:
        with Daemon(cfg, catalog=cat) as daemon:
            wait_for(lambda: daemon.readiness()[0], timeout=60)  # the refused one too
            assert len(table(cat, "vol")) == 7
            rig.put("in/after-start.txt", b"events flow after the backfill")
            other.put("in/o.txt", b"and after a refused one")
            wait_for(lambda: len(table(cat, "vol")) == 8 and len(table(cat, "other")) == 1,
                     timeout=60)
    finally:
        other.sqs.delete_queue(QueueUrl=other.queue_url)
    assert metric(daemon, "volume_stream_refreshes_total", volume="vol", reason="start") == 1
    assert metric(daemon, "volume_stream_errors_total", volume="other", stage="refresh") == 1
