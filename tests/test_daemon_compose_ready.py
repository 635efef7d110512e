"""The daemon configuration of deploy/compose (an S3 prefix fed by SQS, and a local folder)
reaches /readyz against moto's server, and commits what lands in the bucket.

The file is used as shipped; only what names the compose network and the container's folders is
substituted: moto's endpoint, a unique bucket and queue (moto keeps one state per process), the
warehouse, the local folder and the metrics address."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import volume_stream as vs
from tests.aws_fixtures import FAKE_ENV, UNSET_ENV, make_rig, moto_server  # noqa: F401
from tests.volume_stream.test_daemon_process import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose" / "volume-stream.toml"


def test_compose_config_is_ready_on_moto_and_commits_s3_events(tmp_path, moto_server):
    rig = make_rig(moto_server)
    text = COMPOSE.read_text()
    queue_name = rig.queue_url.rsplit("/", 1)[1]
    for old, new in [("http://moto:5000/123456789012/raw-events", rig.queue_url),
                     ('"s3://raw/incoming/"', f'"s3://{rig.bucket}/incoming/"'),
                     ('"/var/lib/volume-stream/warehouse"', f'"{tmp_path / "wh"}"'),
                     ('"/data/landing"', f'"{tmp_path / "landing"}"'),
                     ('host = "0.0.0.0"', 'host = "127.0.0.1"'), ("port = 9108", "port = 0"),
                     ("wait_time_seconds = 5", "wait_time_seconds = 1")]:
        assert old in text, old
        text = text.replace(old, new)
    assert "moto:5000" not in text and queue_name in text
    (tmp_path / "landing").mkdir()
    rig.put("incoming/before.json", b"{}")  # there before the daemon: its start refresh
    config = tmp_path / "volume-stream.toml"
    config.write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in UNSET_ENV}
    env.update(FAKE_ENV, AWS_ENDPOINT_URL=moto_server)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", env=env).start()
    try:
        daemon.wait_ready(timeout=120)
        status, body = daemon.get("/readyz")
        assert status == 200, body
        rig.put("incoming/2024/after.json", b"[1]")  # arrives through SQS
        cat = vs.connect(tmp_path / "wh", create=False)
        deadline = time.monotonic() + 120
        while True:
            seen = sorted(r["relative_path"] for r in
                          cat.read_stream_arrow("raw_images").to_pylist())
            if seen == ["2024/after.json", "before.json"]:
                break
            assert time.monotonic() < deadline, (seen, daemon.log.read_text()[-3000:])
            time.sleep(0.2)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0, daemon.log.read_text()[-3000:]
    finally:
        daemon.kill()
        rig.sqs.delete_queue(QueueUrl=rig.queue_url)
    assert not re.search(r"Traceback", daemon.log.read_text())
