"""DataX job files: `errorLimit` means what it can here (no record can be dirty, so only 0 is
accepted, in DataX's number or string form); other values are refused, naming the setting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs
from volume_stream.errors import InvalidInputError
from volume_stream.shards.datax import job_options


def job(tmp_path, error_limit):
    setting = {"speed": {"concurrent": 1}}
    if error_limit is not None:
        setting["errorLimit"] = error_limit
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"job": {"setting": setting, "content": [{
        "reader": {"name": "otsstreamreader", "parameter": {
            "dataTable": "vol", "startTimestampMillis": 0, "endTimestampMillis": 1}},
        "writer": {"name": "parquet", "parameter": {"path": "out"}}}]}}))
    return path


@pytest.mark.parametrize("limit", [None, {}, {"record": 0}, {"record": "0"},
                                   {"record": 0, "percentage": 0.0}, {"percentage": "0"}])
def test_a_zero_error_limit_is_accepted(tmp_path, limit):
    volume, options = job_options(job(tmp_path, limit))
    assert volume == "vol" and options["start_ms"] == 0


@pytest.mark.parametrize("limit, named", [
    ({"record": 5}, "errorLimit.record"), ({"record": "10"}, "errorLimit.record"),
    ({"record": -1}, "errorLimit.record"), ({"record": True}, "errorLimit.record"),
    ({"record": 0, "percentage": 0.02}, "errorLimit.percentage"),
    ({"records": 0}, "unknown errorLimit"), (3, "setting.errorLimit")])
def test_a_nonzero_error_limit_is_refused_saying_why(tmp_path, limit, named):
    with pytest.raises(InvalidInputError, match=named) as info:
        job_options(job(tmp_path, limit))
    if "record" in str(limit) and named.startswith("errorLimit"):
        assert "no dirty records" in str(info.value)


def test_the_cli_refuses_it_without_a_traceback_and_exports_nothing(tmp_path, data_dir):
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data_dir)
    proc = subprocess.run([str(Path(sys.executable).parent / "volume-stream"), "export",
                           "--job", str(job(tmp_path, {"record": 5})),
                           "--warehouse", str(cat.warehouse.root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "errorLimit.record must be 0" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_shipped_job_file_runs_as_written(tmp_path, data_dir):
    """examples/export_job.json (the seed's template, filled in) exports through the CLI."""
    shipped = Path(__file__).resolve().parents[2] / "examples" / "export_job.json"
    job_file = tmp_path / "export_job.json"
    job_file.write_text(shipped.read_text())
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("landing", data_dir)
    proc = subprocess.run([str(Path(sys.executable).parent / "volume-stream"), "export",
                           "--job", str(job_file), "--warehouse", str(cat.warehouse.root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    volume, options = job_options(job_file)
    assert (volume, options["parallelism"], options["mbps"]) == ("landing", 2, 10.0)


@pytest.mark.parametrize("section, key", [
    ("reader", "dataTabel"), ("writer", "fieldDelimiter"), ("setting", "jvm")])
def test_a_key_nothing_reads_is_refused_by_name(tmp_path, section, key):
    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "export_job.json")
                     .read_text())
    conf = doc["configuration"]
    if section == "setting":
        conf["setting"][key] = 1
    else:
        conf[section]["parameter"][key] = "x"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInputError, match=f"nothing reads: {key}; known: "):
        job_options(path)


def test_a_datasource_is_refused_and_table_is_data_table(tmp_path):
    doc = json.loads((Path(__file__).resolve().parents[2] / "examples" / "export_job.json")
                     .read_text())
    param = doc["configuration"]["reader"]["parameter"]
    param["datasource"] = "my_ots"
    path = tmp_path / "job.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInputError, match="the warehouse .* is the source"):
        job_options(path)
    param["datasource"], param["table"] = "", param.pop("dataTable")
    path.write_text(json.dumps(doc))
    assert job_options(path)[0] == "landing"
