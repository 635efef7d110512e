"""Parallel listings give exactly the serial listing: `connectors._listing.parallel_pages` over
an in-memory store with the ListObjectsV2 delimiter rules (hypothesis), S3 on moto's server,
OSS on the wire fake, and local trees."""

# ruff: noqa: F811  (pytest fixtures imported from the fixture modules are used as parameters)

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors._listing import parallel_pages
from connectors.alicloud.store import OssLister
from connectors.aws.store import S3Lister
from connectors.local import LocalLister
from connectors.protocols import LISTING_SCHEMA
from tests.alicloud_fixtures import alicloud_env, make_volume, mns_server, oss_server  # noqa: F401
from tests.aws_fixtures import make_rig, moto_server  # noqa: F401

CREDS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
         "aws_secret_access_key": "testing-secret"}


class Store:
    """ListObjectsV2 over a sorted key list: prefix, delimiter, pages of `size`."""

    def __init__(self, keys, size=3, fail_under=None):
        self.keys, self.size, self.fail_under = sorted(set(keys)), size, fail_under
        self.calls = 0
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def page(self, prefix, delimiter, token):
        with self.lock:
            self.calls += 1
            self.threads.add(threading.current_thread().name)
        if self.fail_under and prefix.startswith(self.fail_under):
            raise RuntimeError(f"listing {prefix!r} failed")
        entries = []
        for key in self.keys:
            if not key.startswith(prefix):
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            entry = ("p", key[:cut + 1]) if cut >= 0 else ("o", key)
            if not entries or entries[-1] != entry:
                entries.append(entry)
        start = int(token or 0)
        chunk = entries[start:start + self.size]
        more = start + self.size < len(entries)
        return ([(k, 1, None, None) for kind, k in chunk if kind == "o"],
                [k for kind, k in chunk if kind == "p"], str(start + self.size) if more else None)


def keys_of(pages):
    return sorted(obj[0] for page in pages for obj in page)


segment = st.sampled_from(["a", "b", "c", "d e", "x", ""])
key = st.lists(segment, min_size=1, max_size=5).map("/".join).filter(bool)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(key, max_size=40), prefix=st.sampled_from(["", "a", "a/", "b/c/"]),
       workers=st.integers(1, 6), size=st.integers(1, 4))
def test_parallel_pages_equal_the_serial_listing(keys, prefix, workers, size):
    store = Store(keys, size)
    expected = sorted(k for k in set(keys) if k.startswith(prefix))
    assert keys_of(parallel_pages(store.page, prefix, workers=workers, fan_out=1)) == expected
    flat = sorted(k for k in expected if "/" not in k[len(prefix):])
    assert keys_of(parallel_pages(store.page, prefix, recursive=False, workers=workers)) == flat


def test_parallel_pages_use_the_pool_raise_errors_and_stop_when_closed():
    keys = [f"{a}/{b}/f{i}" for a in "abcdefgh" for b in "xyz" for i in range(20)]
    store = Store(keys, size=5)
    assert keys_of(parallel_pages(store.page, "", workers=4)) == sorted(keys)
    assert len({t for t in store.threads if t.startswith("list")}) > 1

    failing = Store(keys, size=5, fail_under="c/y/")
    with pytest.raises(RuntimeError, match="listing 'c/y/' failed"):
        keys_of(parallel_pages(failing.page, "", workers=4))

    before = {t.name for t in threading.enumerate()}
    pages = parallel_pages(Store(keys, size=1).page, "", workers=4)
    next(pages)
    pages.close()  # the consumer stops early: the listing threads end with it
    assert {t.name for t in threading.enumerate()} <= before


def listing(lister) -> list[tuple]:
    table = pa.Table.from_batches(list(lister.list()), schema=LISTING_SCHEMA)
    return sorted((r["relative_path"], r["size"], r["etag"], r["last_modified_time"])
                  for r in table.to_pylist())


TREE = ([f"top{i}.txt" for i in range(5)]
        + [f"p{a}/q{b}/f{i}.bin" for a in range(12) for b in range(3) for i in range(4)]
        + [f"deep/{'/'.join('d' * 6)}/leaf{i}" for i in range(3)]
        + ["sp ace/é+.csv", "one/only.txt"])


def test_s3_parallel_listing_is_the_serial_listing(moto_server):
    rig = make_rig(moto_server, notify=False)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: rig.put(k, k.encode()), [f"vol/{k}" for k in TREE]
                      + ["elsewhere", "volume/x"]))
    rig.put("vol/marker/", b"")

    def lister(**kw):
        return S3Lister(rig.bucket, "vol", endpoint_url=rig.endpoint, page_size=7, **CREDS, **kw)

    serial = listing(lister(list_workers=1))
    assert [r[0] for r in serial] == sorted(TREE)
    assert listing(lister(list_workers=8)) == serial
    assert listing(lister(list_workers=3)) == serial
    assert listing(lister(list_workers=8, recursive=False)) == listing(
        lister(list_workers=1, recursive=False))


def test_oss_parallel_listing_is_the_serial_listing(mns_server, oss_server, alicloud_env):
    vol = make_volume(mns_server, oss_server)
    try:
        for k in TREE + ["elsewhere"]:
            vol.oss.put_object(f"vol/{k}" if k != "elsewhere" else k, k.encode())

        def lister(**kw):
            return OssLister(vol.bucket, "vol", vol.oss_endpoint, page_size=7, **kw)

        serial = listing(lister(list_workers=1))
        assert [r[0] for r in serial] == sorted(TREE)
        assert listing(lister(list_workers=8)) == serial
    finally:
        vol.close()


def test_local_parallel_scan_is_the_serial_scan(tmp_path: Path):
    root = tmp_path / "tree"
    for k in TREE:
        (root / k).parent.mkdir(parents=True, exist_ok=True)
        (root / k).write_bytes(k.encode())
    (root / "empty" / "dirs").mkdir(parents=True)
    serial = listing(LocalLister(root, workers=1))
    assert [r[0] for r in serial] == sorted(TREE)
    assert listing(LocalLister(root, workers=4)) == serial
    assert listing(LocalLister(root, workers=4, batch_size=5)) == serial
    assert listing(LocalLister(root, workers=4, recursive=False)) == listing(
        LocalLister(root, workers=1, recursive=False))
