"""The GetRecords response as JSON text, written straight from a page's Arrow columns
(`record_texts`: each record's text, which the endpoint makes for blocks of records,
`serve.record_blocks`; `page_json`: a page's document) or from records (`records_json`).

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

__all__ = ["concatenated", "page_body", "page_json", "record_texts", "records_json", "typed",
           "typed_json"]

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
    return json.dumps(typed(value), separators=(",", ":"))


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


def _join(*parts: Any) -> pa.Array:
    """Element-wise concatenation (strings broadcast); null where a part is null."""
    return pc.binary_join_element_wise(*parts, "")


Part = str | pa.Array
#: parts a record's text is joined from: constant text, or a string column (null: leave out)
Parts = list[Part]


def _plain(col: pa.Array) -> bool:
    """Whether the values of a string column are all quoted as they are: printable ASCII
    (0x20 to 0x7e, as `_enc` leaves them), no quote nor backslash. Its data buffer is looked
    at whole (bytes behind a null too: at worst the values are encoded one by one)."""
    offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset:col.offset + len(col) + 1]
    data = col.buffers()[2]
    if data is None or offsets[-1] == offsets[0]:
        return True
    b = np.frombuffer(data, np.uint8)[int(offsets[0]):int(offsets[-1])]
    return not (b.min() < 0x20 or b.max() > 0x7e or (b == 0x22).any() or (b == 0x5c).any())


def _value_parts(col: pa.Array) -> tuple[str, pa.Array, str]:
    """(before, texts, after): each value's typed JSON (`typed_json`) is before + its text +
    after; a text is null where the value is null."""
    t = col.type
    if pa.types.is_integer(t):
        return '{"N":"', pc.cast(col, pa.string()), '"}'
    if pa.types.is_boolean(t):
        return "", pc.if_else(col, '{"BOOL":true}', '{"BOOL":false}'), ""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        col = col.cast(pa.string())
        if _plain(col):
            return '{"S":"', col, '"}'
        return "", pa.array([None if v is None else '{"S":' + _enc(v) + "}"
                             for v in col.to_pylist()], pa.string()), ""
    if pa.types.is_timestamp(t) or pa.types.is_date(t):  # each distinct value once
        distinct = pc.unique(col)
        texts = _iso_texts(distinct)
        if texts is None:
            return "", pa.array([None if v is None else typed_json(v)
                                 for v in pylist(distinct)], pa.string()).take(
                pc.index_in(col, distinct)), ""
        return ('{"S":"', texts.take(pc.index_in(col, distinct)),
                _ISO_SUFFIX[getattr(t, "tz", None)])
    return "", pa.array([None if v is None else typed_json(v) for v in pylist(col)],
                        pa.string()), ""


#: what follows a time's ISO text in its typed JSON, by the column's time zone: the offset
#: `datetime.isoformat` writes (UTC only; other zones go through Python)
_ISO_SUFFIX = {None: '"}', "UTC": '+00:00"}', "Etc/UTC": '+00:00"}', "+00:00": '+00:00"}'}


def _iso_texts(col: pa.Array) -> pa.Array | None:
    """`value.isoformat()` of each date, or microsecond timestamp without a zone or in UTC
    (numpy's `datetime_as_string`, the fraction left out when it is zero as Python does),
    null where the value is; None for the other time types."""
    t = col.type
    if pa.types.is_date32(t):
        unit, ints = "D", pc.cast(col, pa.int32())
    elif pa.types.is_timestamp(t) and t.unit == "us" and t.tz in _ISO_SUFFIX:
        unit, ints = "us", pc.cast(col, pa.int64())
    else:
        return None
    values = ints.fill_null(0).to_numpy(zero_copy_only=False).astype(f"datetime64[{unit}]")
    texts = pa.array(np.datetime_as_string(values, unit=unit), pa.string())
    if unit == "us":
        texts = pc.replace_substring(texts, ".000000", "")
    return pc.if_else(pc.is_valid(col), texts, pa.scalar(None, pa.string())) \
        if col.null_count else texts


def _values_json(col: pa.Array) -> pa.Array:
    """Each value's typed JSON (`typed_json`), null where the value is null."""
    before, texts, after = _value_parts(col)
    return _join(before, texts, after) if before or after else texts


def _image_parts(arr: pa.StructArray, head: str) -> Parts:
    """The parts of `head` + each struct's typed attribute map as JSON (null attributes left
    out), for a struct array whose rows are all valid, or whose first attribute is null only
    where the struct is (the row's text is then null). Attributes that are never null are
    parts of their own (no copy made for them); one that is sometimes null is a part of its
    own `,"name":{...}` text, "" where null."""
    fields = arr.flatten()  # children with the struct's nulls applied
    parts: Parts = [head + "{"]
    for i, (f, child) in enumerate(zip(arr.type, fields, strict=True)):
        name = ("," if i else "") + _NAMES[f.name] + ":"
        before, texts, after = _value_parts(child)
        if i == 0 or child.null_count == arr.null_count:
            parts += [name + before, texts, after]
        else:
            parts.append(pc.fill_null(_join(name + before, texts, after), ""))
    parts.append("}")
    return parts


def _merged(parts: Parts) -> Parts:
    """`parts` with neighbouring constant texts joined (fewer arguments to the kernel)."""
    out: Parts = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif not (isinstance(p, str) and not p):
            out.append(p)
    return out


def _image_json_parts(col: pa.ChunkedArray | pa.Array, head: str) -> Parts:
    """The parts of `head` + the typed JSON of each struct (`_image_parts`), "" for the rows
    where the struct is null."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.null_count == len(arr):
        return [""]
    fields = arr.flatten()
    if fields and fields[0].null_count == arr.null_count:
        parts = _image_parts(arr, head)
    else:  # the first attribute is null in some rows: it may not lead without a comma
        frags = [pc.fill_null(_join("," + _NAMES[f.name] + ":", _values_json(child)), "")
                 for f, child in zip(arr.type, fields, strict=True)]
        whole = _join(*frags) if len(frags) > 1 else frags[0]
        parts = [head + "{", pc.utf8_slice_codeunits(whole, 1), "}"]
        if arr.null_count:
            parts = [pc.if_else(pc.is_valid(arr), _join(*_merged(parts)),
                                pa.scalar(None, pa.string()))]
    if not arr.null_count:
        return parts
    return [pc.fill_null(_join(*_merged(parts)), "")]


def concatenated(texts: pa.Array) -> memoryview:
    """The values of a string array one after another: a view of its data buffer."""
    if texts.null_count:  # a record's text is never null: a column it needs was
        raise ValueError(f"{texts.null_count} records have no JSON text")
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    offsets = np.frombuffer(texts.buffers()[1], width)[texts.offset:
                                                       texts.offset + len(texts) + 1]
    data = texts.buffers()[2]
    return memoryview(data)[int(offsets[0]):int(offsets[-1])] if data is not None else \
        memoryview(b"")


#: the two hex digits of each byte value, as one uint16 each
_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint16)


def _event_ids(shard_id: str, seqs: pa.Array) -> pa.Array:
    """Each record's eventID: the first 32 hex digits of sha256("<shard id>/<sequence
    number>"), the hex made for the whole page at once. Each hash starts from a copy of the
    prefix's state (~25% less than hashing the prefix again for each record)."""
    start = hashlib.sha256(f"{shard_id}/".encode()).copy
    digests = []
    for s in seqs.cast(pa.binary()).to_pylist():
        h = start()
        h.update(s)
        digests.append(h.digest())
    n = len(seqs)
    half = np.frombuffer(b"".join(digests), np.uint8).reshape(n, 32)[:, :16]
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=np.int32)),
        pa.py_buffer(_HEX[half].tobytes()))


def record_texts(page: pa.Table, view_type: str, region: str) -> pa.Array:
    """Each record's text in the GetRecords response document of a page table
    (`ChangeLog.get_records_arrow`), a comma after each, built column by column (Arrow
    compute): no dict per record; each record's text is one element-wise concatenation of
    constant texts and columns."""
    if not page.num_rows:
        return pa.array([], pa.string())
    seqs = page["sequence_number"].combine_chunks()
    ids = _event_ids(page["shard_id"][0].as_py(), seqs)
    us = pc.cast(page["commit_timestamp"], pa.int64()).to_numpy()
    seconds = np.sign(us) * (np.abs(us) // 1_000_000)    # int(datetime.timestamp())
    sizes = np.maximum(page["size_bytes"].to_numpy(), 1)
    return _join(*_merged([
        '{"eventID":"', ids, '","eventName":"', page["event_name"].combine_chunks(),
        '","eventVersion":"1.1","eventSource":"aws:dynamodb","awsRegion":' + _enc(region)
        + ',"dynamodb":{"ApproximateCreationDateTime":',
        pc.cast(pa.array(seconds), pa.string()),
        *_image_json_parts(page["keys"], ',"Keys":'),
        ',"SequenceNumber":"', seqs, '","SizeBytes":', pc.cast(pa.array(sizes), pa.string()),
        ',"StreamViewType":' + _enc(view_type),
        *_image_json_parts(page["new_image"], ',"NewImage":'),
        *_image_json_parts(page["old_image"], ',"OldImage":'), "}},"]))


def page_body(texts: list[memoryview], next_iterator: str | None) -> bytes:
    """The GetRecords response document of records whose texts (`record_texts`, each with
    its comma) are `texts` one after another, in order."""
    texts = [t for t in texts if len(t)]
    if texts:
        texts[-1] = texts[-1][:-1]  # the last record's comma
    tail = b"]}" if not next_iterator else \
        b'],"NextShardIterator":' + _enc(next_iterator).encode("ascii") + b"}"
    return b"".join([b'{"Records":[', *texts, tail])


def page_json(page: pa.Table, view_type: str, region: str, next_iterator: str | None) -> bytes:
    """The GetRecords response document of a page table (`ChangeLog.get_records_arrow`) as
    UTF-8 (ASCII) JSON (`record_texts`): the same text `records_json` writes for the page's
    records."""
    return page_body([concatenated(record_texts(page, view_type, region))], next_iterator)
