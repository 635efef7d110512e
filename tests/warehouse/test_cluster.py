"""On a real (local) Spark cluster: `spark-submit --master local-cluster[2,1,1024]` (separate
executor JVMs and Python workers) with an S3 warehouse on moto (own process) and a volume on
S3 fed by SQS. The executors read the volume's files and write the target's Parquet files to
the object store themselves; the driver commits. Credentials and the endpoint reach every
process through the environment only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from tests.aws_fixtures import make_rig
from tests.s3_warehouse_fixtures import child_env, s3_client

ROOT = Path(__file__).resolve().parents[2]
MASTER = "local-cluster[2,1,1024]"


def spark_submit(script: Path, args: list[str], endpoint: str, cwd: Path,
                 ) -> subprocess.CompletedProcess:
    bin_dir = Path(sys.executable).parent
    env = child_env(endpoint)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=str(ROOT),
               JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1")
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return subprocess.run(
        [str(bin_dir / "spark-submit"), "--master", MASTER, "--conf", "spark.ui.enabled=false",
         "--conf", "spark.executor.memory=512m", str(script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.cluster
@pytest.mark.timeout(900)
@pytest.mark.slow
def test_pipeline_and_stream_reads_on_local_cluster_with_an_s3_warehouse(s3_env, s3_bucket,
                                                                         tmp_path):
    rig = make_rig(s3_env)
    rig.purge()
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri)
    cat.create_volume("v", f"s3://{rig.bucket}/data/", notification=vs.SqsNotification(
        rig.queue_url))
    cat.create_stream("s", on_volume="v")
    names = [f"f{i}.txt" for i in range(6)]
    for name in names:
        rig.put(f"data/{name}", f"hello {name}".encode())
    metrics = cat.watch("v", until_idle=True, timeout=120)
    assert cat.list_volumes()[0]["files"] == len(names), metrics
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = spark_submit(ROOT / "tests" / "warehouse" / "cluster_job.py", [uri, str(out_dir)],
                        s3_env, cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"master"')][-1])
    assert report["master"] == MASTER and report["exit_code"] == 0
    assert report["batch_paths"] == names and report["streamed"] == names
    # the target lives in the warehouse bucket; its rows were made on executor processes
    target = DeltaTable(f"{uri}/tables/contents", storage_options={
        "AWS_ENDPOINT_URL": s3_env, "AWS_ALLOW_HTTP": "true"})
    rows = target.to_pyarrow_table().to_pylist()
    assert sorted(r["relative_path"] for r in rows) == names
    assert all(r["text"] == f"hello {r['relative_path']}" for r in rows)
    assert {r["ran_on"] for r in rows} == {"executor"}
    assert report["driver_pid"] not in {r["pid"] for r in rows}
    keys = [o["Key"] for o in s3_client(s3_env).list_objects_v2(
        Bucket=s3_bucket, Prefix="wh/tables/contents/")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys)
    assert cat.describe_stream("s")["offset"] == cat.directory_table("v").version()
    assert list(cwd.iterdir()) == []  # nothing local for the warehouse (no "s3:" folder)
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)
