"""A gs:// volume made the other ways a user makes one: `volume create NAME gs://… --notification
SUBSCRIPTION --option KEY=VALUE`, `CREATE EXTERNAL VOLUME … LOCATION 'gs://…' NOTIFICATION =
(QUEUE_TYPE = 'GCP_PUBSUB', …)`, a daemon configuration that `config check` takes (and refuses
without its subscription); on fake-gcs-server and pstest."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json

from typer.testing import CliRunner

import volume_stream as vs
from tests.gcp_fixtures import gcp_emulators, gcp_env, gcs_rig  # noqa: F401
from volume_stream.cli import app

runner = CliRunner()


def run(*args: str, code: int = 0):
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def refused(*args: str) -> str:
    """The message of the error a command raises (`main` prints it as one line, exit 1)."""
    result = runner.invoke(app, list(args))
    assert isinstance(result.exception, vs.VolumeStreamError), result.output
    return " ".join(str(result.exception).split())


def test_volume_create_with_a_subscription_and_options(tmp_path, gcp_emulators, gcs_rig):
    rig, wh = gcs_rig, ["--warehouse", str(tmp_path / "wh")]
    rig.put("in/a.txt", b"old")
    run("volume", "create", "v", f"gs://{rig.bucket_name}/in/", "--notification",
        rig.subscription, "--option", f"storage_endpoint={gcp_emulators.storage}",
        "--option", f"pubsub_endpoint={gcp_emulators.pubsub}", *wh)
    assert "refreshed v" in run("volume", "refresh", "v", *wh).output
    rig.put("in/b.txt", b"new")
    rig.published(2)
    cat = vs.connect(tmp_path / "wh")
    assert cat.watch("v", until_idle=True, timeout=60, refresh=False).applied >= 1
    described = json.loads(run("volume", "describe", "v", "--json", *wh).stdout)
    assert described["files"] == 2 and "GCP_PUBSUB" in json.dumps(described)
    assert "--option takes KEY=VALUE" in refused("volume", "create", "w", "gs://b/x/",
                                                 "--option", "nonsense", *wh)
    assert "--notification takes the queue of abfss://, az://, gs://, s3://" in refused(
        "volume", "create", "w", "oss://b/x/", "--notification", "q", *wh)


def test_create_external_volume_on_gs(tmp_path, gcp_env, gcs_rig):
    rig = gcs_rig
    cat = vs.connect(tmp_path / "wh")
    cat.sql(f"CREATE EXTERNAL VOLUME v LOCATION 'gs://{rig.bucket_name}/in/' NOTIFICATION = "
            f"(QUEUE_TYPE = 'GCP_PUBSUB', QUEUE_NAME = '{rig.subscription}', "
            f"WAIT_TIME_SECONDS = 1)")
    assert cat.describe_volume("v")["notification"] == "GCP_PUBSUB"
    rig.put("in/a.txt", b"x")
    rig.published(1)
    assert cat.watch("v", until_idle=True, timeout=60, refresh=False).versions == [1]
    bad = runner.invoke(app, ["sql", "--warehouse", str(tmp_path / "wh"), "-e",
                              "CREATE EXTERNAL VOLUME w LOCATION 's3://b/x/' NOTIFICATION = "
                              "(QUEUE_TYPE = 'GCP_PUBSUB', QUEUE_NAME = 'projects/p/"
                              "subscriptions/s')"])
    assert bad.exit_code == 1 and "needs a gs:// location" in bad.output


def test_config_check_takes_a_gs_volume_with_its_subscription_only(tmp_path):
    file = tmp_path / "volume-stream.toml"
    base = ('warehouse = "wh"\n[metrics]\nenabled = false\n'
            '[volumes.landing]\nlocation = "gs://bkt/in/"\n')
    file.write_text(base)
    refused = run("config", "check", str(file), code=2)
    assert "GCP_PUBSUB (subscription = ...)" in " ".join(refused.output.split())
    file.write_text(base + '[volumes.landing.notification]\ntype = "GCP_PUBSUB"\n'
                    'subscription = "projects/p/subscriptions/s"\nwait_time_seconds = 5\n')
    assert "landing" in run("config", "check", str(file)).output
    file.write_text(base + '[volumes.landing.notification]\ntype = "GCP_PUBSUB"\n'
                    'queue_url = "projects/p/subscriptions/s"\n')
    assert "GCP_PUBSUB" in " ".join(run("config", "check", str(file), code=2).output.split())
    # a queue of another kind for a gs:// volume: refused by the check, not retried for ever
    file.write_text(base + '[volumes.landing.notification]\ntype = "AWS_SQS"\n'
                    'queue_url = "https://sqs.example/q"\n')
    out = " ".join(run("config", "check", str(file), code=2).output.split())
    assert "listens to a GCP_PUBSUB queue, not AWS_SQS" in out


def test_notification_given_as_its_keys_takes_the_type_of_the_scheme(tmp_path):
    """`--notification` is a queue's address or the daemon's notification keys; without
    `type=` the keys are the volume's scheme's (no emulator: nothing is contacted)."""
    wh = ["--warehouse", str(tmp_path / "wh")]
    run("volume", "create", "k", "gs://b/k/", "--notification",
        "subscription=projects/p/subscriptions/s,wait_time_seconds=2", *wh)
    run("volume", "create", "t", "gs://b/t/", "--notification",
        "type=gcp_pubsub,subscription=projects/p/subscriptions/t", *wh)
    cat = vs.connect(tmp_path / "wh")
    assert cat.volume_spec("k").notification == {
        "type": "GCP_PUBSUB", "subscription": "projects/p/subscriptions/s",
        "wait_time_seconds": 2}
    assert cat.volume_spec("t").notification == {
        "type": "GCP_PUBSUB", "subscription": "projects/p/subscriptions/t"}
    assert "--option credentials_file: credentials come from the environment" in refused(
        "volume", "create", "c", "gs://b/c/", "--option", "credentials_file=/k.json", *wh)
