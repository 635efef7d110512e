"""discovery: 10 new files in a local volume of N existing files (1k, 10k, 100k), next to Spark
Structured Streaming's own file source on the same folder, in the same run.

Per N:

* setup: N tiny files (sub-folders of 1000), a volume on the folder, `catalog.refresh` to
  build its directory table (timed: shown against the file source's first batch, which takes
  in the same N files).
* (a) discovery work per batch. Ours: `DirectoryTable.apply` of the 10 CREATED events (as the
  local listener emits them) plus the stream's change set via `read_stream_arrow`. The file
  source's: `latestOffset` of the micro-batch that found the 10 files, from
  `query.lastProgress["durationMs"]`. Target: ours >= 10x lower at 100k.
* (b) latency from the last file's close to its records being readable. Ours: a
  `VolumeWatcher` (local inotify listener) runs in a thread; `read_stream_arrow` is polled until
  all 10 INSERTs show. The file source's: a `binaryFile` stream on the folder
  (`recursiveFileLookup`, content never read) into a memory sink, 1 s processing-time trigger;
  polled until the micro-batch holding the 10 files is committed to the sink. Targets at 100k:
  ours below the file source's, and ours at 100k <= 1.5x ours at 1k.
* overwrite one existing file and delete another while both run: our stream reports
  UPDATE_BEFORE/UPDATE_AFTER and DELETE; the file source's sink gets nothing for them (a
  sentinel file written afterwards proves the file source listed the folder after the change).

`discovery.gcs.10k` (benchmarks/latency_gcs.py): 10 new objects in a gs:// volume of 10k on the
emulators, through the daemon, against a GCS-listing refresh poller.

Ours is measured while the file source is stopped (its listing of the whole folder every
trigger keeps a core busy); the file source is measured while our watcher also runs.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

import volume_stream as vs
from benchmarks._context import Context
from benchmarks._data import existing_path, file_event, write_files, write_tree
from benchmarks._report import Figure, count_label, median, timed

NAME = "discovery"
TITLE = "new files in a large local volume: ours vs Spark's file source"

NEW_FILES = 10
TRIGGER = "1 second"
POLL_S = 0.02
ROUND_TIMEOUT_S = 180.0
FIRST_BATCH_TIMEOUT_S = 900.0
WORK_TARGET_RATIO = 0.1  # ours >= 10x lower
SCALING_TARGET = 1.5
TARGET_SIZE = 100_000
BINARY_FILE_SCHEMA = "path string, modificationTime timestamp, length long, content binary"


@dataclass(frozen=True)
class Sizes:
    files: tuple[int, ...]
    rounds: int


FULL = Sizes(files=(1_000, 10_000, 100_000), rounds=3)
QUICK = Sizes(files=(1_000,), rounds=1)


@dataclass
class Volume:
    """One N: the folder, its volume and stream in the catalog."""

    cat: vs.Catalog
    n: int
    root: Path

    @property
    def name(self) -> str:
        return f"files_{self.n}"

    @property
    def stream(self) -> str:
        return f"s_{self.n}"

    @property
    def incoming(self) -> Path:
        return self.root / "incoming"

    def new_files(self, tag: str) -> list[str]:
        """Write NEW_FILES files named `tag_NN.txt` into `incoming/`; return their keys."""
        names = [f"{tag}_{i:02d}.txt" for i in range(NEW_FILES)]
        write_files(self.incoming, names, payload=f"{tag}\n".encode())
        return [f"incoming/{name}" for name in names]

    def reset_stream(self) -> None:
        self.cat.create_stream(self.stream, on_volume=self.name, replace=True)

    def records(self) -> dict[str, set[str]]:
        """The stream's pending records as {change type: relative paths}."""
        table = self.cat.read_stream_arrow(self.stream)
        out: dict[str, set[str]] = {}
        for kind, path in zip(table["__change_type"].to_pylist(),
                              table["relative_path"].to_pylist(), strict=True):
            out.setdefault(kind, set()).add(path)
        return out


@dataclass
class SizeResult:
    """Everything measured for one N (seconds)."""

    n: int
    refresh_s: float = 0.0
    files_s: float = 0.0
    ours_work: list[float] = field(default_factory=list)
    ours_latency: list[float] = field(default_factory=list)
    fs_first_batch_s: float = 0.0
    fs_latest_offset: list[float] = field(default_factory=list)
    fs_latency: list[float] = field(default_factory=list)
    demo: dict[str, Any] = field(default_factory=dict)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `check` every POLL_S until it is true; return the time it became true."""
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_S)
    return time.perf_counter()


# ------------------------------------------------------------------------------ ours

class WatcherThread:
    """The volume's `VolumeWatcher` stepping in a background thread until the block ends."""

    def __init__(self, cat: vs.Catalog, volume: str) -> None:
        self.watcher = cat.watcher(volume)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="bench-watcher", daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.watcher.step(timeout=0.05)
        except BaseException as exc:  # surfaced by check() / __exit__
            self._error = exc

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"watcher thread failed: {self._error!r}") from self._error

    def __enter__(self) -> WatcherThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.watcher.listener.close()
        self.check()


def our_work(vol: Volume, tag: str) -> float:
    """Seconds to apply the 10 events of freshly written files and read the change set."""
    vol.reset_stream()
    table = vol.cat.directory_table(vol.name)
    table.version()  # open the Delta table first, as a running watcher holds it open
    keys = vol.new_files(tag)
    events = [file_event(vol.root, key) for key in keys]

    def apply_and_read():
        table.apply(events)
        return vol.cat.read_stream_arrow(vol.stream)

    seconds, records = timed(apply_and_read)
    inserted = set(records.filter(pc.equal(records["__change_type"], "INSERT"))
                   ["relative_path"].to_pylist())
    if inserted != set(keys):
        raise AssertionError(f"expected {len(keys)} INSERTs, stream shows {sorted(inserted)}")
    return seconds


def our_latency(vol: Volume, watcher: WatcherThread, tag: str) -> float:
    """Seconds from the last close of 10 new files until the stream shows all 10 INSERTs."""
    vol.reset_stream()
    keys = set(vol.new_files(tag))
    closed = time.perf_counter()

    def visible() -> bool:
        watcher.check()
        return keys <= vol.records().get("INSERT", set())

    return wait_for(visible, ROUND_TIMEOUT_S, f"our stream to show {tag}") - closed


# ------------------------------------------------------------------------------ file source

class FileSource:
    """Spark's file source on the volume's folder, into a memory sink, 1 s trigger."""

    def __init__(self, ctx: Context, vol: Volume) -> None:
        self.spark = ctx.spark
        self.sink = f"file_source_{vol.n}"
        self.root = vol.root
        self.checkpoint = ctx.path(f"checkpoint-{vol.n}")
        self.query = None
        self.batches: dict[int, Any] = {}  # batchId -> progress of batches that had rows

    def __enter__(self) -> FileSource:
        df = (self.spark.readStream.format("binaryFile").schema(BINARY_FILE_SCHEMA)
              .option("recursiveFileLookup", "true").load(str(self.root))
              .select("path", "length", "modificationTime"))
        self.query = (df.writeStream.format("memory").queryName(self.sink)
                      .trigger(processingTime=TRIGGER)
                      .option("checkpointLocation", str(self.checkpoint)).start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.query.stop()

    def poll(self) -> None:
        """Record the latest progress (and catch up from recentProgress if one was missed)."""
        last = self.query.lastProgress
        if last is None:
            return
        known = max(self.batches, default=-1)
        progresses = [last]
        if last["batchId"] > known + 1:
            progresses = list(self.query.recentProgress)
        for p in progresses:
            if p["numInputRows"] > 0:
                self.batches[p["batchId"]] = p

    def last_batch(self) -> int:
        self.poll()
        return max(self.batches, default=-1)

    def rows_after(self, batch_id: int) -> int:
        if self.query.exception() is not None:
            raise RuntimeError(f"file source query failed: {self.query.exception()}")
        self.poll()
        return sum(p["numInputRows"] for b, p in self.batches.items() if b > batch_id)

    def new_batches(self, batch_id: int) -> list[Any]:
        return [p for b, p in sorted(self.batches.items()) if b > batch_id]

    def sink_count(self, where: str) -> int:
        return self.spark.sql(f"SELECT count(*) FROM {self.sink} WHERE {where}").first()[0]

    def first_batch(self, files: int) -> float:
        """Wait until the existing files are in the sink; return that batch's duration (s)."""
        wait_for(lambda: self.rows_after(-1) >= files, FIRST_BATCH_TIMEOUT_S,
                 f"the file source's first batch of {files} files")
        return sum(p["durationMs"]["triggerExecution"] for p in self.new_batches(-1)) / 1000


def fs_round(vol: Volume, fs: FileSource, tag: str) -> tuple[float, float]:
    """(latency, latestOffset seconds) of 10 new files through the file source."""
    before = fs.last_batch()
    keys = vol.new_files(tag)
    closed = time.perf_counter()
    seen = wait_for(lambda: fs.rows_after(before) >= NEW_FILES, ROUND_TIMEOUT_S,
                    f"the file source to deliver {tag}")
    batches = fs.new_batches(before)
    in_sink = fs.sink_count(f"path LIKE '%/incoming/{tag}_%'")
    if in_sink != len(keys):
        raise AssertionError(f"file source sink holds {in_sink} of the {len(keys)} files {tag}")
    latest_offset = max(p["durationMs"].get("latestOffset", 0) for p in batches) / 1000
    return seen - closed, latest_offset


# ------------------------------------------------------------------------------ overwrite/delete

def overwrite_and_delete(vol: Volume, fs: FileSource, watcher: WatcherThread) -> dict[str, Any]:
    """Overwrite one existing file and delete another; what does each side report?"""
    vol.reset_stream()
    overwritten, deleted = existing_path(1), existing_path(2)
    before = fs.last_batch()
    (vol.root / overwritten).write_bytes(b"overwritten, longer than before\n")
    (vol.root / deleted).unlink()
    sentinel = vol.new_files("sentinel")

    def ours_has_all() -> bool:
        watcher.check()
        got = vol.records()
        return (overwritten in got.get("UPDATE_BEFORE", set())
                and overwritten in got.get("UPDATE_AFTER", set())
                and deleted in got.get("DELETE", set()))

    with contextlib.suppress(TimeoutError):  # a miss is what the result then shows
        wait_for(ours_has_all, 30, "our stream to report the overwrite and the delete")
    ours = vol.records()
    # once the sentinel (written after the change) is in the sink, the file source has
    # listed the folder after the overwrite and the delete
    wait_for(lambda: fs.rows_after(before) >= len(sentinel), ROUND_TIMEOUT_S,
             "the file source to deliver the sentinel")
    # Each path had one sink row from the first batch; any further row would be the file
    # source's only way to say something about the overwrite or the delete.
    fs_overwritten = fs.sink_count(f"path LIKE '%/{overwritten}'") - 1
    fs_deleted = fs.sink_count(f"path LIKE '%/{deleted}'") - 1
    return {
        "overwritten": overwritten, "deleted": deleted,
        "ours_update": overwritten in ours.get("UPDATE_BEFORE", set())
        and overwritten in ours.get("UPDATE_AFTER", set()),
        "ours_delete": deleted in ours.get("DELETE", set()),
        "ours_records": sum(p in (overwritten, deleted) for paths in ours.values()
                            for p in paths),
        "fs_update": fs_overwritten > 0, "fs_delete": fs_deleted > 0,
        "fs_rows_for_changed": fs_overwritten + fs_deleted,
        "fs_new_rows_after_change": fs.rows_after(before), "sentinel_files": len(sentinel),
    }


# ------------------------------------------------------------------------------ per size

def setup(ctx: Context, cat: vs.Catalog, n: int, result: SizeResult) -> Volume:
    vol = Volume(cat, n, ctx.data_path(f"volume-{n}"))
    result.files_s, _ = timed(lambda: write_tree(vol.root, n))
    vol.incoming.mkdir()
    cat.create_volume(vol.name, vol.root)
    result.refresh_s, metrics = timed(lambda: cat.refresh(vol.name))
    if metrics.inserted != n:
        raise AssertionError(f"refresh inserted {metrics.inserted} rows, expected {n}")
    return vol


def measure_size(ctx: Context, cat: vs.Catalog, n: int, rounds: int) -> SizeResult:
    result = SizeResult(n)
    vol = setup(ctx, cat, n, result)
    ctx.report.say(f"{count_label(n)} files: written in {result.files_s:.1f} s, "
                   f"refresh {result.refresh_s:.2f} s")
    result.ours_work = [our_work(vol, f"work{r}") for r in range(rounds)]
    with WatcherThread(cat, vol.name) as watcher:
        result.ours_latency = [our_latency(vol, watcher, f"ours{r}") for r in range(rounds)]
        with FileSource(ctx, vol) as fs:
            existing = n + NEW_FILES * 2 * rounds
            result.fs_first_batch_s = fs.first_batch(existing)
            for r in range(rounds):
                latency, latest_offset = fs_round(vol, fs, f"fs{r}")
                result.fs_latency.append(latency)
                result.fs_latest_offset.append(latest_offset)
            result.demo = overwrite_and_delete(vol, fs, watcher)
    shutil.rmtree(vol.root, ignore_errors=True)
    return result


# ------------------------------------------------------------------------------ figures

def _at_target(n: int) -> bool:
    return n == TARGET_SIZE


def report_size(ctx: Context, r: SizeResult) -> None:
    report, label = ctx.report, count_label(r.n)
    work, fs_work = median(r.ours_work), median(r.fs_latest_offset)
    report.add(Figure(
        name=f"discovery.work.{label}",
        description=f"discovery work per batch, {NEW_FILES} new files among {label}",
        value=work, unit="s", baseline=fs_work, baseline_label="file source latestOffset",
        target=f"ratio <= {WORK_TARGET_RATIO:g} (>= 10x lower) at 100k",
        passed=(work <= WORK_TARGET_RATIO * fs_work) if _at_target(r.n) else None,
        details={"ours_runs_s": r.ours_work, "file_source_runs_s": r.fs_latest_offset}))
    latency, fs_latency = median(r.ours_latency), median(r.fs_latency)
    report.add(Figure(
        name=f"discovery.latency.{label}",
        description=f"close -> records readable, {NEW_FILES} new files among {label}",
        value=latency, unit="s", baseline=fs_latency, baseline_label="file source",
        target="ratio < 1 (below the file source) at 100k",
        passed=(latency < fs_latency) if _at_target(r.n) else None,
        details={"ours_runs_s": r.ours_latency, "file_source_runs_s": r.fs_latency}))
    report.add(Figure(
        name=f"discovery.refresh.{label}",
        description=f"initial load of {label} existing files (refresh)",
        value=r.refresh_s, unit="s", baseline=r.fs_first_batch_s,
        baseline_label="file source first batch", target="none (information)",
        details={"files_written_s": r.files_s}))
    report_demo(ctx, label, r.demo)


def report_demo(ctx: Context, label: str, demo: dict[str, Any]) -> None:
    def yn(flag: bool) -> str:
        return "yes" if flag else "no"

    ours = demo["ours_update"] and demo["ours_delete"]
    theirs = demo["fs_update"] or demo["fs_delete"]
    ctx.report.say(
        f"overwrite + delete at {label}: ours reports UPDATE_BEFORE/UPDATE_AFTER: "
        f"{yn(demo['ours_update'])}, DELETE: {yn(demo['ours_delete'])} | file source reports "
        f"the overwrite: {yn(demo['fs_update'])}, the delete: {yn(demo['fs_delete'])}")
    ctx.report.note(f"overwrite_delete_{label}", demo)
    ctx.report.add(Figure(
        name=f"discovery.overwrite_delete.{label}",
        description="change records for 1 overwrite + 1 delete (ours) vs new sink rows "
                    "for them (file source)",
        value=float(demo["ours_records"]), unit="records",
        baseline=float(demo["fs_rows_for_changed"]), baseline_label="file source",
        target="ours reports both, the file source neither",
        passed=ours and not theirs, details=demo))


def report_scaling(ctx: Context, results: list[SizeResult]) -> None:
    small, large = results[0], results[-1]
    if small is large:
        return
    ours_small, ours_large = median(small.ours_latency), median(large.ours_latency)
    real_target = small.n == 1_000 and large.n == TARGET_SIZE
    ctx.report.add(Figure(
        name=f"discovery.latency_scaling.{count_label(large.n)}",
        description=f"our latency at {count_label(large.n)} files vs at {count_label(small.n)}",
        value=ours_large, unit="s", baseline=ours_small,
        baseline_label=f"ours at {count_label(small.n)}",
        target=f"ratio <= {SCALING_TARGET:g}x",
        passed=(ours_large <= SCALING_TARGET * ours_small) if real_target else None))


def warm_up(ctx: Context, cat: vs.Catalog) -> float:
    """Run the file source once on a tiny folder, so no figure pays for a cold JVM."""
    vol = Volume(cat, 0, ctx.data_path("warm-up"))
    vol.incoming.mkdir(parents=True)
    started = time.perf_counter()
    with FileSource(ctx, vol) as fs:
        vol.new_files("warm")
        fs.first_batch(NEW_FILES)
    shutil.rmtree(vol.root, ignore_errors=True)
    return time.perf_counter() - started


def run(ctx: Context) -> None:
    sizes = QUICK if ctx.quick else FULL
    cat = vs.connect(ctx.path("discovery-warehouse"), spark=ctx.spark)
    ctx.report.say(f"Spark file source warmed up in {warm_up(ctx, cat):.1f} s (not measured)")
    ctx.report.say(f"{sizes.rounds} round(s) of {NEW_FILES} new files per size and side; "
                   f"medians shown")
    results = []
    for n in sizes.files:
        seconds, result = timed(lambda n=n: measure_size(ctx, cat, n, sizes.rounds))
        ctx.report.say(f"{count_label(n)} files measured in {seconds:.1f} s")
        report_size(ctx, result)
        results.append(result)
    report_scaling(ctx, results)
    from benchmarks.latency_gcs import run_discovery  # a gs:// volume of 10k objects

    run_discovery(ctx)
