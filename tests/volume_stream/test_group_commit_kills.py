"""Group commit under a feeder with kills (issue 26): a real `volume-stream daemon` process on a
local (inotify) volume while a feeder writes files, first a trickle, then a flood; the daemon
is SIGKILLed in the middle of the flood (mid-batch, with events buffered and unacknowledged)
and restarted. No event is lost or doubled: the table equals a fresh listing and an
APPEND_ONLY stream created before the run holds exactly one INSERT per file. Batch sizes grow
with the load: the trickle commits a few events at a time, the flood hundreds.

The short scenario (one kill) runs in `make test`; `make soak` runs the long one (8 kills at
random points of the flood).
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
from tests.volume_stream.test_daemon_process import (
    DaemonProcess,
    listing,
    table_state,
    wait_converged,
    write_config,
)

SEED = int(os.environ.get("GROUP_COMMIT_SEED", random.randrange(1 << 30)))


class Feeder(threading.Thread):
    """Writes new files (and overwrites some) `per_tick` at a time every `tick_s` seconds until
    stopped; `per_tick` can be changed while it runs (the flood; 0 pauses it)."""

    def __init__(self, data: Path, rng: random.Random):
        super().__init__(name="group-commit-kill-feeder")
        self.data, self.rng = data, rng
        self.per_tick, self.tick_s = 1, 0.05
        self.created: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            i = 0
            while not self.halt.is_set():
                for _ in range(self.per_tick):
                    if self.created and self.rng.random() < 0.1:
                        name = self.rng.choice(self.created)   # an overwrite
                    else:
                        name = f"d{i % 5}/f{i:06d}.txt"
                        self.created.append(name)
                        i += 1
                    (self.data / name).write_bytes(os.urandom(self.rng.randint(0, 32)))
                self.halt.wait(self.tick_s)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def finish(self) -> list[str]:
        self.halt.set()
        if self.ident is not None:  # started
            self.join(30)
        assert self.error is None, self.error
        return list(self.created)


def commit_sizes(daemon: DaemonProcess, since_start: bool = True) -> list[int]:
    """Events per batch the daemon committed (from its JSON logs)."""
    return [int(r["events"]) for r in daemon.records(since_start)
            if r.get("message", "").startswith("volume vol: committed version")
            and "events" in r]


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.05)


def run_scenario(tmp_path: Path, kills: int, rng: random.Random) -> None:
    data, wh = tmp_path / "data", tmp_path / "wh"
    data.mkdir()
    for d in range(5):
        (data / f"d{d}").mkdir()
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    cat.create_stream("inserts", "vol", mode="APPEND_ONLY")
    cfg = write_config(tmp_path / "vs.toml", wh, data, target_commit_s=2.0)
    log = tmp_path / "daemon.log"
    feeder = Feeder(data, random.Random(rng.random()))
    trickle: list[int] = []
    flood: list[int] = []
    daemon = DaemonProcess(cfg, log).start()
    try:
        daemon.wait_ready(120)
        feeder.start()
        wait_for(lambda: len(commit_sizes(daemon)) >= 6)        # the trickle: ~20 files/s
        trickle = commit_sizes(daemon)
        for kill in range(kills):
            if kill:
                daemon = DaemonProcess(cfg, log).start()
                daemon.wait_ready(120)
            feeder.per_tick = 60                                # the flood: ~1,200 files/s
            # kill mid-flood: once a batch of it has committed (and the run has written
            # enough files to say something: the first kill waits for 300), at a random moment
            wait_for(lambda d=daemon: any(n >= 100 for n in commit_sizes(d))
                     and len(feeder.created) > 300, 120)
            time.sleep(rng.uniform(0.0, 1.0))
            flood += commit_sizes(daemon)
            daemon.proc.kill()
            feeder.per_tick = 0                                 # paused while it is down
            daemon.wait()
            assert daemon.proc.returncode == -signal.SIGKILL
    finally:
        created = feeder.finish()
        daemon.kill()
    final = DaemonProcess(cfg, log).start()   # the restart heals what the kills dropped
    try:
        final.wait_ready(120)
        wait_converged(cat, data, timeout=120)
        final.signal(signal.SIGTERM)
        assert final.wait(60) == 0
    finally:
        final.kill()

    assert table_state(cat) == listing(data)
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("inserts").to_pylist())
    assert set(inserts) == set(created) and len(created) > 300
    assert [p for p, n in inserts.items() if n != 1] == []     # no event lost or doubled
    # batch sizes grow with the load
    assert max(flood) >= 100 and max(flood) > 5 * max(trickle[1:] or [1]), (trickle, flood)
    errors = [r["message"] for r in final.records() if r.get("level") in ("ERROR", "CRITICAL")]
    assert errors == []
    print(f"GROUP-COMMIT-KILLS seed={SEED} kills={kills} files={len(created)} "
          f"trickle_batches={trickle} flood_max={max(flood)} flood_batches={len(flood)}")


def test_group_commit_survives_a_sigkill_mid_flood(tmp_path):
    run_scenario(tmp_path, kills=1, rng=random.Random(SEED))


@pytest.mark.soak
def test_group_commit_survives_8_sigkills_mid_flood(tmp_path):
    print(f"GROUP_COMMIT_SEED={SEED}")
    run_scenario(tmp_path, kills=8, rng=random.Random(SEED))
