"""DataX-style export of a change log (the OTSStream Reader's contract): a volume's, or a
change-tracked SQL table's (its key column or columns in place of `relative_path`).

    cat.export_changes("landing", start_ms=A, end_ms=B, out="/exports/landing",
                       format="parquet", status_table="landing_export")

Every change committed in [A, B) (`date="20261123"`: that UTC day) becomes rows
`relative_path, column_name, version, column_value, op_type` (+ `sequence_info`), one per column
version as DataX writes them: a new file gives a `U` row per public column other than the key
(`version` = commit time in ms); an overwrite gives `DR` and then the `U` rows (a PutRow); a
delete gives one `DR` row. The range must have ended a safety lag ago (B ≤ now − `safety_lag_ms`,
default `SAFETY_LAG_MS`): a commit's timestamp is taken before its log entry lands, so a range
ending at (or just before) now could be recorded done while a commit stamped inside it is still
being written, and that commit would never be exported. After the lag a finished range is final.

Work is cut per shard into windows of `WINDOW` versions fixed by version number, so a window's
output file (`part-<shard>-<first version>.<ext>`, written to a temporary name and renamed;
for `delta`, one commit carrying a Delta app transaction) is the same on every run. With
`status_table` (a Delta table under `<warehouse>/export_status/`), each finished window is
recorded per (range, shard): a re-run of a finished range exports nothing new, and a run killed
anywhere resumes after the last recorded window; a window written but not yet recorded is
written again under the same name (parquet, csv) or skipped by its app transaction (delta), so
nothing is duplicated. Shards run in parallel threads (`parallelism`), or one Spark task per
shard (`engine="spark"`); storage errors (OSError, Delta errors) are retried up to
`max_retries` times with back-off.
"""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError

from connectors.errors import is_transient
from volume_stream.errors import (
    InvalidInputError,
    SourceError,
    TrimmedDataError,
    WarehouseError,
    converted,
)
from volume_stream.shards.destination import checked_out as _checked_out
from volume_stream.shards.log import ChangeLog, Target, list_change_logs
from volume_stream.shards.model import Shard
from volume_stream.shards.reader import CommitTimes, Window, shard_window
from volume_stream.shards.sources import VolumeSource
from volume_stream.tables.store import ROW_ID, TableStore
from volume_stream.volumes.registry import VolumeRegistry
from volume_stream.warehouse import Warehouse, check_name

__all__ = ["CRASH_ENV", "FORMATS", "SAFETY_LAG_MS", "ExportResult", "check_ended",
           "export_changes", "resolve_range", "window_rows"]

FORMATS = ("parquet", "csv", "delta")
#: how long (ms) before now an export range must have ended: longer than a commit takes from
#: the timestamp in its commit info to its log entry being visible (retries included)
SAFETY_LAG_MS = 5_000
#: versions per window (the unit of output files and of resumption)
WINDOW = 64
#: Test hook: SIGKILL this process once this many windows have been written (not recorded)
CRASH_ENV = "VOLUME_STREAM_TEST_EXPORT_CRASH_AFTER"
_STATUS_SCHEMA = pa.schema([
    ("range_key", pa.string()), ("shard_id", pa.string()), ("window_end", pa.int64()),
    ("done", pa.bool_()), ("rows", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC"))])


#: the key column of a volume's export rows
VOLUME_KEY = pa.field("relative_path", pa.string())


def _schema(sequence_info: bool, key: pa.Field | list[pa.Field] = VOLUME_KEY) -> pa.Schema:
    keys = [key] if isinstance(key, pa.Field) else key
    fields = [(k.name, k.type) for k in keys] + [("column_name", pa.string()),
              ("version", pa.int64()), ("column_value", pa.string()), ("op_type", pa.string())]
    return pa.schema(fields + ([("sequence_info", pa.string())] if sequence_info else []))


@dataclass
class ExportResult:
    """What one export run did."""

    start_ms: int
    end_ms: int
    rows: int = 0
    records: int = 0
    files: list[str] = field(default_factory=list)
    #: transient storage errors outlived by a retry
    retries: int = 0
    windows_written: int = 0
    windows_skipped: int = 0
    shards: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "files"} | {
            "files": len(self.files)}


def resolve_range(start_ms: int | None, end_ms: int | None, date: str | None) -> tuple[int, int]:
    """[A, B) in ms from start/end or a `yyyyMMdd` UTC day (one or the other)."""
    if date is not None:
        if start_ms is not None or end_ms is not None:
            raise InvalidInputError("give either date or start_ms/end_ms, not both")
        try:
            day = datetime.strptime(str(date), "%Y%m%d").replace(tzinfo=UTC)
        except ValueError as exc:
            raise InvalidInputError(f"date must be yyyyMMdd, not {date!r}") from exc
        a = int(day.timestamp() * 1000)
        return a, a + 24 * 3600 * 1000
    if start_ms is None or end_ms is None:
        raise InvalidInputError("give the range's start and end in ms (start_ms and end_ms; "
                                "--start-ms and --end-ms on the command line) or a date")
    a, b = int(start_ms), int(end_ms)
    if a >= b:
        raise InvalidInputError(f"start_ms {a} must be before end_ms {b}")
    return a, b


def check_ended(what: str, end_ms: int, safety_lag_ms: int = SAFETY_LAG_MS) -> None:
    """Refuse a range whose end is not at least `safety_lag_ms` in the past (see above)."""
    if isinstance(safety_lag_ms, bool) or not isinstance(safety_lag_ms, int) or safety_lag_ms < 0:
        raise InvalidInputError(f"safety_lag_ms must be an integer >= 0, not {safety_lag_ms!r}")
    now = _ms(datetime.now(UTC))
    if end_ms > now - safety_lag_ms:
        ahead = "is in the future" if end_ms > now else f"ended only {now - end_ms} ms ago"
        raise InvalidInputError(
            f"export of {what}: end_ms {end_ms} {ahead} (now is {now}); the range must have "
            f"ended at least the safety lag of {safety_lag_ms} ms ago, so that no commit "
            f"stamped inside it is still being written; run it at or after "
            f"{end_ms + safety_lag_ms} ms, or pick an earlier end")


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _text(col: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
    """A column's values as DataX text: timestamps ISO 8601 (with the offset when zoned),
    binary as Base64 (as DataX writes OTS binary columns), everything else Arrow's cast."""
    if pa.types.is_timestamp(col.type):
        zoned = col.type.tz is not None
        return pc.strftime(col, format="%Y-%m-%dT%H:%M:%S" + ("%z" if zoned else ""))
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return pa.array([None if v is None else base64.b64encode(v).decode("ascii")
                         for v in col.to_pylist()], pa.string())
    return pc.cast(col, pa.string())


def window_rows(window: Window, shard: Shard, commit_time: Any, a: int, b: int, sequence_info:
                bool, key: pa.Field | list[pa.Field] = VOLUME_KEY) -> tuple[pa.Table, int]:
    """(the DataX rows, the number of records) of a window's records committed in [a, b),
    built column-wise: per record a `DR` row if it had an old image (MODIFY, REMOVE), then a
    `U` row per non-null public column of its new image (INSERT, MODIFY); the first column is
    the change log's key (`key`: `relative_path`, or a table's key column or columns)."""
    schema = _schema(sequence_info, key)
    if not len(window):
        return schema.empty_table(), 0
    versions = np.unique(window.version)
    ms_of = {int(v): _ms(commit_time(int(v))) for v in versions}
    ms = np.array([ms_of[v] for v in window.version.tolist()], np.int64)
    keep = np.nonzero((ms >= a) & (ms < b))[0]
    if not len(keep):
        return schema.empty_table(), 0
    old, new, ms = window.old[keep], window.new[keep], ms[keep]
    seqs = None
    if sequence_info:
        seqs = np.array([f"{shard.shard_id}:1{v:019d}{r:010d}" for v, r in zip(
            window.version[keep].tolist(), window.row[keep].tolist(), strict=True)], object)
    parts, order = [], []
    t = window.rows
    keys = [key] if isinstance(key, pa.Field) else key
    values_of = [c for c in window.columns if c not in {k.name for k in keys}]
    width = len(values_of) + 1

    def part(rec: np.ndarray, src: np.ndarray, name: str | None, values: Any, op: str,
             slot: int) -> None:
        n = len(rec)
        cols = {**{k.name: pc.cast(t[k.name].take(pa.array(src)), k.type) for k in keys},
                "column_name": pa.repeat(pa.scalar(name, pa.string()), n),
                "version": pa.array(ms[rec]),
                "column_value": values if values is not None else pa.nulls(n, pa.string()),
                "op_type": pa.repeat(pa.scalar(op, pa.string()), n)}
        if sequence_info:
            cols["sequence_info"] = pa.array(seqs[rec], pa.string())
        parts.append(pa.table(cols, schema=schema))
        order.append(rec * width + slot)

    rec = np.nonzero(old >= 0)[0]
    part(rec, old[rec], None, None, "DR", 0)
    has_new = np.nonzero(new >= 0)[0]
    for slot, col in enumerate(values_of, 1):
        values = t[col].take(pa.array(new[has_new]))
        valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
        rec = has_new[valid]
        part(rec, new[rec], col, _text(values.filter(pa.array(valid))), "U", slot)
    rows = pa.concat_tables(parts)
    return rows.take(pa.array(np.argsort(np.concatenate(order), kind="stable"))), len(keep)


class _Exporter:
    def __init__(self, catalog: Any, volume: str, a: int, b: int, out: str, fmt: str,
                 status_path: str | None, sequence_info: bool, max_retries: int,
                 mbps: float | None, result: ExportResult):
        self.catalog, self.volume, self.a, self.b = catalog, volume, a, b
        self.out, self.fmt, self.status_path = out, fmt, status_path
        self.sequence_info, self.max_retries, self.mbps = sequence_info, max_retries, mbps
        self.result = result
        self._lock = threading.Lock()
        self.options = dict(getattr(catalog.warehouse.location, "storage_options", {}) or {})
        #: what errors name: "volume 'x'" or "table 'x'"
        self.what = f"volume or table {volume!r}"
        self.target = self._retry(lambda: Target(catalog, volume), "read the catalog")
        self.what = f"{self.target.kind} {volume!r}"
        self.range_key = f"{volume}:{self.target.owner_id}:{a}:{b}"
        self.key = _key_field(self.target)
        self._written = 0
        self._bytes, self._started = 0, time.monotonic()

    def source(self, log: ChangeLog | None = None) -> Any:
        """What to read: the log's own source for a table (keyed as its stream is), a freshly
        opened directory table for a volume."""
        if self.target.kind == "table":
            return log.source if log is not None else self.target.source
        return VolumeSource(self.catalog.directory_table(self.volume))

    # ---------------------------------------------------------------- status
    def status(self) -> dict[str, tuple[int, bool]]:
        """{shard_id: (last recorded window end, done)} of this range."""
        if not self.status_path or not DeltaTable.is_deltatable(self.status_path,
                                                                self.options or None):
            return {}
        rows = DeltaTable(self.status_path, storage_options=self.options or None
                          ).to_pyarrow_dataset().to_table(use_threads=False).to_pylist()
        out: dict[str, tuple[int, bool]] = {}
        for r in rows:
            if r["range_key"] == self.range_key:
                prev = out.get(r["shard_id"], (-1, False))
                out[r["shard_id"]] = max(prev, (r["window_end"], r["done"]))
        return out

    def record(self, shard_id: str, window_end: int, done: bool, rows: int) -> None:
        if not self.status_path:
            return
        row = pa.Table.from_pylist([{
            "range_key": self.range_key, "shard_id": shard_id, "window_end": window_end,
            "done": done, "rows": rows, "updated_at": datetime.now(UTC)}], _STATUS_SCHEMA)
        self._retry(lambda: write_deltalake(self.status_path, row, mode="append",
                                            storage_options=self.options or None),
                    f"record shard {shard_id} in status table")

    # ---------------------------------------------------------------- work
    def _retry(self, fn: Any, what: str) -> Any:
        """fn(), retried up to `max_retries` times with back-off while it fails transiently
        (`connectors.errors.is_transient`: 5xx, SlowDown, resets, timeouts); then, or on any
        other storage error, a WarehouseError naming the volume, the range and the step."""
        for attempt in range(self.max_retries + 1):
            try:
                return fn()
            except (OSError, DeltaError, pa.ArrowException, SourceError, WarehouseError) as exc:
                transient = is_transient(exc)
                if not transient or attempt == self.max_retries:
                    # a retry helps only what may pass: a storage error (denied, missing,
                    # corrupt) comes back on every run, so no "run it again" for it
                    hint = ("; run it again to resume (with a status table) or raise "
                            "max_retries" if transient else "")
                    tried = f" after {attempt} retries" if transient else ""
                    raise WarehouseError(
                        f"export of {self.what}, range [{self.a}, {self.b}) ms: "
                        f"could not {what}{tried} ({'transient' if transient else 'storage'} "
                        f"error: {exc}){hint}") from exc
                with self._lock:
                    self.result.retries += 1
                time.sleep(min(0.05 * 2 ** attempt, 5.0))
        return None

    def _crash_check(self) -> None:
        limit = os.environ.get(CRASH_ENV)
        with self._lock:
            self._written += 1
            if limit and self._written >= int(limit):
                os.kill(os.getpid(), signal.SIGKILL)

    def _throttle(self, nbytes: int) -> None:
        if not self.mbps:
            return
        with self._lock:
            self._bytes += nbytes
            ahead = self._bytes / (self.mbps * 1024 * 1024) - (time.monotonic() - self._started)
        if ahead > 0:
            time.sleep(ahead)

    def _write(self, shard: Shard, first: int, table: pa.Table) -> str:
        if self.fmt == "delta":
            app = f"volume-stream-export/{self.range_key}/{shard.shard_id}"
            if DeltaTable.is_deltatable(self.out):
                done = DeltaTable(self.out).transaction_version(app)
                if done is not None and done >= first:
                    return self.out  # committed before a crash, not yet recorded
            write_deltalake(self.out, table, mode="append", commit_properties=CommitProperties(
                app_transactions=[Transaction(app, first)]))
            return self.out
        ext = "parquet" if self.fmt == "parquet" else "csv"
        final = Path(self.out) / f"part-{shard.shard_id}-{first:020d}.{ext}"
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        final.parent.mkdir(parents=True, exist_ok=True)
        if self.fmt == "parquet":
            pq.write_table(table, tmp)
        else:
            pacsv.write_csv(table, tmp)
        os.replace(tmp, final)
        self._throttle(final.stat().st_size)
        return str(final)

    def shard(self, log: ChangeLog | None, shard: Shard, lo_v: int, hi_v: int,
              status: dict[str, tuple[int, bool]]) -> None:
        recorded, done = status.get(shard.shard_id, (-1, False))
        start = max(lo_v, shard.start_version)
        stop = min(hi_v, shard.end_version if shard.closed else hi_v)
        if done:
            with self._lock:
                self.result.windows_skipped += 1
            return
        source = self._retry(lambda: self.source(log), f"open {self.what}")
        times = CommitTimes(source)
        total_rows = 0
        w = start - start % WINDOW  # windows fixed by version number
        while w < stop:
            w_end = min(w + WINDOW, stop)
            if w_end <= recorded:
                with self._lock:
                    self.result.windows_skipped += 1
                w = w_end
                continue
            lo = max(w, start)
            rows, n_records = self._retry(lambda lo=lo, w_end=w_end: window_rows(
                shard_window(source, shard, lo, w_end), shard, times, self.a, self.b,
                self.sequence_info, self.key), f"read shard {shard.shard_id} versions {lo + 1}..{w_end}")
            if rows.num_rows:
                path = self._retry(lambda rows=rows, w=w: self._write(shard, w + 1, rows),
                                   f"write shard {shard.shard_id} window {w + 1}")
                with self._lock:
                    self.result.files.append(path)
                    self.result.rows += rows.num_rows
                    self.result.records += n_records
                    self.result.windows_written += 1
                self._crash_check()
            total_rows += rows.num_rows
            self.record(shard.shard_id, w_end, w_end >= stop, total_rows)
            w = w_end
        if stop <= start:
            self.record(shard.shard_id, stop, True, 0)


def _key_field(target: Target) -> pa.Field | list[pa.Field]:
    """The first columns of the export rows: `relative_path`, or the table's key column(s)."""
    if target.kind == "volume":
        return VOLUME_KEY
    if target.source.key == ROW_ID:
        return pa.field(ROW_ID, pa.int64())
    schema = target.source.store.schema(target.name)
    return [schema.field(k) for k in target.source.key_columns]


def _version_window(source: Any, a: int, b: int, what: str) -> tuple[int, int] | None:
    """(lo, hi): the versions (lo, hi] holding every commit in [a, b); None if none is."""
    history = source.history()
    inside = [h["version"] for h in history if a <= _ms(h["timestamp"]) < b]
    oldest = source.oldest_version()
    kept = [h for h in history if h["version"] >= oldest]
    if kept and oldest > 0 and _ms(min(kept, key=lambda h: h["version"])["timestamp"]) > a:
        raise TrimmedDataError(
            f"{what}: the export range starts at {a} ms, before the oldest kept "
            f"version {oldest} (trimmed by retention)")
    if not inside:
        return None
    return min(inside) - 1, max(inside)


class _Tables:
    """What an export task needs of a catalog, rebuilt from the warehouse folder on a Spark
    executor (the `Catalog` holds a SparkSession and does not travel)."""

    def __init__(self, root: str):
        self.warehouse = Warehouse(root)
        self._volumes = VolumeRegistry(self.warehouse, lambda: None)
        self.tables = TableStore.of_warehouse(self.warehouse)

    def volume_spec(self, volume: str) -> Any:
        return self._volumes.spec(volume)

    def directory_table(self, volume: str) -> Any:
        return self._volumes.table(self._volumes.spec(volume))


def _spark_task(args: tuple) -> dict[str, Any]:
    """One shard's export, inside a Spark task."""
    root, volume, a, b, out, fmt, status_path, seq_info, retries, mbps, shard, window, status = args
    result = ExportResult(a, b)
    _Exporter(_Tables(root), volume, a, b, out, fmt, status_path, seq_info, retries, mbps,
              result).shard(None, shard, *window, status)
    return result.__dict__


def _run_on_spark(spark: Any, exporter: _Exporter, jobs: list, window: tuple[int, int],
                  status: dict) -> None:
    e = exporter
    tasks = [(str(e.catalog.warehouse.root), e.volume, e.a, e.b, e.out, e.fmt, e.status_path,
              e.sequence_info, e.max_retries, e.mbps, shard, window, status)
             for _, shard in jobs]
    if not tasks:
        return
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))  # one task per shard
    for part in rdd.map(_spark_task).collect():
        for key in ("rows", "records", "retries", "windows_written", "windows_skipped"):
            setattr(e.result, key, getattr(e.result, key) + part[key])
        e.result.files += part["files"]


def export_changes(catalog: Any, volume: str, *, out: str | os.PathLike,
                   start_ms: int | None = None, end_ms: int | None = None,
                   date: str | None = None, format: str = "parquet",
                   status_table: str | None = None, export_sequence_info: bool = False,
                   max_retries: int = 30, parallelism: int = 1,
                   mbps: float | None = None, engine: str = "threads",
                   safety_lag_ms: int = SAFETY_LAG_MS) -> ExportResult:
    """Export the changes of volume (or change-tracked table) `volume` committed in
    [start_ms, end_ms) (or on UTC day `date`); the end must be at least `safety_lag_ms` in the
    past (a smaller lag only where no commit can be in flight).
    `engine="spark"` runs one Spark task per shard (the warehouse and `out` must be reachable
    from the executors); `"threads"` runs `parallelism` shards at once in this process."""
    if engine not in ("threads", "spark"):
        raise InvalidInputError(f"engine must be 'threads' or 'spark', not {engine!r}")
    started = time.perf_counter()
    a, b = resolve_range(start_ms, end_ms, date)
    fmt = str(format).lower()
    if fmt not in FORMATS:
        raise InvalidInputError(f"invalid format {format!r}; valid formats: {', '.join(FORMATS)}")
    if not isinstance(max_retries, int) or max_retries < 0:
        raise InvalidInputError(f"max_retries must be an integer >= 0, not {max_retries!r}")
    if not isinstance(parallelism, int) or parallelism < 1:
        raise InvalidInputError(f"parallelism must be an integer >= 1, not {parallelism!r}")
    if mbps is not None and mbps <= 0:
        raise InvalidInputError(f"mbps must be > 0, not {mbps!r}")
    check_ended(f"volume or table {volume!r}", b, safety_lag_ms)
    out = _checked_out(catalog, out, fmt)
    status_path = None
    if status_table:
        check_name("status table", status_table)
        status_path = catalog.warehouse.location.join("export_status", status_table)
    result = ExportResult(a, b)
    exporter = _Exporter(catalog, volume, a, b, out, fmt, status_path,
                         export_sequence_info, max_retries, mbps, result)
    retry = exporter._retry
    with converted(exporter.what):
        window = retry(lambda: _version_window(exporter.source(), a, b, exporter.what),
                       "read the history")
    if window is None:
        result.seconds = time.perf_counter() - started
        return result
    status = retry(exporter.status, "read the status table")

    def shards() -> list[tuple[ChangeLog, Shard]]:
        jobs = []
        for _, label in list_change_logs(catalog, volume):
            log = ChangeLog(catalog, volume, label=label)
            jobs += [(log, s) for s in log.shards() if s.start_version < window[1]
                     and (not s.closed or s.end_version > window[0])]
        return jobs

    jobs = retry(shards, "list the change log's shards")
    result.shards = len(jobs)
    if engine == "spark":
        with converted(exporter.what):
            _run_on_spark(catalog.spark, exporter, jobs, window, status)
        result.seconds = time.perf_counter() - started
        return result
    with converted(exporter.what), ThreadPoolExecutor(
            max_workers=parallelism, thread_name_prefix="volume-stream-export") as pool:
        futures = [pool.submit(exporter.shard, log, s, *window, status) for log, s in jobs]
        for f in futures:
            f.result()
    result.seconds = time.perf_counter() - started
    return result
