"""inventory: backfill a volume from a Parquet S3 Inventory report vs listing it (issue 26).

moto's server runs in its own process on loopback. A bucket gets N objects (50k; `--quick`:
2k) spread over 100 folders under the volume's prefix, and a Parquet inventory report of them
(AWS's layout and format: manifest.json, manifest.checksum, one data file per 25k objects)
in a destination bucket. Each run backfills two fresh volumes on that bucket, alternately:

- ours: `Catalog.refresh(volume, inventory=<destination prefix>)`: find the newest manifest,
  check it, download and check each data file, decode it, diff, one commit;
- baseline: `Catalog.refresh(volume)`: the parallel ListObjectsV2 listing (8 workers), the same
  diff and commit.

The figure is keys/s (median of the runs); target: the report is at least as fast as the
listing on moto, where a page of 1,000 keys costs no network latency (on AWS each page is a
round trip of tens of milliseconds, and a billion keys a million of them).

    python -m benchmarks --only inventory [--quick]
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from benchmarks._context import Context
from benchmarks._report import Figure, count_label, median, timed
from benchmarks.warehouse import _ENV, _start_moto

NAME = "inventory"
TITLE = "backfill from a Parquet S3 Inventory report vs listing the bucket (moto)"
FULL, QUICK = (50_000, 3), (2_000, 1)  # keys, runs of each
PER_FILE = 25_000


def _fill(s3, bucket: str, n: int) -> None:
    def put(i: int) -> None:
        s3.put_object(Bucket=bucket, Key=f"in/d{i % 100:02d}/f{i:06d}.bin", Body=b"x" * (i % 7))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(n)))


def _report(s3, bucket: str, dest: str) -> None:
    from tests.inventory_fixtures import from_s3_listing, write_report

    objects = from_s3_listing(s3, bucket)
    write_report(lambda k, data: s3.put_object(Bucket=dest, Key=k, Body=data), source=bucket,
                 destination=dest, created=datetime.now(UTC), objects=objects, fmt="Parquet",
                 files=max(1, -(-len(objects) // PER_FILE)))


def run(ctx: Context) -> None:
    import boto3

    import volume_stream as vs

    keys, runs = QUICK if ctx.quick else FULL
    proc, endpoint = _start_moto()
    saved = {k: os.environ.get(k) for k in [*_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        bucket, dest = f"bench-{uuid.uuid4().hex[:10]}", f"inv-{uuid.uuid4().hex[:10]}"
        s3.create_bucket(Bucket=bucket)
        s3.create_bucket(Bucket=dest)
        _fill(s3, bucket, keys)
        _report(s3, bucket, dest)
        cat = vs.connect(ctx.path("inventory-wh"))
        ours, base = [], []
        for i in range(runs):
            for name, kw, into in ((f"listed{i}", {}, base),
                                   (f"inv{i}", {"inventory": f"s3://{dest}/reports/"}, ours)):
                cat.create_volume(name, f"s3://{bucket}/in/")
                seconds, m = timed(lambda name=name, kw=kw: cat.refresh(name, **kw))
                if m.inserted != keys:
                    raise RuntimeError(f"{name}: {m.inserted} rows, expected {keys}")
                into.append(keys / seconds)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        proc.wait(10)
    value, baseline = median(ours), median(base)
    ctx.report.add(Figure(
        name="inventory.backfill",
        description=f"first refresh of {count_label(keys)} keys from a Parquet inventory report",
        value=value, unit="keys/s", baseline=baseline, baseline_label="ListObjectsV2 listing",
        target=">= 1x the listing", passed=value >= baseline,
        details={"keys": keys, "runs": runs, "ours": ours, "listing": base}))
