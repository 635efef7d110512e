"""warehouse: the cost of an object-store warehouse, and of a real (local) Spark cluster.

- `warehouse.catalog_commit`: one catalog compare-and-swap (`Warehouse.mutate`, create a
  stream entry) on an S3 warehouse against moto's server in its own process on loopback, vs
  the same on a local warehouse. Target: <= 30x local (every commit is a few round trips:
  read the log, write one object with If-None-Match).
- `warehouse.apply_1k`: `DirectoryTable.apply` of 1k new files on S3 (moto) vs local.
  Target: <= 10x local.
- `warehouse.pipeline_cluster` (full mode only: two Spark applications take a minute to
  start): one `run_once` of a pipeline over 1k small local files on `local-cluster[2,1,1024]`
  (separate executor JVMs) vs `local[2]`, each in its own process, timed inside the process
  after Spark is up. Target: <= 3x local[2].

moto answers on loopback with no network latency and its own CPU cost on this machine, so the
S3 ratios say how many round trips a commit takes rather than how fast real S3 is.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._context import Context
from benchmarks._report import Figure, median, timed
from connectors.events import FileEvent

NAME = "warehouse"
TITLE = "S3 warehouse (moto) vs local, local-cluster vs local[2]"
ROOT = Path(__file__).resolve().parents[1]

_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
        "AWS_EC2_METADATA_DISABLED": "true"}

_PIPELINE = r'''
import json, sys, time
from pathlib import Path
import volume_stream as vs
from volume_stream._spark import get_spark

@vs.file_udf("n int")
def size_of(file: vs.FileRecord):
    return {"n": len(file.read_bytes())}

master, data, wh = sys.argv[1], sys.argv[2], sys.argv[3]
spark = get_spark(master=master)
spark.range(4).count()  # executors up before the clock starts
cat = vs.connect(wh, spark=spark)
cat.create_volume("v", data)
cat.create_stream("s", on_volume="v", show_initial_rows=True)
cat.refresh("v")
t0 = time.perf_counter()
m = cat.pipeline("s", size_of, "sizes").run_once()
print(json.dumps({"seconds": time.perf_counter() - t0, "files_ok": m.files_ok}), flush=True)
spark.stop()
'''


def _start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).read()
            return proc, endpoint
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto's server did not start") from None
            time.sleep(0.1)


def _events(n: int, prefix: str) -> list[FileEvent]:
    now = datetime.now(UTC)
    return [FileEvent.created(f"{prefix}/{i:05d}.bin", size=i + 1, last_modified_time=now)
            for i in range(n)]


def _measure(ctx: Context, where: str, options: dict[str, str], repeats: int, n_events: int
             ) -> tuple[float, float]:
    from volume_stream.warehouse import Warehouse
    from volume_stream.warehouse.store import STREAM

    wh = Warehouse(where, options)
    commits = []
    for i in range(repeats):
        def change(state, i=i):
            state[(STREAM, f"bench_{i}")] = {"n": i}
        commits.append(timed(lambda c=change: wh.mutate(c))[0])
    from directory_table import DirectoryTable

    applies = []
    for i in range(max(1, repeats // 3)):
        table = DirectoryTable.create(wh.volume_root("bench", f"{i}"), "file:///bench/",
                                      storage_options=wh.storage_options)
        events = _events(n_events, f"r{i}")
        applies.append(timed(lambda t=table, e=events: t.apply(e))[0])
    return median(commits), median(applies)


def _pipeline(ctx: Context, master: str, data: Path) -> float:
    wh = ctx.path(f"wh-pipeline-{uuid.uuid4().hex[:6]}")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _PIPELINE, master, str(data), str(wh)],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline on {master} failed: {proc.stderr[-2000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
    return json.loads(line)["seconds"]


def run(ctx: Context) -> None:
    import boto3

    report = ctx.report
    repeats, n_events = (6, 1000) if ctx.quick else (15, 1000)
    proc, endpoint = _start_moto()
    saved = {k: os.environ.get(k) for k in [*_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        s3_commit, s3_apply = _measure(ctx, f"s3://{bucket}/wh", {}, repeats, n_events)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(10)
    local_commit, local_apply = _measure(ctx, str(ctx.path("wh-local")), {}, repeats, n_events)
    for name, desc, ours, base, limit in (
            ("catalog_commit", "one catalog compare-and-swap", s3_commit, local_commit, 30),
            ("apply_1k", f"apply of {n_events} new files to a directory table", s3_apply,
             local_apply, 10)):
        report.add(Figure(
            name=f"warehouse.{name}", description=f"{desc}, S3 warehouse on moto",
            value=ours, unit="s", baseline=base, baseline_label="local warehouse",
            target=f"<= {limit}x local", passed=ours <= limit * base,
            details={"repeats": repeats}))
    if ctx.quick:
        report.note("pipeline_cluster", None, "pipeline on local-cluster vs local[2]: full "
                    "mode only (two Spark applications take a minute to start)")
        return
    data = ctx.data_path("cluster-files")
    data.mkdir(parents=True)
    for i in range(1000):
        (data / f"f{i:04d}.txt").write_bytes(b"x" * (i % 97 + 1))
    cluster = _pipeline(ctx, "local-cluster[2,1,1024]", data)
    local = _pipeline(ctx, "local[2]", data)
    report.add(Figure(
        name="warehouse.pipeline_cluster",
        description="run_once of a pipeline over 1k files on local-cluster[2,1,1024]",
        value=cluster, unit="s", baseline=local, baseline_label="local[2]",
        target="<= 3x local[2]", passed=cluster <= 3 * local))
