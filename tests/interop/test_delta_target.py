"""A pipeline target written by Spark's own Delta connector (`format="delta"`): each batch is
one Spark append with Delta's idempotent-write options (`txnAppId` = the pipeline's app id,
`txnVersion` = the batch id), so a batch run again — after its offset commit failed, or after
the process was SIGKILLed between its commits (`make soak`) — writes nothing twice. Delta
Spark reads the tables back as the judge."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs
from tests.interop import judge
from volume_stream.cli.jobs import load_spec
from volume_stream.pipelines.delta_target import transaction_version, write_idempotent
from volume_stream.pipelines.run import CRASH_ENV, app_id_for

ROOT = Path(__file__).resolve().parents[2]
FILES = {"a.txt": "A", "b.txt": "B", "bad.txt": "?"}


@vs.file_udf("content string")
def content(file):
    if file.name.startswith("bad"):
        raise ValueError("bad file")
    return {"content": file.read_text()}


@pytest.fixture
def cat(tmp_path, delta_spark):
    data = tmp_path / "data"
    data.mkdir()
    for name, text in FILES.items():
        (data / name).write_text(text)
    catalog = vs.connect(tmp_path / "warehouse", spark=delta_spark)
    catalog.create_volume("vol", data)
    catalog.create_stream("s", on_volume="vol")
    catalog.refresh("vol")
    return catalog


def _target(cat) -> str:
    return str(cat.warehouse.root / "tables" / "out")


def _rows(spark, uri: str, column: str) -> list[tuple]:
    return judge.rows(judge.spark_table(spark, uri), ["relative_path", column])


def _writes(spark, uri: str) -> list[str]:
    return [h["operation"] for h in judge.spark_history(spark, uri)]


def _app_id(cat) -> str:
    return app_id_for("s", cat.stream_spec("s")[0])


def test_spark_writes_each_batch_once_with_its_app_transaction(cat, delta_spark, tmp_path):
    app_id = _app_id(cat)
    m = cat.pipeline("s", content, "out", format="delta").run_once()
    assert (m.batch_id, m.files_seen, m.files_ok, m.files_failed, m.rows_written) == \
        (0, 3, 2, 1, 2)
    target = _target(cat)
    assert _rows(delta_spark, target, "content") == [("a.txt", "A"), ("b.txt", "B")]
    assert _rows(delta_spark, target + "_errors", "error") == [("bad.txt", "ValueError: bad file")]
    assert transaction_version(target, app_id) == 0  # txnAppId / txnVersion, read by delta-rs
    assert transaction_version(target + "_errors", app_id) == 0
    detail = judge.spark_detail(delta_spark, target)
    assert detail["numFiles"] >= 1
    # nothing pending: no Spark job, no commit
    assert cat.pipeline("s", content, "out", format="delta").run_once().files_seen == 0
    assert _writes(delta_spark, target) == ["WRITE"]
    (tmp_path / "data" / "c.txt").write_text("C")
    cat.refresh("vol")
    assert cat.pipeline("s", content, "out", format="delta").run_once().batch_id == 1
    assert transaction_version(target, app_id) == 1
    assert _rows(delta_spark, target, "content") == [("a.txt", "A"), ("b.txt", "B"),
                                                     ("c.txt", "C")]


def test_a_batch_run_again_after_its_offset_commit_failed_writes_nothing(
        cat, delta_spark, monkeypatch):
    """The batch's commits landed, the offset move did not (the catalog's store failed): the
    run again pins the same batch, finds it in the target and only moves the offset."""
    real = cat.commit_offset

    def failing(*args, **kwargs):
        monkeypatch.setattr(cat, "commit_offset", real)
        raise OSError("the catalog's store is down")

    monkeypatch.setattr(cat, "commit_offset", failing)
    with pytest.raises(OSError, match="store is down"):
        cat.pipeline("s", content, "out", format="delta").run_once()
    target = _target(cat)
    assert cat.describe_stream("s")["offset"] == 0
    m = cat.pipeline("s", content, "out", format="delta").run_once()
    assert (m.batch_id, m.resumed_files, m.rows_written) == (0, 3, 0)
    assert cat.describe_stream("s")["offset"] == 1
    assert _writes(delta_spark, target) == ["WRITE"]  # one commit
    assert _writes(delta_spark, target + "_errors") == ["WRITE"]
    assert _rows(delta_spark, target, "content") == [("a.txt", "A"), ("b.txt", "B")]


def test_delta_skips_a_write_of_a_batch_the_table_holds(delta_spark, tmp_path):
    """The mechanism itself: Spark's append with the same txnAppId and a txnVersion not above
    the table's is skipped (no commit, no rows); the next txnVersion writes."""
    uri = str(tmp_path / "t")
    df = delta_spark.createDataFrame([(1, "x")], "id int, v string")
    write_idempotent(df, uri, "app", 7)
    write_idempotent(df, uri, "app", 7)
    write_idempotent(df, uri, "app", 6)
    assert judge.rows(judge.spark_table(delta_spark, uri), ["id", "v"]) == [(1, "x")]
    assert len(judge.spark_history(delta_spark, uri)) == 1
    write_idempotent(df, uri, "app", 8)
    write_idempotent(df, uri, "other-app", 0)
    assert len(judge.spark_table(delta_spark, uri)) == 3
    assert transaction_version(uri, "app") == 8


def test_format_delta_options_are_checked(cat, tmp_path):
    with pytest.raises(vs.InvalidInputError, match="format"):
        cat.pipeline("s", content, "out", format="parquet")
    with pytest.raises(vs.InvalidInputError, match="delete_rows"):
        cat.pipeline("s", content, "out", format="delta", on_delete="delete_rows")
    with pytest.raises(vs.InvalidInputError, match="max_files_per_batch"):
        cat.pipeline("s", content, "out", format="delta", max_files_per_batch=2)
    spec = tmp_path / "job.toml"
    spec.write_text('stream = "s"\nudf = "x.py:f"\ntarget = "out"\n[options]\n'
                    'format = "delta"\n')
    assert load_spec(spec).options.format == "delta"
    spec.write_text(spec.read_text().replace('"delta"', '"csv"'))
    with pytest.raises(vs.InvalidInputError, match="format"):
        load_spec(spec)


SCRIPT = '''
import json, sys
import volume_stream as vs

@vs.file_udf("content string")
def content(file):
    if file.name.startswith("bad"):
        raise ValueError("bad file")
    return {"content": file.read_text()}

cat = vs.connect(sys.argv[1])
print(json.dumps(cat.pipeline("s", content, "out", format="delta").run_once().as_dict()))
'''


@pytest.mark.soak  # each case starts its own Spark JVM with Delta: ~30-60 s
@pytest.mark.parametrize("point, target_rows, error_rows", [
    ("after_pin", [], 0),
    ("after_errors_commit", [], 1),  # the errors table's append landed, the target's not
    ("after_target_commit", [("a.txt", "A"), ("b.txt", "B")], 1),  # offset not moved
])
def test_a_batch_killed_between_its_commits_is_written_once(cat, delta_spark, tmp_path, point,
                                                            target_rows, error_rows):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, CRASH_ENV: point, "VOLUME_STREAM_SPARK_MASTER": "local[1]"}
    proc = subprocess.Popen([sys.executable, str(script), str(cat.warehouse.root)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        try:  # the killed driver's JVM exits when its stdin closes; make sure of it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {out}\n{err[-3000:]}"
    target = _target(cat)
    judge.cold(delta_spark)
    found = _rows(delta_spark, target, "content") if Path(target).exists() else []
    assert found == target_rows
    errors = Path(target + "_errors")
    assert (len(judge.spark_table(delta_spark, str(errors))) if errors.exists() else 0) \
        == error_rows
    assert cat.describe_stream("s")["offset"] == 0
    m = cat.pipeline("s", content, "out", format="delta").run_once()
    assert m.batch_id == 0 and json.dumps(m.as_dict())
    assert _rows(delta_spark, target, "content") == [("a.txt", "A"), ("b.txt", "B")]
    assert _rows(delta_spark, target + "_errors", "error") == [("bad.txt", "ValueError: bad file")]
    assert transaction_version(target, _app_id(cat)) == 0
    assert cat.describe_stream("s")["offset"] == 1
