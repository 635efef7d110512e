"""The GetRecords JSON written from Arrow columns (`page_json`) against the two other ways of
writing it, for random record values: the record-by-record writer (`records_json`, byte for
byte) and `json.dumps` of the dict form (`typed` values, nulls left out), compared after
`json.loads`."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from volume_stream.serve.records_json import page_json, records_json, typed
from volume_stream.shards.pages import page_records

IMAGE = pa.struct([
    pa.field("note", pa.string()), pa.field("id", pa.int64(), nullable=False),
    pa.field("n", pa.int32()), pa.field("ratio", pa.float64()), pa.field("flag", pa.bool_()),
    pa.field("raw", pa.binary()), pa.field("at", pa.timestamp("us", tz="UTC")),
    pa.field("naive", pa.timestamp("us")), pa.field("day", pa.date32()),
    pa.field("amount", pa.decimal128(10, 2)), pa.field("tags", pa.list_(pa.string())),
    pa.field("meta", pa.struct([pa.field("k", pa.string()), pa.field("v", pa.int64())]))])
KEYS = pa.struct([pa.field("id", pa.int64(), nullable=False)])
SHARD = "shardId-00000001735689600000-0a1b2c3d"

#: text with what JSON must escape, and what it need not, next to any other character
_TEXT = st.text(st.one_of(st.characters(exclude_categories=("Cs",)),   # Arrow holds UTF-8
                          st.sampled_from('"\\/\x00\x1f\x7f\n\t\u2028é✓😀')), max_size=12)
_UTC = st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=st.just(UTC))


def _maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


_IMAGE = st.fixed_dictionaries({
    "note": _maybe(_TEXT), "id": st.integers(-2**63, 2**63 - 1),
    "n": _maybe(st.integers(-2**31, 2**31 - 1)), "ratio": _maybe(st.floats()),
    "flag": _maybe(st.booleans()), "raw": _maybe(st.binary(max_size=8)),
    "at": _maybe(_UTC), "naive": _maybe(st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31))),
    "day": _maybe(st.dates(date(1, 1, 1), date(9999, 12, 31))),
    "amount": _maybe(st.decimals(-10**7, 10**7, places=2, allow_nan=False)),
    "tags": _maybe(st.lists(_maybe(_TEXT), max_size=3)),
    "meta": _maybe(st.fixed_dictionaries({"k": _maybe(_TEXT),
                                          "v": _maybe(st.integers(-10, 10))}))})
_RECORD = st.tuples(st.sampled_from(["INSERT", "MODIFY", "REMOVE"]), _IMAGE, _IMAGE,
                    st.datetimes(datetime(1900, 1, 1), datetime(2200, 1, 1),
                                 timezones=st.just(UTC)),
                    st.integers(0, 10**6))


def _page(records: list[tuple]) -> pa.Table:
    """A page table (`RECORD_COLUMNS`) of (event, old image, new image, time, size)."""
    olds = [None if e == "INSERT" else old for e, old, _, _, _ in records]
    news = [None if e == "REMOVE" else new for e, _, new, _, _ in records]
    keys = [{"id": (new if new is not None else old)["id"]} for old, new in zip(olds, news,
                                                                               strict=True)]
    return pa.table({
        "sequence_number": [f"1{k // 3 + 1:019d}{k % 3:010d}" for k in range(len(records))],
        "event_name": [r[0] for r in records], "keys": pa.array(keys, KEYS),
        "old_image": pa.array(olds, IMAGE), "new_image": pa.array(news, IMAGE),
        "shard_id": [SHARD] * len(records),
        "commit_version": pa.array([k // 3 + 1 for k in range(len(records))], pa.int64()),
        "commit_timestamp": pa.array([r[3] for r in records], pa.timestamp("us", tz="UTC")),
        "size_bytes": pa.array([r[4] for r in records], pa.int64())})


def _typed_map(values: dict | None) -> dict:
    return {k: typed(v) for k, v in values.items() if v is not None}


def _dict_document(page: pa.Table, view_type: str, region: str, nxt: str | None) -> dict:
    """The response as a dict per record, the way the endpoint first wrote it."""
    out = []
    for row in page.to_pylist():
        seq = row["sequence_number"]
        ddb = {"ApproximateCreationDateTime": int(row["commit_timestamp"].timestamp()),
               "Keys": _typed_map(row["keys"]), "SequenceNumber": seq,
               "SizeBytes": max(1, row["size_bytes"]), "StreamViewType": view_type}
        if row["new_image"] is not None:
            ddb["NewImage"] = _typed_map(row["new_image"])
        if row["old_image"] is not None:
            ddb["OldImage"] = _typed_map(row["old_image"])
        out.append({"eventID": hashlib.sha256(f"{SHARD}/{seq}".encode()).hexdigest()[:32],
                    "eventName": row["event_name"], "eventVersion": "1.1",
                    "eventSource": "aws:dynamodb", "awsRegion": region, "dynamodb": ddb})
    doc: dict = {"Records": out}
    if nxt:
        doc["NextShardIterator"] = nxt
    return doc


@settings(max_examples=150, deadline=None)
@given(st.lists(_RECORD, max_size=12),
       st.sampled_from(["NEW_AND_OLD_IMAGES", "NEW_IMAGE", "OLD_IMAGE", "KEYS_ONLY"]),
       st.sampled_from(["us-east-1", 'r"é']), st.sampled_from([None, "", "tok.en/é"]))
def test_page_json_is_the_record_writers_text_and_the_dict_forms_document(
        records, view_type, region, nxt):
    page = _page(records)
    body = page_json(page, view_type, region, nxt)
    assert body.isascii()
    assert body == records_json(page_records(page), view_type, region, nxt)
    doc = _dict_document(page, view_type, region, nxt)
    assert json.loads(body) == json.loads(json.dumps(doc))


def test_strings_that_need_escaping_anywhere_in_a_column():
    """A column whose values are all plain but one (first, middle or last) is escaped as the
    record writer does (DEL and non-ASCII as \\u escapes)."""
    for odd in ('"', "\\", "\x7f", "\x00", "é", "😀"):
        for at in (0, 1, 2):
            notes = ["plain", "text", "here"]
            notes[at] = "a" + odd
            records = [("INSERT", {}, {"id": k, "note": note}, datetime(2025, 1, 1, tzinfo=UTC),
                        1) for k, note in enumerate(notes)]
            page = _page([(e, None, {**dict.fromkeys(IMAGE.names), **new}, t, s)
                          for e, _, new, t, s in records])
            body = page_json(page, "NEW_IMAGE", "r", None)
            assert body == records_json(page_records(page), "NEW_IMAGE", "r", None)
            got = [r["dynamodb"]["NewImage"]["note"]["S"] for r in json.loads(body)["Records"]]
            assert got == notes


def test_an_empty_page():
    page = _page([])
    assert page_json(page, "KEYS_ONLY", "r", None) == b'{"Records":[]}'
    assert json.loads(page_json(page, "KEYS_ONLY", "r", "t")) == {
        "Records": [], "NextShardIterator": "t"}
    assert Decimal("1.50") == Decimal(typed(Decimal("1.50"))["N"])
