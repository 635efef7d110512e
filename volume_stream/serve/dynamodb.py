"""The DynamoDB Streams API (JSON 1.0, `X-Amz-Target: DynamoDBStreams_20120810.<Op>`) over the
change logs of one warehouse: ListStreams, DescribeStream, GetShardIterator, GetRecords.

`StreamsApi.call(operation, body)` returns (HTTP status, JSON document): the shapes are those
of botocore's `dynamodbstreams` service model, errors are `{"__type": ..., "message": ...}` with
HTTP 400 (`ResourceNotFoundException`, `ExpiredIteratorException`,
`TrimmedDataAccessException`, `ValidationException`), as DynamoDB sends them. A volume is a
"table" whose key schema is `relative_path` (HASH); a change-tracked SQL table is one too,
keyed by its change log's key: the table's declared key (its first column HASH, any others
RANGE), else the hidden row id `_vs_row_id`, or the key its change log was given. Images are
typed attribute maps (`{"S": ...}`, numbers `{"N": "..."}`).
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from typing import Any

from volume_stream.errors import (
    ExpiredIteratorError,
    InvalidInputError,
    NotFoundError,
    TrimmedDataError,
    VolumeStreamError,
)
from volume_stream.serve.record_blocks import RecordBlocks
from volume_stream.shards import ChangeLog, list_change_logs
from volume_stream.shards.iterators import IteratorSigner
from volume_stream.shards.log import DEFAULT_ACCOUNT, DEFAULT_REGION, MAX_BYTES, owner_id

__all__ = ["OPERATIONS", "TARGET_PREFIX", "ApiError", "StreamsApi"]

TARGET_PREFIX = "DynamoDBStreams_20120810"
OPERATIONS = ("ListStreams", "DescribeStream", "GetShardIterator", "GetRecords")
_ERROR_NS = "com.amazonaws.dynamodb.v20120810#"
_ARN = re.compile(r"^arn:aws:dynamodb:([^:]+):(\d{12}):table/([^/]+)/stream/(.+)$")


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status

    def document(self) -> dict[str, str]:
        return {"__type": _ERROR_NS + self.code, "message": str(self)}


#: each operation's members and their JSON types (botocore's service model); a structure is a
#: dict of its members. Unknown members are ignored, null is absent.
_SHARD_FILTER = {"Type": str, "ShardId": str}
_MEMBERS: dict[str, dict[str, Any]] = {
    "ListStreams": {"TableName": str, "Limit": int, "ExclusiveStartStreamArn": str},
    "DescribeStream": {"StreamArn": str, "Limit": int, "ExclusiveStartShardId": str,
                       "ShardFilter": _SHARD_FILTER},
    "GetShardIterator": {"StreamArn": str, "ShardId": str, "ShardIteratorType": str,
                         "SequenceNumber": str},
    "GetRecords": {"ShardIterator": str, "Limit": int},
}
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number"}


def _check_types(members: dict[str, Any], body: dict[str, Any], where: str = "") -> None:
    """SerializationException for a member of the wrong JSON type, as DynamoDB answers."""
    for name, kind in members.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(kind, dict):
            ok, wanted = isinstance(value, dict), "an object"
        elif kind is int:
            ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
        else:
            ok, wanted = isinstance(value, str), "a string"
            if ok and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
                    ok, wanted = False, "a string of valid Unicode"
        if not ok:
            got = "one with a lone surrogate" if isinstance(value, str) else \
                _JSON_TYPES.get(type(value), type(value).__name__)
            raise ApiError("SerializationException", f"{where}{name} must be {wanted}, not "
                           f"{got}")
        if isinstance(kind, dict):
            _check_types(kind, value, f"{where}{name}.")


def _limit(body: dict[str, Any], top: int) -> int:
    value = body.get("Limit")
    if value is None:
        return top
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
        raise ApiError("ValidationException", f"1 validation error detected: Value {value!r} "
                       f"at 'limit' failed to satisfy constraint: Member must have value less "
                       f"than or equal to {top} and greater than or equal to 1")
    return value


def _key_columns(source: Any) -> tuple[str, ...]:
    key = source.key
    return (key,) if isinstance(key, str) else tuple(key)


def _required(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ApiError("ValidationException", f"1 validation error detected: Value null at "
                       f"'{name[0].lower() + name[1:]}' failed to satisfy constraint: Member "
                       f"must not be null")
    return value


class StreamsApi:
    """The API over `catalog` (a `volume_stream.Catalog`)."""

    def __init__(self, catalog: Any, *, region: str = DEFAULT_REGION,
                 account_id: str = DEFAULT_ACCOUNT):
        self.catalog, self.region, self.account_id = catalog, region, account_id
        self._logs: dict[tuple[str, str], ChangeLog] = {}
        self._lock = threading.Lock()
        self._signer = IteratorSigner(catalog.warehouse.location)
        self._blocks = RecordBlocks(region)

    # ------------------------------------------------------------------ dispatch
    def call(self, operation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, response document)."""
        status, doc = self._dispatch(operation, body)
        return status, json.loads(doc) if isinstance(doc, bytes) else doc

    def call_json(self, operation: str, body: dict[str, Any]) -> tuple[int, bytes]:
        """(HTTP status, response document as JSON): what the server sends."""
        status, doc = self._dispatch(operation, body)
        return status, doc if isinstance(doc, bytes) else json.dumps(doc).encode()

    def _dispatch(self, operation: str, body: dict[str, Any]
                  ) -> tuple[int, dict[str, Any] | bytes]:
        try:
            if operation not in OPERATIONS:
                raise ApiError("UnknownOperationException", f"unknown operation {operation!r}")
            if not isinstance(body, dict):
                raise ApiError("SerializationException", "the request body is not a JSON object")
            _check_types(_MEMBERS[operation], body)
            with self._lock:  # a change log's reader is not shared between threads
                return 200, getattr(self, "_" + operation)(body)
        except ApiError as exc:
            return exc.status, exc.document()
        except NotFoundError as exc:
            return 400, ApiError("ResourceNotFoundException", str(exc)).document()
        except ExpiredIteratorError as exc:
            return 400, ApiError("ExpiredIteratorException", str(exc)).document()
        except TrimmedDataError as exc:
            return 400, ApiError("TrimmedDataAccessException", str(exc)).document()
        except InvalidInputError as exc:
            return 400, ApiError("ValidationException", str(exc)).document()
        except VolumeStreamError as exc:
            return 500, ApiError("InternalServerError", str(exc), 500).document()

    def _log(self, volume: str, label: str) -> ChangeLog:
        log = self._logs.get((volume, label))
        if log is not None and owner_id(self.catalog, volume) != log.owner_id:
            log = None  # the volume (table) was dropped and made again under its name
        if log is None:
            log = ChangeLog(self.catalog, volume, label=label, region=self.region,
                            account_id=self.account_id)
            self._logs[(volume, label)] = log
        return log

    def _by_arn(self, arn: str) -> ChangeLog:
        m = _ARN.match(arn)
        if not m or (m.group(1), m.group(2)) != (self.region, self.account_id):
            raise ApiError("ResourceNotFoundException", f"Requested resource not found: "
                           f"Stream: {arn} not found")
        try:
            return self._log(m.group(3), m.group(4))
        except NotFoundError as exc:
            raise ApiError("ResourceNotFoundException", f"Requested resource not found: "
                           f"Stream: {arn} not found ({exc})") from exc

    # ------------------------------------------------------------------ operations
    def _ListStreams(self, body: dict[str, Any]) -> dict[str, Any]:
        limit = _limit(body, 100)
        table = body.get("TableName")
        if table is not None:
            names = {v["name"] for v in self.catalog.list_volumes()}
            if table not in names and not self.catalog.tables.exists(table):
                raise ApiError("ResourceNotFoundException",
                               f"Requested resource not found: Table: {table} not found")
        streams = [{"StreamArn": self._log(v, label).arn, "TableName": v, "StreamLabel": label}
                   for v, label in list_change_logs(self.catalog, table)]
        start = body.get("ExclusiveStartStreamArn")
        if start:
            arns = [s["StreamArn"] for s in streams]
            streams = streams[arns.index(start) + 1:] if start in arns else []
        out: dict[str, Any] = {"Streams": streams[:limit]}
        if len(streams) > limit:
            out["LastEvaluatedStreamArn"] = streams[limit - 1]["StreamArn"]
        return out

    def _DescribeStream(self, body: dict[str, Any]) -> dict[str, Any]:
        log = self._by_arn(_required(body, "StreamArn"))
        limit = _limit(body, 100)
        shards = log.shards()
        flt = body.get("ShardFilter")
        if flt:
            if flt.get("Type") != "CHILD_SHARDS" or not flt.get("ShardId"):
                raise ApiError("ValidationException", "ShardFilter needs Type CHILD_SHARDS and "
                               "a ShardId")
            shards = [s for s in shards if flt["ShardId"] in
                      (s.parent_shard_id, s.parent_sibling_shard_id)]
        start = body.get("ExclusiveStartShardId")
        if start:
            ids = [s.shard_id for s in shards]
            shards = shards[ids.index(start) + 1:] if start in ids else []
        page = shards[:limit]
        described = []
        for s in page:
            rng = {"StartingSequenceNumber": s.starting_sequence_number}
            if s.ending_sequence_number is not None:
                rng["EndingSequenceNumber"] = s.ending_sequence_number
            item: dict[str, Any] = {"ShardId": s.shard_id, "SequenceNumberRange": rng}
            if s.parent_shard_id:
                item["ParentShardId"] = s.parent_shard_id
            described.append(item)
        desc: dict[str, Any] = {
            "StreamArn": log.arn, "StreamLabel": log.label,
            "StreamStatus": "ENABLED" if log.enabled else "DISABLED",
            "StreamViewType": log.view_type,
            "CreationRequestDateTime": datetime.fromisoformat(
                log.stream["created_at"]).timestamp(),
            "TableName": log.volume,
            "KeySchema": [{"AttributeName": k, "KeyType": "RANGE" if i else "HASH"}
                          for i, k in enumerate(_key_columns(log.source))],
            "Shards": described}
        if len(shards) > limit:
            desc["LastEvaluatedShardId"] = page[-1].shard_id
        return {"StreamDescription": desc}

    def _GetShardIterator(self, body: dict[str, Any]) -> dict[str, Any]:
        log = self._by_arn(_required(body, "StreamArn"))
        shard_id = _required(body, "ShardId")
        kind = _required(body, "ShardIteratorType")
        try:
            token = log.iterator(shard_id, kind, body.get("SequenceNumber"))
        except NotFoundError as exc:
            raise ApiError("ResourceNotFoundException", f"Requested resource not found: "
                           f"Shard does not exist ({exc})") from exc
        return {"ShardIterator": token}

    def _GetRecords(self, body: dict[str, Any]) -> bytes:
        token = _required(body, "ShardIterator")
        limit = _limit(body, 1000)
        payload = self._signer.verify(token, time.time())  # a forged one names nothing
        try:
            log = self._log(str(payload.get("vol")), str(payload.get("label")))
        except NotFoundError as exc:
            raise ExpiredIteratorError(f"the change log of this iterator is gone: {exc}") from exc
        slices, shard, next_iterator, _ = log.read_slices(token, limit, MAX_BYTES)
        return self._blocks.body(log, slices, shard, next_iterator)
