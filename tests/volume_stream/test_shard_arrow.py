"""`ChangeLog.get_records_arrow` (issue 25 item 1): a page of records as an Arrow table, which
`get_records`' records are views over and the endpoint's GetRecords JSON is written from."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

import volume_stream as vs
from volume_stream.errors import InvalidInputError
from volume_stream.serve.record_blocks import BLOCK_BYTES, RecordBlocks, block_starts
from volume_stream.serve.records_json import page_json, records_json
from volume_stream.shards.log import MAX_BYTES
from volume_stream.shards.pages import RECORD_COLUMNS
from volume_stream.tables import Column


@pytest.fixture
def cat(tmp_path):
    return vs.connect(tmp_path / "wh")


def typed_table(cat, name="things"):
    """A change-tracked table with many column types, odd strings and nulls, inserted,
    updated and deleted over four commits."""
    store = cat.tables
    store.create(name, [Column("id", "BIGINT"), Column("label", "STRING"),
                        Column("ratio", "DOUBLE"), Column("flag", "BOOLEAN"),
                        Column("at", "TIMESTAMP"), Column("amount", "DECIMAL(10,2)"),
                        Column("raw", "BINARY"), Column("n", "INT")])
    store.set_properties(name, {"change_tracking": "true"})
    t0 = datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=UTC)
    store.insert(name, pa.table({
        "id": pa.array(range(12), pa.int64()),
        "label": ['plain', 'quote " and \\ slash', "tab\there\n", "ünïcödé ✓", None,
                  "", "x" * 50, "a/b", "%s %d", "{}", "null", "'"],
        "ratio": [0.25, 1e20, -0.0, None, 3.5, 1e-7, 2.0, 0.1, 7.0, 8.0, 9.0, 10.0],
        "flag": [True, False, None] * 4,
        "at": pa.array([t0] * 11 + [None], pa.timestamp("us", tz="UTC")),
        "amount": pa.array([Decimal("1.50")] * 12, pa.decimal128(10, 2)),
        "raw": [b"\x00\xff", None] * 6,
        "n": pa.array(list(range(12)), pa.int32())}))
    store.update(name, {"label": "'changed'", "n": "n + 100"}, where="id < 4")
    store.delete(name, where="id >= 10")
    store.update(name, {"ratio": "ratio"}, where="id = 5")       # a no-op rewrite: no record
    return store


def drain_both(log, shard_id, limit):
    """(the Arrow pages, the records pages) of one shard read by both APIs in step."""
    arrow_pages, record_pages = [], []
    it_a = it_r = log.iterator(shard_id, "TRIM_HORIZON")
    while it_a:
        table, next_a = log.get_records_arrow(it_a, limit=limit)
        page = log.get_records(it_r, limit=limit)
        arrow_pages.append(table)
        record_pages.append(page)
        if not table.num_rows:
            assert not page.records
            break
        it_a, it_r = next_a, page.next_iterator
    return arrow_pages, record_pages


@pytest.mark.parametrize("limit", [1000, 3, 1])
def test_arrow_pages_and_records_agree_record_by_record(cat, limit):
    typed_table(cat)
    cat.reshard("things", 2)            # closed parent (empty) and two open children
    store = cat.tables
    store.update("things", {"n": "n * 2"}, where="id >= 6")
    log = cat.change_log("things")
    total = []
    for shard in log.shards():
        arrow_pages, record_pages = drain_both(log, shard.shard_id, limit)
        for table, page in zip(arrow_pages, record_pages, strict=True):
            assert table.column_names == list(RECORD_COLUMNS)
            assert table.num_rows == len(page.records) <= limit
            for row, rec in zip(table.to_pylist(), page.records, strict=True):
                assert row["sequence_number"] == rec.sequence_number
                assert row["event_name"] == rec.event_name
                assert row["keys"] == rec.key
                assert row["old_image"] == rec.old_image
                assert row["new_image"] == rec.new_image
                assert row["shard_id"] == rec.shard_id == shard.shard_id
                assert row["commit_version"] == rec.commit_version
                assert row["commit_timestamp"] == rec.commit_timestamp
                assert row["size_bytes"] == rec.size_bytes
            total += page.records
    seqs = [(r.shard_id, r.sequence_number) for r in total]
    assert len(seqs) == len(set(seqs)) == 12 + 4 + 2 + 4
    events = sorted(r.event_name for r in total)
    assert events == ["INSERT"] * 12 + ["MODIFY"] * 8 + ["REMOVE"] * 2
    odd = next(r for r in total if r.event_name == "INSERT" and r.new_image["id"] == 1)
    assert odd.new_image["label"] == 'quote " and \\ slash'


def test_page_boundaries_and_iterators_follow_the_limit(cat):
    typed_table(cat)
    log = cat.change_log("things")
    (shard,) = log.shards()
    whole, _ = log.get_records_arrow(log.iterator(shard.shard_id, "TRIM_HORIZON"))
    assert whole.num_rows == 18
    seqs, it, sizes = [], log.iterator(shard.shard_id, "TRIM_HORIZON"), []
    while it:
        table, it = log.get_records_arrow(it, limit=4)
        if not table.num_rows:
            break
        sizes.append(table.num_rows)
        seqs += table["sequence_number"].to_pylist()
    assert sizes == [4, 4, 4, 4, 2]
    assert seqs == whole["sequence_number"].to_pylist()
    # AFTER_SEQUENCE_NUMBER continues where a page ended; max_bytes cuts a page short
    after = log.iterator(shard.shard_id, "AFTER_SEQUENCE_NUMBER", seqs[9])
    assert log.get_records_arrow(after, limit=3)[0]["sequence_number"].to_pylist() == \
        seqs[10:13]
    small, nxt = log.get_records_arrow(log.iterator(shard.shard_id, "TRIM_HORIZON"),
                                       max_bytes=1)
    assert small.num_rows == 1 and nxt is not None
    # an empty page keeps the typed columns
    latest, _ = log.get_records_arrow(log.iterator(shard.shard_id, "LATEST"))
    assert latest.num_rows == 0 and latest.schema.equals(whole.schema)
    with pytest.raises(InvalidInputError, match="limit must be from 1 to 1000"):
        log.get_records_arrow(after, limit=0)


@pytest.mark.parametrize("view_type", ["NEW_AND_OLD_IMAGES", "NEW_IMAGE", "OLD_IMAGE",
                                       "KEYS_ONLY"])
def test_endpoint_json_from_arrow_columns_is_the_records_json(cat, view_type):
    typed_table(cat)
    cat.disable_change_log("things")
    cat.enable_change_log("things", view_type=view_type, key="id")
    cat.tables.update("things", {"label": "concat(label, '\u00e9\"')"}, where="id < 6")
    cat.tables.delete("things", where="id = 7")
    log = cat.change_log("things")
    (shard,) = log.shards()
    it = log.iterator(shard.shard_id, "TRIM_HORIZON")
    table, nxt = log.get_records_arrow(it)
    records = log.get_records(it).records
    assert table.num_rows == len(records) == 6     # id 4: concat(null, ...) is no change
    fast = page_json(table, log.view_type, "eu-west-1", nxt)
    slow = records_json(records, log.view_type, "eu-west-1", nxt)
    assert fast == slow                            # the same text, byte for byte
    doc = json.loads(fast)
    for rec in doc["Records"]:
        ddb = rec["dynamodb"]
        assert set(ddb["Keys"]) == {"id"}
        assert ("NewImage" in ddb) == (view_type in ("NEW_AND_OLD_IMAGES", "NEW_IMAGE")
                                       and rec["eventName"] != "REMOVE")
        assert ("OldImage" in ddb) == (view_type in ("NEW_AND_OLD_IMAGES", "OLD_IMAGE"))
    if view_type == "NEW_AND_OLD_IMAGES":
        first = doc["Records"][0]["dynamodb"]
        assert first["NewImage"]["amount"] == {"N": "1.50"}
        assert first["NewImage"]["raw"] == {"B": "AP8="}
        assert first["NewImage"]["at"] == {"S": "2025-03-04T05:06:07.891011+00:00"}
        assert "flag" not in doc["Records"][2]["dynamodb"]["NewImage"]     # null left out
    assert json.loads(page_json(table.slice(0, 0), view_type, "r", None)) == {"Records": []}


@pytest.mark.parametrize("view_type", ["NEW_AND_OLD_IMAGES", "NEW_IMAGE", "OLD_IMAGE",
                                       "KEYS_ONLY"])
def test_endpoint_json_byte_for_byte_with_nulls_in_any_attribute(cat, view_type):
    """The first attribute of an image null in some rows (it cannot lead the object without
    a comma), strings that need escaping next to nulls, a key column later in the table."""
    store = cat.tables
    store.create("firsts", [Column("note", "STRING"), Column("id", "BIGINT"),
                            Column("n", "INT"), Column("odd", "STRING"), Column("day", "DATE"),
                            Column("naive", "TIMESTAMP_NTZ"), Column("at", "TIMESTAMP")])
    store.set_properties("firsts", {"change_tracking": "true"})
    cat.disable_change_log("firsts")
    cat.enable_change_log("firsts", view_type=view_type, key="id")
    store.insert("firsts", pa.table({
        "note": [None, "a", None, "q"], "id": pa.array(range(4), pa.int64()),
        "n": pa.array([1, None, 3, None], pa.int32()), "odd": ['"', None, "\u00e9", "x"],
        "day": pa.array([date(1, 1, 1), None, date(9999, 12, 31), date(1969, 12, 31)]),
        "naive": pa.array([datetime(1999, 1, 2, 3, 4, 5), None, datetime(999, 1, 1, 0, 0, 0, 1),
                           datetime(1969, 12, 31, 23, 59, 59, 999999)], pa.timestamp("us")),
        "at": pa.array([datetime(2026, 1, 1, tzinfo=UTC), None, None,
                        datetime(1900, 2, 3, 4, 5, 6, 7, tzinfo=UTC)],
                       pa.timestamp("us", tz="UTC"))}))
    store.update("firsts", {"note": "'x'"}, where="id = 0")
    store.delete("firsts", where="id = 3")
    log = cat.change_log("firsts")
    for shard in log.shards():
        it = log.iterator(shard.shard_id, "TRIM_HORIZON")
        table, nxt = log.get_records_arrow(it)
        fast = page_json(table, log.view_type, "eu-west-1", nxt)
        assert fast == records_json(log.get_records(it).records, log.view_type, "eu-west-1",
                                    nxt)
        assert len(json.loads(fast)["Records"]) == table.num_rows


@pytest.mark.parametrize(("block", "block_bytes"), [(1, BLOCK_BYTES), (3, BLOCK_BYTES),
                                                   (4096, BLOCK_BYTES), (4096, 300)])
def test_endpoint_bodies_cut_from_blocks_are_the_page_json(cat, block, block_bytes):
    """GetRecords bodies cut from blocks of record texts (`RecordBlocks`): pages within a
    block, across two, one record long, and cut by max_bytes, blocks cut by record count and
    by size, are `page_json`'s text."""
    typed_table(cat)
    cat.reshard("things", 2)
    cat.tables.update("things", {"label": "concat(label, '\\u007f')"}, where="id >= 6")
    log = cat.change_log("things")
    blocks = RecordBlocks("eu-west-1", block, block_bytes)
    counts = set()
    for limit, max_bytes in ((1000, MAX_BYTES), (2, MAX_BYTES), (5, MAX_BYTES), (1, MAX_BYTES),
                             (1000, 150)):
        n = 0
        for shard in log.shards():
            it = log.iterator(shard.shard_id, "TRIM_HORIZON")
            while it:
                table, nxt = log.get_records_arrow(it, limit, max_bytes=max_bytes)
                slices, at, _, _ = log.read_slices(it, limit, max_bytes)
                body = blocks.body(log, slices, at, nxt)
                assert body == page_json(table, log.view_type, "eu-west-1", nxt)
                assert len(json.loads(body)["Records"]) == table.num_rows <= limit
                n += table.num_rows
                if not table.num_rows:
                    break
                it = nxt
        counts.add(n)
    assert len(counts) == 1 and counts.pop() > 10


def test_blocks_end_by_record_count_and_by_size():
    sizes = np.array([1, 50, 200, 1, 1, 60, 60, 1, 1, 1])
    assert block_starts(sizes, 4, 100).tolist() == [0, 2, 4, 5, 8, 10]
    assert block_starts(np.full(9, 5), 4, 10**6).tolist() == [0, 4, 8, 9]
    assert block_starts(np.full(3, 10**7), 4096, 100).tolist() == [0, 1, 2, 3]
    assert block_starts(np.zeros(0, np.int64)).tolist() == [0]
