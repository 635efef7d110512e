"""inventory: backfill a volume of 10M keys from an S3 Inventory report vs listing it (issue 26).

moto's server runs in its own process on loopback. Two reports of the same 10M keys (`--quick`:
200k), in AWS's layout and formats (manifest.json, manifest.checksum, data files of 25k keys:
Parquet, and gzipped CSV with URL-encoded keys), are written to a destination bucket; the data
files are built once, column by column, and kept under `.bench/inventory/`. Keys look like
`in/d07/f 00012345.bin` (100 folders; the space is a `+` in the CSV). Each report backfills a
fresh volume in a process of its own (`Catalog.refresh(volume, inventory=<prefix>)`: find the
newest manifest, check it, download and check each data file, decode, diff, commit), timed
around the call; the peak RSS is that process's (and its children's, if any).

Baseline, same run: the listing a backfill would need without a report. A bucket gets 100k
objects (`--quick`: 5k; put through moto's backend before its server starts answering) and a
volume on it is refreshed by its parallel ListObjectsV2 listing (8 workers) over HTTP, also in
a process of its own; its keys/s scaled to 10M keys is what listing the
bucket would take. moto answers a page of 1,000 keys with no network latency, so this
baseline flatters listing (on AWS each page is a round trip of tens of milliseconds, and a
billion keys a million of them).

Targets (issue 26): the backfill of 10M keys takes at most 60 s with a peak RSS under 2 GiB,
and runs at least 10x as fast as the listing. At `--quick` size the time target is not applied
(a fixed cost dominates 200k keys); the RSS and ratio targets are.

    python -m benchmarks --only inventory [--quick]
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from benchmarks._context import Context
from benchmarks._report import Figure, count_label
from benchmarks.warehouse import _ENV

NAME = "inventory"
TITLE = "backfill 10M keys from an S3 Inventory report (Parquet, CSV.gz) vs listing (moto)"
FULL, QUICK = (10_000_000, 100_000), (200_000, 5_000)  # report keys, listed keys
PER_FILE = 25_000
TARGET_SECONDS, TARGET_RSS_GIB, TARGET_RATIO = 60.0, 2.0, 10.0
CACHE = Path(".bench/inventory/v2")  # v2: CSV times as AWS writes them (v1 had ".000.000Z")
SOURCE, DEST, LISTED = "bench-source", "bench-inventory", "bench-listed"
WHEN = datetime(2026, 1, 1, tzinfo=UTC)

#: the child process: one refresh, timed around the call; prints one JSON line
_CHILD = r'''
import json, resource, sys, time
import volume_stream as vs
where, location, kw = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cat = vs.connect(where)
cat.create_volume("v", location)
started = time.perf_counter()
m = cat.refresh("v", **kw)
seconds = time.perf_counter() - started
gib = lambda who: resource.getrusage(who).ru_maxrss / 2**20
print(json.dumps({"seconds": seconds, "inserted": m.inserted, "listed": m.listed,
                  "rss_gib": gib(resource.RUSAGE_SELF) + gib(resource.RUSAGE_CHILDREN)}))
'''


def _keys(start: int, stop: int) -> pa.Array:
    i = np.arange(start, stop)
    folder = pc.utf8_lpad(pa.array(i % 100).cast(pa.string()), 2, "0")
    name = pc.utf8_lpad(pa.array(i).cast(pa.string()), 8, "0")
    return pc.binary_join_element_wise("in/d", folder, "/f ", name, ".bin", "")


def _columns(start: int, stop: int) -> dict[str, pa.Array]:
    n = stop - start
    i = np.arange(start, stop)
    return {
        "bucket": pa.array(np.full(n, SOURCE, dtype=object), pa.string()),
        "key": _keys(start, stop),
        "size": pa.array(i % 100_000, pa.int64()),
        "last_modified_date": pa.array(
            np.datetime64(WHEN.replace(tzinfo=None), "ms") + (i % 86_400_000).astype(
                "timedelta64[ms]"), pa.timestamp("ms", tz="UTC")),
        "e_tag": pc.utf8_lpad(pa.array(i).cast(pa.string()), 32, "e"),
        "storage_class": pa.array(np.full(n, "STANDARD", dtype=object), pa.string()),
    }


def _data_file(fmt: str, start: int, stop: int) -> bytes:
    table = pa.table(_columns(start, stop))
    out = io.BytesIO()
    if fmt == "Parquet":
        pq.write_table(table, out)
        return out.getvalue()
    # AWS's CSV: no header, every field quoted, keys URL-encoded (form style: ' ' is '+'),
    # times 'YYYY-MM-DDTHH:MM:SS.fffZ'
    text = pa.table({
        "Bucket": table["bucket"],
        "Key": pc.replace_substring(table["key"], " ", "+"),
        "Size": table["size"].cast(pa.string()),
        # %S of a timestamp in ms prints the milliseconds too ("15.001")
        "LastModifiedDate": pc.binary_join_element_wise(
            pc.strftime(table["last_modified_date"], "%Y-%m-%dT%H:%M:%S"), "Z", ""),
        "ETag": table["e_tag"],
        "StorageClass": table["storage_class"],
    })
    pcsv.write_csv(text, out, pcsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    return gzip.compress(out.getvalue(), compresslevel=6)


def _report_files(fmt: str, keys: int, log) -> list[Path]:
    """The report's data files, built once into `.bench/inventory/<fmt>-<keys>/`."""
    folder = CACHE / f"{fmt.lower()}-{keys}"
    ext = "parquet" if fmt == "Parquet" else "csv.gz"
    count = -(-keys // PER_FILE)
    files = [folder / f"part-{i:05d}.{ext}" for i in range(count)]
    if all(f.exists() for f in files):
        return files
    log(f"building the {fmt} report of {count_label(keys)} keys under {folder} (once)")
    folder.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(files):
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(_data_file(fmt, i * PER_FILE, min(keys, (i + 1) * PER_FILE)))
            tmp.rename(path)
    return files


def _upload_report(s3, prefix: str, fmt: str, files: list[Path], created: datetime) -> None:
    """The report in AWS's layout under `prefix` of the destination bucket."""
    from tests.inventory_fixtures import S3_CSV, md5, write_manifest

    base = f"{prefix}reports/{SOURCE}/daily"

    def put(path: Path) -> dict:
        data = path.read_bytes()
        key = f"{base}/data/{path.name}"
        s3.put_object(Bucket=DEST, Key=key, Body=data)
        return {"key": key, "size": len(data), "MD5checksum": md5(data)}

    with ThreadPoolExecutor(8) as pool:
        listed = list(pool.map(put, files))
    write_manifest(lambda key, body: s3.put_object(Bucket=DEST, Key=key, Body=body), base,
                   source=SOURCE, destination=DEST, created=created, fmt=fmt,
                   fields=S3_CSV, files=listed)


#: moto's server on loopback, in a process of its own, with `LISTED` holding N objects put
#: through moto's own S3 backend before it answers (100k PUTs over HTTP took over 10 minutes)
_MOTO = r'''
import socket, sys, time
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer
from benchmarks.inventory import LISTED, _keys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
backend = s3_backends["123456789012"]["global"]
backend.create_bucket(LISTED, "us-east-1")
for key in _keys(0, int(sys.argv[1])).to_pylist():
    backend.put_object(LISTED, key, b"x")
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
print(f"http://127.0.0.1:{port}", flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
server.stop()
'''


def _start_moto(listed: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", _MOTO, str(listed)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # its request log
    endpoint = proc.stdout.readline().strip()
    if not endpoint.startswith("http://"):
        proc.kill()
        raise RuntimeError("moto's server did not start")
    return proc, endpoint


def _refresh(ctx: Context, name: str, location: str, **kw) -> dict:
    """One refresh in a process of its own (see `_CHILD`)."""
    where = str(ctx.path(f"inventory-{name}"))
    done = subprocess.run([sys.executable, "-c", _CHILD, where, location, json.dumps(kw)],
                          capture_output=True, text=True, env=os.environ.copy(), check=False)
    if done.returncode:
        raise RuntimeError(f"refresh {name} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(ctx: Context) -> None:
    import boto3

    keys, listed_keys = QUICK if ctx.quick else FULL
    reports = {fmt: _report_files(fmt, keys, ctx.report.say) for fmt in ("Parquet", "CSV")}
    proc, endpoint = _start_moto(listed_keys)
    saved = {k: os.environ.get(k) for k in [*_ENV, "AWS_ENDPOINT_URL"]}
    os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        for bucket in (SOURCE, DEST):
            s3.create_bucket(Bucket=bucket)
        listing = _refresh(ctx, "listed", f"s3://{LISTED}/in/")
        if listing["inserted"] != listed_keys:
            raise RuntimeError(f"listing: {listing['inserted']} rows, expected {listed_keys}")
        results = {}
        created = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)
        for fmt, files in reports.items():
            prefix = f"{fmt.lower()}/"  # one destination prefix per format
            _upload_report(s3, prefix, fmt, files, created)
            results[fmt] = _refresh(ctx, fmt.lower(), f"s3://{SOURCE}/in/",
                                    inventory=f"s3://{DEST}/{prefix}reports/")
            if results[fmt]["inserted"] != keys:
                raise RuntimeError(f"{fmt}: {results[fmt]['inserted']} rows, expected {keys}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.stdin.close()
        proc.wait(30)
    listing_rate = listed_keys / listing["seconds"]
    for fmt, got in results.items():
        rate = keys / got["seconds"]
        fast = rate >= TARGET_RATIO * listing_rate
        small = got["rss_gib"] < TARGET_RSS_GIB
        quick_enough = ctx.quick or got["seconds"] <= TARGET_SECONDS
        ctx.report.add(Figure(
            name=f"inventory.{fmt.lower()}",
            description=(f"backfill of {count_label(keys)} keys from a {fmt} report: "
                         f"{got['seconds']:.1f} s, peak RSS {got['rss_gib']:.2f} GiB"),
            value=rate, unit="keys/s", baseline=listing_rate,
            baseline_label=f"ListObjectsV2 listing of {count_label(listed_keys)} keys",
            target=(f">= {TARGET_RATIO:g}x the listing, peak RSS < {TARGET_RSS_GIB:g} GiB"
                    + ("" if ctx.quick else f", <= {TARGET_SECONDS:g} s")),
            passed=fast and small and quick_enough,
            details={"keys": keys, "seconds": got["seconds"], "peak_rss_gib": got["rss_gib"],
                     "listing_keys": listed_keys, "listing_seconds": listing["seconds"],
                     "listing_seconds_scaled": keys / listing_rate,
                     "listing_peak_rss_gib": listing["rss_gib"]}))
