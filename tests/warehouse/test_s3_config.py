"""The daemon configuration, the CLI and the dead letters with a warehouse URI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from tests.s3_warehouse_fixtures import s3_client
from volume_stream.cli.app import app
from volume_stream.config.daemon import DaemonConfig
from volume_stream.config.settings import Settings
from volume_stream.errors import ConfigError
from volume_stream.warehouse.dead_letters import DeadLetters

CONFIG = """
warehouse = "s3://bucket/team/wh"

[storage_options]
AWS_REGION = "eu-west-1"
AWS_ALLOW_HTTP = "true"

[volumes.landing]
location = "/data/landing"
"""


def test_daemon_config_keeps_a_warehouse_uri_and_its_storage_options(tmp_path):
    path = tmp_path / "vs.toml"
    path.write_text(textwrap.dedent(CONFIG))
    cfg = DaemonConfig.load(path)
    assert cfg.warehouse == "s3://bucket/team/wh"  # not Path("s3:/bucket/...")
    assert cfg.storage_options == {"AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true"}
    assert cfg.dead_letter_dir == "s3://bucket/team/wh/_dead_letter"


def test_daemon_config_refuses_a_secret_storage_option(tmp_path):
    path = tmp_path / "vs.toml"
    path.write_text(textwrap.dedent(CONFIG) + "")
    text = path.read_text().replace('AWS_REGION = "eu-west-1"',
                                    'AWS_REGION = "eu-west-1"\nAWS_SECRET_ACCESS_KEY = "x"')
    path.write_text(text)
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY.*secret"):
        DaemonConfig.load(path)


def test_settings_take_a_uri_and_json_storage_options(monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_WAREHOUSE", "s3://b/wh")
    monkeypatch.setenv("VOLUME_STREAM_STORAGE_OPTIONS", '{"AWS_REGION": "us-east-1"}')
    settings = Settings()
    assert settings.warehouse == "s3://b/wh"
    assert settings.storage_options == {"AWS_REGION": "us-east-1"}


def test_cli_takes_an_s3_warehouse(s3_env, s3_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{s3_bucket}/wh"
    runner = CliRunner()
    made = runner.invoke(app, ["volume", "create", "landing", str(tmp_path), "--warehouse", uri])
    assert made.exit_code == 0, made.output
    listed = runner.invoke(app, ["volume", "list", "--json", "--warehouse", uri])
    assert listed.exit_code == 0, listed.output
    assert [json.loads(line)["name"] for line in listed.output.splitlines()] == ["landing"]
    assert list(tmp_path.iterdir()) == []  # no local folder named after the URI
    bad = subprocess.run([sys.executable, "-m", "volume_stream.cli", "volume", "list",
                          "--warehouse", "oss://b/wh"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "oss://b/wh" in bad.stderr and "S3, HDFS" in bad.stderr.replace("\n", " ")


def test_dead_letters_on_s3_are_one_object_per_batch(s3_env, s3_bucket):
    letters = DeadLetters(f"s3://{s3_bucket}/wh/_dead_letter", "landing")
    first = letters.write([{"event": {"relative_path": "a"}}, {"event": {"relative_path": "b"}}])
    letters.write([{"event": {"relative_path": "c"}}])
    s3 = s3_client(s3_env)
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="wh/_dead_letter/landing/")["Contents"]
    assert len(listed) == 2
    key = first[len(f"s3://{s3_bucket}/"):]
    body = s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read().decode()
    assert [json.loads(line)["event"]["relative_path"] for line in body.splitlines()] == \
        ["a", "b"]


def test_dead_letters_in_a_folder_append_to_one_file(tmp_path):
    letters = DeadLetters(tmp_path / "dl", "landing")
    letters.write([{"n": 1}])
    letters.write([{"n": 2}, {"n": 3}])
    assert (tmp_path / "dl" / "landing.jsonl").read_text().count("\n") == 3
