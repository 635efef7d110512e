"""Benchmarks of volume-stream against same-run baselines: `python -m benchmarks` (`make bench`).

Each benchmark module has `NAME`, `TITLE` and `run(ctx)`; it reports `Figure`s (our value, a
baseline measured in the same run, their ratio, the target and PASS/MISS) through `ctx.report`.
`--quick` runs the smallest sizes (used by the smoke test), `--only NAME` a subset; a JSON
summary goes to `.bench/results.json`.

    discovery    new files in a 1k/10k/100k-file local volume vs Spark's file source (and in a
                 10k-object gs:// volume vs a GCS-listing poller)
    stream_read  1k changes read from a 10k- and a 1M-row directory table
    apply        10k events applied to a 1M-row directory table vs raw delta-rs writes
    scale        10-event and 10k-event batches, change reads and optimize at 10M rows
    mor          snapshot reads after 1,000 merge-on-read batches, and after compaction
    sustain      the daemon under 20k and 2k events/s into 10M rows (group commit)
    filesize     10-event, local and spread batches at 2k/8k/32k rows per file, per table size
    pipeline     image-metadata recipe over 2k JPEGs vs a Python loop and binaryFile
    sqs          20k pending S3 event messages drained into versions vs raw SQS receive+delete
    tables       Table Stream STANDARD read at 10k/10M rows; UPDATE vs raw DeltaTable.update
    shards       1M-change log read by GetRecords (Python API, boto3) and exported vs a CDF read
    latency      file close -> record in read_stream through the daemon (local; S3+SQS on moto;
                 GCS+Pub/Sub on fake-gcs-server and pstest)
    azure        the same on Azure Blob + a Storage Queue (Azurite) vs a listing poller, and
                 10 new blobs in a 10k-blob volume (latency.azure, discovery.azure)
    backfill     refresh of a 1M-file local tree vs a raw os.scandir walk
    cli          `sql` syntax error and `run` with nothing pending without Spark; `sql --remote`
    warehouse    catalog commit and 1k-event apply on an S3 warehouse (moto) vs local;
                 a 1k-file pipeline on local-cluster[2,1,1024] vs local[2]
    inventory    backfill of 50k keys from a Parquet S3 Inventory report vs listing (moto)
    status       the status page at 100 volumes / 1k streams in Chromium (< 1 s); the CPU it
                 adds to a busy daemon (< 5%)
    keyindex     the key index at 10M rows: rebuild rate and RSS, 2k-path lookup, 2k-change apply
    interop      1k changes read vs Delta Spark's readChangeFeed at 10M rows; a 10-event
                 commit vs a Spark Delta MERGE of the same rows
    deltalog     our log replay and checkpoint writer vs delta-rs's at 5k files + 100 commits
    predicates   DELETE with a 2.5k-20k-term OR of equalities vs the same IN list (<= 5 s)

To add one: a module with `NAME`, `TITLE` and `run(ctx: Context)` that reports through
`ctx.report` (`benchmarks._report`), listed in `BENCHMARKS` below.
"""

from benchmarks import (
    apply,
    backfill,
    bench_azure,
    bench_latency,
    bench_pipeline,
    bench_sqs,
    cli,
    deltalog,
    discovery,
    filesize,
    interop,
    inventory,
    keyindex,
    mor,
    predicates,
    scale,
    shards,
    status,
    stream_read,
    sustain,
    tables,
    warehouse,
)

#: in run order: the cheap, Spark-free one first
BENCHMARKS = {m.NAME: m for m in (apply, deltalog, scale, mor, keyindex, sustain, stream_read,
                                  shards, discovery, bench_latency, bench_azure, backfill,
                                  bench_sqs, bench_pipeline, tables, predicates, cli, warehouse,
                                  inventory, filesize, status, interop)}

__all__ = ["BENCHMARKS"]
