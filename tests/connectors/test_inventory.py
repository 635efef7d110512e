"""`connectors.inventory` on reports held in a dict of bytes (the formats, not the stores: the
stores are exercised in tests/volume_stream/test_inventory_*.py): ORC data files, a volume's
recursion and suffix, unsafe keys, malformed manifests, picking the newest report."""

from __future__ import annotations

import hashlib
import io
import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.orc as orc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.errors import InventoryError, ObjectNotFoundError
from connectors.inventory import InventoryLister, newest_manifest, parse_created, parse_manifest
from connectors.protocols import LISTING_SCHEMA
from connectors.scope import BucketScope
from tests.inventory_fixtures import write_report

WHEN = datetime(2026, 3, 1, 12, 30, 15, 123000, tzinfo=UTC)


def objects(*keys: str) -> list[dict]:
    return [{"Key": k, "Size": i, "ETag": f"{i:032x}", "LastModifiedDate": WHEN}
            for i, k in enumerate(keys)]


class Store(dict):
    def put(self, key: str, data: bytes) -> None:
        self[key] = data

    def open(self, key: str) -> io.BytesIO:
        if key not in self:
            raise ObjectNotFoundError(f"mem://{key} does not exist")
        return io.BytesIO(self[key])


def lister(store: Store, key: str, scope: BucketScope) -> InventoryLister:
    manifest = parse_manifest(store[key], store[key.replace(".json", ".checksum")],
                              f"mem://{key}")
    return InventoryLister(manifest, scope, store.open, lambda k: f"mem://{k}")


def listed(lst: InventoryLister) -> list[dict]:
    return pa.Table.from_batches(list(lst.list()), schema=LISTING_SCHEMA).to_pylist()


def test_creation_timestamps_in_milliseconds_and_seconds():
    assert parse_created("1772368215123") == WHEN
    assert parse_created(1772368215) == WHEN.replace(microsecond=0)


@pytest.mark.parametrize("fmt", ["CSV", "Parquet"])
def test_recursion_suffix_and_times(fmt):
    store = Store()
    key = write_report(store.put, source="src", created=WHEN, fmt=fmt,
                       objects=objects("in/a.csv", "in/b.txt", "in/sub/c.csv", "in/", "x.csv"))
    rows = listed(lister(store, key, BucketScope("src", "in", recursive=False, suffix=".csv")))
    assert rows == [{"relative_path": "a.csv", "size": 0, "etag": "0" * 32,
                     "last_modified_time": WHEN}]


def test_orc_data_files():
    store = Store()
    table = pa.table({"bucket": ["src", "src", "src"], "key": ["p/a b", "p/c", "p/d"],
                      "is_latest": [True, False, True], "is_delete_marker": [False, False, True],
                      "size": pa.array([1, 2, None], pa.int64()),
                      "last_modified_date": pa.array([WHEN] * 3, pa.timestamp("ms")),
                      "e_tag": ["e1", "e2", None]})
    out = io.BytesIO()
    orc.write_table(table, out)
    data = out.getvalue()
    store["d/1.orc"] = data
    manifest = json.dumps({"sourceBucket": "src", "destinationBucket": "arn:aws:s3:::d",
                           "version": "2016-11-30", "creationTimestamp": "1772368215123",
                           "fileFormat": "ORC", "fileSchema": "struct<bucket:string,...>",
                           "files": [{"key": "d/1.orc", "size": len(data),
                                      "MD5checksum": hashlib.md5(data).hexdigest()}]}).encode()
    store["m/manifest.json"] = manifest
    store["m/manifest.checksum"] = hashlib.md5(manifest).hexdigest().encode() + b"\n"
    rows = listed(lister(store, "m/manifest.json", BucketScope("src", "p")))
    assert rows == [{"relative_path": "a b", "size": 1, "etag": "e1",
                     "last_modified_time": WHEN}]


def test_unsafe_keys_are_skipped_and_counted():
    store = Store()
    key = write_report(store.put, source="src", created=WHEN,
                       objects=objects("in/ok", "in/../escape", "in/a//b", "in/./x", "in/t\tab"))
    lst = lister(store, key, BucketScope("src", "in"))
    assert [r["relative_path"] for r in listed(lst)] == ["ok"] and lst.malformed == 4


def test_malformed_manifests():
    def refused(doc, match):
        data = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
        with pytest.raises(InventoryError, match=match):
            parse_manifest(data, hashlib.md5(data).hexdigest().encode(), "mem://m.json")

    good = {"sourceBucket": "s", "creationTimestamp": "1", "fileFormat": "CSV",
            "fileSchema": "Bucket, Key, Size, LastModifiedDate, ETag", "files": []}
    assert parse_manifest(json.dumps(good).encode(),
                          hashlib.md5(json.dumps(good).encode()).hexdigest().upper().encode(),
                          "mem://m.json").files == ()
    refused(b"{not json", r"mem://m.json is not an inventory manifest")
    refused({**good, "files": [{"key": "k"}]}, r"is not an inventory manifest: KeyError")
    refused({**good, "fileFormat": "JSON"}, r"unsupported fileFormat 'JSON'")
    refused({**good, "fileSchema": "Bucket, Key"}, r"fileSchema lacks .*Size")
    with pytest.raises(InventoryError, match=r"mem://manifest.checksum does not exist"):
        parse_manifest(b"{}", None, "mem://manifest.json")


def test_a_data_file_of_another_format_is_refused():
    store = Store()
    key = write_report(store.put, source="src", created=WHEN, objects=objects("a"))
    doc = json.loads(store[key])
    data = b"PAR1 not really parquet"
    store[doc["files"][0]["key"]] = data
    doc["files"][0].update(size=len(data), MD5checksum=hashlib.md5(data).hexdigest())
    doc["fileFormat"] = "Parquet"
    store[key] = json.dumps(doc).encode()
    store[key.replace(".json", ".checksum")] = hashlib.md5(store[key]).hexdigest().encode()
    with pytest.raises(InventoryError, match=r"is not a readable PARQUET inventory file"):
        listed(lister(store, key, BucketScope("src")))


def test_the_newest_report_of_a_bucket():
    keys = ["inv/src/daily/2026-03-01T00-00Z/manifest.json",
            "inv/src/daily/2026-03-02T00-00Z/manifest.json",
            "inv/src/weekly/2026-02-27T00-00Z/manifest.json",
            "inv/other/daily/2026-03-03T00-00Z/manifest.json",
            "inv/src/daily/hive/dt=2026-03-02-00-00/symlink.txt",
            "inv/src/daily/data/manifest.json"]
    assert newest_manifest(keys, "src") == keys[1]
    assert newest_manifest(keys, "other") == keys[3]
    assert newest_manifest(keys, "none") is None


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(st.sampled_from("ab +%/é"), max_size=6), max_size=8))
def test_csv_keys_decode_as_urllib_does(keys):
    """`_unquote` (on the column when no key has a %-escape) agrees with `unquote_plus` on
    keys as AWS writes them (quote_plus) and on the raw keys themselves."""
    from urllib.parse import quote_plus, unquote_plus

    from connectors.inventory import _unquote

    for column in ([quote_plus(k, safe="/") for k in keys], [k for k in keys if "%" not in k]):
        got, bad = _unquote(pa.chunked_array([pa.array(column, pa.string())]))
        assert got.to_pylist() == [unquote_plus(k) for k in column]
        assert not any(bad.to_pylist())


@settings(max_examples=200, deadline=None)
@given(names=st.lists(st.binary(max_size=6), max_size=8))
def test_csv_keys_that_are_not_utf8_are_flagged(names):
    """Any bytes percent-encoded: a key decodes to its UTF-8 text, or is flagged when its bytes
    are not UTF-8 (never merged into one U+FFFD name with another key)."""
    from urllib.parse import quote_from_bytes

    from connectors.inventory import _unquote

    got, bad = _unquote(pa.chunked_array([pa.array(
        ["in/" + quote_from_bytes(n, safe="/") for n in names], pa.string())]))
    for name, text, flagged in zip(names, got.to_pylist(), bad.to_pylist(), strict=True):
        try:
            assert (text, flagged) == ("in/" + name.decode("utf-8"), False)
        except UnicodeDecodeError:
            assert flagged


@settings(max_examples=100, deadline=None)
@given(times=st.lists(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                                   timezones=st.just(UTC)), max_size=6),
       blank=st.booleans())
def test_csv_times_parse_as_python_reads_them(times, blank):
    """AWS's 'YYYY-MM-DDTHH:MM:SS.fffZ' read on the column (Arrow's ISO 8601 cast) is Python's
    reading, to the ms; a blank value among them is refused at its index."""
    from connectors.inventory import _times, _Unreadable

    text = [t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z" for t in times]
    want = [t.replace(microsecond=t.microsecond // 1000 * 1000) for t in times]
    column = pa.chunked_array([pa.array([*text, ""] if blank else text, pa.string())])
    if blank:
        with pytest.raises(_Unreadable, match=r"LastModifiedDate '' is not a time") as info:
            _times(column)
        assert info.value.index == len(text)
    else:
        assert _times(column).to_pylist() == want
