"""Our own replay of a Delta table's log (DESIGN §4.8): the protocol, the metadata, the
application transactions and the active files of one version, with each file's deletion vector
descriptor, read from the newest checkpoint at or before that version and the JSON commits
after it. delta-rs 1.6.6 hides the deletion vectors of a table's files (`get_add_actions`) and
refuses to read or checkpoint such a table, so the directory table reads the log itself.

Replay follows PROTOCOL.md's "Action Reconciliation": a logical file is identified by its
path (percent-decoded: the log holds RFC 2396 URIs) and its deletion vector's unique id; the
newest action about a logical file wins, an `add` keeps it in the table, a `remove` makes it a
tombstone. A checkpoint (classic, multi-part, or a V2 one, UUID-named in JSON or Parquet, with
its sidecars; written by delta-rs or delta-spark) is read whole by pyarrow, its add actions kept as Arrow columns: the commits after
it are parsed in Python (they are small), the checkpoint's rows never are.

    state = replay("s3://bucket/wh/tables/docs", storage_options)        # the newest version
    state.files.column("path"), state.files.column("deletionVector")
    replay(uri, options, version=12).version                             # time travel
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from directory_table.files import CommitLog
from directory_table.storage import list_names

__all__ = ["ADD", "DV", "REMOVE", "LogGap", "LogState", "Listing", "decoded", "dv_unique_id",
           "list_log", "replay"]

_MAP = pa.map_(pa.string(), pa.string())
#: a deletion vector descriptor, as delta-spark writes it in checkpoints
DV = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()),
                ("offset", pa.int32()), ("sizeInBytes", pa.int32()),
                ("cardinality", pa.int64()), ("maxRowIndex", pa.int64())])
#: the fields of an `add` action kept by replay and written to checkpoints
ADD = pa.struct([("path", pa.string()), ("partitionValues", _MAP), ("size", pa.int64()),
                 ("modificationTime", pa.int64()), ("dataChange", pa.bool_()),
                 ("stats", pa.string()), ("tags", _MAP), ("deletionVector", DV),
                 ("baseRowId", pa.int64()), ("defaultRowCommitVersion", pa.int64()),
                 ("clusteringProvider", pa.string())])
#: the fields of a `remove` action kept as a tombstone (no stats nor tags, as in checkpoints)
REMOVE = pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()),
                    ("dataChange", pa.bool_()), ("extendedFileMetadata", pa.bool_()),
                    ("partitionValues", _MAP), ("size", pa.int64()), ("deletionVector", DV),
                    ("baseRowId", pa.int64()), ("defaultRowCommitVersion", pa.int64())])
#: the statistics replay parses out of an add's `stats` JSON
_STATS = pa.schema([("numRecords", pa.int64()),
                    ("minValues", pa.struct([("relative_path", pa.string())])),
                    ("maxValues", pa.struct([("relative_path", pa.string())]))])
_BUCKET = "_bucket"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_UUID_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(?:json|parquet)$")
_ACTIONS = ("protocol", "metaData", "txn", "domainMetadata", "add", "remove", "sidecar")


class LogGap(FileNotFoundError):
    """The log cannot give the wanted version: no table there, a version not yet committed,
    or commits missing with no checkpoint to stand for them."""


@dataclass
class LogState:
    """One version of a table as its log describes it.

    `files` has one row per active logical file: `path` (percent-decoded, relative to the table
    unless absolute), `log_path` (as the log spells it), the add action's other fields
    (`partitionValues`, `size`, `modificationTime`, `dataChange`, `stats` JSON, `tags`,
    `deletionVector` or null, `baseRowId`, `defaultRowCommitVersion`, `clusteringProvider`) and,
    parsed, `bucket` (the `_bucket` partition value), `num_records`, `min_path` and `max_path`
    (the stats of `relative_path`). `tombstones` holds the unexpired and expired `remove`
    actions alike (`REMOVE`'s fields; a checkpoint writer drops the expired)."""

    version: int
    protocol: dict[str, Any]
    metadata: dict[str, Any]
    files: pa.Table
    tombstones: pa.Table
    txns: dict[str, dict[str, Any]] = field(default_factory=dict)
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoint: int | None = None  # the checkpoint replay started from

    def adds(self) -> list[dict[str, Any]]:
        """The add actions as the log would hold them (`path` as the log spells it, maps as
        dicts)."""
        rows = pa.table({f.name: self.files["log_path" if f.name == "path" else f.name]
                         for f in ADD}).to_pylist()
        for row in rows:
            row["partitionValues"] = _dict(row["partitionValues"])
            row["tags"] = _dict(row["tags"]) if row["tags"] is not None else None
        return rows

    def deletion_vectors(self) -> dict[str, dict[str, Any]]:
        """Decoded path → deletion vector descriptor, for the files that have one."""
        has = self.files.filter(pc.is_valid(self.files["deletionVector"]))
        return dict(zip(has["path"].to_pylist(), has["deletionVector"].to_pylist(), strict=True))


@dataclass(frozen=True)
class Listing:
    """What `_delta_log` holds from some version on: commits and complete checkpoints."""

    commits: set[int]
    checkpoints: dict[int, list[str]]  # version → its file names (one, or every part)


def decoded(paths: pa.Array | pa.ChunkedArray) -> pa.Array:
    """`paths` with RFC 2396 percent-escapes decoded (only the paths holding a `%` go through
    Python)."""
    paths = paths.combine_chunks() if isinstance(paths, pa.ChunkedArray) else paths
    escaped = pc.fill_null(pc.match_substring(paths, "%"), False)
    if not pc.any(escaped).as_py():
        return paths
    values = paths.to_pylist()
    flags = escaped.to_pylist()
    return pa.array([unquote(p) if f else p for p, f in zip(values, flags, strict=True)],
                    pa.string())


def dv_unique_id(dv: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each descriptor's unique id (`<storageType><pathOrInlineDv>[@<offset>]`), "" where a
    file has no deletion vector."""
    dv = dv.combine_chunks() if isinstance(dv, pa.ChunkedArray) else dv
    if len(dv) == 0:
        return pa.array([], pa.string())
    base = pc.binary_join_element_wise(pc.struct_field(dv, "storageType"),
                                       pc.struct_field(dv, "pathOrInlineDv"), "")
    offset = pc.cast(pc.struct_field(dv, "offset"), pa.string())
    with_offset = pc.binary_join_element_wise(base, offset, "@")
    uid = pc.if_else(pc.is_valid(offset), with_offset, base)
    return pc.fill_null(pc.if_else(pc.is_valid(dv), uid, pa.scalar(None, pa.string())), "")


def _key(path: str, dv: dict[str, Any] | None) -> tuple[str, str]:
    """A logical file's (decoded path, DV unique id) from a JSON action."""
    if "%" in path:
        path = unquote(path)
    if not dv:
        return path, ""
    uid = f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}"
    if dv.get("offset") is not None:
        uid += f"@{dv['offset']}"
    return path, uid


def _conform(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """`arr` as `target`: struct fields matched by name (missing ones null, extra ones
    dropped), recursively; everything else cast."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_struct(target) and pa.types.is_struct(arr.type):
        names = {arr.type.field(i).name for i in range(arr.type.num_fields)}
        children = [_conform(pc.struct_field(arr, f.name), f.type) if f.name in names
                    else pa.nulls(len(arr), f.type) for f in target]
        return pa.StructArray.from_arrays(children, fields=list(target),
                                          mask=pc.invert(pc.is_valid(arr)))
    return arr if arr.type == target else arr.cast(target)


def _rows(table: pa.Table, action: str, kind: pa.StructType) -> pa.Table:
    """The non-null rows of column `action` of a checkpoint, as a table of `kind`'s fields."""
    if action not in table.column_names:
        return pa.Table.from_batches([], pa.schema(list(kind)))
    col = table[action].combine_chunks()
    col = col.filter(pc.is_valid(col))
    return pa.Table.from_struct_array(_conform(col, kind))


def list_log(table_uri: str, options: dict[str, str] | None, after: int | None = None,
             ) -> Listing:
    """The commits and complete checkpoints (classic, multi-part with every part, UUID-named
    V2) in `_delta_log` (from version `after` on, when given: one listing from there on S3)."""
    start = f"{after:020d}" if after is not None else None
    names = list_names(f"{table_uri.rstrip('/')}/_delta_log", options, start_after=start)
    commits: set[int] = set()
    parts: dict[tuple[int, int], list[str]] = {}
    uuid_named: dict[int, str] = {}
    for name in names:
        if m := _COMMIT.match(name):
            commits.add(int(m[1]))
        elif m := _CHECKPOINT.match(name):
            parts.setdefault((int(m[1]), int(m[3] or 1)), []).append(name)
        elif m := _UUID_CHECKPOINT.match(name):
            uuid_named.setdefault(int(m[1]), name)
    checkpoints = {v: sorted(found) for (v, n), found in parts.items() if len(found) == n}
    for v, name in uuid_named.items():  # a V2 checkpoint when no classic one is complete
        checkpoints.setdefault(v, [name])
    return Listing(commits, checkpoints)


def _locate(log: CommitLog, uri: str, options: dict[str, str] | None, version: int | None,
            ) -> tuple[int, int | None, list[str]]:
    """(the version to read, the checkpoint to start from, its files)."""
    hint = log.last_checkpoint()
    if hint is not None and version is not None and version < hint:
        hint = None  # time travel before the last checkpoint: list the whole log
    listing = list_log(uri, options, hint)
    if hint is not None and hint not in listing.checkpoints:
        listing = list_log(uri, options)  # _last_checkpoint names a checkpoint not (all) there
    known = listing.commits | set(listing.checkpoints)
    if not known:
        raise LogGap(f"no Delta table at {uri}: {uri}/_delta_log holds no commit")
    target = max(known) if version is None else version
    if target not in known and not any(v > target for v in known):
        raise LogGap(f"table {uri} has no version {target} (newest: {max(known)})")
    usable = [v for v in listing.checkpoints if v <= target]
    start = max(usable) if usable else None
    first = 0 if start is None else start + 1
    missing = [v for v in range(first, target + 1) if v not in listing.commits]
    if missing:
        raise LogGap(f"table {uri} cannot be read at version {target}: commit {missing[0]} is "
                     f"missing and no checkpoint at or after it stands for it")
    return target, start, listing.checkpoints.get(start, []) if start is not None else []


@dataclass
class _Checkpoint:
    """A checkpoint's file actions as tables, its other actions as dicts, by action name."""

    adds: list[pa.Table] = field(default_factory=list)
    removes: list[pa.Table] = field(default_factory=list)
    other: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def _read_checkpoint(log: CommitLog, names: list[str], into: _Checkpoint | None = None,
                     ) -> _Checkpoint:
    """The actions of a checkpoint: its parts (Parquet) or its V2 top-level file (Parquet or
    JSON), and the sidecars it names."""
    cp = _Checkpoint() if into is None else into
    sidecars: list[str] = []
    for name in names:
        body = log.read(name)
        if body is None:
            raise LogGap(f"checkpoint {name} vanished while being read")
        if name.endswith(".json"):
            actions = json.loads(b"[" + b",".join(
                ln for ln in body.splitlines() if ln.strip()) + b"]")
            cp.adds.append(pa.Table.from_pylist([a["add"] for a in actions if "add" in a],
                                                schema=pa.schema(list(ADD))))
            cp.removes.append(pa.Table.from_pylist(
                [a["remove"] for a in actions if "remove" in a], schema=pa.schema(list(REMOVE))))
            for action in actions:
                for kind, value in action.items():
                    if kind in _ACTIONS and kind not in ("add", "remove"):
                        cp.other.setdefault(kind, []).append(value)
        else:
            pf = pq.ParquetFile(pa.BufferReader(body))
            present = set(pf.schema_arrow.names)  # (built anew on each access)
            table = pf.read(columns=[c for c in _ACTIONS if c in present])
            adds = _rows(table, "add", ADD)
            if "add" in table.column_names:
                adds = adds.set_column(adds.schema.get_field_index("stats"), "stats",
                                       _stats_json(table["add"]))
            cp.adds.append(adds)
            cp.removes.append(_rows(table, "remove", REMOVE))
            for kind in ("protocol", "metaData", "txn", "domainMetadata", "sidecar"):
                if kind in table.column_names:
                    col = table[kind].combine_chunks()
                    cp.other.setdefault(kind, []).extend(col.filter(pc.is_valid(col)).to_pylist())
        sidecars += [s["path"] for s in cp.other.pop("sidecar", [])]
    if sidecars:
        _read_checkpoint(log, [f"_sidecars/{p}" for p in sidecars], cp)
    return cp


def _stats_json(add: pa.ChunkedArray) -> pa.Array:
    """The add rows' `stats` JSON; where a checkpoint kept only `stats_parsed`, that as JSON."""
    add = add.combine_chunks()
    add = add.filter(pc.is_valid(add))
    names = {add.type.field(i).name for i in range(add.type.num_fields)}
    stats = (pc.struct_field(add, "stats") if "stats" in names
             else pa.nulls(len(add), pa.string()))
    if "stats_parsed" not in names or stats.null_count == 0:
        return stats
    parsed = pc.struct_field(add, "stats_parsed").to_pylist()
    return pa.array([s if s is not None or p is None else json.dumps(p, default=str)
                     for s, p in zip(stats.to_pylist(), parsed, strict=True)], pa.string())


def _commit_actions(log: CommitLog, versions: list[int]) -> list[list[dict[str, Any]]]:
    """The actions of each commit in `versions`, in order (read in parallel on S3)."""

    def one(v: int) -> list[dict[str, Any]]:
        body = log.commit(v)
        if body is None:
            raise LogGap(f"commit {v} of {log_name(log)} vanished while being read")
        # one parse per commit (an array of its lines), not one per action
        return json.loads(b"[" + b",".join(ln for ln in body.splitlines() if ln.strip()) + b"]")

    # (on S3 the log's boto3 client exists by now: `_locate` read `_last_checkpoint` with it,
    # and creating one is not safe from several threads at once)
    if log.local or len(versions) < 2:
        return [one(v) for v in versions]
    with ThreadPoolExecutor(min(16, len(versions))) as pool:
        return list(pool.map(one, versions))


def log_name(log: CommitLog) -> str:
    return log.root if log.local else f"s3://{log.bucket}/{log.prefix}"


def _dict(value: Any) -> dict[str, Any]:
    """A map from a checkpoint (pyarrow gives key/value pairs) or JSON (a dict) as a dict."""
    if value is None:
        return {}
    return dict(value) if not isinstance(value, dict) else value


_METADATA_KEYS = ("id", "name", "description", "format", "schemaString", "partitionColumns",
                  "configuration", "createdTime")
_PROTOCOL_KEYS = ("minReaderVersion", "minWriterVersion", "readerFeatures", "writerFeatures")


def _protocol(p: dict[str, Any]) -> dict[str, Any]:
    """A protocol action with every field (absent in JSON = null in a checkpoint)."""
    return {**dict.fromkeys(_PROTOCOL_KEYS), **p}


def _metadata(md: dict[str, Any]) -> dict[str, Any]:
    """A metaData action with every field, its maps as dicts."""
    md = {**dict.fromkeys(_METADATA_KEYS), **md}
    md["configuration"] = _dict(md.get("configuration"))
    md["partitionColumns"] = list(md.get("partitionColumns") or [])
    fmt = dict(md.get("format") or {"provider": "parquet"})
    fmt["options"] = _dict(fmt.get("options"))
    md["format"] = fmt
    return md


def _stats_columns(stats: pa.Array) -> pa.Table:
    """numRecords, minValues and maxValues of `relative_path` from each stats JSON (null where
    absent): pyarrow's JSON reader over one buffer of all rows; row by row only when some
    writer's stats do not parse as that (a row that does not parse gives nulls)."""
    text = pc.fill_null(stats, "{}").cast(pa.large_string())
    joined = pc.binary_join(pa.LargeListArray.from_arrays([0, len(stats)], text),
                            pa.scalar("\n", pa.large_string()))[0]
    options = pajson.ParseOptions(explicit_schema=_STATS, unexpected_field_behavior="ignore")
    try:
        parsed = pajson.read_json(pa.BufferReader(joined.as_buffer()), parse_options=options)
        if parsed.num_rows == len(stats):
            return parsed
    except pa.ArrowInvalid:
        pass
    rows = []
    for one in text.to_pylist():
        try:
            rows.append(pajson.read_json(pa.BufferReader(one.encode()),
                                         parse_options=options).to_pylist()[0])
        except (pa.ArrowInvalid, IndexError):
            rows.append({})
    return pa.Table.from_pylist(rows, schema=_STATS)


def _parse_stats(files: pa.Table) -> pa.Table:
    """`files` with `num_records`, `min_path`, `max_path` parsed from the stats JSON and
    `bucket` from the partition values."""
    parsed = _stats_columns(files["stats"].combine_chunks())
    records = parsed["numRecords"]
    low = pc.struct_field(parsed["minValues"].combine_chunks(), "relative_path")
    high = pc.struct_field(parsed["maxValues"].combine_chunks(), "relative_path")
    values = pc.map_lookup(files["partitionValues"], _BUCKET, "first")
    bucket = pc.cast(pc.if_else(pc.equal(values, ""), None, values), pa.int32())
    return (files.append_column("bucket", bucket).append_column("num_records", records)
            .append_column("min_path", low).append_column("max_path", high))


def replay(table_uri: str, storage_options: dict[str, str] | None = None,
           version: int | None = None) -> LogState:
    """The state of the table at `table_uri` at `version` (default: its newest), from the
    newest complete checkpoint at or before it and the commits after that checkpoint."""
    log = CommitLog(table_uri, storage_options)
    target, start, names = _locate(log, table_uri, storage_options, version)
    protocol: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    txns: dict[str, dict[str, Any]] = {}
    domains: dict[str, dict[str, Any]] = {}
    empty_add = pa.Table.from_batches([], pa.schema(list(ADD)))
    empty_remove = pa.Table.from_batches([], pa.schema(list(REMOVE)))
    base_adds, base_removes = empty_add, empty_remove
    if names:
        cp = _read_checkpoint(log, names)
        base_adds = pa.concat_tables([t.cast(pa.schema(list(ADD))) for t in cp.adds])
        base_removes = pa.concat_tables([t.cast(pa.schema(list(REMOVE))) for t in cp.removes])
        protocol = (cp.other.get("protocol") or [protocol])[-1]
        metadata = (cp.other.get("metaData") or [metadata])[-1]
        txns.update((t["appId"], t) for t in cp.other.get("txn", []))
        domains.update((d["domain"], d) for d in cp.other.get("domainMetadata", []))
    active: dict[tuple[str, str], dict[str, Any]] = {}
    removed: dict[tuple[str, str], dict[str, Any]] = {}
    first = 0 if start is None else start + 1
    for actions in _commit_actions(log, list(range(first, target + 1))):
        for action in actions:
            if (add := action.get("add")) is not None:
                key = _key(add["path"], add.get("deletionVector"))
                active[key] = add
                removed.pop(key, None)
            elif (rm := action.get("remove")) is not None:
                key = _key(rm["path"], rm.get("deletionVector"))
                active.pop(key, None)
                removed[key] = rm
            elif "metaData" in action:
                metadata = action["metaData"]
            elif "protocol" in action:
                protocol = action["protocol"]
            elif "txn" in action:
                txns[action["txn"]["appId"]] = action["txn"]
            elif "domainMetadata" in action:
                domains[action["domainMetadata"]["domain"]] = action["domainMetadata"]
    touched = pa.array([f"{p}\x00{d}" for p, d in (*active, *removed)], pa.string())
    adds = _reconcile(base_adds, touched, active.values(), ADD)
    tombstones = _reconcile(base_removes, touched, removed.values(), REMOVE)
    files = adds.add_column(0, "log_path", adds["path"]).set_column(
        1, "path", decoded(adds["path"]))
    files = _parse_stats(files)
    return LogState(target, _protocol(protocol), _metadata(metadata), files, tombstones, txns,
                    {k: d for k, d in domains.items() if not d.get("removed")}, start)


def _reconcile(base: pa.Table, touched: pa.Array, newer: Any, kind: pa.StructType,
               ) -> pa.Table:
    """`base`'s rows whose logical file no commit after the checkpoint touched, and `newer`
    (the commits' surviving actions of this kind)."""
    if len(touched) and base.num_rows:
        keys = pc.binary_join_element_wise(decoded(base["path"]),
                                           dv_unique_id(base["deletionVector"]), "\x00")
        base = base.filter(pc.invert(pc.is_in(keys, value_set=touched)))
    schema = pa.schema(list(kind))
    more = list(newer)
    if not more:
        return base.cast(schema) if base.schema != schema else base
    return pa.concat_tables([base.cast(schema), pa.Table.from_pylist(more, schema=schema)])
