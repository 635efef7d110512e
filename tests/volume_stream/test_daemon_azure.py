"""The daemon on an `abfss://` volume over Azurite: malformed and poison messages never stop it
(they reach the poison queue by their dequeue count while good files commit once), and a
daemon process SIGKILLed again and again while blobs come and go loses and doubles nothing.

Azurite emits no Event Grid events: tests/azure_fixtures.py delivers the message of each write
(its doc says what it makes up)."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from functools import partial
from pathlib import Path

import pytest

import volume_stream as vs
from tests.azure_fixtures import (  # noqa: F401
    ACCOUNT,
    azure_env,
    azure_rig,
    azurite,
    event_message,
)
from tests.volume_stream.test_daemon import config, metric, wait_for
from tests.volume_stream.test_daemon_process import DaemonProcess
from volume_stream.daemon import Daemon

REPO = Path(__file__).resolve().parents[2]


def location(rig) -> str:
    return f"abfss://{rig.container}@{ACCOUNT}.dfs.core.windows.net/in/"


def test_malformed_and_poison_messages_reach_the_poison_queue_and_never_stop_it(tmp_path,
                                                                                azure_rig):
    cat = vs.connect(tmp_path / "wh")
    note = vs.AzureQueueNotification(azure_rig.queue_name, wait_seconds=1, visibility_timeout=1,
                                     max_dequeue_count=2)
    cat.create_volume("vol", location(azure_rig), notification=note)
    cat.create_stream("inserts", "vol", mode="APPEND_ONLY")
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0.2, "poll_s": 0.5}}, poison_after=1)
    # parses, but cannot be stored: a size no table column holds
    poison = event_message("BlobCreated", azure_rig.container, "in/huge.bin",
                           sequencer="1".rjust(32, "0"), etag="0x1", size=10**20)
    with Daemon(cfg, catalog=cat) as daemon:
        wait_for(lambda: daemon.readiness()[0])
        azure_rig.send("this is not an event")
        azure_rig.send(poison)
        azure_rig.put("in/a.txt", b"a")
        azure_rig.put("in/sub/b.txt", b"bb")
        table = cat.directory_table("vol")
        wait_for(lambda: table.file_count() == 2, timeout=60)
        wait_for(lambda: azure_rig.counts() == (0, 2), timeout=90, interval=0.5)
        assert daemon.health()[0]
    assert metric(daemon, "volume_stream_messages_malformed_total", volume="vol") >= 1
    paths = sorted(table.snapshot(columns=["relative_path"])["relative_path"].to_pylist())
    assert paths == ["a.txt", "sub/b.txt"]
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("inserts").to_pylist())
    assert inserts == Counter({"a.txt": 1, "sub/b.txt": 1})


def converged(cat, expected: dict[str, int], rig) -> bool:
    snap = cat.directory_table("vol").snapshot(columns=["relative_path", "size"])
    got = dict(zip(snap["relative_path"].to_pylist(), snap["size"].to_pylist(), strict=True))
    return got == expected and rig.counts() == (0, 0)


def write_config(tmp_path: Path, rig) -> Path:
    path = tmp_path / "daemon.toml"
    path.write_text(f"""
warehouse = "{tmp_path / 'wh'}"
log_level = "INFO"

[metrics]
port = 0

[daemon]
backoff_initial_s = 0.05
backoff_max_s = 0.5

[volumes.vol]
location = "{location(rig)}"
notification = {{ type = "AZURE_STORAGE_QUEUE", queue_name = "{rig.queue_name}", wait_seconds = 1, visibility_timeout = 2, max_dequeue_count = 50 }}
refresh_on_start = false
refresh_interval_s = 0
max_wait_s = 0.2
poll_s = 0.5
""")
    return path


@pytest.mark.parametrize("kills", [
    1, pytest.param(8, marks=pytest.mark.slow, id="8-kills")])
def test_a_daemon_sigkilled_while_blobs_come_and_go_loses_and_doubles_nothing(tmp_path,
                                                                               azure_rig, kills):
    """Only the queue feeds the table (no refresh at start): every change must arrive by a
    message the killed daemons did not ack, and none may count twice. `make test` kills once,
    `make soak` eight times."""
    rng = random.Random(36)
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # azure_env's connection string
    cfg = write_config(tmp_path, azure_rig)
    names = [f"in/f{i}.txt" for i in range(8)]
    present: dict[str, int] = {}
    for round_ in range(kills + 1):
        daemon = DaemonProcess(cfg, tmp_path / "daemon.log", env).start()
        try:
            daemon.wait_ready()
            for _ in range(12):
                name = rng.choice(names)
                if name in present and rng.random() < 0.3:
                    azure_rig.delete(name)
                    del present[name]
                else:
                    size = rng.randrange(1, 50)
                    azure_rig.put(name, b"x" * size)
                    present[name] = size
            if round_ < kills:
                daemon.signal(signal.SIGKILL)
                daemon.wait()
                continue
            cat = vs.connect(tmp_path / "wh")
            expected = {n.removeprefix("in/"): s for n, s in present.items()}
            wait_for(partial(converged, cat, expected, azure_rig), timeout=120, interval=0.5)
        finally:
            daemon.kill()
    # nothing doubled: no change in the table's feed changes nothing (an event applied twice
    # would be an update to the same image, or a second insert of a present path)
    table = cat.directory_table("vol")
    feed = table.changes(0, table.version()).to_pylist()
    live: dict[str, str] = {}
    for row in sorted(feed, key=lambda r: (r["_commit_version"],
                                           r["_change_type"] != "update_preimage")):
        key, kind = row["relative_path"], row["_change_type"]
        if kind == "insert":
            assert key not in live, row
            live[key] = row["etag"]
        elif kind == "delete":
            assert live.pop(key) == row["etag"], row
        elif kind == "update_preimage":
            assert live[key] == row["etag"], row
        else:
            assert live[key] != row["etag"], row  # an update changes the blob
            live[key] = row["etag"]
    assert set(live) == set(expected)
    assert json.dumps(daemon.records())  # the log is JSON lines


def test_the_daemon_s_log_carries_no_azure_http_chatter(azure_rig):
    """azure-core logs each request and response with their headers at INFO: a daemon at INFO
    would write several lines per queue poll. Its logging quiets the `azure` loggers."""
    import io
    import logging

    from connectors.azure.store import AzureLister
    from volume_stream.daemon.logs import configure_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("azure").level)
    stream = io.StringIO()
    try:
        configure_logging("INFO", stream=stream)
        azure_rig.put("in/a.csv", b"abc", deliver=False)
        assert len(list(AzureLister(azure_rig.container, "in/").list())) == 1
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger("azure").setLevel(saved[2])
    assert "Request URL" not in stream.getvalue() and "Response status" not in stream.getvalue()
