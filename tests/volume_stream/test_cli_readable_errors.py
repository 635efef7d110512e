"""Errors users can read (issue 22 item 9), through real `volume-stream` processes: URIs stay
URIs, exports never land in the warehouse or in a `./s3:` folder, a malformed environment
setting names the variable, and `config check` refuses what the daemon would refuse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import volume_stream as vs

CLI = str(Path(sys.executable).parent / "volume-stream")


def cli(*args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOLUME_STREAM_", "AWS_"))}
    env.update(extra)
    return subprocess.run([CLI, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=120)


def one_error(proc: subprocess.CompletedProcess, code: int = 1) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


def test_sql_warehouse_keeps_its_uri(tmp_path):
    proc = cli("sql", "--warehouse", "s3://no-such-bucket-vs/wh", "-e", "SHOW VOLUMES",
               cwd=tmp_path, AWS_ENDPOINT_URL="http://127.0.0.1:1", AWS_ACCESS_KEY_ID="x",
               AWS_SECRET_ACCESS_KEY="x", AWS_REGION="us-east-1",
               VOLUME_STREAM_STORAGE_OPTIONS='{"AWS_EC2_METADATA_DISABLED": "true"}')
    assert "s3:/no-such" not in proc.stderr and "s3://no-such-bucket-vs/wh" in proc.stderr, \
        proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_out_is_refused_as_a_uri_or_inside_the_warehouse(tmp_path):
    (tmp_path / "data").mkdir()
    vs.connect(tmp_path / "warehouse").create_volume("vol", tmp_path / "data")
    uri = one_error(cli("export", "vol", "--date", "20240101", "--out", "s3://bucket/x",
                        cwd=tmp_path))
    assert "s3://bucket/x" in uri and "format 'delta'" in uri, uri
    assert not (tmp_path / "s3:").exists()
    inside = one_error(cli("export", "vol", "--date", "20240101", "--out", "warehouse/exports",
                           cwd=tmp_path))
    assert "inside the warehouse" in inside, inside
    assert not (tmp_path / "warehouse" / "exports").exists()


def test_a_malformed_environment_setting_names_the_variable(tmp_path):
    for value in ("not json", '["a list"]'):
        err = one_error(cli("volume", "list", cwd=tmp_path,
                            VOLUME_STREAM_STORAGE_OPTIONS=value))
        assert err.startswith("error: invalid environment: VOLUME_STREAM_STORAGE_OPTIONS"), err
        assert "pydantic" not in err and len(err.strip().splitlines()) == 1, err


def test_config_check_refuses_what_the_daemon_refuses(tmp_path):
    config = tmp_path / "vs.toml"
    config.write_text(f'warehouse = "{tmp_path / "wh"}"\n'
                      '[shard_api]\nenabled = true\nrequire_signature = true\n'
                      '[volumes.landing]\n')
    err = one_error(cli("config", "check", str(config), cwd=tmp_path), code=2)
    assert "shard_api.require_signature" in err and "VOLUME_STREAM_SHARD_API_SECRET" in err
    assert "volumes.landing.location" in err, err
    assert not (tmp_path / "wh").exists()


def test_stream_read_limit_says_of_how_many_and_refuses_negatives(tmp_path):
    (tmp_path / "data").mkdir()
    for i in range(7):
        (tmp_path / "data" / f"f{i}.txt").write_text("x")
    cat = vs.connect(tmp_path / "warehouse")
    cat.create_volume("vol", tmp_path / "data")
    cat.create_stream("s", "vol", show_initial_rows=True)
    cat.refresh("vol")
    shown = cli("stream", "read", "s", "--limit", "5", cwd=tmp_path)
    assert shown.returncode == 0 and "s: 5 of 7 change records" in shown.stdout, shown.stdout
    err = one_error(cli("stream", "read", "s", "--limit", "-5", cwd=tmp_path))
    assert "--limit -5" in err, err


def test_version(tmp_path):
    from importlib.metadata import version

    proc = cli("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"volume-stream {version('volume-stream')}"


def test_a_failed_command_leaves_no_warehouse_behind(tmp_path):
    """A command that fails before writing anything removes the warehouse it just created;
    one that succeeded, or a warehouse that already existed, stays."""
    data = tmp_path / "data"
    data.mkdir()
    one_error(cli("volume", "create", "v", str(tmp_path / "missing"), cwd=tmp_path))
    one_error(cli("volume", "create", "bad-name", str(data), cwd=tmp_path))
    one_error(cli("sql", "-e", "CREATE TABLE `../x` (id INT)", cwd=tmp_path))
    bad = tmp_path / "bad.toml"
    bad.write_text(f'warehouse = "{tmp_path / "warehouse"}"\n[metrics]\nport = 0\n'
                   f'[volumes.v]\nlocation = "{data}"\n[pipelines.p]\nstream = "nope"\n'
                   f'udf = "x.py:f"\ntarget = "t"\n')
    daemon = cli("daemon", "--config", str(bad), cwd=tmp_path)
    assert daemon.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "data"]
    assert cli("volume", "create", "v", str(data), cwd=tmp_path).returncode == 0
    one_error(cli("volume", "create", "v", str(data), cwd=tmp_path))  # exists: kept
    assert (tmp_path / "warehouse" / "volume-stream.json").exists()


def test_the_commands_that_start_spark_all_take_verbose(tmp_path):
    """docs/sql.md promises --verbose (Spark's own log lines) for the commands that start it."""
    for command in (["sql"], ["run"], ["daemon"]):
        proc = cli(*command, "--help", cwd=tmp_path)
        assert proc.returncode == 0 and "--verbose" in proc.stdout, (command, proc.stdout)
