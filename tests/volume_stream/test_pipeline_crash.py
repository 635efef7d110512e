"""Exactly-once across a real crash: a pipeline process is SIGKILLed between two of its
commits (via the `VOLUME_STREAM_TEST_CRASH_AT` hook), then the batch is run again; the target
and errors tables end with every row exactly once and the offset moves once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

import volume_stream as vs
from volume_stream.pipelines.run import CRASH_ENV

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = '''
import json, sys
import volume_stream as vs

@vs.file_udf("content string")
def content(file):
    if file.name.startswith("bad"):
        raise ValueError("bad file")
    return {"content": file.read_text()}

cat = vs.connect(sys.argv[1])
print(json.dumps(cat.pipeline("s", content, "out", max_files_per_batch=int(sys.argv[2]))
                 .run_once().as_dict()))
'''


@vs.file_udf("content string")
def content(file):
    if file.name.startswith("bad"):
        raise ValueError("bad file")
    return {"content": file.read_text()}


def run_until_killed(tmp_path: Path, warehouse: Path, point: str, chunk: int) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, CRASH_ENV: point, "VOLUME_STREAM_SPARK_MASTER": "local[1]"}
    proc = subprocess.Popen([sys.executable, str(script), str(warehouse), str(chunk)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        try:  # the killed driver's JVM exits when its stdin closes; make sure of it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"not killed at {point}: {out}\n{err[-3000:]}"


def rows(uri: str) -> list[tuple]:
    return sorted((r["relative_path"], r.get("content") or r.get("error"))
                  for r in DeltaTable(uri).to_pyarrow_table().to_pylist())


FILES = {"a.txt": "A", "b.txt": "B", "bad.txt": "?", "c.txt": "C", "d.txt": "D"}
EXPECTED = [("a.txt", "A"), ("b.txt", "B"), ("c.txt", "C"), ("d.txt", "D")]


@pytest.mark.slow  # ~30 s per case on a loaded 2-core machine: each starts its own Spark JVM
@pytest.mark.parametrize("point, committed_before_crash, resumed", [
    # the range recorded in the catalog with batch id 0, nothing written yet
    ("after_pin", ([], 0), 0),
    # every chunk committed to both tables, killed before the offset moved
    ("after_target_commit", (EXPECTED, 1), 5),
    # chunk 1 (a, b) committed; chunk 2's errors committed (bad), its target rows (c) not
    ("after_errors_commit", ([("a.txt", "A"), ("b.txt", "B")], 1), 2),
])
def test_killed_between_commits_then_rerun_writes_each_row_once(
        catalog, volume, data_dir, tmp_path, point, committed_before_crash, resumed):
    chunk = 2  # a, b | bad, c | d: three commits per table, the errors one in the middle
    for name, text in FILES.items():
        (data_dir / name).write_text(text)
    catalog.create_stream("s", on_volume="vol")
    catalog.refresh("vol")
    run_until_killed(tmp_path, catalog.warehouse.root, point, chunk)

    target = str(catalog.warehouse.root / "tables" / "out")
    target_rows, n_errors = committed_before_crash
    assert rows(target) == target_rows
    assert len(rows(target + "_errors")) == n_errors
    info = catalog.describe_stream("s")
    assert info["offset"] == 0  # killed before the offset commit
    # the batch's range is in the catalog (not only in the target's progress)
    assert (info["batch_id"], info["pinned_end"]) == (0, 1)

    (data_dir / "late.txt").write_text("L")  # the volume moves on before the rerun
    catalog.refresh("vol")
    m = catalog.pipeline("s", content, "out", max_files_per_batch=chunk).run_once()
    assert (m.start_version, m.end_version) == (0, 1)  # the range the killed run pinned
    assert m.resumed_files == resumed
    assert rows(target) == EXPECTED
    assert rows(target + "_errors") == [("bad.txt", "ValueError: bad file")]
    info = catalog.describe_stream("s")
    assert (info["offset"], info["batch_id"]) == (1, 1)

    assert catalog.pipeline("s", content, "out").run_once().files_ok == 1
    assert rows(target) == sorted([*EXPECTED, ("late.txt", "L")])
