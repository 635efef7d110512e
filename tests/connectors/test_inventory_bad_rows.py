"""`connectors.inventory` on reports no store should deliver (issue 34 items 2, 7, 8, 9): a
manifest dated in the future, sizes that are not numbers, times that are not times, and keys
whose percent-escapes are not UTF-8. A report whose rows cannot be read as they are is refused
(`InventoryError` naming the data file and the row), never committed with NULLs or a raw Arrow
error; a key that cannot be decoded is skipped and counted, never merged with another."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from connectors.errors import InventoryError
from connectors.inventory import CLOCK_SKEW, parse_manifest
from connectors.scope import BucketScope
from tests.connectors.test_inventory import WHEN, Store, listed, lister
from tests.inventory_fixtures import write_data_file, write_raw_csv, write_report

STAMP = "2026-03-01T12:30:15.123Z"


def csv_rows(*rows: tuple[str, str, str]) -> list[list[str]]:
    """(key as written, Size, LastModifiedDate) -> S3_CSV rows of bucket 'src'."""
    return [["src", key, size, when, "0" * 32, "STANDARD"] for key, size, when in rows]


def refused(store: Store, key: str, match: str) -> InventoryError:
    with pytest.raises(InventoryError, match=match) as info:
        listed(lister(store, key, BucketScope("src", "in")))
    assert info.value.__cause__ is None  # no raw Arrow error behind it
    return info.value


def data_key(store: Store) -> str:
    (key,) = [k for k in store if "/data/" in k]
    return key


# ---------------------------------------------------------------- item 2: dated in the future
@pytest.mark.parametrize("oss", [False, True])  # creationTimestamp in ms (S3), s (OSS)
def test_a_manifest_dated_in_the_future_is_refused(oss):
    store = Store()
    key = write_report(store.put, source="src", created=datetime(2200, 1, 1, tzinfo=UTC),
                       objects=[], oss=oss)
    checksum = store[key.replace(".json", ".checksum")]
    with pytest.raises(InventoryError, match=rf"^mem://{re.escape(key)}: creationTimestamp "
                       r"2200-01-01 00:00:00 UTC is in the future .*refusing the inventory"):
        parse_manifest(store[key], checksum, f"mem://{key}")
    now = datetime(2026, 3, 1, tzinfo=UTC)
    for ahead, ok in ((timedelta(0), True), (CLOCK_SKEW, True),
                      (CLOCK_SKEW + timedelta(seconds=1), False)):
        store = Store()
        key = write_report(store.put, source="src", created=now + ahead, objects=[])
        checksum = store[key.replace(".json", ".checksum")]
        if ok:
            assert parse_manifest(store[key], checksum, "mem://m", now=now).created == now + ahead
        else:
            with pytest.raises(InventoryError, match=r"is in the future"):
                parse_manifest(store[key], checksum, "mem://m", now=now)


@pytest.mark.parametrize("stamp", ["99999999999999999999", "-99999999999999999", "1e12", "x"])
def test_a_creation_timestamp_out_of_any_range_is_refused(stamp):
    data = (b'{"sourceBucket": "s", "creationTimestamp": "%s", "fileFormat": "CSV", '
            b'"fileSchema": "Bucket, Key, Size, LastModifiedDate, ETag", "files": []}'
            % stamp.encode())
    import hashlib

    with pytest.raises(InventoryError, match=r"mem://m.json is not an inventory manifest"):
        parse_manifest(data, hashlib.md5(data).hexdigest().encode(), "mem://m.json")


# ---------------------------------------------------------------- item 7: sizes
@pytest.mark.parametrize("size", ["abc", "12abc", "", "1e3", " 5 ", "-5", "5.0",
                                  "99999999999999999999"])
def test_a_size_that_is_not_a_number_is_refused_naming_the_file_and_row(size):
    store = Store()
    key = write_raw_csv(store.put, csv_rows(("in/a", "1", STAMP), ("in/b", size, STAMP)),
                        source="src", created=WHEN)
    refused(store, key, rf"^mem://{re.escape(data_key(store))}, row 2: Size {re.escape(repr(size))}"
                        r" is not a number of bytes; refusing the inventory$")


def test_sizes_of_rows_the_volume_does_not_take_are_not_read():
    """A delete marker (no size), another prefix: not the volume's rows, not checked."""
    store = Store()
    rows = [["src", "in/a", "v1", "true", "false", "7", STAMP, "0" * 32, "STANDARD"],
            ["src", "in/b", "v2", "true", "true", "", STAMP, "", "STANDARD"],
            ["src", "out/c", "v3", "true", "false", "abc", "garbage", "", "STANDARD"]]
    from tests.inventory_fixtures import S3_CSV_VERSIONED

    key = write_raw_csv(store.put, rows, source="src", created=WHEN, fields=S3_CSV_VERSIONED)
    assert [(r["relative_path"], r["size"]) for r in listed(
        lister(store, key, BucketScope("src", "in")))] == [("a", 7)]


def _columnar(store: Store, fmt: str, **columns) -> str:
    n = len(columns["key"])
    table = pa.table({"bucket": ["src"] * n, **columns,
                      "e_tag": pa.array(["e"] * n, pa.string())})
    out = io.BytesIO()
    (pq.write_table if fmt == "Parquet" else orc.write_table)(table, out)
    return write_data_file(store.put, out.getvalue(), fmt.lower(), source="src", created=WHEN,
                           fmt=fmt)


TIMES = pa.array([WHEN] * 2, pa.timestamp("ms", tz="UTC"))


@pytest.mark.parametrize("fmt", ["Parquet", "ORC"])
def test_columnar_sizes_of_the_wrong_type_are_refused(fmt):
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array(["1", "abc"]),
                    last_modified_date=TIMES)
    refused(store, key, rf"^mem://.*\.{fmt.lower()}, row 2: Size 'abc' is not a number of bytes")
    store = Store()  # a size column of text holding numbers is read as numbers
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array(["1", "22"]),
                    last_modified_date=TIMES)
    assert [r["size"] for r in listed(lister(store, key, BucketScope("src", "in")))] == [1, 22]
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1.0, 2.5]),
                    last_modified_date=TIMES)
    refused(store, key, r"column size is of type double, not an integer")
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1, None], pa.int64()),
                    last_modified_date=TIMES)
    refused(store, key, r", row 2: Size None is not a number of bytes")
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1, -1], pa.int64()),
                    last_modified_date=TIMES)
    refused(store, key, r", row 2: Size -1 is not a number of bytes")
    if fmt == "Parquet":  # ORC has no unsigned types
        store = Store()
        key = _columnar(store, fmt, key=["in/a", "in/b"], last_modified_date=TIMES,
                        size=pa.array([1, 2**64 - 1], pa.uint64()))
        refused(store, key, rf", row 2: Size {2**64 - 1} is not a number of bytes")


# ---------------------------------------------------------------- item 9: times
@pytest.mark.parametrize("when", ["garbage", "", "2026-13-45T99:99:99.000Z",
                                  "2026-03-01T12:30:15.123Zjunk", "2026-03-01"])
def test_a_time_that_is_not_a_time_is_refused_naming_the_file_and_row(when):
    store = Store()
    key = write_raw_csv(store.put, csv_rows(("in/a", "1", STAMP), ("in/b", "2", STAMP),
                                            ("in/c", "3", when)), source="src", created=WHEN)
    refused(store, key, rf"^mem://{re.escape(data_key(store))}, row 3: LastModifiedDate "
                        rf"{re.escape(repr(when))} is not a time \(YYYY-MM-DDTHH:MM:SS.fffZ\); "
                        r"refusing the inventory$")


@pytest.mark.parametrize("fmt", ["Parquet", "ORC"])
def test_columnar_times_of_the_wrong_type_are_refused(fmt):
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1, 2]),
                    last_modified_date=pa.array([STAMP, "garbage"]))
    refused(store, key, r", row 2: LastModifiedDate 'garbage' is not a time")
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1, 2]),
                    last_modified_date=pa.array([WHEN, None], pa.timestamp("ms", tz="UTC")))
    refused(store, key, r", row 2: LastModifiedDate None is not a time")
    store = Store()
    key = _columnar(store, fmt, key=["in/a", "in/b"], size=pa.array([1, 2]),
                    last_modified_date=pa.array([1, 2]))
    refused(store, key, r"column last_modified_date is of type int64, not a timestamp")


def test_the_row_is_counted_across_batches_of_a_data_file(monkeypatch):
    import connectors.inventory as inventory

    monkeypatch.setattr(inventory, "_BATCH_ROWS", 3)
    store = Store()
    rows = [(f"in/{i}", str(i), STAMP) for i in range(10)]
    rows[7] = ("in/7", "seven", STAMP)
    columns = {"key": [r[0] for r in rows], "size": pa.array([r[1] for r in rows]),
               "last_modified_date": pa.array([WHEN] * 10, pa.timestamp("ms", tz="UTC"))}
    key = _columnar(store, "Parquet", **columns)
    refused(store, key, r", row 8: Size 'seven'")


# ---------------------------------------------------------------- item 8: undecodable keys
def test_keys_whose_escapes_are_not_utf8_are_skipped_and_counted(caplog):
    store = Store()
    key = write_raw_csv(store.put, csv_rows(
        ("in/%FF%FE.txt", "1", STAMP), ("in/%C0%AF.txt", "2", STAMP), ("in/ok%C3%A9.txt", "3", STAMP),
        ("in/%EF%BF%BD%EF%BF%BD.txt", "4", STAMP),  # two real U+FFFD: a valid name
        ("out/%FF.txt", "5", STAMP)), source="src", created=WHEN)  # not the volume's
    lst = lister(store, key, BucketScope("src", "in"))
    with caplog.at_level("WARNING", "connectors.inventory"):
        rows = listed(lst)
    assert [(r["relative_path"], r["size"]) for r in rows] == [("oké.txt", 3),
                                                              ("\ufffd\ufffd.txt", 4)]
    assert lst.malformed == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("not UTF-8" in w for w in warnings), warnings
    assert "in/%FF%FE.txt" in warnings[0] and "row 1" in warnings[0]
