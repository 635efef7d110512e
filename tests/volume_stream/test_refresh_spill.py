"""Refresh of an S3 prefix whose listing is bigger than one diff group (issue 12 item 4): the
listing is spilled per bucket partition and diffed a group at a time. Against moto's server
over HTTP: the same table and the same change records as a refresh holding the whole listing;
a denied listing half way, or a missing bucket, is a `VolumeStreamError` naming the volume,
commits nothing and leaves no spill files; the next refresh lists everything."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import glob
import os
import tempfile
from urllib.parse import parse_qs, urlparse

import pytest

import volume_stream as vs
from tests.alicloud_fixtures import (  # noqa: F401
    alicloud_env,
    make_volume,
    mns_server,
    oss_server,
)
from tests.aws_fixtures import aws_env, make_rig, moto_server  # noqa: F401
from tests.fakes._http import FakeHTTPServer
from tests.fakes.faulty_proxy import _Handler, _State
from tests.volume_stream.conftest import rows
from volume_stream.volumes import _spill, refresh

KEYS = [f"in/d{d}/e{e}/f{i:02d}.bin" for d in range(6) for e in range(2) for i in range(6)]


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "warehouse")


def spill_files() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), "volume-stream-refresh-*"))


def table(cat, name):
    snap = cat.directory_table(name).snapshot(
        columns=["relative_path", "size", "etag", "last_modified_time"])
    return sorted(snap.to_pylist(), key=lambda r: r["relative_path"])


def add(cat, rig, name, **options):
    note = vs.SqsNotification(rig.queue_url, wait_time_seconds=0)
    cat.create_volume(name, f"s3://{rig.bucket}/in/", notification=note, **options)
    cat.create_stream(f"{name}_s", name)


def test_a_spilled_listing_gives_the_same_table_and_records(cat, aws_env, monkeypatch):
    rig = make_rig(aws_env, notify=False)
    for i, key in enumerate(KEYS):
        rig.put(key, b"x" * (i % 7))
    add(cat, rig, "whole")
    add(cat, rig, "spilled")
    before = set(spill_files())

    def both() -> list:
        before_whole, before_spilled = (cat.directory_table(n).version()
                                        for n in ("whole", "spilled"))
        monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 1_000_000)
        whole = cat.refresh("whole")
        monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 10)  # 72 keys: spilled
        seen: list[tuple[str, int, int]] = []
        spilled = cat.refresh("spilled", lambda *a: seen.append(a))
        assert [s for s, *_ in seen].count("diffing") > 3  # one per group of partitions
        assert seen[-1] == ("committing", spilled.listed, spilled.inserted + spilled.updated
                            + spilled.deleted)
        assert table(cat, "whole") == table(cat, "spilled")
        # the same records; the spilled refresh committed its differences a group of
        # partitions at a time, in versions of their own
        whole_rows, spilled_rows = (rows(cat.read_stream_arrow(f"{n}_s"))
                                    for n in ("whole", "spilled"))
        assert [r[:3] for r in whole_rows] == [r[:3] for r in spilled_rows]
        if whole.version is not None:
            assert len({r[3] for r in whole_rows if r[3] > before_whole}) == 1
            assert len({r[3] for r in spilled_rows if r[3] > before_spilled}) > 1
        return [(m.listed, m.inserted, m.updated, m.deleted) for m in (whole, spilled)]

    assert both() == [(72, 72, 0, 0)] * 2
    for key in KEYS[::7]:  # 10 deletes, 6 overwrites (one of a deleted key), 3 new keys
        rig.s3.delete_object(Bucket=rig.bucket, Key=key)
    for key in KEYS[3::12]:
        rig.put(key, b"rewritten")
    for i in range(3):
        rig.put(f"in/new/n{i}", b"new")
    assert both() == [(65, 3, 6, 10)] * 2
    assert both() == [(65, 0, 0, 0)] * 2
    assert set(spill_files()) == before
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)


class _Denying(_Handler):
    """moto behind a proxy that answers AccessDenied to listings of a sub-prefix."""

    def _any(self) -> None:
        query = parse_qs(urlparse(self.path).query)
        prefix = (query.get("prefix") or [""])[0]
        if self.server.state.deny and self.command == "GET" and "list-type" in query \
                and prefix.startswith(self.server.state.deny):
            self.read_body()
            body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
                    b"<Message>Access Denied</Message><RequestId>1</RequestId></Error>")
            self.respond(403, body, {"Content-Type": "application/xml"})
            return
        super()._any()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any


def test_a_denied_listing_or_a_missing_bucket_changes_nothing(cat, aws_env, monkeypatch):
    rig = make_rig(aws_env, notify=False)
    for key in KEYS:
        rig.put(key, b"data")
    state = _State(aws_env, rate=0.0, faults=("error500",), seed=0, latency_s=0.0)
    state.deny = "in/d3/e1/"  # listed in the last level: the others' keys come first
    server = FakeHTTPServer("fake-denying-proxy", _Denying, state).start()
    try:
        add(cat, rig, "vol", endpoint_url=server.endpoint)
        monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 10)
        spilled = []
        start = _spill.Listing._start_spilling
        monkeypatch.setattr(_spill.Listing, "_start_spilling",
                            lambda self: (spilled.append(self.rows), start(self)))
        before = set(spill_files())
        with pytest.raises(vs.VolumeStreamError, match=r"volume 'vol'.*AccessDenied"):
            cat.refresh("vol")
        assert spilled  # the failure came after rows went to spill files
        assert cat.directory_table("vol").version() == 0
        assert rows(cat.read_stream_arrow("vol_s")) == []
        assert set(spill_files()) == before

        note = vs.SqsNotification(rig.queue_url, wait_time_seconds=0)
        cat.create_volume("gone", f"s3://no-such-bucket-{rig.bucket}/in/", notification=note)
        with pytest.raises(vs.VolumeStreamError, match=r"volume 'gone'"):
            cat.refresh("gone")
        assert cat.directory_table("gone").version() == 0

        state.deny = ""  # allowed again: nothing was lost
        m = cat.refresh("vol")
        assert (m.listed, m.inserted) == (72, 72)
        assert len(rows(cat.read_stream_arrow("vol_s"))) == 72
        assert set(spill_files()) == before
    finally:
        server.stop()
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)


def test_a_spilled_oss_listing_gives_the_same_table_and_records(cat, mns_server, oss_server,
                                                                 alicloud_env, monkeypatch):
    vol = make_volume(mns_server, oss_server, prefix="in/")
    try:
        for i, key in enumerate(KEYS):
            vol.oss.put_object(key, b"x" * (i % 7))
        note = vs.MnsNotification(vol.mns_endpoint, vol.queue_name, wait_seconds=0)
        for name in ("whole", "spilled"):
            cat.create_volume(name, f"oss://{vol.bucket}/in/", endpoint=vol.oss_endpoint,
                              notification=note)
            cat.create_stream(f"{name}_s", name)
        monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 1_000_000)
        assert cat.refresh("whole").inserted == 72
        monkeypatch.setattr(refresh, "ROWS_PER_BUCKET_GROUP", 10)
        assert cat.refresh("spilled").inserted == 72
        assert table(cat, "whole") == table(cat, "spilled")
        # the same records, the spilled ones committed a group of partitions at a time
        whole_rows, spilled_rows = (rows(cat.read_stream_arrow(f"{n}_s"))
                                    for n in ("whole", "spilled"))
        assert [r[:3] for r in whole_rows] == [r[:3] for r in spilled_rows]
        assert len({r[3] for r in spilled_rows}) > 1
        assert cat.refresh("spilled").version is None
    finally:
        vol.close()
