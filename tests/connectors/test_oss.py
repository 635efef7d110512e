"""`OssReader` and `OssLister` with oss2 against the fake OSS server over HTTP."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import io
import os
import pickle
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from connectors.alicloud.store import OssLister, OssReader, oss_url
from connectors.errors import ConnectorError, CredentialsError, ObjectNotFoundError
from connectors.events import InvalidPathError
from connectors.protocols import LISTING_SCHEMA, Lister, ObjectReader
from tests.alicloud_fixtures import (  # noqa: F401
    FAKE_ACCESS_KEY_ID,
    FAKE_ACCESS_KEY_SECRET,
    alicloud_env,
    make_volume,
    mns_server,
    oss_server,
)

BIG = os.urandom(3 * 1024 * 1024 + 17)


@pytest.fixture(scope="module")
def vol(mns_server, oss_server):
    volume = make_volume(mns_server, oss_server, events=())
    for key in ("in/a.txt", "in/dir/b.txt", "in/dir/deeper/c.txt", "in/sp ace+é.csv",
                "in/dir/", "in/../escape.txt", "out/x.txt", "inbox.txt"):
        volume.oss.put_object(key, key.encode())
    volume.oss.put_object("in/big.bin", BIG)
    yield volume
    volume.close()


@pytest.fixture
def reader(vol, alicloud_env):
    return OssReader(vol.bucket, "in", vol.oss_endpoint)


def test_open_streams_and_seeks(reader):
    assert isinstance(reader, ObjectReader)
    with reader.open("big.bin") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.read(10) == BIG[:10]
        chunks = [f.read(256 * 1024) for _ in range(3)]
        assert b"".join(chunks) == BIG[10:10 + 3 * 256 * 1024]
        f.seek(-7, io.SEEK_END)
        assert f.read() == BIG[-7:] and f.read() == b""
        f.seek(5)
        assert f.tell() == 5 and f.read(3) == BIG[5:8]
    with reader.open("sp ace+é.csv") as f:
        assert f.read() == b"in/sp ace+\xc3\xa9.csv"


def test_read_range(reader):
    assert reader.read_range("big.bin", 1000, 50) == BIG[1000:1050]
    assert reader.read_range("big.bin", len(BIG) - 5, 50) == BIG[-5:]
    assert reader.read_range("big.bin", len(BIG), 10) == b""
    assert reader.read_range("a.txt", 0, 0) == b""
    assert reader.read_range("dir/deeper/c.txt", 3, 3) == b"dir"
    with pytest.raises(ValueError):
        reader.read_range("a.txt", -1, 2)


def test_missing_objects_and_unsafe_paths(reader):
    with pytest.raises(ObjectNotFoundError, match="oss://bkt-.*/in/nope.txt"):
        reader.open("nope.txt")
    with pytest.raises(ObjectNotFoundError):
        reader.read_range("nope.txt", 0, 1)
    assert issubclass(ObjectNotFoundError, FileNotFoundError)
    for bad in ("../out/x.txt", "/abs", "a//b"):
        with pytest.raises(InvalidPathError):
            reader.open(bad)


def test_transient_errors_are_retried(oss_server, reader):
    oss_server.backend.fail_next("GetObject", "InternalError", 500, times=2)
    assert reader.read_range("a.txt", 0, 4) == b"in/a"
    oss_server.backend.fail_next("GetObject", "ServiceUnavailable", 503, times=1)
    with reader.open("a.txt") as f:
        assert f.read() == b"in/a.txt"
    oss_server.backend.fail_next("GetObject", "AccessDenied", 403, times=1)
    with pytest.raises(ConnectorError, match="AccessDenied"):
        reader.read_range("a.txt", 0, 4)  # not transient: no retry
    oss_server.backend.clear_faults()


def test_a_body_cut_off_mid_read_is_resumed(oss_server, reader):
    oss_server.backend.fail_next("TruncateBody")
    with reader.open("big.bin") as f:
        assert f.read() == BIG


def test_an_object_changed_while_resuming_fails(vol, alicloud_env):
    vol.oss.put_object("tmp/changing.bin", BIG)
    with OssReader(vol.bucket, "tmp/", vol.oss_endpoint).open("changing.bin") as f:
        f.read(10)
        vol.oss.put_object("tmp/changing.bin", b"new content")
        f.seek(2 * 1024 * 1024)  # past the buffer: the next read re-requests with If-Match
        with pytest.raises(ConnectorError, match="changed"):
            f.read(10)


def test_reader_pickles_without_secrets(vol, reader):
    reader.read_range("a.txt", 0, 1)  # a client now exists; it must not be pickled
    clone = pickle.loads(pickle.dumps(reader))
    assert clone.read_range("a.txt", 0, 4) == b"in/a"
    explicit = OssReader(vol.bucket, "in/", vol.oss_endpoint, access_key_id=FAKE_ACCESS_KEY_ID,
                         access_key_secret=FAKE_ACCESS_KEY_SECRET)
    assert FAKE_ACCESS_KEY_SECRET not in repr(explicit) and FAKE_ACCESS_KEY_ID not in repr(explicit)
    assert FAKE_ACCESS_KEY_SECRET.encode() not in pickle.dumps(reader)
    assert pickle.loads(pickle.dumps(explicit)).read_range("a.txt", 0, 2) == b"in"
    assert explicit.url("dir/b.txt") == f"oss://{vol.bucket}/in/dir/b.txt"


def test_credentials_are_checked(monkeypatch, vol):
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", raising=False)
    lazy = OssReader(vol.bucket, "in/", vol.oss_endpoint)  # nothing resolved yet
    with pytest.raises(CredentialsError, match="ALIBABA_CLOUD_ACCESS_KEY_ID"):
        lazy.read_range("a.txt", 0, 1)
    wrong = OssReader(vol.bucket, "in/", vol.oss_endpoint, access_key_id=FAKE_ACCESS_KEY_ID,
                      access_key_secret="wrong")
    with pytest.raises(CredentialsError, match="SignatureDoesNotMatch"):
        wrong.open("a.txt")


def table_of(lister: OssLister) -> pa.Table:
    batches = list(lister.list())
    assert all(b.schema == LISTING_SCHEMA for b in batches)
    return pa.Table.from_batches(batches, schema=LISTING_SCHEMA)


def test_lister_paginates_and_filters(vol, alicloud_env, caplog):
    lister = OssLister(vol.bucket, "in/", vol.oss_endpoint, page_size=2)
    assert isinstance(lister, Lister)
    table = table_of(lister)
    rows = {r["relative_path"]: r for r in table.to_pylist()}
    assert sorted(rows) == ["a.txt", "big.bin", "dir/b.txt", "dir/deeper/c.txt", "sp ace+é.csv"]
    assert rows["a.txt"]["size"] == 8 and rows["big.bin"]["size"] == len(BIG)
    assert rows["a.txt"]["etag"] == vol.oss.head_object("in/a.txt").etag  # unquoted
    assert '"' not in rows["a.txt"]["etag"]
    modified = rows["a.txt"]["last_modified_time"]
    assert modified.tzinfo is not None and abs(datetime.now(UTC) - modified) < timedelta(hours=1)
    assert "escape.txt" in caplog.text  # the unsafe key was skipped with a warning


def test_lister_non_recursive_and_suffix(vol, alicloud_env):
    flat = table_of(OssLister(vol.bucket, "in", vol.oss_endpoint, recursive=False, page_size=1))
    assert sorted(flat.column("relative_path").to_pylist()) == ["a.txt", "big.bin", "sp ace+é.csv"]
    csv = table_of(OssLister(vol.bucket, "in/", vol.oss_endpoint, suffix=".csv"))
    assert csv.column("relative_path").to_pylist() == ["sp ace+é.csv"]
    whole = table_of(OssLister(vol.bucket, "", vol.oss_endpoint))
    assert {"inbox.txt", "out/x.txt", "in/a.txt"} <= set(whole.column("relative_path").to_pylist())


def test_lister_retries_and_empty_prefix(oss_server, vol, alicloud_env):
    oss_server.backend.fail_next("ListObjectsV2", "InternalError", 500, times=1)
    assert table_of(OssLister(vol.bucket, "in/dir/deeper", vol.oss_endpoint)).num_rows == 1
    assert list(OssLister(vol.bucket, "nothing/", vol.oss_endpoint).list()) == []


def test_oss_url():
    assert oss_url("bkt", "dir/a b+c é.txt") == "oss://bkt/dir/a b+c é.txt"
