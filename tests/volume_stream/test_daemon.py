"""The daemon in-process: a real local volume end to end, and its loop's rules (batching,
acknowledging after the commit, poison events, failing listeners, refreshes, pipelines) driven
by a scripted listener that implements the `Listener` protocol over a real directory table."""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import volume_stream as vs
from connectors.errors import ConnectorError
from connectors.events import FileEvent
from connectors.memory import MemoryListener
from connectors.protocols import Received
from volume_stream.config.daemon import DaemonConfig
from volume_stream.daemon import Daemon
from volume_stream.errors import ConfigError
from volume_stream.volumes.watcher import VolumeWatcher

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def wait_for(predicate, timeout=30.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def config(tmp_path, volumes=None, pipelines=None, **daemon):
    tuning = {"backoff_initial_s": 0.05, "backoff_max_s": 0.2, "stats_interval_s": 0.2,
              **daemon}
    return DaemonConfig.from_mapping({
        "warehouse": str(tmp_path / "wh"), "metrics": {"port": 0}, "daemon": tuning,
        "volumes": volumes or {}, "pipelines": pipelines or {}})


def metric(daemon, name, **labels):
    value = daemon.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def paths(table):
    return sorted(table.snapshot(columns=["relative_path"])["relative_path"].to_pylist())


def put(i, size=1):
    t = T0 + timedelta(seconds=i)
    return FileEvent.created(f"f{i:03d}.txt", size=size, last_modified_time=t, event_time=t)


class ScriptedListener:
    """A `Listener` that hands out scripted receipts (or raises scripted errors) and records
    each acknowledgement with the table version current at that moment."""

    def __init__(self, table, script=()):
        self.table = table
        self.script = deque(script)
        self.acks: list[tuple[tuple, int]] = []
        self.closed = False
        self.tail = Received()  # what receive returns once the script is done
        self.tails = 0

    def receive(self, timeout):
        if self.script:
            item = self.script.popleft()
            if isinstance(item, Exception):
                raise item
            return item
        time.sleep(min(timeout, 0.02))
        self.tails += 1
        return self.tail

    def ack(self, handles):
        self.acks.append((tuple(handles), self.table.version()))

    def extend(self, handles, seconds):
        pass

    @property
    def idle(self):
        return not self.script

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def rig(tmp_path):
    """A warehouse with volume 'vol' on a real folder, and a factory of scripted watchers."""
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", data)
    opened: list[ScriptedListener] = []
    scripts: deque[list] = deque()

    def open_watcher(name):
        table = cat.directory_table(name)
        listener = ScriptedListener(table, scripts.popleft() if scripts else ())
        listener.tail = r.tail
        opened.append(listener)
        return VolumeWatcher(table, listener, lambda p: not p.endswith(".tmp"),
                             lambda: cat.refresh(name))

    class Rig:
        pass

    r = Rig()
    r.tail = Received()
    r.cat, r.data, r.opened, r.scripts, r.open_watcher = cat, data, opened, scripts, open_watcher
    r.table = cat.directory_table("vol")
    return r


# ---------------------------------------------------------------------- real local volume
def test_local_volume_end_to_end_with_metrics_and_probes(tmp_path):
    data = tmp_path / "landing"
    (data / "old").mkdir(parents=True)
    (data / "old" / "before.txt").write_text("existed before the daemon")
    cfg = config(tmp_path, volumes={"landing": {
        "location": str(data), "max_wait_s": 0.1, "notification": {"type": "LOCAL",
                                                                   "debounce_s": 0.05},
        "streams": {"arrivals": {"mode": "APPEND_ONLY"}, "changes": {}}}})
    with Daemon(cfg) as daemon:
        cat = daemon.catalog
        assert wait_for(lambda: daemon.readiness()[0])
        (data / "new.txt").write_text("new")
        (data / "old" / "before.txt").write_text("overwritten, longer")
        want = {("INSERT", "new.txt"), ("INSERT", "old/before.txt")}
        wait_for(lambda: {(r["__change_type"], r["relative_path"]) for r in
                          cat.read_stream_arrow("arrivals").to_pylist()} == want)
        wait_for(lambda: cat.directory_table("landing").snapshot(
            columns=["size"])["size"].to_pylist().count(19) == 1)
        wait_for(lambda: metric(daemon, "volume_stream_stream_pending_changes",
                                stream="arrivals", volume="landing") == 2)
        base = daemon.server.url
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["ok"] and body["volumes"]["landing"]["listening"]
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert 'volume_stream_events_received_total{volume="landing"}' in text
        assert metric(daemon, "volume_stream_refreshes_total", volume="landing",
                      reason="start") == 1
        # the gauges are sampled every stats_interval_s: wait for them, do not read them once
        wait_for(lambda: metric(daemon, "volume_stream_events_applied_total",
                                volume="landing") >= 2)
        wait_for(lambda: metric(daemon, "volume_stream_directory_files", volume="landing") == 2)
        wait_for(lambda: metric(daemon, "volume_stream_directory_version", volume="landing")
                 == cat.directory_table("landing").version())
    assert not any(r.alive for r in daemon.runners.values())
    assert cat.refresh("landing").version is None  # the table equals a fresh listing


def test_existing_volume_must_match_and_missing_needs_a_location(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("vol", tmp_path)
    with pytest.raises(ConfigError, match=r"volume 'vol' exists at file://.*but the "
                                          r"configuration says file://.*elsewhere"):
        Daemon(config(tmp_path, volumes={"vol": {"location": str(elsewhere)}})).prepare()
    with pytest.raises(ConfigError, match=r"volume 'ghost' is not in the warehouse .* \(it has: "
                                          r"vol\) and no 'location'"):
        Daemon(config(tmp_path, volumes={"ghost": {}})).prepare()
    with pytest.raises(ConfigError, match=r"\[volumes.other\] location: .*does not exist"):
        Daemon(config(tmp_path, volumes={"other": {"location": str(tmp_path / "no")}})).prepare()
    cat.create_volume("vol2", elsewhere)
    cat.create_stream("s", "vol2")
    with pytest.raises(ConfigError, match="stream 's' exists on volume 'vol2', not 'vol'"):
        Daemon(config(tmp_path, volumes={"vol": {"streams": {"s": {}}}})).prepare()
    Daemon(config(tmp_path, volumes={"vol": {"location": str(tmp_path)}})).prepare()  # matches


# ---------------------------------------------------------------------- loop rules
def test_batches_commit_once_and_ack_only_after_their_commit(tmp_path, rig):
    receipts = [Received(events=tuple(put(5 * r + i) for i in range(5)),
                         handles=tuple(f"h{5 * r + i}" for i in range(5))) for r in range(6)]
    receipts.insert(2, Received(handles=("test-event",), ignored=1))  # nothing to commit
    receipts.insert(4, Received(malformed=2))
    rig.scripts.append(receipts)
    cfg = config(tmp_path, volumes={"vol": {"max_batch_events": 10, "max_wait_s": 5,
                                            "refresh_on_start": False}})
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: len(paths(rig.table)) == 30)
        listener = rig.opened[0]
        wait_for(lambda: sum(len(h) for h, _ in listener.acks) == 31)
    assert rig.table.version() == 3  # 30 events, at most 10 per commit
    for handles, version in listener.acks:
        present = set(rig.table.snapshot(version, columns=["relative_path"])
                      ["relative_path"].to_pylist())
        for h in handles:
            if h != "test-event":
                assert f"f{int(h[1:]):03d}.txt" in present, (h, version)
    assert metric(daemon, "volume_stream_messages_malformed_total", volume="vol") == 2
    assert metric(daemon, "volume_stream_events_ignored_total", volume="vol") == 1
    assert metric(daemon, "volume_stream_batch_events_count", volume="vol") == 3
    assert listener.closed


def test_a_quiet_queue_commits_at_once_and_a_busy_one_batches(tmp_path, rig):
    """Adaptive batching: no waiting out `max_wait_s` when the queue is quiet; receipts that
    are already there join the batch (up to `max_batch_events`)."""
    busy = [Received(events=(put(i),), handles=(f"h{i}",)) for i in range(4)]
    rig.scripts.append(busy)
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 3600, "refresh_on_start": False}})
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: len(paths(rig.table)) == 4)  # long before max_wait_s
        assert rig.table.version() == 1  # the four back-to-back receipts: one commit
        wait_for(lambda: sum(len(h) for h, _ in rig.opened[0].acks) == 4)
        assert metric(daemon, "volume_stream_batch_events_count", volume="vol") == 1


def test_inotify_daemon_commits_a_closed_file_without_waiting_out_the_timers(tmp_path):
    """With a real local volume, a debounce and a max wait of an hour, a closed file still
    becomes a record: the close is a complete file and the queue is quiet."""
    data = tmp_path / "landing"
    data.mkdir()
    cfg = config(tmp_path, volumes={"landing": {
        "location": str(data), "max_wait_s": 3600, "poll_s": 0.2,
        "notification": {"type": "LOCAL", "debounce_s": 3600},
        "streams": {"arrivals": {"mode": "APPEND_ONLY"}}}})
    with Daemon(cfg) as daemon:
        cat = daemon.catalog
        assert wait_for(lambda: daemon.readiness()[0])
        for name in ("a.bin", "b.bin"):
            (data / name).write_bytes(b"payload")
            wait_for(lambda n=name: n in cat.read_stream_arrow("arrivals")[
                "relative_path"].to_pylist())
        rows = cat.read_stream_arrow("arrivals").to_pylist()
        assert sorted(r["relative_path"] for r in rows) == ["a.bin", "b.bin"]
        assert {r["size"] for r in rows} == {7}


def test_filtered_events_are_counted_not_committed(tmp_path, rig):
    t = T0
    rig.scripts.append([Received(events=(put(1), FileEvent.created(
        "partial.tmp", size=1, last_modified_time=t, event_time=t)), handles=("a", "b"))])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}})
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: rig.opened and rig.opened[0].acks)
    assert paths(rig.table) == ["f001.txt"]
    assert metric(daemon, "volume_stream_events_filtered_total", volume="vol") == 1


def test_poison_event_is_dead_lettered_and_the_rest_commit(tmp_path, rig):
    poison = FileEvent.created("huge.bin", size=10**20, last_modified_time=T0, event_time=T0)
    rig.scripts.append([Received(events=(put(1), poison, put(2)), handles=("h1", "hp", "h2")),
                        Received(events=(put(3),), handles=("h3",))])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}},
                 poison_after=2)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: paths(rig.table) == ["f001.txt", "f002.txt", "f003.txt"])
        wait_for(lambda: rig.opened[0].acks)
        assert daemon.readiness()[0]
    # the poisoned batch's messages are left to the queue's redrive policy; the next is acked
    assert [h for h, _ in rig.opened[0].acks] == [("h3",)]
    (line,) = (tmp_path / "wh" / "_dead_letter" / "vol.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["event"]["relative_path"] == "huge.bin" and "int" in record["error"].lower()
    assert metric(daemon, "volume_stream_events_poison_total", volume="vol") == 1
    assert metric(daemon, "volume_stream_errors_total", volume="vol", stage="apply") >= 1


def test_poison_message_alone_is_held_when_the_listener_links_handles(tmp_path, rig):
    t = T0
    poison = FileEvent.created("huge.bin", size=10**20, last_modified_time=t, event_time=t,
                               source_id="mp")
    good = FileEvent.created("ok.txt", size=1, last_modified_time=t, event_time=t,
                             source_id="m1")
    rig.scripts.append([Received(events=(good, poison), handles=("h1", "hp"),
                                 info={"handle_of_source": {"m1": "h1", "mp": "hp"}})])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}},
                 poison_after=1)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher):
        wait_for(lambda: rig.opened and rig.opened[0].acks)
    assert paths(rig.table) == ["ok.txt"]
    assert [h for h, _ in rig.opened[0].acks] == [("h1",)]  # only the poison's message is held


def test_poison_message_alone_is_held_by_source_handles(tmp_path, rig):
    good = FileEvent.created("ok.txt", size=1, last_modified_time=T0, event_time=T0,
                             source_id="m1")
    rig.scripts.append([Received(events=(good, huge("huge.bin", "mp")), handles=("h1", "hp"),
                                 source_handles={"m1": "h1", "mp": "hp"})])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}},
                 poison_after=1)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher):
        wait_for(lambda: rig.opened and rig.opened[0].acks)
    assert paths(rig.table) == ["ok.txt"]
    assert [h for h, _ in rig.opened[0].acks] == [("h1",)]


def test_poison_event_on_a_memory_queue_is_dead_lettered_the_rest_acked(tmp_path, rig):
    """The real in-memory listener: one message of three carries a poison event; it alone
    stays on the queue (for its redrive policy), the two others are acknowledged."""
    listener = MemoryListener()
    ids = [listener.send(put(1)), listener.send(huge("huge.bin")), listener.send(put(2))]

    def open_watcher(name):
        return VolumeWatcher(rig.table, listener, lambda p: True, lambda: rig.cat.refresh(name))

    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0.2, "refresh_on_start": False}},
                 poison_after=1)
    with Daemon(cfg, catalog=rig.cat, open_watcher=open_watcher) as daemon:
        wait_for(lambda: sorted(listener.acked) == sorted([ids[0], ids[2]]))
    assert paths(rig.table) == ["f001.txt", "f002.txt"]
    assert ids[1] not in listener.acked  # left on the queue, not deleted
    (line,) = (tmp_path / "wh" / "_dead_letter" / "vol.jsonl").read_text().splitlines()
    assert json.loads(line)["event"]["source_id"] == ids[1]
    assert metric(daemon, "volume_stream_events_poison_total", volume="vol") == 1


def huge(name, source_id=None):
    return FileEvent.created(name, size=10**20, last_modified_time=T0, event_time=T0,
                             source_id=source_id)


def test_batch_where_nothing_commits_is_released_not_dead_lettered(tmp_path, rig):
    rig.scripts.append([Received(events=(huge("a.bin"), huge("b.bin")), handles=("ha", "hb")),
                        Received(events=(put(1),), handles=("h1",))])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}},
                 poison_after=2)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: rig.opened and rig.opened[0].acks)
        wait_for(lambda: daemon.readiness()[0])
    assert paths(rig.table) == ["f001.txt"]
    assert [h for h, _ in rig.opened[0].acks] == [("h1",)]  # the two came back to the queue
    assert not (tmp_path / "wh" / "_dead_letter").exists()


def test_local_batch_where_nothing_commits_is_retried_not_dropped(tmp_path, rig):
    rig.scripts.append([Received(events=(huge("a.bin"),)), Received(events=(put(1),))])
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 0, "refresh_on_start": False}},
                 poison_after=1, backoff_max_s=0.05)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: metric(daemon, "volume_stream_errors_total", volume="vol",
                                stage="apply") >= 5)
        assert not daemon.readiness()[0]  # stuck on it, and says so
        assert paths(rig.table) == []
    assert not (tmp_path / "wh" / "_dead_letter").exists()
    assert len(rig.opened[0].script) == 1  # the next receipt was never taken


def test_failing_listener_backs_off_reopens_and_refreshes(tmp_path, rig):
    (rig.data / "missed.txt").write_text("written while the listener was broken")
    rig.scripts.append([ConnectorError("queue unreachable")] * 3)
    rig.scripts.append([Received(events=(put(7),), handles=("h7",))])
    cfg = config(tmp_path, volumes={"vol": {"refresh_on_start": False, "poll_s": 0.05}},
                 reopen_after=3)
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: paths(rig.table) == ["f007.txt", "missed.txt"])
        wait_for(lambda: daemon.readiness()[0])
    first, second = rig.opened
    assert first.closed and second.closed and second.acks[0][0] == ("h7",)
    assert metric(daemon, "volume_stream_errors_total", volume="vol", stage="receive") == 3
    assert metric(daemon, "volume_stream_refreshes_total", volume="vol", reason="reopen") == 1


def test_listener_asking_for_refresh_and_scheduled_refresh(tmp_path, rig):
    rig.scripts.append([Received(needs_refresh=True)])
    (rig.data / "lost.txt").write_text("an event the listener dropped")
    cfg = config(tmp_path, volumes={"vol": {"refresh_on_start": False,
                                            "refresh_interval_s": 0.3}})
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher) as daemon:
        wait_for(lambda: paths(rig.table) == ["lost.txt"])
        (rig.data / "later.txt").write_text("healed by the schedule")
        wait_for(lambda: paths(rig.table) == ["later.txt", "lost.txt"])
    assert metric(daemon, "volume_stream_refreshes_total", volume="vol", reason="listener") == 1
    assert metric(daemon, "volume_stream_refreshes_total", volume="vol", reason="schedule") >= 1


def test_stop_commits_and_acks_the_batch_in_hand(tmp_path, rig):
    rig.scripts.append([Received(events=(put(1),), handles=("h1",))])
    rig.tail = Received(malformed=1)  # the queue stays busy: the batch stays open
    cfg = config(tmp_path, volumes={"vol": {"max_wait_s": 60, "refresh_on_start": False}})
    daemon = Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher).start()
    wait_for(lambda: rig.opened and rig.opened[0].tails >= 5)
    assert paths(rig.table) == []  # still collecting the batch
    started = time.monotonic()
    daemon.stop()
    assert daemon.join(10)
    assert time.monotonic() - started < 5
    assert paths(rig.table) == ["f001.txt"]
    assert rig.opened[0].acks == [(("h1",), 1)] and rig.opened[0].closed


# ---------------------------------------------------------------------- pipelines
def test_pipelines_run_on_interval_and_are_stopped_with_the_daemon(tmp_path):
    marker = tmp_path / "runs.txt"
    tick = [sys.executable, "-c",
            "import os, sys; open(sys.argv[1], 'a').write(os.environ['VOLUME_STREAM_WAREHOUSE']"
            " + '\\n')", str(marker)]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    cfg = config(tmp_path, pipelines={
        "tick": {"command": tick, "interval_s": 0.3},
        "slow": {"command": sleeper, "interval_s": 100, "timeout_s": 1.0},
        "long": {"command": sleeper, "interval_s": 100},
        "broken": {"command": [sys.executable, "-c", "raise SystemExit(3)"], "interval_s": 100},
    })
    with Daemon(cfg) as daemon:
        wait_for(lambda: metric(daemon, "volume_stream_pipeline_runs_total", pipeline="tick",
                                outcome="ok") >= 2)
        wait_for(lambda: daemon.pipelines["slow"].last_outcome == "timeout", timeout=20)
        wait_for(lambda: daemon.pipelines["broken"].last_outcome == "failed")
        assert daemon.pipelines["long"].running
        assert daemon.health()[0]
    assert set(marker.read_text().splitlines()) == {str(tmp_path / "wh")}
    assert daemon.pipelines["long"].last_outcome == "stopped"
    assert daemon.pipelines["broken"].last_returncode == 3
    assert len(marker.read_text().splitlines()) >= 2


def test_spec_pipeline_command_is_the_run_cli(tmp_path):
    cfg = config(tmp_path, pipelines={"p": {"spec": str(tmp_path / "p.toml")}})
    daemon = Daemon(cfg)
    pipeline_cmd = daemon.config.pipelines["p"]
    from volume_stream.daemon.pipeline_runner import PipelineRunner

    cmd = PipelineRunner("p", pipeline_cmd, cfg.warehouse, daemon.metrics,
                         threading.Event()).command()
    assert cmd[1:] == ["-m", "volume_stream.cli", "run", str(tmp_path / "p.toml"),
                       "--warehouse", str(tmp_path / "wh")]


def test_spark_master_of_the_config_reaches_the_pipelines(tmp_path, monkeypatch):
    monkeypatch.delenv("VOLUME_STREAM_SPARK_MASTER", raising=False)
    marker = tmp_path / "master.txt"
    probe = [sys.executable, "-c",
             "import os, sys; open(sys.argv[1], 'w').write("
             "os.environ.get('VOLUME_STREAM_SPARK_MASTER', '<unset>'))", str(marker)]
    cfg = DaemonConfig.from_mapping({
        "warehouse": str(tmp_path / "wh"), "metrics": {"enabled": False},
        "spark_master": "local[1]",
        "pipelines": {"probe": {"command": probe, "interval_s": 100}}})
    with Daemon(cfg) as daemon:
        wait_for(lambda: daemon.pipelines["probe"].last_outcome == "ok")
    assert marker.read_text() == "local[1]"
    # without it the child keeps the environment's (here: none)
    cfg = DaemonConfig.from_mapping({"warehouse": str(tmp_path / "wh"),
                                     "metrics": {"enabled": False},
                                     "pipelines": {"probe": {"command": probe}}})
    with Daemon(cfg) as daemon:
        wait_for(lambda: daemon.pipelines["probe"].last_outcome == "ok")
    assert marker.read_text() == "<unset>"


def test_scheduled_optimize_compacts_the_directory_table(tmp_path, rig):
    # six receipts, six commits
    rig.scripts.append([Received(events=(put(i),), handles=(f"h{i}",)) for i in range(1, 7)])
    cfg = config(tmp_path, volumes={"vol": {"refresh_on_start": False, "poll_s": 0.05,
                                            "max_wait_s": 0, "optimize_interval_s": 0.3}})
    table = rig.cat.directory_table("vol")
    with Daemon(cfg, catalog=rig.cat, open_watcher=rig.open_watcher):
        wait_for(lambda: len(paths(table)) == 6)
        # optimize() checkpoints the log (delta-rs alone would only every 100 commits)
        log_dir = Path(table.path) / "_delta_log"
        wait_for(lambda: any(log_dir.glob("*.checkpoint.parquet")))
    assert len(paths(table)) == 6
