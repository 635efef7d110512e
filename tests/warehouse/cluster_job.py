"""The cluster test's driver, run by `spark-submit --master local-cluster[2,1,1024]`:

    spark-submit tests/warehouse/cluster_job.py S3_WAREHOUSE_URI OUT_DIR

The warehouse (volume `v` on S3 with stream `s`) exists. It runs, on the cluster: the pipeline
job (`volume_stream.jobs.run_job`, as `volume-stream run` would) whose UDF reads each file on an
executor; a batch read and a Structured Streaming query of the `volume_stream` data source with
`warehouse` as a URI. It prints one JSON line with what it saw. Credentials and the endpoint
come from the environment only.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import volume_stream as vs
from volume_stream._spark import get_spark
from volume_stream.jobs import load_spec, run_job


def _executor_chain() -> str:
    """Which process started this Python worker: an executor JVM or the driver's."""
    pid, seen = os.getpid(), []
    for _ in range(5):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            break
        seen.append(cmd)
    return "executor" if any("CoarseGrainedExecutorBackend" in c for c in seen) else "driver"


@vs.file_udf("text string, size_read int, ran_on string, pid int")
def read_it(file: vs.FileRecord):
    data = file.read_bytes()
    return {"text": data.decode(), "size_read": len(data), "ran_on": _executor_chain(),
            "pid": os.getpid()}


def main(uri: str, out: str) -> None:
    spark = get_spark()
    spec_path = Path(out) / "job.toml"
    spec_path.write_text(f'stream = "s"\nudf = "{Path(__file__).resolve()}:read_it"\n'
                         f'target = "contents"\nuntil_empty = true\n')
    result = run_job(load_spec(spec_path), warehouse=uri, spark=spark)
    batch = (spark.read.format("volume_stream").option("warehouse", uri).option("volume", "v")
             .load())
    batch_paths = sorted(r.relative_path for r in batch.select("relative_path").collect())
    query = (spark.readStream.format("volume_stream").option("warehouse", uri)
             .option("volume", "v").option("storage_options", json.dumps({"AWS_REGION":
                                                                         "us-east-1"}))
             .load().writeStream.format("parquet").option("path", f"{out}/stream_out")
             .option("checkpointLocation", f"{out}/chk").trigger(availableNow=True).start())
    query.awaitTermination(300)
    streamed = sorted(r.relative_path for r in
                      spark.read.parquet(f"{out}/stream_out").select("relative_path").collect())
    print(json.dumps({"master": spark.sparkContext.master, "driver_pid": os.getpid(),
                      "exit_code": result.exit_code,
                      "batches": [b.__dict__ if hasattr(b, "__dict__") else str(b)
                                  for b in result.batches],
                      "batch_paths": batch_paths, "streamed": streamed}, default=str),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.exit(0)
