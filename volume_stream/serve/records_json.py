"""The GetRecords response as JSON text, written straight from a page's Arrow columns
(`page_json`, what the endpoint sends) or from records (`records_json`).

A page of 1000 records made into nested dicts (`{"S": ...}` per attribute) and then encoded
by `json.dumps` cost ~20 us a record; writing each record's JSON text from its values with
`json`'s C string encoder, the attribute names encoded once, costs a fraction of that. The
text is what `json.dumps` of the dict form would say (`StreamsApi.call` parses it back for
callers that want the dict): typed attribute values as `typed` makes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Iterable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from volume_stream.shards import Record
from volume_stream.shards.reader import pylist

__all__ = ["page_json", "records_json", "typed", "typed_json"]

_enc: Callable[[str], str] = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def typed(value: Any) -> dict[str, Any]:
    """A value's typed form: `{"S": ...}`, `{"N": "..."}`, `{"BOOL": ...}`, `{"B": base64}`,
    `{"L": [...]}`, `{"M": {...}}` (dates and times as ISO strings)."""
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | float | Decimal):
        return {"N": str(value)}
    if isinstance(value, datetime | date):
        return {"S": value.isoformat()}
    if isinstance(value, bytes):
        return {"B": base64.b64encode(value).decode()}
    if isinstance(value, list):
        return {"L": [typed(v) if v is not None else {"NULL": True} for v in value]}
    if isinstance(value, dict):
        return {"M": {k: typed(v) for k, v in value.items() if v is not None}}
    return {"S": str(value)}


def _general(value: Any) -> str:
    return json.dumps(typed(value))


def _s(value: str) -> str:
    return '{"S":' + _enc(value) + "}"


def _n(value: int | float) -> str:
    return '{"N":"' + str(value) + '"}'


def _dt(value: datetime) -> str:
    return '{"S":"' + value.isoformat() + '"}'


def _bool(value: bool) -> str:
    return '{"BOOL":true}' if value else '{"BOOL":false}'


#: the typed JSON of a value by its exact type; other types through `typed`
_BY_TYPE: dict[type, Callable[[Any], str]] = {str: _s, int: _n, float: _n, datetime: _dt,
                                              bool: _bool}


def typed_json(value: Any) -> str:
    """The JSON of a value's typed form (`{"S": ...}`, `{"N": "..."}`, ...)."""
    return (_BY_TYPE.get(type(value)) or _general)(value)


class _Names(dict):
    """Attribute name → its JSON string literal, encoded once."""

    def __missing__(self, name: str) -> str:
        self[name] = text = _enc(name)
        return text


_NAMES = _Names()


def _image(image: dict[str, Any]) -> str:
    get, names = _BY_TYPE.get, _NAMES
    return "{" + ",".join([names[k] + ":" + (get(type(v)) or _general)(v)
                           for k, v in image.items() if v is not None]) + "}"


def records_json(records: Iterable[Record], view_type: str, region: str,
                 next_iterator: str | None) -> bytes:
    """The GetRecords response document of `records` as UTF-8 (ASCII) JSON."""
    head = ('{"eventID":"%s","eventName":"%s","eventVersion":"1.1","eventSource":'
            '"aws:dynamodb","awsRegion":' + _enc(region).replace("%", "%%") +
            ',"dynamodb":{"ApproximateCreationDateTime":%d,"Keys":%s,"SequenceNumber":"%s",'
            '"SizeBytes":%d,"StreamViewType":' + _enc(view_type).replace("%", "%%"))
    seconds: dict[datetime, int] = {}
    parts = []
    sha = hashlib.sha256
    for r in records:
        seq, shard_id, when = r.sequence_number, r.shard_id, r.commit_timestamp
        ts = seconds.get(when)
        if ts is None:
            ts = seconds[when] = int(when.timestamp())
        event_id = sha(f"{shard_id}/{seq}".encode()).hexdigest()[:32]
        text = head % (event_id, r.event_name, ts, _image(r.key), seq, max(1, r.size_bytes))
        new, old = r.new_image, r.old_image
        if new is not None:
            text += ',"NewImage":' + _image(new)
        if old is not None:
            text += ',"OldImage":' + _image(old)
        parts.append(text + "}}")
    body = '{"Records":[' + ",".join(parts) + "]"
    if next_iterator:
        body += ',"NextShardIterator":' + _enc(next_iterator)
    return (body + "}").encode("ascii")


# ---------------------------------------------------------------------- from Arrow columns
#: a string column whose values hold none of these is quoted as it is (else `_enc` per value)
_NEEDS_ESCAPE = r'[^\x20-\x21\x23-\x5b\x5d-\x7f]'


def _join(*parts: Any) -> pa.Array:
    """Element-wise concatenation (strings broadcast); null where a part is null."""
    return pc.binary_join_element_wise(*parts, "")


def _values_json(col: pa.Array) -> pa.Array:
    """Each value's typed JSON (`typed_json`), null where the value is null."""
    t = col.type
    if pa.types.is_integer(t):
        return _join('{"N":"', pc.cast(col, pa.string()), '"}')
    if pa.types.is_boolean(t):
        return pc.if_else(col, '{"BOOL":true}', '{"BOOL":false}')
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        col = col.cast(pa.string())
        if not pc.any(pc.match_substring_regex(col, _NEEDS_ESCAPE)).as_py():
            return _join('{"S":"', col, '"}')
        return pa.array([None if v is None else '{"S":' + _enc(v) + "}"
                         for v in col.to_pylist()], pa.string())
    if pa.types.is_timestamp(t) or pa.types.is_date(t):  # each distinct value once
        distinct = pc.unique(col)
        texts = pa.array([None if v is None else typed_json(v) for v in pylist(distinct)],
                         pa.string())
        return texts.take(pc.index_in(col, distinct))
    return pa.array([None if v is None else typed_json(v) for v in pylist(col)], pa.string())


def _images_json(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each struct's typed attribute map as JSON (null attributes left out), null where the
    struct is null."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count == len(arr):
        return pa.nulls(len(arr), pa.string())
    fields = arr.flatten()  # children with the struct's nulls applied
    # each attribute as `"name":{...},` ("" when null), joined, the last comma cut
    frags = [pc.fill_null(_join(_NAMES[f.name] + ":", _values_json(child), ","), "")
             for f, child in zip(arr.type, fields, strict=True)]
    body = _join("{", pc.utf8_rtrim(_join(*frags) if len(frags) > 1 else frags[0],
                                    characters=","), "}")
    return pc.if_else(pc.is_valid(arr), body, pa.scalar(None, pa.string()))


def page_json(page: pa.Table, view_type: str, region: str, next_iterator: str | None) -> bytes:
    """The GetRecords response document of a page table (`ChangeLog.get_records_arrow`) as
    UTF-8 (ASCII) JSON, built column by column (Arrow compute): no dict per record; the same
    text `records_json` writes for the page's records."""
    n = page.num_rows
    body = ""
    if n:
        seqs = page["sequence_number"].combine_chunks()
        shard = page["shard_id"][0].as_py()
        sha = hashlib.sha256
        ids = pa.array([sha(f"{shard}/{s}".encode()).hexdigest()[:32]
                        for s in seqs.to_pylist()], pa.string())
        us = pc.cast(page["commit_timestamp"], pa.int64()).to_numpy()
        seconds = np.sign(us) * (np.abs(us) // 1_000_000)    # int(datetime.timestamp())
        sizes = np.maximum(page["size_bytes"].to_numpy(), 1)
        new, old = _images_json(page["new_image"]), _images_json(page["old_image"])
        texts = _join(
            '{"eventID":"', ids, '","eventName":"', page["event_name"].combine_chunks(),
            '","eventVersion":"1.1","eventSource":"aws:dynamodb","awsRegion":' + _enc(region)
            + ',"dynamodb":{"ApproximateCreationDateTime":',
            pc.cast(pa.array(seconds), pa.string()), ',"Keys":', _images_json(page["keys"]),
            ',"SequenceNumber":"', seqs, '","SizeBytes":', pc.cast(pa.array(sizes), pa.string()),
            ',"StreamViewType":' + _enc(view_type),
            pc.fill_null(_join(',"NewImage":', new), ""),
            pc.fill_null(_join(',"OldImage":', old), ""), "}}")
        body = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), texts),
                              ",")[0].as_py()
    out = '{"Records":[' + body + "]"
    if next_iterator:
        out += ',"NextShardIterator":' + _enc(next_iterator)
    return (out + "}").encode("ascii")
