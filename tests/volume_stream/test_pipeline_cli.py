"""`volume-stream run PIPELINE_SPEC` and `volume_stream.jobs`: the example spec files against a
demo-like volume, create-if-missing, until-empty, spec validation and the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from PIL import Image
from typer.testing import CliRunner

from volume_stream import jobs
from volume_stream.cli import app
from volume_stream.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "examples" / "pipelines"
runner = CliRunner()


@pytest.fixture
def landing(tmp_path, spark):
    """A warehouse with a volume named like the demo's, holding images and logs."""
    import volume_stream as vs

    data = tmp_path / "landing"
    (data / "images").mkdir(parents=True)
    (data / "logs").mkdir()
    Image.new("RGB", (8, 8), "red").save(data / "images" / "a.jpg")
    (data / "images" / "b.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (data / "logs" / "app.log").write_text('{"level": "INFO", "msg": "hi"}\nnonsense\n')
    cat = vs.connect(tmp_path / "wh", spark=spark)
    cat.create_volume("landing", data)
    return cat


def run(*args):
    result = runner.invoke(app, ["run", *map(str, args)])
    result.text = " ".join(result.output.split())  # rich wraps long messages
    return result


def test_example_specs_run_on_the_demo_volume(landing, tmp_path):
    wh = landing.warehouse.root
    result = run(PIPELINES / "image_metadata.toml", "--warehouse", wh)  # JSON lines by default
    assert result.exit_code == 0, result.output
    # until_empty: one line per batch, and the empty look that ends it is not a batch
    (first,) = [json.loads(line) for line in result.output.splitlines()]
    assert (first["files_ok"], first["files_failed"]) == (1, 1)
    assert first["target"] == str(wh / "tables" / "image_meta")
    meta = DeltaTable(str(wh / "tables" / "image_meta")).to_pyarrow_table().to_pylist()
    assert [(r["relative_path"], r["width"]) for r in meta] == [("images/a.jpg", 8)]

    result = run(PIPELINES / "log_ingestion.json", "--warehouse", wh, "--text")
    assert result.exit_code == 0, result.output
    assert "2 rows written" in result.output
    lines = DeltaTable(str(wh / "tables" / "log_lines")).to_pyarrow_table().to_pylist()
    assert sorted(r["format"] for r in lines) == ["json", "unparsed"]

    images = tmp_path / "landing" / "images"
    (images / "c.png").write_bytes((images / "a.jpg").read_bytes())
    result = run(PIPELINES / "image_metadata.toml", "--warehouse", wh, "--fail-on-file-errors",
                 "--no-until-empty", "--text")
    assert result.exit_code == 0, result.output  # only c.png is new, and it is fine
    assert "1 ok, 0 failed" in result.text and result.text.count("batch ") == 1


def test_run_exit_codes_and_messages(landing, tmp_path):
    wh = landing.warehouse.root
    udf = ROOT / "examples" / "image_metadata.py"
    spec = tmp_path / "job.toml"
    spec.write_text(f'stream = "imgs"\nudf = "{udf}:image_metadata"\ntarget = "t"\n'
                    f'refresh = true\n[create.stream]\nvolume = "landing"\n'
                    f'show_initial_rows = true\n[options]\npath_glob = "*.jpg"\n')
    result = run(spec, "--warehouse", wh, "--fail-on-file-errors")
    assert result.exit_code == jobs.EXIT_FILE_ERRORS, result.output
    assert "1 file failed" in result.text
    assert run(spec, "--warehouse", wh, "--fail-on-file-errors").exit_code == 0  # nothing new

    bad = tmp_path / "bad.toml"
    bad.write_text('stream = "imgs"\nudf = "x.py:f"\ntarget = "t"\ncolour = "red"\n')
    result = run(bad, "--warehouse", wh)
    assert result.exit_code == 1
    assert "colour: Extra inputs are not permitted" in result.text
    bad.write_text('stream = "nope"\nudf = "x.py:f"\ntarget = "t"\n')
    result = run(bad, "--warehouse", wh)
    assert result.exit_code == 1 and "stream 'nope' does not exist" in result.text
    bad.write_text('stream = "imgs"\nudf = "missing.py:f"\ntarget = "t"\n')
    result = run(bad, "--warehouse", wh)
    assert result.exit_code == 1 and "no such file" in result.text
    bad.write_text("stream = [\n")
    result = run(bad, "--warehouse", wh)
    assert result.exit_code == 1 and "is not valid TOML" in result.text
    assert run(tmp_path / "absent.toml", "--warehouse", wh).exit_code == 1


def test_jobs_main_runs_until_empty_and_returns_the_exit_code(landing, tmp_path, capsys):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({
        "stream": "logs", "udf": str(ROOT / "examples" / "log_ingestion.py") + ":log_lines",
        "target": str(tmp_path / "out" / "lines"), "refresh": True,
        "options": {"path_glob": "*.log", "max_files_per_batch": 1},
        "create": {"stream": {"volume": "landing", "show_initial_rows": True}}}))
    code = jobs.main([str(spec), "--warehouse", str(landing.warehouse.root), "--until-empty"])
    assert code == jobs.EXIT_OK
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["rows_written"] for b in batches] == [2]  # the empty look after it: no line
    assert jobs.main([str(tmp_path / "nope.json")]) == jobs.EXIT_FAILED


def test_load_udf_refuses_what_is_not_a_file_udf(tmp_path):
    (tmp_path / "plain.py").write_text("def f(file):\n    return {}\n")
    with pytest.raises(InvalidInputError, match="not decorated with @volume_stream.file_udf"):
        jobs.load_udf("plain.py:f", tmp_path)
    with pytest.raises(InvalidInputError, match="has no 'g'"):
        jobs.load_udf("plain.py:g", tmp_path)
    with pytest.raises(InvalidInputError, match="must look like"):
        jobs.load_udf("plain.py", tmp_path)
    with pytest.raises(InvalidInputError, match="importing no_such_module failed"):
        jobs.load_udf("no_such_module:f")
    udf = jobs.load_udf("examples/log_ingestion.py:log_lines", ROOT)
    assert udf.__name__ == "log_lines"
