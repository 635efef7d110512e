"""Backfill from OSS inventory reports (issue 26 item 4) on the project's OSS fake, read with the
real oss2: the report (manifest.json with `creationTimestamp` in seconds, upper-case MD5s,
CSV.gz data files with URL-encoded keys) is written to a destination bucket of the fake."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
from datetime import UTC, datetime

import oss2
import pytest

import volume_stream as vs
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    alicloud_env,
    mns_server,
    oss_server,
)
from tests.inventory_fixtures import write_report
from tests.volume_stream.test_oss_volume import add_volume, next_second, vol, watch  # noqa: F401

PUBLIC = ["relative_path", "size", "etag", "last_modified_time"]


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")


@pytest.fixture
def dest(oss_server, vol):
    auth = oss2.Auth(FAKE_ACCESS_KEY_ID, FAKE_ACCESS_KEY_SECRET)
    bucket = oss2.Bucket(auth, oss_server.endpoint, f"{vol.bucket}-inventory")
    bucket.create_bucket()
    return bucket


def listing(vol) -> list[dict]:
    """The bucket's objects as OSS inventory reports them (every prefix)."""
    return [{"Key": o.key, "Size": o.size, "ETag": o.etag,
             "LastModifiedDate": datetime.fromtimestamp(o.last_modified, UTC)}
            for o in oss2.ObjectIteratorV2(vol.oss)]


def report(vol, dest, objects=None, **kw) -> str:
    key = write_report(lambda k, data: dest.put_object(k, data), source=vol.bucket,
                       destination=dest.bucket_name, oss=True,
                       objects=listing(vol) if objects is None else objects,
                       created=kw.pop("created", None) or datetime.now(UTC), **kw)
    return f"oss://{dest.bucket_name}/{key}"


def table(cat, name):
    snap = cat.directory_table(name).snapshot(columns=PUBLIC)
    return sorted(snap.to_pylist(), key=lambda r: r["relative_path"])


def test_an_oss_report_backfills_what_a_listing_would(cat, vol, dest):
    for i, key in enumerate(["in/a.txt", "in/b c/d+e.csv", "in/中文/名字.txt", "in/50%.bin",
                             "out/x.txt", "in/dir/"]):
        vol.oss.put_object(key, b"y" * (i + 1))
    add_volume(cat, vol, "listed")
    add_volume(cat, vol, "backfilled")
    listed = cat.refresh("listed")
    uri = report(vol, dest, files=2)
    manifest = json.loads(dest.get_object(uri.split("/", 3)[3]).read())
    assert manifest["creationTimestamp"].isdigit() and len(manifest["creationTimestamp"]) == 10
    m = cat.refresh("backfilled", inventory=uri)
    assert (m.listed, m.inserted) == (listed.listed, listed.inserted) == (4, 4)
    assert table(cat, "backfilled") == table(cat, "listed")
    m = cat.refresh("backfilled", inventory=f"oss://{dest.bucket_name}/reports/")  # newest
    assert m.version is None and m.listed == 4


def test_oss_events_newer_than_the_report_win(cat, vol, dest):
    add_volume(cat, vol)
    for key in ("in/kept.txt", "in/deleted.txt", "in/gone.txt"):
        vol.oss.put_object(key, b"1")
    watch(cat)
    events, vol.rule.events = vol.rule.events, ()  # a delete nobody hears of
    vol.oss.delete_object("in/gone.txt")
    vol.rule.events = events
    next_second()  # the report is made in a later second than the events before it
    uri = report(vol, dest)  # kept, deleted
    next_second()  # OSS events are stamped to the second, like creationTimestamp
    vol.oss.delete_object("in/deleted.txt")
    vol.oss.put_object("in/after.txt", b"after")
    watch(cat)
    m = cat.refresh("vol", inventory=uri)
    assert (m.inserted, m.deleted) == (0, 1)  # gone.txt out; deleted.txt stays deleted
    assert [r["relative_path"] for r in table(cat, "vol")] == ["after.txt", "kept.txt"]


def test_an_oss_report_failing_its_checksum_is_refused(cat, vol, dest):
    vol.oss.put_object("in/a.txt", b"a")
    add_volume(cat, vol)
    uri = report(vol, dest)
    key = uri.split("/", 3)[3]
    data_key = json.loads(dest.get_object(key).read())["files"][0]["key"]
    data = dest.get_object(data_key).read()
    dest.put_object(data_key, data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(vs.InventoryError,
                       match=rf"oss://{dest.bucket_name}/{data_key} does not match its "
                             rf"MD5checksum"):
        cat.refresh("vol", inventory=uri)
    assert cat.directory_table("vol").version() == 0
