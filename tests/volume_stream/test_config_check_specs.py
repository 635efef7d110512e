"""`config check` and `daemon` check the pipeline specs a configuration names: a missing or
invalid spec is refused (exit 2, naming the key, the file and the problem), so a daemon whose
pipeline could only fail never starts and never reports ready."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from volume_stream.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, spec: str) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    file = tmp_path / "volume-stream.toml"
    file.write_text(f'warehouse = "wh"\n[metrics]\nenabled = false\n'
                    f'[volumes.landing]\nlocation = "data"\n'
                    f'[pipelines.images]\nspec = "{spec}"\ninterval_s = 60\n')
    return file


def test_a_missing_spec_is_refused(tmp_path):
    file = config(tmp_path, "pipelines/images.toml")
    for args in (["config", "check", str(file)], ["daemon", "--config", str(file)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"{file}: key 'pipelines.images.spec'" in text
        assert f"cannot read pipeline spec {tmp_path / 'pipelines' / 'images.toml'}" in text
    assert not (tmp_path / "wh").exists()  # the daemon did not start


def test_an_invalid_spec_is_refused_and_a_valid_one_passes(tmp_path):
    (tmp_path / "pipelines").mkdir()
    spec = tmp_path / "pipelines" / "images.toml"
    spec.write_text('stream = "s"\nudf = "x.py:f"\ntarget = "t"\ncolour = "red"\n')
    file = config(tmp_path, "pipelines/images.toml")
    result = runner.invoke(app, ["config", "check", str(file)])
    assert result.exit_code == 2
    assert "colour: Extra inputs are not permitted" in " ".join(result.output.split())
    spec.write_text((ROOT / "examples" / "pipelines" / "image_metadata.toml").read_text())
    result = runner.invoke(app, ["config", "check", str(file)])
    assert result.exit_code == 0, result.output
    assert "pipeline   images" in result.output


def test_a_disabled_pipeline_is_not_checked(tmp_path):
    file = config(tmp_path, "missing.toml")
    file.write_text(file.read_text() + "enabled = false\n")
    assert runner.invoke(app, ["config", "check", str(file)]).exit_code == 0
