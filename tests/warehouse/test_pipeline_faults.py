"""A pipeline writing its target to an S3 warehouse through the fault proxy (10% of requests:
500s, 503 SlowDown, connection resets, cut-off bodies): every request is retried where it
failed (pyarrow's S3 retry strategy on the executors' Parquet writes, delta-rs's own retries on
the Delta log, a back-off around each step), so one run commits the whole batch: every file
exactly once, none failed, each committed data file readable, instead of the batch failing on
the first reset and starting again from scratch. 8 files in `make test`, 40 in `make soak`.
The executors have the AWS environment (`s3_executors`), as a cluster's have a role; without
it their writes go out unsigned, and the last test shows that a file that does not read
back as written is then never committed. moto and the proxy each run in their own process.

Two uploads a store makes hard (issue 34): a store that answers part uploads 10 s late (the
AWS SDK for C++'s 3 s default read timeout, curl's low-speed window, failed every attempt of
every upload with "curlCode: 28, Timeout was reached"), and a part upload failing more often
than the SDK tries one request (the task writes its files again instead of failing the
batch)."""

from __future__ import annotations

from collections import Counter

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from directory_table.storage import S3_MAX_ATTEMPTS
from tests.fakes.faulty_proxy_process import FaultyProxyProcess
from tests.s3_warehouse_fixtures import s3_client

FAULTS = ("error500", "slowdown503", "reset", "truncate")


@vs.file_udf("content string")
def content(file: vs.FileRecord):
    return {"content": file.read_text()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("files", [8, pytest.param(40, marks=pytest.mark.soak)])
def test_a_batch_writing_to_s3_through_faults_commits_in_one_run(s3_env, s3_bucket, tmp_path,
                                                                  s3_executors, files):
    spark = s3_executors
    data = tmp_path / "data"
    data.mkdir()
    for i in range(files):
        (data / f"f{i:03d}.txt").write_text(f"file {i}")
    uri = f"s3://{s3_bucket}/wh"
    setup = vs.connect(uri)  # moto directly
    setup.create_volume("vol", str(data))
    setup.create_stream("p", on_volume="vol")
    assert setup.refresh("vol").inserted == files
    with FaultyProxyProcess(s3_env, rate=0.1, faults=FAULTS, seed=22, paused=True) as proxy:
        cat = vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint},
                         spark=spark)
        pipeline = cat.pipeline("p", content, "out", max_files_per_batch=files,
                                parallelism=4)
        proxy.resume()
        metrics = pipeline.run_once()
        counts = proxy.counts()
    assert sum(n for k, n in counts.items() if k != "forwarded") > 0, counts
    assert (metrics.files_ok, metrics.files_failed) == (files, 0)
    rows = DeltaTable(f"{uri}/tables/out").to_pyarrow_table().to_pylist()
    assert Counter(r["relative_path"] for r in rows) == {f"f{i:03d}.txt": 1 for i in range(files)}
    assert all(r["content"] == f"file {int(r['relative_path'][1:4])}" for r in rows)
    assert setup.describe_stream("p")["pending_changes"] == 0


def _files(tmp_path, n: int):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(n):
        (data / f"f{i:03d}.txt").write_text(f"file {i}")
    return data


def _committed_once(uri: str, files: int) -> bool:
    rows = DeltaTable(f"{uri}/tables/out").to_pyarrow_table().to_pylist()
    return Counter(r["relative_path"] for r in rows) == {
        f"f{i:03d}.txt": 1 for i in range(files)}


@pytest.mark.timeout(400)
def test_a_store_answering_part_uploads_late_is_waited_for(s3_env, s3_bucket, tmp_path,
                                                            s3_executors):
    # every part upload's answer comes 10 s late; the SDK's default gave up on each attempt
    # after ~8 s (3 s of no bytes once the body's bytes left its speed window): no upload of
    # the batch could ever finish, so it never committed
    uri = f"s3://{s3_bucket}/wh"
    setup = vs.connect(uri)
    setup.create_volume("vol", str(_files(tmp_path, 4)))
    setup.create_stream("p", on_volume="vol")
    setup.refresh("vol")
    with FaultyProxyProcess(s3_env, rate=0.0, faults=FAULTS, hold_uploads_s=10.0) as proxy:
        cat = vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint},
                         spark=s3_executors)
        metrics = cat.pipeline("p", content, "out", parallelism=2).run_once()
    assert (metrics.files_ok, metrics.files_failed) == (4, 0)
    assert _committed_once(uri, 4)
    assert setup.describe_stream("p")["pending_changes"] == 0


@pytest.mark.timeout(400)
def test_an_upload_failing_more_often_than_its_retries_is_written_again(
        s3_env, s3_bucket, tmp_path, s3_executors):
    # the next part uploads all answer 500, more of them than the SDK tries one request: the
    # task's write fails, and the task writes its files again instead of failing the batch
    uri = f"s3://{s3_bucket}/wh"
    setup = vs.connect(uri)
    setup.create_volume("vol", str(_files(tmp_path, 4)))
    setup.create_stream("p", on_volume="vol")
    setup.refresh("vol")
    with FaultyProxyProcess(s3_env, rate=0.0, faults=FAULTS) as proxy:
        cat = vs.connect(uri, storage_options={"AWS_ENDPOINT_URL": proxy.endpoint},
                         spark=s3_executors)
        pipeline = cat.pipeline("p", content, "out", parallelism=1)
        proxy.fail_uploads(S3_MAX_ATTEMPTS + 2)
        metrics = pipeline.run_once()
        counts = proxy.counts()
    assert counts["upload_failed"] == S3_MAX_ATTEMPTS + 2
    assert (metrics.files_ok, metrics.files_failed) == (4, 0)
    assert _committed_once(uri, 4)
    assert setup.describe_stream("p")["pending_changes"] == 0


@pytest.mark.timeout(180)
def test_a_data_file_that_does_not_read_back_as_written_is_never_committed(
        s3_env, s3_bucket, tmp_path, spark, monkeypatch):
    # executors without credentials: pyarrow sends its uploads unsigned, as aws-chunked bodies
    # with a checksum trailer, and moto (which decodes them only when a signature header says
    # so) keeps that framing in the object, as some S3-compatible stores do: every data file
    # is a few bytes longer than written and has no Parquet footer at its end. Each is found
    # out before the commit, rewritten, still wrong, and the batch fails with nothing committed
    for name, value in {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": s3_env,
                        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
                        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}.items():
        monkeypatch.setitem(spark.sparkContext.environment, name, value)
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        (data / f"f{i:03d}.txt").write_text(f"file {i}")
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri, spark=spark)
    cat.create_volume("vol", str(data))
    cat.create_stream("p", on_volume="vol")
    cat.refresh("vol")
    pipeline = cat.pipeline("p", content, "out", parallelism=2, max_attempts=2,
                            retry_backoff_s=0.01)
    with pytest.raises(Exception, match="does not read back as written"):
        pipeline.run_once()
    assert DeltaTable(f"{uri}/tables/out").get_add_actions().num_rows == 0
    listed = s3_client(s3_env).list_objects_v2(Bucket=s3_bucket, Prefix="wh/tables/out/")
    assert [o["Key"] for o in listed["Contents"] if o["Key"].endswith(".parquet")] == []
    assert cat.describe_stream("p")["pending_changes"] == 4
