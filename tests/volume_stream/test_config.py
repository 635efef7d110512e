"""The daemon configuration: TOML file + VOLUME_STREAM_* environment, and its error messages."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from volume_stream.cli import app
from volume_stream.config.daemon import DaemonConfig
from volume_stream.errors import ConfigError

runner = CliRunner()

GOOD = """
warehouse = "wh"
log_level = "debug"

[metrics]
port = 9200

[volumes.landing]
location = "data/landing"
include = ["*.jpg"]
notification = { type = "local", debounce_s = 0.1, polling = true }
max_wait_s = 0.25

[volumes.landing.streams]
arrivals = { mode = "append_only" }

[volumes.s3vol]
location = "s3://bucket/prefix/"
notification = { type = "AWS_SQS", queue_url = "https://sqs.eu-west-1.amazonaws.com/1/q" }

[pipelines.images]
spec = "pipelines/images.toml"
interval_s = 60
"""


def write(tmp_path, text, name="volume-stream.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_file_is_read_and_relative_paths_follow_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    cfg = DaemonConfig.load(write(tmp_path, GOOD))
    assert cfg.warehouse == tmp_path / "wh"
    assert cfg.log_level == "DEBUG"
    assert cfg.metrics.port == 9200 and cfg.metrics.host == "127.0.0.1"
    landing = cfg.volumes["landing"]
    assert landing.location == str(tmp_path / "data" / "landing")
    assert landing.notification == {"type": "LOCAL", "debounce_s": 0.1, "polling": True}
    assert landing.notification_object().debounce_s == 0.1
    assert landing.streams["arrivals"].mode == "APPEND_ONLY"
    assert landing.max_wait_s == 0.25 and landing.max_batch_events is None
    assert landing.batch_limits().target_commit_s == 5.0 and landing.max_batch_bytes == 256 << 20
    assert cfg.volumes["s3vol"].location == "s3://bucket/prefix/"  # URLs are left alone
    assert cfg.pipelines["images"].spec == tmp_path / "pipelines" / "images.toml"
    assert cfg.dead_letter_dir == tmp_path / "wh" / "_dead_letter"
    assert cfg.source == tmp_path / "volume-stream.toml"


def test_environment_wins_over_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_WAREHOUSE", "/srv/wh")
    monkeypatch.setenv("VOLUME_STREAM_METRICS__PORT", "9300")
    monkeypatch.setenv("VOLUME_STREAM_VOLUMES__LANDING__MAX_WAIT_S", "2.5")
    monkeypatch.setenv("VOLUME_STREAM_LOG_JSON", "true")
    cfg = DaemonConfig.load(write(tmp_path, GOOD))
    assert str(cfg.warehouse) == "/srv/wh"
    assert cfg.metrics.port == 9300
    assert cfg.volumes["landing"].max_wait_s == 2.5
    assert cfg.volumes["landing"].include == ["*.jpg"]  # the rest of the table is kept
    assert cfg.log_json is True


def test_unknown_key_names_key_file_and_allowed(tmp_path):
    path = write(tmp_path, """
        [volumes.landing]
        location = "/tmp"
        max_wait = 3
    """)
    with pytest.raises(ConfigError) as err:
        DaemonConfig.load(path)
    msg = str(err.value)
    assert str(path) in msg and "'volumes.landing.max_wait'" in msg
    assert "allowed keys here:" in msg and "max_wait_s" in msg and "refresh_interval_s" in msg


def test_bad_values_are_explained(tmp_path):
    path = write(tmp_path, """
        log_level = "LOUD"
        [metrics]
        port = 70000
        [volumes.v]
        location = "/tmp"
        max_batch_events = 0
        notification = { type = "CARRIER_PIGEON" }
    """)
    with pytest.raises(ConfigError) as err:
        DaemonConfig.load(path)
    msg = str(err.value)
    assert "'log_level'" in msg and "'DEBUG', 'INFO', 'WARNING' or 'ERROR'" in msg
    assert "'metrics.port'" in msg and "65535" in msg
    assert "'volumes.v.max_batch_events'" in msg and "greater than or equal to 1" in msg
    assert "CARRIER_PIGEON" in msg and "allowed: [" in msg and "'LOCAL'" in msg


def test_notification_keys_are_checked(tmp_path):
    path = write(tmp_path, """
        [volumes.v]
        location = "/tmp"
        notification = { type = "LOCAL", debounce = 1 }
    """)
    with pytest.raises(ConfigError, match=r"unknown notification key\(s\) \['debounce'\] for type "
                                          r"LOCAL; allowed: .*'debounce_s'"):
        DaemonConfig.load(path)


def test_bad_value_from_environment_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_METRICS__PORT", "not-a-port")
    with pytest.raises(ConfigError, match="environment variable VOLUME_STREAM_METRICS__PORT: key "
                                          "'metrics.port'"):
        DaemonConfig.load(write(tmp_path, GOOD))


@pytest.mark.parametrize("text, fragment", [
    ('[volumes.v]\nlocation = "s3://b/p/"\noptions = { aws_secret_access_key = "abc" }',
     "'volumes.v.options.aws_secret_access_key' is a secret"),
    ('[volumes.v]\nlocation = "/tmp"\n[volumes.v.notification]\ntype = "LOCAL"\npassword = "x"',
     "'volumes.v.notification.password' is a secret"),
])
def test_secrets_are_refused_in_files(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        DaemonConfig.load(path)
    assert fragment in str(err.value) and str(path) in str(err.value)
    assert "AWS_SECRET_ACCESS_KEY" in str(err.value)  # says where credentials do come from
    assert "abc" not in str(err.value)


def test_secret_in_environment_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUME_STREAM_VOLUMES__V__OPTIONS__ACCESS_KEY_SECRET", "hush")
    with pytest.raises(ConfigError, match="VOLUME_STREAM_VOLUMES__V__OPTIONS__ACCESS_KEY_SECRET "
                                          "sets a secret"):
        DaemonConfig.load(write(tmp_path, GOOD))


def test_missing_unreadable_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        DaemonConfig.load(tmp_path / "nope.toml")
    broken = write(tmp_path, "[volumes.v\nlocation = 1\n")
    with pytest.raises(ConfigError, match=r"is not valid TOML: .*line 1"):
        DaemonConfig.load(broken)
    with pytest.raises(ConfigError, match="nothing to run"):
        DaemonConfig.load(write(tmp_path, 'warehouse = "wh"\n'))
    with pytest.raises(ConfigError, match="exactly one of 'spec'"):
        DaemonConfig.load(write(tmp_path, '[pipelines.p]\ninterval_s = 5\n'))


def test_config_check_command(tmp_path):
    good = write(tmp_path, GOOD)
    (tmp_path / "pipelines").mkdir()  # config check reads the pipeline specs it names
    (tmp_path / "pipelines" / "images.toml").write_text(
        'stream = "s"\nudf = "images.py:f"\ntarget = "t"\n')
    result = runner.invoke(app, ["config", "check", str(good)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "volume     landing" in result.output
    assert "stream     arrivals on landing (APPEND_ONLY)" in result.output
    as_json = runner.invoke(app, ["config", "check", str(good), "--json"])
    assert json.loads(as_json.output)["volumes"]["landing"]["max_wait_s"] == 0.25
    quiet = write(tmp_path, GOOD.replace(
        'notification = { type = "AWS_SQS", queue_url = "https://sqs.eu-west-1.amazonaws.com/1/q" }\n',
        ""), "no-queue.toml")
    result = runner.invoke(app, ["config", "check", str(quiet)])  # the daemon would retry for ever
    assert result.exit_code == 2
    assert "volumes.s3vol.notification" in result.output and "no notification queue" in result.output
    bad = write(tmp_path, "[metrics]\nprot = 1\n[volumes.v]\nlocation='/tmp'\n", "bad.toml")
    result = runner.invoke(app, ["config", "check", str(bad)])
    assert result.exit_code == 2
    assert "unknown key 'metrics.prot'" in result.output and "port" in result.output
