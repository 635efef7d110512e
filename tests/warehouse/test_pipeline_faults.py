"""A pipeline writing its target to an S3 warehouse through the fault proxy (10% of requests:
500s, 503 SlowDown, connection resets, cut-off bodies), in `make test`: every request is
retried where it failed (pyarrow's S3 retry strategy on the executors' Parquet writes,
delta-rs's own retries on the Delta log, a back-off around each step), so one run commits the
whole batch: every file exactly once, none failed, instead of the batch failing on the first
reset and starting again from scratch. moto and the proxy each run in their own process."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from tests.fakes.faulty_proxy_process import FaultyProxyProcess

FILES = 40
FAULTS = ("error500", "slowdown503", "reset", "truncate")


@vs.file_udf("content string")
def content(file: vs.FileRecord):
    return {"content": file.read_text()}


@pytest.mark.soak
@pytest.mark.timeout(240)
def test_a_batch_writing_to_s3_through_faults_commits_in_one_run(s3_env, s3_bucket, tmp_path,
                                                                  s3_executors):
    spark = s3_executors
    data = tmp_path / "data"
    data.mkdir()
    for i in range(FILES):
        (data / f"f{i:03d}.txt").write_text(f"file {i}")
    uri = f"s3://{s3_bucket}/wh"
    setup = vs.connect(uri)  # moto directly
    setup.create_volume("vol", str(data))
    setup.create_stream("p", on_volume="vol")
    assert setup.refresh("vol").inserted == FILES
    with FaultyProxyProcess(s3_env, rate=0.1, faults=FAULTS, seed=22, paused=True) as proxy:
        cat = vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint},
                         spark=spark)
        pipeline = cat.pipeline("p", content, "out", max_files_per_batch=FILES,
                                parallelism=4)
        proxy.resume()
        metrics = pipeline.run_once()
        counts = proxy.counts()
    assert sum(n for k, n in counts.items() if k != "forwarded") > 0, counts
    assert (metrics.files_ok, metrics.files_failed) == (FILES, 0)
    rows = DeltaTable(f"{uri}/tables/out").to_pyarrow_table().to_pylist()
    assert Counter(r["relative_path"] for r in rows) == {f"f{i:03d}.txt": 1 for i in range(FILES)}
    assert all(r["content"] == f"file {int(r['relative_path'][1:4])}" for r in rows)
    assert setup.describe_stream("p")["pending_changes"] == 0
