"""`volume-stream daemon` as a real process: clean stops on SIGTERM/SIGINT, exit codes, JSON
logs, and two daemons on one volume committing every change exactly once.

`DaemonProcess` is also used by the crash-safety tests."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

import volume_stream as vs
from connectors.local import LocalLister
from connectors.protocols import LISTING_SCHEMA

CLI = str(Path(sys.executable).parent / "volume-stream")


class DaemonProcess:
    """One `volume-stream daemon --config FILE --log-json` child, logging to a file."""

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None, *,
                 own_group: bool = False):
        self.config, self.log, self.env, self.own_group = config, log, env, own_group
        self.proc: subprocess.Popen | None = None

    def start(self) -> DaemonProcess:
        self._log_fh = self.log.open("ab")
        self.proc = subprocess.Popen([CLI, "daemon", "--config", str(self.config), "--log-json"],
                                     stdout=self._log_fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env,
                                     cwd=self.config.parent,  # Spark children write here
                                     start_new_session=self.own_group)
        self._started_at = self.log.stat().st_size
        return self

    def records(self, since_start: bool = False) -> list[dict]:
        out = []
        with self.log.open("rb") as fh:
            if since_start:
                fh.seek(self._started_at)
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def port(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.records(since_start=True):
                if "port" in rec and rec.get("logger") == "volume_stream.metrics":
                    return int(rec["port"])
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}: "
                                     f"{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"daemon never served metrics: {self.log.read_text()[-3000:]}")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port()}{path}",
                                        timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.get("/readyz")[0] == 200:
                return
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready: {self.get('/readyz')}")

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.get("/metrics")[1].decode()):
            for s in family.samples:
                if s.name == name and s.labels == labels:
                    return s.value
        return 0.0

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log_fh.close()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
        if self.proc:
            self.wait()
        if self.proc and self.own_group:  # its JVM and Python workers too
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def write_config(path: Path, warehouse: Path, data: Path, **volume: object) -> Path:
    extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in volume.items())
    path.write_text(textwrap.dedent(f"""
        warehouse = "{warehouse}"
        [metrics]
        port = 0
        [daemon]
        stats_interval_s = 0.5
        backoff_initial_s = 0.05
        backoff_max_s = 0.5
        shutdown_timeout_s = 20
        [volumes.vol]
        location = "{data}"
        max_wait_s = 0.05
        notification = {{ type = "LOCAL", debounce_s = 0.05 }}
    """) + extra + "\n")
    return path


def listing(data: Path) -> dict[str, tuple]:
    table = pa.Table.from_batches(list(LocalLister(data).list()), schema=LISTING_SCHEMA)
    return {r["relative_path"]: (r["size"], r["etag"]) for r in table.to_pylist()}


def table_state(cat, volume: str = "vol") -> dict[str, tuple]:
    snap = cat.directory_table(volume).snapshot(columns=["relative_path", "size", "etag"])
    return {r["relative_path"]: (r["size"], r["etag"]) for r in snap.to_pylist()}


def wait_converged(cat, data: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if table_state(cat) == listing(data):
            return
        time.sleep(0.1)
    want, got = listing(data), table_state(cat)
    raise AssertionError(f"table never matched the folder: missing "
                         f"{sorted(set(want) - set(got))[:10]}, differing "
                         f"{sorted(p for p in want if p in got and want[p] != got[p])[:10]}")


def test_sigterm_and_sigint_stop_cleanly_with_json_logs(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cfg = write_config(tmp_path / "vs.toml", tmp_path / "wh", data)
    for sig in (signal.SIGTERM, signal.SIGINT):
        daemon = DaemonProcess(cfg, tmp_path / f"daemon-{sig}.log").start()
        try:
            daemon.wait_ready()
            (data / f"file-{sig}.txt").write_text("x")
            cat = vs.connect(tmp_path / "wh")
            wait_converged(cat, data)
            status, body = daemon.get("/healthz")
            assert status == 200 and json.loads(body)["ok"]
            daemon.signal(sig)
            assert daemon.wait(30) == 0
        finally:
            daemon.kill()
        messages = [r["message"] for r in daemon.records()]
        assert any(m.startswith(f"received {signal.Signals(sig).name}") for m in messages)
        assert messages[-1] == "daemon stopped"
        assert all({"ts", "level", "logger", "message"} <= set(r) for r in daemon.records())


def test_readme_demo_config_runs(tmp_path):
    """examples/volume-stream.toml, laid out as in the repository (paths relative to the file),
    runs as the README says: files dropped into demo-data/landing show up in the streams."""
    examples = tmp_path / "examples"
    examples.mkdir()
    shutil.copy(Path(__file__).parents[2] / "examples" / "volume-stream.toml", examples)
    landing = tmp_path / "demo-data" / "landing"
    landing.mkdir(parents=True)
    env = {**os.environ, "VOLUME_STREAM_METRICS__PORT": "0"}  # the env wins over the file
    daemon = DaemonProcess(examples / "volume-stream.toml", tmp_path / "daemon.log", env).start()
    try:
        daemon.wait_ready()
        (landing / "hello.txt").write_text("hello")
        wh = ["--warehouse", str(tmp_path / "demo-data" / "warehouse")]
        deadline = time.monotonic() + 60
        while True:
            read = subprocess.run([CLI, "stream", "read", "arrivals", "--json", *wh],
                                  capture_output=True, text=True, timeout=120)
            records = [json.loads(line) for line in read.stdout.splitlines()]
            if records or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(r["relative_path"], r["__change_type"]) for r in records] == [
            ("hello.txt", "INSERT")], read.stderr
        daemon.signal(signal.SIGINT)  # Ctrl-C
        assert daemon.wait(30) == 0
    finally:
        daemon.kill()


def test_bad_config_exits_2_with_the_key_named(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[volumes.vol]\nlocation = "/tmp"\nmax_wait_s = "soon"\n')
    proc = subprocess.run([CLI, "daemon", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"{cfg}: key 'volumes.vol.max_wait_s'" in proc.stderr


def test_a_taken_metrics_port_is_one_line_naming_the_port_and_the_setting(tmp_path):
    import socket

    data = tmp_path / "data"
    data.mkdir()
    with socket.socket() as taken:  # what a first daemon on this configuration holds
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path / "d.toml", tmp_path / "wh", data)
        cfg.write_text(cfg.read_text().replace("port = 0", f"port = {port}"))
        proc = subprocess.run([CLI, "daemon", "--config", str(cfg)], capture_output=True,
                              text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: it is already in use" in proc.stderr
    assert "[metrics] port" in proc.stderr
    assert "Traceback" not in proc.stderr and "Address already in use" not in proc.stderr


def _sizes_pipeline(tmp_path: Path) -> tuple[Path, Path]:
    """A daemon configuration with three files and a `sizes` pipeline spec; (config,
    warehouse)."""
    data, wh = tmp_path / "data", tmp_path / "wh"
    data.mkdir()
    for i in range(3):
        (data / f"f{i}.txt").write_text("x" * (i + 1))
    (tmp_path / "udf.py").write_text(textwrap.dedent("""
        import volume_stream as vs

        @vs.file_udf("n_bytes long")
        def n_bytes(file):
            return {"n_bytes": len(file.read_bytes())}
    """))
    (tmp_path / "job.toml").write_text(textwrap.dedent("""
        stream = "sizes"
        udf = "udf.py:n_bytes"
        target = "sizes"
        refresh = true
        until_empty = true
        [create.stream]
        volume = "vol"
        show_initial_rows = true
    """))
    cfg = write_config(tmp_path / "vs.toml", wh, data)
    with cfg.open("a") as fh:
        fh.write(f'[pipelines.sizes]\nspec = "{tmp_path / "job.toml"}"\ninterval_s = 3600\n')
    return cfg, wh


def _first_run_ok(daemon: DaemonProcess) -> None:
    deadline = time.monotonic() + 240
    while not any(r.get("pipeline") == "sizes" and r.get("outcome") for r in daemon.records()):
        assert daemon.proc.poll() is None, daemon.log.read_text()[-3000:]
        assert time.monotonic() < deadline, daemon.log.read_text()[-3000:]
        time.sleep(0.5)
    outcome = next(r for r in daemon.records() if r.get("pipeline") == "sizes"
                   and r.get("outcome"))
    assert outcome["outcome"] == "ok", daemon.log.read_text()[-3000:]


@pytest.mark.slow
def test_daemon_runs_a_pipeline_spec_with_the_run_command(tmp_path):
    """A `[pipelines.NAME] spec = ...` entry runs its job (`volume-stream run SPEC`) in the
    daemon's Spark session against the daemon's warehouse: the target table gets one row per
    file. Slow (20-50 s): Spark starts a JVM."""
    from deltalake import DeltaTable

    cfg, wh = _sizes_pipeline(tmp_path)
    daemon = DaemonProcess(cfg, tmp_path / "daemon.log").start()
    try:
        _first_run_ok(daemon)
        assert daemon.metric("volume_stream_pipeline_runs_total", pipeline="sizes",
                             outcome="ok") == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        daemon.kill()
    rows = DeltaTable(str(wh / "tables" / "sizes")).to_pyarrow_table().to_pylist()
    assert sorted((r["relative_path"], r["n_bytes"]) for r in rows) == [
        ("f0.txt", 1), ("f1.txt", 2), ("f2.txt", 3)]
    # --log-json: every line the daemon wrote is JSON, the child's output (its metrics line,
    # Spark's log4j lines) included, tagged with the pipeline
    lines = [line for line in daemon.log.read_text().splitlines() if line.strip()]
    not_json = [line for line in lines if not _is_json_object(line)]
    assert not not_json, not_json[:10]
    (batch,) = [r["batch"] for r in daemon.records() if r.get("pipeline") == "sizes"
                and "batch" in r]
    assert (batch["files_seen"], batch["files_ok"]) == (3, 3)


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_is_a_clean_stop(tmp_path):
    """SIGTERM sent to the daemon's process group (`kill -- -PGID`, a terminal's Ctrl-C, a
    process manager) reaches Spark's JVM too, which exits at once: stopping the daemon's Spark
    session then found no JVM ("[Errno 111] Connection refused"), and the daemon logged
    "daemon failed to start" and exited 1 (issue 34). A stopping daemon is not failing to
    start: Spark already gone is a warning, and the stop is clean."""
    cfg, _ = _sizes_pipeline(tmp_path)
    daemon = DaemonProcess(cfg, tmp_path / "daemon.log", own_group=True).start()
    try:
        _first_run_ok(daemon)  # the daemon's Spark session is up
        os.killpg(daemon.proc.pid, signal.SIGTERM)
        code = daemon.wait(120)
    finally:
        daemon.kill()
    log = daemon.log.read_text()
    records = daemon.records()
    assert not [r for r in records if r.get("level") == "ERROR"], log[-4000:]
    assert "failed to start" not in log, log[-4000:]
    assert any(r.get("message") == "daemon stopped" and r.get("clean") for r in records), \
        log[-4000:]
    assert code == 0, log[-4000:]


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_two_daemons_on_one_volume_commit_each_change_once(tmp_path):
    """Both daemons see every event and race for every version; each version is committed by
    exactly one of them, each file is INSERTed exactly once, and the table ends equal to the
    folder."""
    data, wh = tmp_path / "data", tmp_path / "wh"
    data.mkdir()
    cat = vs.connect(wh)
    cat.create_volume("vol", data)
    cat.create_stream("ao", "vol", mode="APPEND_ONLY")
    cfg = write_config(tmp_path / "vs.toml", wh, data)
    daemons = [DaemonProcess(cfg, tmp_path / f"daemon-{i}.log").start() for i in range(2)]
    rng = random.Random(7)
    names = []
    try:
        for d in daemons:
            d.wait_ready()
        for i in range(80):
            name = f"d{i % 4}/f{i:03d}.txt"
            (data / name).parent.mkdir(exist_ok=True)
            (data / name).write_text("x" * rng.randint(1, 50))
            names.append(name)
            if i % 10 == 9:  # overwrite an earlier file: an UPDATE, never a second INSERT
                (data / names[i - 5]).write_text("overwritten " * 3)
            time.sleep(rng.uniform(0, 0.03))
        wait_converged(cat, data)
        # the table can be converged by one daemon while the other still takes its events in
        deadline = time.monotonic() + 60
        while True:
            received = [d.metric("volume_stream_events_received_total", volume="vol")
                        for d in daemons]
            if all(r >= 80 for r in received) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for d in daemons:
            d.signal(signal.SIGTERM)
        assert [d.wait(30) for d in daemons] == [0, 0]
    finally:
        for d in daemons:
            d.kill()
    assert all(r >= 80 for r in received), received  # both saw (and raced on) every file
    inserts = Counter(r["relative_path"] for r in cat.read_stream_arrow("ao").to_pylist())
    assert inserts == Counter(names)  # every file exactly once
    committed = [[r["version"] for r in d.records()
                  if r.get("message", "").startswith("volume vol: committed version")
                  or (r.get("reason") and r.get("version") is not None)] for d in daemons]
    every = sorted(committed[0] + committed[1])
    assert every == list(range(1, cat.directory_table("vol").version() + 1))  # no version twice
    assert cat.refresh("vol").version is None
    races = [sum("lost the race" in r.get("message", "") for r in d.records()) for d in daemons]
    print(f"versions committed per daemon: {[len(c) for c in committed]}, races lost: {races}")
