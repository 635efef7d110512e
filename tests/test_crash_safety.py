"""Crash safety of `volume-stream daemon` (issue 6): while files are written continuously, the
real daemon process is SIGKILLed at random points 20 times and restarted. At the end the
directory table equals a fresh listing, an APPEND_ONLY stream created before the run holds
exactly one INSERT per file, and (S3 + SQS) no message is left on the queue.

Both tests take about a minute each on a loaded 2-core machine (marked `slow`): 20 process
starts are the point of the test. The kill schedule is seeded and printed, so a failure can be
replayed with CRASH_SEED=<seed>.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import volume_stream as vs
from tests.aws_fixtures import aws_env, make_rig, moto_server, queue_counts  # noqa: F401
from tests.volume_stream.test_daemon_process import (
    DaemonProcess,
    listing,
    table_state,
    wait_converged,
    write_config,
)

KILLS = 20
SEED = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))


class Writer(threading.Thread):
    """Writes new files (directly, or staged and renamed into place) and overwrites a few,
    until stopped; remembers every path it created."""

    def __init__(self, write, rng: random.Random, rate_s: float = 0.04):
        super().__init__(name="crash-test-writer")
        self.write, self.rng, self.rate_s = write, rng, rate_s
        self.created: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            i = 0
            while not self.halt.is_set():
                if self.created and self.rng.random() < 0.1:
                    self.write(self.rng.choice(self.created), overwrite=True)
                else:
                    name = f"d{i % 7}/f{i:05d}.txt"
                    self.write(name, overwrite=False)
                    self.created.append(name)
                    i += 1
                time.sleep(self.rng.uniform(0, 2 * self.rate_s))
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> list[str]:
        self.halt.set()
        self.join(30)
        assert self.error is None, self.error
        return list(self.created)


def kill_at_random_points(cfg: Path, log: Path, rng: random.Random,
                          env: dict[str, str] | None = None) -> None:
    """Start the daemon and SIGKILL it KILLS times: during start-up (imports, the start
    refresh) about a third of the time, else after it is ready, in steady state."""
    for _ in range(KILLS):
        daemon = DaemonProcess(cfg, log, env).start()
        try:
            if rng.random() < 0.35:
                time.sleep(rng.uniform(0.2, 2.0))
            else:
                daemon.wait_ready(120)
                time.sleep(rng.uniform(0.0, 1.5))
        finally:
            daemon.proc.kill()
            daemon.wait()
        assert daemon.proc.returncode == -signal.SIGKILL


def final_run(cfg: Path, log: Path, converged, env: dict[str, str] | None = None
              ) -> DaemonProcess:
    """One last daemon: wait until `converged()`, then a clean SIGTERM stop."""
    daemon = DaemonProcess(cfg, log, env).start()
    try:
        daemon.wait_ready(120)
        converged()
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        daemon.kill()
    return daemon


def errors_logged(daemon: DaemonProcess) -> list[str]:
    return [r["message"] for r in daemon.records() if r.get("level") in ("ERROR", "CRITICAL")]


@pytest.mark.slow
def test_local_volume_survives_20_sigkills(tmp_path):
    rng = random.Random(SEED)
    print(f"CRASH_SEED={SEED}")
    data, staging, wh = tmp_path / "data", tmp_path / "staging", tmp_path / "wh"
    data.mkdir()
    staging.mkdir()
    for d in range(7):
        (data / f"d{d}").mkdir()
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    cat.create_stream("inserts", "vol", mode="APPEND_ONLY")
    cfg = write_config(tmp_path / "vs.toml", wh, data)
    log = tmp_path / "daemon.log"

    def write(name: str, overwrite: bool) -> None:
        body = os.urandom(rng.randint(0, 64))
        if overwrite or rng.random() < 0.5:
            (data / name).write_bytes(body)  # written in place: appears on close
        else:
            tmp = staging / name.replace("/", "_")
            tmp.write_bytes(body)
            os.rename(tmp, data / name)  # renamed into place

    writer = Writer(write, random.Random(SEED + 1))
    writer.start()
    try:
        kill_at_random_points(cfg, log, rng)
    finally:
        created = writer.finish()
    daemon = final_run(cfg, log, lambda: wait_converged(cat, data, timeout=120))

    assert table_state(cat) == listing(data)
    assert cat.refresh("vol").version is None  # a fresh listing finds nothing to change
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("inserts").to_pylist())
    assert set(inserts) == set(created) and len(created) > 200
    assert [p for p, n in inserts.items() if n != 1] == []  # exactly once each
    history = cat.directory_table("vol").history()
    assert [h["version"] for h in history] == list(range(len(history) - 1, -1, -1))
    assert errors_logged(daemon) == []


@pytest.mark.slow
def test_s3_sqs_volume_survives_20_sigkills(tmp_path, aws_env):  # noqa: F811
    from volume_stream.volumes import SqsNotification

    rng = random.Random(SEED)
    print(f"CRASH_SEED={SEED}")
    # Messages a killed daemon held come back after 10 s. A receive drains at most 100
    # messages, so it ends well within that even when moto answers slowly (a drain longer
    # than the visibility timeout would re-receive its own messages).
    rig = make_rig(aws_env, queue_attributes={"VisibilityTimeout": "10"})
    wh = tmp_path / "wh"
    cat = vs.connect(wh)
    cat.create_volume("vol", f"s3://{rig.bucket}/in/",
                      notification=SqsNotification(rig.queue_url, wait_time_seconds=1,
                                                   max_batch_messages=100))
    cat.create_stream("inserts", "vol", mode="APPEND_ONLY")
    cfg = tmp_path / "vs.toml"
    cfg.write_text(f"""
warehouse = "{wh}"
[metrics]
port = 0
[daemon]
stats_interval_s = 0.5
backoff_initial_s = 0.05
backoff_max_s = 0.5
[volumes.vol]
max_wait_s = 0.1
poll_s = 0.5
""")
    log = tmp_path / "daemon.log"

    def write(name: str, overwrite: bool) -> None:
        rig.put(f"in/{name}", os.urandom(rng.randint(0, 64)))

    def s3_state() -> dict[str, tuple]:
        out = {}
        for page in rig.s3.get_paginator("list_objects_v2").paginate(Bucket=rig.bucket,
                                                                       Prefix="in/"):
            for obj in page.get("Contents", []):
                out[obj["Key"][3:]] = (obj["Size"], obj["ETag"].strip('"'))
        return out

    def converged() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if table_state(cat) == s3_state() and queue_counts(rig) == (0, 0):
                return
            time.sleep(0.2)
        raise AssertionError(f"not converged: queue {queue_counts(rig)}, missing "
                             f"{sorted(set(s3_state()) - set(table_state(cat)))[:10]}")

    writer = Writer(write, random.Random(SEED + 1), rate_s=0.05)
    writer.start()
    try:
        kill_at_random_points(cfg, log, rng)
    finally:
        created = writer.finish()
    daemon = final_run(cfg, log, converged)

    assert queue_counts(rig) == (0, 0)  # every message acknowledged, none in flight
    assert table_state(cat) == s3_state()
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("inserts").to_pylist())
    assert set(inserts) == set(created) and len(created) > 150
    assert [p for p, n in inserts.items() if n != 1] == []
    assert errors_logged(daemon) == []
    rig.sqs.delete_queue(QueueUrl=rig.queue_url)
