"""Our own classic checkpoint writer (DESIGN §4.8): delta-rs 1.6.6 refuses to checkpoint a table
with deletion vectors, and a table that is never checkpointed makes every cold reader replay its
whole log.

`write_checkpoint(uri, options, version)` replays the log at `version` (`deltalog.replay`) and
writes `_delta_log/<version>.checkpoint.parquet` with one row per action, in the V1 layout
PROTOCOL.md gives ("Checkpoint Schema"): `protocol`, `metaData`, `txn`, `domainMetadata` (not
removed), `add` (each file's `deletionVector` struct and its `stats` as a JSON string,
`dataChange` false) and the `remove` tombstones not yet expired (`deletionTimestamp` within
`delta.deletedFileRetentionDuration`, a week by default). Then `_last_checkpoint` (`version`,
`size`, `sizeInBytes`, `numOfAddFiles`), unless it already names a newer checkpoint.

Each file appears whole or not at all: locally written to a temporary name in `_delta_log`
and renamed over the final one (a reader never sees a part-written checkpoint), on S3 one PUT.
The checkpoint is written before `_last_checkpoint` names it.

    write_checkpoint("s3://bucket/wh/tables/docs/directory", options, 120)
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from directory_table import deltalog
from directory_table.files import CommitLog
from directory_table.storage import s3_client

__all__ = ["CHECKPOINT", "Checkpoint", "retention_ms", "write_checkpoint"]

_MAP = pa.map_(pa.string(), pa.string())
_PROTOCOL = pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32()),
                       ("readerFeatures", pa.list_(pa.string())),
                       ("writerFeatures", pa.list_(pa.string()))])
_METADATA = pa.struct([("id", pa.string()), ("name", pa.string()),
                       ("description", pa.string()),
                       ("format", pa.struct([("provider", pa.string()), ("options", _MAP)])),
                       ("schemaString", pa.string()),
                       ("partitionColumns", pa.list_(pa.string())),
                       ("configuration", _MAP), ("createdTime", pa.int64())])
_TXN = pa.struct([("appId", pa.string()), ("version", pa.int64()),
                  ("lastUpdated", pa.int64())])
_DOMAIN = pa.struct([("domain", pa.string()), ("configuration", pa.string()),
                     ("removed", pa.bool_())])
#: the columns of a checkpoint written here, in delta-spark's order
CHECKPOINT = pa.schema([("txn", _TXN), ("add", deltalog.ADD), ("remove", deltalog.REMOVE),
                        ("metaData", _METADATA), ("protocol", _PROTOCOL),
                        ("domainMetadata", _DOMAIN)])
#: delta-spark's default for `delta.deletedFileRetentionDuration`
DEFAULT_RETENTION = "interval 1 week"
_UNITS_MS = {"microsecond": 0.001, "millisecond": 1, "second": 1000, "sec": 1000,
             "minute": 60_000, "min": 60_000, "hour": 3_600_000, "day": 86_400_000,
             "week": 604_800_000}
_INTERVAL = re.compile(r"(-?\d+)\s*([a-z]+?)s?\b")


def retention_ms(configuration: dict[str, str]) -> int:
    """`delta.deletedFileRetentionDuration` (a Spark interval such as "interval 7 days" or
    "interval 1 week 2 hours") in milliseconds."""
    text = str(configuration.get("delta.deletedFileRetentionDuration") or DEFAULT_RETENTION)
    text = text.strip().lower().removeprefix("interval").strip()
    total = 0.0
    found = False
    for amount, unit in _INTERVAL.findall(text):
        if unit not in _UNITS_MS:
            raise ValueError(f"unknown unit {unit!r} in delta.deletedFileRetentionDuration "
                             f"{configuration.get('delta.deletedFileRetentionDuration')!r}")
        total += int(amount) * _UNITS_MS[unit]
        found = True
    if not found:
        raise ValueError(f"delta.deletedFileRetentionDuration {text!r} is not an interval")
    return int(total)


@dataclass(frozen=True)
class Checkpoint:
    """What `write_checkpoint` wrote: its version, file name, number of actions (`size`), bytes,
    add actions and tombstones, and whether `_last_checkpoint` now names it."""

    version: int
    name: str
    size: int
    size_in_bytes: int
    adds: int
    tombstones: int
    pointed: bool


def _one_column(name: str, values: pa.Array, rows: int) -> pa.Table:
    """`rows` checkpoint rows holding `values` in column `name`, null everywhere else."""
    return pa.table([values if f.name == name else pa.nulls(rows, f.type) for f in CHECKPOINT],
                    schema=CHECKPOINT)


def _pairs(d: dict[str, Any] | None) -> list[tuple[str, str]] | None:
    return None if d is None else [(str(k), None if v is None else str(v))
                                   for k, v in d.items()]


def _actions(state: deltalog.LogState, now_ms: int) -> tuple[pa.Table, int, int]:
    """The checkpoint's rows, its number of adds, its number of tombstones."""
    md = dict(state.metadata)
    fmt = dict(md.get("format") or {"provider": "parquet"})
    fmt["options"] = _pairs(fmt.get("options") or {})
    md.update(format=fmt, configuration=_pairs(md.get("configuration") or {}))
    protocol = {k: state.protocol.get(k) for k in _PROTOCOL.names}
    if protocol["minReaderVersion"] == 3 and protocol["readerFeatures"] is None:
        protocol["readerFeatures"] = []
    if protocol["minWriterVersion"] == 7 and protocol["writerFeatures"] is None:
        protocol["writerFeatures"] = []
    parts = [_one_column("protocol", pa.array([protocol], _PROTOCOL), 1),
             _one_column("metaData", pa.array([md], _METADATA), 1)]
    if state.txns:
        parts.append(_one_column("txn", pa.array(list(state.txns.values()), _TXN),
                                 len(state.txns)))
    if state.domains:
        domains = [{**d, "removed": False} for d in state.domains.values()]
        parts.append(_one_column("domainMetadata", pa.array(domains, _DOMAIN), len(domains)))
    files = state.files
    adds = files.select([f.name if f.name != "path" else "log_path" for f in deltalog.ADD])
    adds = adds.rename_columns(deltalog.ADD.names).set_column(
        deltalog.ADD.get_field_index("dataChange"), "dataChange",
        pa.array([False] * files.num_rows, pa.bool_()))
    if adds.num_rows:
        parts.append(_one_column("add", pa.StructArray.from_arrays(
            [adds[n].combine_chunks() for n in deltalog.ADD.names],
            fields=list(deltalog.ADD)), adds.num_rows))
    tomb = state.tombstones
    cutoff = now_ms - retention_ms(state.metadata.get("configuration") or {})
    tomb = tomb.filter(pc.fill_null(pc.greater(tomb["deletionTimestamp"], cutoff), False))
    tomb = tomb.set_column(deltalog.REMOVE.get_field_index("dataChange"), "dataChange",
                           pa.array([False] * tomb.num_rows, pa.bool_()))
    if tomb.num_rows:
        parts.append(_one_column("remove", pa.StructArray.from_arrays(
            [tomb[n].combine_chunks() for n in deltalog.REMOVE.names],
            fields=list(deltalog.REMOVE)), tomb.num_rows))
    return pa.concat_tables(parts), adds.num_rows, tomb.num_rows


def _put(log: CommitLog, name: str, body: bytes, *, durable: bool = True) -> None:
    """`_delta_log/<name>` replaced by `body` whole: a local temporary file (synced to disk when
    `durable`) renamed over it, or one S3 PUT."""
    if log.local:
        final = f"{log.root}/_delta_log/{name}"
        temp = f"{log.root}/_delta_log/.{name}.{uuid.uuid4().hex}.tmp"
        try:
            with open(temp, "wb") as f:
                f.write(body)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            # Hadoop's local file system (delta-spark on a local table) checks a file against
            # its hidden `.<name>.crc` when there is one: a stale one would fail the new file
            crc = f"{log.root}/_delta_log/.{name}.crc"
            if os.path.exists(crc):
                os.remove(crc)
            os.replace(temp, final)
        finally:
            if os.path.exists(temp):
                os.remove(temp)
        return
    s3_client(log._options).put_object(Bucket=log.bucket,
                                       Key=f"{log.prefix}/_delta_log/{name}", Body=body)


def write_checkpoint(table_uri: str, storage_options: dict[str, str] | None = None,
                     version: int | None = None, *, now_ms: int | None = None) -> Checkpoint:
    """Write the classic checkpoint of `version` (default: the newest) of the table at
    `table_uri`, then point `_last_checkpoint` at it unless that names a newer one.
    `now_ms` (default: the clock) is the time tombstones expire against."""
    state = deltalog.replay(table_uri, storage_options, version)
    table, adds, tombstones = _actions(state, int(time.time() * 1000) if now_ms is None
                                       else now_ms)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    body = sink.getvalue().to_pybytes()
    log = CommitLog(table_uri, storage_options)
    name = f"{state.version:020d}.checkpoint.parquet"
    _put(log, name, body)
    newest = log.last_checkpoint()
    pointed = newest is None or newest <= state.version
    if pointed:
        last = {"version": state.version, "size": table.num_rows, "sizeInBytes": len(body),
                "numOfAddFiles": adds}
        # not synced: after a crash a torn `_last_checkpoint` is only a hint that does not
        # parse, and readers (delta-spark, delta-rs, deltalog) then list the log instead
        _put(log, "_last_checkpoint", json.dumps(last).encode(), durable=False)
    return Checkpoint(state.version, name, table.num_rows, len(body), adds, tombstones,
                      pointed)
