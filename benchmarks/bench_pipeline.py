"""pipeline: the image-metadata recipe over 2,000 generated JPEGs, three ways, in one run.

Ours: `catalog.pipeline(stream, image_metadata, target).run_once()` on `local[2]` — the stream's
2,000 INSERTs, the recipe on Spark executors, rows committed to a Delta target, offset moved;
timed end to end after a small warm-up pipeline has started Spark's Python workers (a daemon or
a scheduled job on a warm cluster has them). Baselines, same files, same function, same run: a
plain single-process Python loop (open each file, call the recipe, write the rows to a Delta
table with `write_deltalake`), and Spark's own `binaryFile` source with the recipe as a Python
UDF writing Parquet. Target: ours >= 1.5x the loop's throughput on 2 cores; the ratio to
`binaryFile` is reported for information, and so is how many cores the run really had (two
CPU-bound processes against one, measured each round): on a machine shared with busy
processes no 2-process speed-up can beat that figure. Runs are interleaved (loop, ours,
binaryFile) for several rounds and each way's best round counts (as `timeit` does: other
processes on a shared machine only ever slow a run down); per-round ratios and medians are in
the JSON details.

    python -m benchmarks.bench_pipeline [--quick] [--keep]
    python -m benchmarks --only pipeline            # once registered in benchmarks/__init__.py
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from PIL import Image, ImageFilter

from benchmarks._context import Context, run_alone
from benchmarks._report import Figure

NAME = "pipeline"
TITLE = "image-metadata recipe over 2,000 JPEGs: pipeline vs a Python loop vs binaryFile"
TARGET = 1.5
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    images: int
    width: int
    height: int
    repeats: int
    distinct: int


FULL = Sizes(images=2_000, width=1024, height=768, repeats=4, distinct=16)
QUICK = Sizes(images=200, width=640, height=480, repeats=1, distinct=4)


def make_images(folder: Path, sizes: Sizes) -> list[Path]:
    """`sizes.images` photo-like JPEGs (gradient plus noise, with EXIF camera and date), in
    subfolders of 250; `sizes.distinct` different encodings, copied round-robin."""
    rng = random.Random(7)
    blobs = []
    for i in range(sizes.distinct):
        size = (sizes.width, sizes.height)
        base = Image.linear_gradient("L").rotate(rng.randrange(360)).resize(size)
        noise = Image.effect_noise(size, 20 + 2 * i).filter(ImageFilter.GaussianBlur(1))
        img = Image.merge("RGB", (base, noise, base.transpose(Image.Transpose.FLIP_LEFT_RIGHT)))
        exif = Image.Exif()
        exif[0x010F], exif[0x0110] = "BenchCam", f"Model {i}"
        exif.get_ifd(0x8769)[0x9003] = f"2024:0{1 + i % 9}:1{i % 10} 12:00:00"
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85, exif=exif)
        blobs.append(buf.getvalue())
    files = []
    for n in range(sizes.images):
        path = folder / f"batch{n // 250:02d}" / f"img{n:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blobs[n % len(blobs)])
        files.append(path)
    return files


def _spin(n: int) -> float:
    started = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - started


def cpu_capacity(n: int = 5_000_000) -> float:
    """How many cores this run really gets now: the same pure-Python work in one process, then
    in two at once; 2.0 on an idle 2-core machine, ~1.0 when other processes fill a core."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_spin, [1000, 1000])  # start both workers before timing
        single = pool.apply(_spin, (n,))
        double = max(pool.map(_spin, [n, n]))
    return 2 * single / double


def load_recipe() -> Any:
    from volume_stream.cli.jobs import load_udf

    return load_udf("examples/image_metadata.py:image_metadata", ROOT)


def run_loop(files: list[Path], folder: Path, udf: Any, target: Path) -> tuple[float, int]:
    """The baseline: one process, one file after another, rows to Delta at the end."""
    from deltalake import write_deltalake

    from connectors.local import LocalReader
    from volume_stream.pipelines.udf import FileRecord

    started = time.perf_counter()
    reader = LocalReader(folder)
    schema = udf.arrow_schema()
    rows, failed = [], 0
    for path in files:
        rel = path.relative_to(folder).as_posix()
        record = FileRecord(relative_path=rel, url=reader.url(rel), size=None,
                            last_modified_time=None, etag=None, change_type="INSERT",
                            commit_version=1, reader=reader)
        try:
            rows.append({"relative_path": rel, **udf(record)})
        except Exception:
            failed += 1
    out = pa.schema([pa.field("relative_path", pa.string()), *schema])
    write_deltalake(str(target), pa.Table.from_pylist(rows, schema=out), mode="append")
    return time.perf_counter() - started, len(rows)


def run_pipeline(catalog: Any, volume: str, udf: Any, name: str) -> tuple[float, Any]:
    """Ours: a fresh stream that shows the volume's files, one `run_once`."""
    catalog.create_stream(name, on_volume=volume, show_initial_rows=True)
    started = time.perf_counter()
    metrics = catalog.pipeline(name, udf, f"{name}_meta").run_once()
    return time.perf_counter() - started, metrics


def run_binary_file(spark: Any, folder: Path, udf: Any, target: Path) -> tuple[float, int]:
    """Spark's file source: `binaryFile` rows (path, content) through the recipe as a UDF."""
    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    from volume_stream.pipelines.udf import FileRecord

    fn = udf.fn
    module = sys.modules[fn.__module__]

    def extract(path, content):  # no hints: Spark would read them as a pandas UDF
        try:
            return fn(FileRecord.from_bytes(bytes(content), relative_path=path))
        except Exception:
            return None

    cloudpickle.register_pickle_by_value(module)  # the recipe is a script, not a package
    try:
        started = time.perf_counter()
        meta = F.udf(extract, udf.struct_type())
        df = (spark.read.format("binaryFile").option("pathGlobFilter", "*.jpg")
              .option("recursiveFileLookup", "true").load(str(folder)))
        (df.select("path", meta("path", "content").alias("m")).select("path", "m.*")
         .write.mode("overwrite").parquet(str(target)))
        seconds = time.perf_counter() - started
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    return seconds, spark.read.parquet(str(target)).where("width IS NOT NULL").count()


def run(ctx: Context) -> None:
    import volume_stream as vs

    sizes = QUICK if ctx.quick else FULL
    report = ctx.report
    folder = ctx.data_path("images")
    started = time.perf_counter()
    files = make_images(folder, sizes)
    mb = sum(f.stat().st_size for f in files) / 1e6
    report.say(f"{len(files)} JPEGs of {sizes.width}x{sizes.height} ({mb:.0f} MB) generated in "
               f"{time.perf_counter() - started:.1f} s (not measured)")
    udf = load_recipe()
    spark = ctx.spark
    catalog = vs.connect(ctx.path("warehouse"), spark=spark)
    catalog.create_volume("images", folder)
    catalog.refresh("images")
    warm = ctx.data_path("warmup")
    make_images(warm, Sizes(images=8, width=64, height=48, repeats=1, distinct=2))
    catalog.create_volume("warmup", warm)
    catalog.refresh("warmup")
    seconds, _ = run_pipeline(catalog, "warmup", udf, "warm")
    report.say(f"warm-up pipeline (8 files: Python workers start, Pillow loads) "
               f"{seconds:.1f} s (not measured)")

    loop_s, pipe_s, binary_s, capacity = [], [], [], []
    for i in range(sizes.repeats):
        capacity.append(cpu_capacity())
        seconds, n = run_loop(files, folder, udf, ctx.path(f"loop{i}"))
        assert n == len(files), f"the loop extracted {n} of {len(files)} images"
        loop_s.append(seconds)
        seconds, metrics = run_pipeline(catalog, "images", udf, f"run{i}")
        assert metrics.files_ok == len(files), metrics
        pipe_s.append(seconds)
        seconds, n = run_binary_file(spark, folder, udf, ctx.path(f"binary{i}"))
        assert n == len(files), f"binaryFile extracted {n} of {len(files)} images"
        binary_s.append(seconds)
        report.say(f"round {i + 1}: loop {loop_s[-1]:.2f} s, pipeline {pipe_s[-1]:.2f} s, "
                   f"binaryFile {binary_s[-1]:.2f} s; cores available {capacity[-1]:.2f}, "
                   f"load average {os.getloadavg()[0]:.1f}")
    loop, pipe, binary = min(loop_s), min(pipe_s), min(binary_s)
    n = len(files)
    details = {"images": n, "megabytes": round(mb, 1), "pipeline_runs_s": pipe_s,
               "loop_runs_s": loop_s, "binary_file_runs_s": binary_s,
               "median_ratio_vs_loop": statistics.median(loop_s) / statistics.median(pipe_s),
               "round_ratios_vs_loop": [a / b for a, b in zip(loop_s, pipe_s, strict=True)],
               "cores_available_per_round": capacity,
               "spark_master": spark.sparkContext.master}
    report.add(Figure(f"{NAME}.vs_loop", f"{n} JPEGs {sizes.width}x{sizes.height}, image-metadata "
                      f"recipe, stream -> Delta target, best of {sizes.repeats}", n / pipe,
                      "files/s", n / loop, "single-process Python loop",
                      f">= {TARGET}x the loop's throughput", passed=(loop / pipe) >= TARGET,
                      details=details))
    report.add(Figure(f"{NAME}.vs_binary_file", "same run, same function as a Python UDF over "
                      "Spark's binaryFile source", n / pipe, "files/s", n / binary,
                      "Spark binaryFile + UDF", "none (information)", passed=None,
                      details=details))
    best = capacity[loop_s.index(loop)]
    report.add(Figure(f"{NAME}.cores_available", "two CPU-bound Python processes vs one, "
                      "measured in the round of the best loop (other processes share the CPUs)",
                      best, "cores", 1.0, "one process", "none (information: the most any "
                      "2-process speed-up can be now)", passed=None, details=details))
    report.note("pipeline", details)


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.bench_pipeline [--quick] [--keep]`: this benchmark alone."""
    import logging

    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_pipeline",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 smaller images, one round")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folders")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start")
    started = time.perf_counter()
    status = run_alone(NAME, TITLE, run, quick=args.quick, keep=args.keep)
    print(f"took {time.perf_counter() - started:.1f} s; load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    return status


if __name__ == "__main__":
    sys.exit(main())
