"""Azure volumes through every front door, on Azurite: the CLI (`volume create ... --notification
...`), SQL (`CREATE EXTERNAL VOLUME ... LOCATION 'abfss://...'`), the daemon's TOML and
`config check`, and the status page's facts."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import volume_stream as vs
from tests.azure_fixtures import ACCOUNT, azure_env, azure_rig, azurite  # noqa: F401
from volume_stream.cli import app
from volume_stream.config.daemon import DaemonConfig
from volume_stream.serve.status import StatusSource

runner = CliRunner()


def location(rig) -> str:
    return f"abfss://{rig.container}@{ACCOUNT}.dfs.core.windows.net/in/"


def run(*args, code=0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output + str(result.exception)
    return result.output


def test_cli_volume_create_with_a_notification_then_watch(tmp_path, azure_rig):
    wh = ["--warehouse", str(tmp_path / "wh")]
    out = run("volume", "create", "landing", location(azure_rig), "--notification",
              azure_rig.queue_name, *wh)
    assert "created volume landing" in out
    azure_rig.put("in/a.csv", b"abc")
    cat = vs.connect(tmp_path / "wh")
    assert cat.watch("landing", until_idle=True, timeout=60, refresh=False).versions == [1]
    spec = cat.volume_spec("landing")
    assert spec.notification == {"type": "AZURE_STORAGE_QUEUE",
                                 "queue_name": azure_rig.queue_name}
    run("volume", "create", "v3", f"az://{azure_rig.container}/in/", "--option",
        f"account_name={ACCOUNT}", *wh)
    assert cat.refresh("v3").inserted == 1
    result = runner.invoke(app, ["volume", "create", "v4", f"az://{azure_rig.container}/in/",
                                 "--option", "acount_name=x", *wh])
    assert result.exit_code == 1 and "account_name" in str(result.exception), result.output
    # a secret on the command line, a notification without its queue: one error line each
    for args in (["--option", "account_key=abc"], ["--notification", "type=AZURE_STORAGE_QUEUE"],
                 ["--notification", "type=AZURE_STORAGE_QUEUE,queue_name=q,bogus=1"]):
        result = runner.invoke(app, ["volume", "create", "v2", f"az://{azure_rig.container}/",
                                     *args, *wh])
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output


def test_cli_notification_a_queue_name_alone(tmp_path):
    """For abfss:// and az:// volumes `--notification` takes the queue's name alone, or the
    notification's keys without `type=` (the scheme tells it); nothing is contacted."""
    wh = ["--warehouse", str(tmp_path / "wh")]
    run("volume", "create", "a", f"abfss://c@{ACCOUNT}.dfs.core.windows.net/a/",
        "--notification", "events", *wh)
    run("volume", "create", "b", "az://c/b/", "--notification",
        "queue_name=b-events,wait_seconds=0", *wh)
    cat = vs.connect(tmp_path / "wh")
    assert cat.volume_spec("a").notification == {"type": "AZURE_STORAGE_QUEUE",
                                                 "queue_name": "events"}
    assert cat.volume_spec("b").notification == {"type": "AZURE_STORAGE_QUEUE",
                                                 "queue_name": "b-events", "wait_seconds": 0}


def test_sql_create_external_volume_on_abfss(tmp_path, azure_rig):
    cat = vs.connect(tmp_path / "wh")
    cat.sql(f"CREATE EXTERNAL VOLUME landing LOCATION '{location(azure_rig)}' "
            f"NOTIFICATION = (QUEUE_TYPE = 'AZURE_STORAGE_QUEUE', "
            f"QUEUE_NAME = '{azure_rig.queue_name}', WAIT_SECONDS = 0)")
    azure_rig.put("in/a.csv", b"abc")
    assert cat.watch("landing", until_idle=True, timeout=60, refresh=False).versions == [1]
    with pytest.raises(vs.SqlSyntaxError, match="needs a abfss:// location"):
        cat.sql("CREATE EXTERNAL VOLUME bad LOCATION 's3://b/in/' "
                "NOTIFICATION = (QUEUE_TYPE = 'AZURE_STORAGE_QUEUE', QUEUE_NAME = 'q')")
    with pytest.raises(vs.SqlSyntaxError, match="unknown NOTIFICATION option COLOUR"):
        cat.sql("CREATE EXTERNAL VOLUME bad LOCATION 'az://c/in/' "
                "NOTIFICATION = (QUEUE_TYPE = 'AZURE_STORAGE_QUEUE', QUEUE_NAME = 'q', "
                "COLOUR = 'blue')")
    info = StatusSource(cat).volume("landing", commits=1)
    assert (info["location"], info["files"], info["notification"]) == (
        location(azure_rig), 1, "AZURE_STORAGE_QUEUE")


def test_daemon_toml_and_config_check(tmp_path, azure_rig):
    from tests.volume_stream.test_bad_input import cli

    path = tmp_path / "vs.toml"
    good = (f'warehouse = "{tmp_path / "wh"}"\n[volumes.landing]\n'
            f'location = "{location(azure_rig)}"\n'
            f'notification = {{ type = "AZURE_STORAGE_QUEUE", queue_name = "q", '
            f'max_dequeue_count = 3 }}\n')
    path.write_text(good)
    cfg = DaemonConfig.load(path)
    assert cfg.volumes["landing"].notification_object() == vs.AzureQueueNotification(
        "q", max_dequeue_count=3)
    proc = cli("config", "check", str(path))
    assert proc.returncode == 0, proc.stderr
    for bad, says in (
            (good.replace('notification = { type = "AZURE_STORAGE_QUEUE", queue_name = "q", '
                          'max_dequeue_count = 3 }\n', ""), "no notification queue"),
            (good.replace("max_dequeue_count", "max_dequeue"), "max_dequeue"),
            (good.replace('type = "AZURE_STORAGE_QUEUE", queue_name = "q"',
                          'type = "AWS_SQS", queue_url = "https://q"'), "AZURE_STORAGE_QUEUE")):
        path.write_text(bad)
        proc = cli("config", "check", str(path))
        assert proc.returncode != 0 and says in proc.stderr and "Traceback" not in proc.stderr, \
            proc.stderr
