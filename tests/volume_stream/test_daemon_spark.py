"""The daemon's pipelines in its one Spark session (issue 17): a `spec` pipeline runs in-process
on the shared session, interval after interval, without a child process; a run with nothing
pending never asks for Spark; a run past its `timeout_s` has its Spark jobs interrupted and its
offset left where it was; `isolate = true` keeps the child process."""

from __future__ import annotations

import textwrap
import threading

from deltalake import DeltaTable

import volume_stream as vs
from tests.volume_stream.test_daemon import config, metric, wait_for
from volume_stream.daemon import Daemon
from volume_stream.daemon.pipeline_runner import PipelineRunner, SharedSpark

UDF = """
import time
import volume_stream as vs

@vs.file_udf("n_bytes long")
def n_bytes(file):
    data = file.read_bytes()
    if data.startswith(b"slow"):
        time.sleep(120)
    return {"n_bytes": len(data)}
"""


def _job(tmp_path, name="job"):
    (tmp_path / "udf.py").write_text(textwrap.dedent(UDF))
    spec = tmp_path / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""
        stream = "{name}_files"
        udf = "udf.py:n_bytes"
        target = "{name}_sizes"
        until_empty = true
        [create.stream]
        volume = "vol"
        show_initial_rows = true
    """))
    return spec


def _rows(wh, target):
    table = DeltaTable(str(wh / "tables" / target)).to_pyarrow_table().to_pylist()
    return sorted((r["relative_path"], r["n_bytes"]) for r in table)


def test_spec_pipelines_share_the_daemons_spark_session(tmp_path, spark):
    data, wh = tmp_path / "data", tmp_path / "wh"
    data.mkdir()
    (data / "a.txt").write_text("x")
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    cat.refresh("vol")
    cfg = config(tmp_path, pipelines={
        "sizes": {"spec": str(_job(tmp_path)), "interval_s": 0.3}})
    with Daemon(cfg) as daemon:
        runner = daemon.pipelines["sizes"]
        assert runner.in_process
        wait_for(lambda: metric(daemon, "volume_stream_pipeline_runs_total", pipeline="sizes",
                                outcome="ok") >= 1, timeout=120)
        assert _rows(wh, "job_sizes") == [("a.txt", 1)]
        assert daemon.spark.started and daemon.spark.get() is spark  # the process's one session
        (data / "b.txt").write_text("yy")
        cat.refresh("vol")
        wait_for(lambda: _rows(wh, "job_sizes") == [("a.txt", 1), ("b.txt", 2)], timeout=120)
        assert runner.last_returncode == 0 and runner.last_outcome == "ok"
    # a session the daemon did not start is left running for its owner
    assert spark.sql("SELECT 1 AS one").collect()[0].one == 1


def test_nothing_pending_needs_no_spark_and_a_timeout_interrupts_the_run(tmp_path, spark):
    data, wh = tmp_path / "data", tmp_path / "wh"
    data.mkdir()
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    spec = _job(tmp_path)
    # nothing pending: the run completes without asking for a session
    shared = SharedSpark()
    stop = threading.Event()
    cfg = config(tmp_path, pipelines={"p": {"spec": str(spec), "interval_s": 100,
                                            "timeout_s": 5}})
    runner = PipelineRunner("p", cfg.pipelines["p"], wh, Daemon(cfg).metrics, stop, spark=shared)
    runner._run_once()
    assert runner.last_outcome == "ok" and not shared.started
    # a file whose UDF hangs: the run's Spark job is interrupted at timeout_s
    (data / "hang.txt").write_text("slow")
    cat.refresh("vol")
    before = cat.describe_stream("job_files")["offset"]
    runner._run_once()
    assert runner.last_outcome == "timeout"
    assert cat.describe_stream("job_files")["offset"] == before  # the offset did not move
    spark.sparkContext.cancelAllJobs()


def test_isolate_keeps_the_child_process(tmp_path):
    cfg = config(tmp_path, pipelines={"p": {"spec": str(tmp_path / "p.toml"), "isolate": True},
                                      "q": {"spec": str(tmp_path / "p.toml")}})
    daemon = Daemon(cfg)
    stop = threading.Event()
    isolated = PipelineRunner("p", cfg.pipelines["p"], cfg.warehouse, daemon.metrics, stop)
    shared = PipelineRunner("q", cfg.pipelines["q"], cfg.warehouse, daemon.metrics, stop)
    assert not isolated.in_process and shared.in_process
    assert isolated.command()[2:4] == ["volume_stream.cli", "run"]
