"""Two `volume-stream daemon` processes on one S3 warehouse (moto, own process) and one S3
volume fed by one SQS queue, one of them SIGKILLed again and again while files arrive: every
file ends up in the directory table, each is INSERTed exactly once, and the versions are
contiguous (no version written twice)."""

from __future__ import annotations

import signal
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import volume_stream as vs
from tests.aws_fixtures import make_rig
from tests.s3_warehouse_fixtures import child_env
from tests.volume_stream.test_daemon_process import DaemonProcess


def write_config(path: Path, warehouse: str) -> Path:
    path.write_text(textwrap.dedent(f"""
        warehouse = "{warehouse}"
        [storage_options]
        AWS_REGION = "us-east-1"
        [metrics]
        port = 0
        [daemon]
        backoff_initial_s = 0.05
        backoff_max_s = 0.5
        shutdown_timeout_s = 20
        [volumes.vol]
        max_wait_s = 0.05
    """))
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_daemons_one_s3_warehouse_one_killed_repeatedly(s3_env, s3_bucket, tmp_path):
    rig = make_rig(s3_env, queue_attributes={"VisibilityTimeout": "2"})
    rig.purge()
    uri = f"s3://{s3_bucket}/wh"
    cat = vs.connect(uri)
    cat.create_volume("vol", f"s3://{rig.bucket}/data/",
                      notification=vs.SqsNotification(rig.queue_url))
    cat.create_stream("ao", on_volume="vol", mode="APPEND_ONLY")
    cfg = write_config(tmp_path / "vs.toml", uri)
    env = child_env(s3_env)
    steady = DaemonProcess(cfg, tmp_path / "steady.log", env).start()
    victims: list[DaemonProcess] = []
    names: list[str] = []
    try:
        steady.wait_ready(120)
        for round_ in range(3):
            victim = DaemonProcess(cfg, tmp_path / f"victim-{round_}.log", env).start()
            victims.append(victim)
            victim.wait_ready(120)
            for i in range(12):
                name = f"r{round_}/f{i:02d}.txt"
                rig.put(f"data/{name}", f"{round_}-{i}".encode())
                names.append(name)
            time.sleep(0.3 * round_)  # kill at different moments of the batches' commits
            victim.signal(signal.SIGKILL)
            victim.wait(30)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if cat.directory_table("vol").file_count() == len(names):
                break
            time.sleep(0.5)
        steady.signal(signal.SIGTERM)
        assert steady.wait(60) == 0
    finally:
        for d in [steady, *victims]:
            d.kill()
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)
    stored = sorted(cat.directory_table("vol").snapshot()["relative_path"].to_pylist())
    assert stored == sorted(names)  # nothing lost
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("ao").to_pylist())
    assert inserts == Counter(names)  # nothing applied twice
    history = cat.history("vol")
    assert [h["version"] for h in history] == list(range(len(history) - 1, -1, -1))
