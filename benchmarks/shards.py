"""shards: GetRecords throughput over a change log, and the DataX-style export.

A volume with a 4-shard change log gets its directory table from a synthetic template (1M
inserts over 5 commits; `--quick`: 20k in one) plus one commit overwriting and one deleting
1% of the files, so the log holds ~1.02M records (INSERT, MODIFY, REMOVE). Timed, once each
(a full read is long enough to be stable):

- `shards.python_api`: every record of every shard read through `ChangeLog.get_records`
  (Limit 1000 pages), each record's sequence number, key and image looked at (images are
  made lazily, so a read that ignored them would not pay for them), records/s; baseline: a plain read of the same change data feed
  (`DirectoryTable.changes` over all versions), CDF rows/s. Target: at least 0.2x.
- `shards.arrow`: every record of every shard read through `ChangeLog.get_records_arrow`
  (Limit 1000 pages, Arrow tables: keys and images as struct columns), records/s; baseline:
  the plain CDF read's rows/s. Target: at least 0.5x.
- `shards.boto3`: the same through the HTTP endpoint with boto3's `dynamodbstreams` client
  (JSON 1.0 over loopback, typed attribute maps); baseline: the Python API's rate. Target:
  at least 0.1x (it serialises every record to JSON and parses it again in botocore).
- `shards.export`: `export_changes` of the whole range to Parquet (one row per column
  version, ~4 rows per record) vs the plain CDF read, seconds. Target: at most 15x.
"""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
from botocore.config import Config

import volume_stream as vs
from benchmarks._context import Context
from benchmarks._data import T0, clone_table, created_events, removed_events, table_template
from benchmarks._report import Figure, count_label, timed
from volume_stream.serve import ShardApiServer

NAME = "shards"
TITLE = "GetRecords throughput (Python API, Arrow, boto3) and DataX export vs plain CDF reads"
SHARDS = 4
MIN_API_RATIO = 0.2
MIN_BOTO_RATIO = 0.1
MIN_ARROW_RATIO = 0.5
MAX_EXPORT_RATIO = 15.0


def _prepare(ctx: Context, rows: int) -> vs.Catalog:
    cat = vs.connect(ctx.path(f"shards-wh-{rows}"))
    location = ctx.data_path(f"shards-{rows}")
    location.mkdir(parents=True, exist_ok=True)
    cat.create_volume("bench", location, shards=SHARDS)
    table = cat.directory_table("bench")
    clone_table(table_template(ctx, rows), Path(table.root), base_url=table.base_url)
    changed = max(1, rows // 100)
    when = T0 + timedelta(hours=1)
    table = cat.directory_table("bench")
    table.apply(created_events(range(0, rows, rows // changed), when=when, size=7))
    table.apply(removed_events(range(1, rows, rows // changed), when=when))
    return cat


def _read_api(log: vs.shards.ChangeLog) -> int:
    n = 0
    for shard in log.shards():
        it = log.iterator(shard.shard_id, "TRIM_HORIZON")
        while it:
            page = log.get_records(it, 1000)
            for r in page.records:  # what a consumer looks at
                if r.sequence_number and r.key and (r.new_image or r.old_image):
                    n += 1
            if not page.records:
                break
            it = page.next_iterator
    return n


def _read_arrow(log: vs.shards.ChangeLog) -> int:
    n = 0
    for shard in log.shards():
        it = log.iterator(shard.shard_id, "TRIM_HORIZON")
        while it:
            page, it = log.get_records_arrow(it, 1000)
            n += page.num_rows
            if not page.num_rows:
                break
    return n


def _read_boto(url: str) -> int:
    c = boto3.client("dynamodbstreams", endpoint_url=url, region_name="us-east-1",
                     aws_access_key_id="bench", aws_secret_access_key="bench",
                     config=Config(retries={"max_attempts": 1}, read_timeout=300))
    arn = c.list_streams(TableName="bench")["Streams"][0]["StreamArn"]
    n = 0
    for shard in c.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        it = c.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while it:
            page = c.get_records(ShardIterator=it, Limit=1000)
            n += len(page["Records"])
            if not page["Records"]:
                break
            it = page.get("NextShardIterator")
    return n


def run(ctx: Context) -> None:
    rows = 20_000 if ctx.quick else 1_000_000
    cat = _prepare(ctx, rows)
    table = cat.directory_table("bench")
    latest = table.version()
    cpu0 = time.process_time()
    cdf_s, cdf = timed(lambda: table.changes(0, latest))
    cpu1 = time.process_time()
    cdf_rate = cdf.num_rows / cdf_s
    api_s, n_api = timed(lambda: _read_api(cat.change_log("bench")))
    cpu2 = time.process_time()
    api_rate = n_api / api_s
    label = count_label(n_api)
    ctx.report.add(Figure(
        f"shards.python_api.{label}", f"{label} records of {SHARDS} shards via get_records",
        api_rate, "records/s", cdf_rate, "plain CDF read", f">= {MIN_API_RATIO}x",
        passed=api_rate >= MIN_API_RATIO * cdf_rate,
        details={"records": n_api, "cdf_rows": cdf.num_rows, "seconds": api_s,
                 "cdf_seconds": cdf_s,
                 # CPU seconds of the process (all threads): on a busy machine the read's one
                 # Python thread gets a smaller share than delta-rs's reader threads, so the
                 # CPU ratio shows the cost apart from the load (information, not the target)
                 "cpu_seconds": cpu2 - cpu1, "cdf_cpu_seconds": cpu1 - cpu0,
                 "cpu_rate_ratio": round((n_api / max(cpu2 - cpu1, 1e-9))
                                         / (cdf.num_rows / max(cpu1 - cpu0, 1e-9)), 3)}))
    arrow_s, n_arrow = timed(lambda: _read_arrow(cat.change_log("bench")))
    arrow_rate = n_arrow / arrow_s
    ctx.report.add(Figure(
        f"shards.arrow.{label}", f"{label} records of {SHARDS} shards via get_records_arrow",
        arrow_rate, "records/s", cdf_rate, "plain CDF read", f">= {MIN_ARROW_RATIO}x",
        passed=n_arrow == n_api and arrow_rate >= MIN_ARROW_RATIO * cdf_rate,
        details={"records": n_arrow, "seconds": arrow_s, "cdf_seconds": cdf_s}))
    with ShardApiServer(cat, "127.0.0.1", 0) as server:
        boto_s, n_boto = timed(lambda: _read_boto(server.url))
    boto_rate = n_boto / boto_s
    ctx.report.add(Figure(
        f"shards.boto3.{label}", f"{label} records via boto3 GetRecords over HTTP", boto_rate,
        "records/s", api_rate, "Python API", f">= {MIN_BOTO_RATIO}x",
        passed=n_boto == n_api and boto_rate >= MIN_BOTO_RATIO * api_rate,
        details={"records": n_boto, "seconds": boto_s}))
    out = ctx.path("shards-export")
    end = int(datetime.now(UTC).timestamp() * 1000)
    export_s, res = timed(lambda: cat.export_changes("bench", start_ms=0, end_ms=end, out=out,
                                                     parallelism=2, safety_lag_ms=0))
    ctx.report.add(Figure(
        f"shards.export.{label}", f"export {label} records ({count_label(res.rows)} rows) to "
        f"Parquet", export_s, "s", cdf_s, "plain CDF read", f"<= {MAX_EXPORT_RATIO}x",
        passed=res.records == n_api and export_s <= MAX_EXPORT_RATIO * cdf_s,
        details=res.as_dict()))
    if not ctx.keep:
        shutil.rmtree(out, ignore_errors=True)
