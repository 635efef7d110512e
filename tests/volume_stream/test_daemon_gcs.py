"""A `volume-stream daemon` process on a gs:// volume (fake-gcs-server and pstest, real
processes), SIGKILLed while files come, are overwritten and go: nothing is lost (the directory
table ends equal to the bucket), nothing is doubled (each file INSERTed once, versions
contiguous), and the status page and metrics show the volume like any other."""

# ruff: noqa: F811 - the fixtures are imported explicitly and injected by name

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import volume_stream as vs
from tests.gcp_fixtures import GcsRig, gcp_emulators, gcs_rig  # noqa: F401
from tests.volume_stream.test_daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, warehouse: Path) -> Path:
    path.write_text(textwrap.dedent(f"""
        warehouse = "{warehouse}"
        [metrics]
        port = 0
        [daemon]
        backoff_initial_s = 0.05
        backoff_max_s = 0.5
        shutdown_timeout_s = 20
        [volumes.vol]
        max_wait_s = 0.05
        poll_s = 0.5
    """))
    return path


def bucket_state(rig: GcsRig, prefix: str) -> dict[str, int]:
    return {b.name[len(prefix):]: b.size for b in rig.storage.list_blobs(rig.bucket_name,
                                                                          prefix=prefix)}


def table_state(cat) -> dict[str, int]:
    snap = cat.directory_table("vol").snapshot(columns=["relative_path", "size"]).to_pydict()
    return dict(zip(snap["relative_path"], snap["size"], strict=True))


def run_scenario(rig: GcsRig, tmp_path: Path, rounds: int, per_round: int) -> None:
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", f"gs://{rig.bucket_name}/data/",
                      notification=vs.PubSubNotification(rig.subscription,
                                                         wait_time_seconds=1))
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    cat.create_stream("std", "vol")
    cfg = write_config(tmp_path / "vs.toml", tmp_path / "wh")
    env = {**os.environ, **rig.emulators.env, "PYTHONPATH": str(REPO)}
    daemons: list[DaemonProcess] = []
    created: list[str] = []
    try:
        for round_ in range(rounds):
            daemon = DaemonProcess(cfg, tmp_path / f"daemon-{round_}.log", env).start()
            daemons.append(daemon)
            daemon.wait_ready(120)
            for i in range(per_round):
                name = f"r{round_}/f{i:02d}.txt"
                rig.put(f"data/{name}", f"{round_}-{i}".encode())
                created.append(name)
                if round_ and i % 3 == 0:  # overwrite a file of an earlier round
                    rig.put(f"data/r{round_ - 1}/f{i:02d}.txt", b"overwritten" * (i + 1))
                if round_ and i % 4 == 1:  # and delete another
                    rig.delete(f"data/r{round_ - 1}/f{i:02d}.txt")
            time.sleep(0.2 * round_)  # killed at different moments of its batches
            daemon.signal(signal.SIGKILL)
            daemon.wait(30)
        final = DaemonProcess(cfg, tmp_path / "daemon-final.log", env).start()
        daemons.append(final)
        final.wait_ready(120)
        want = bucket_state(rig, "data/")
        deadline = time.monotonic() + 120
        while table_state(cat) != want and time.monotonic() < deadline:
            time.sleep(0.3)
        assert table_state(cat) == want  # nothing lost
        status, page = final.get("/volumes/vol.json")
        assert status == 200 and f"gs://{rig.bucket_name}/data/" in page.decode()
        assert final.metric("volume_stream_events_applied_total", volume="vol") >= 0
        final.signal(signal.SIGTERM)
        assert final.wait(60) == 0
    finally:
        for d in daemons:
            d.kill()
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("ao").to_pylist())
    assert max(inserts.values()) == 1  # nothing applied twice
    assert set(want) <= set(inserts)  # every file that stayed was inserted once
    std = {r["relative_path"]: r["size"] for r in cat.read_stream_arrow("std").to_pylist()}
    assert std == want  # the net change since the start is the bucket
    history = cat.history("vol")
    assert [h["version"] for h in history] == list(range(len(history) - 1, -1, -1))
    assert json.dumps(want)  # (what was compared, for the failure message)


def test_daemon_sigkilled_while_files_come_and_go(gcs_rig, tmp_path):
    run_scenario(gcs_rig, tmp_path, rounds=2, per_round=8)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_daemon_sigkilled_many_times_while_files_come_and_go(gcs_rig, tmp_path):
    run_scenario(gcs_rig, tmp_path, rounds=6, per_round=25)
