"""The long-running daemon: every configured volume's listener, scheduled refreshes, pipelines,
metrics and probes, in one process (DESIGN §1, §6).

    volume-stream daemon --config volume-stream.toml [--log-json]

or from Python:

    from volume_stream.config.daemon import DaemonConfig
    from volume_stream.daemon import Daemon

    with Daemon(DaemonConfig.load("volume-stream.toml")) as daemon:   # starts, then stops
        ...

The daemon does not care about backends: each volume runs through `Catalog.watcher(volume)`,
a `VolumeWatcher` with the listener its backend registers (local inotify, SQS, MNS), in a
`VolumeRunner` thread (see `volume_stream.daemon.volume_runner`). SIGTERM or SIGINT make every loop
finish (commit and acknowledge) the batch it holds, close its listener and return; a second
signal exits at once, which is as safe as a crash. Two daemons on one volume are safe: each
commit lands at exactly the next version or is re-planned against the winner's, and events
the table already holds change nothing.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from connectors.errors import is_transient
from volume_stream.catalog import Catalog, connect
from volume_stream.config.daemon import DaemonConfig, VolumeConfig
from volume_stream.config.settings import Settings
from volume_stream.daemon.metrics import DaemonMetrics, MetricsServer
from volume_stream.daemon.pipeline_runner import PipelineRunner, SharedSpark
from volume_stream.daemon.volume_runner import VolumeRunner
from volume_stream.errors import AlreadyExistsError, ConfigError, InvalidInputError
from volume_stream.serve.charts import Timeline
from volume_stream.serve.status import StatusSource
from volume_stream.volumes import normalize_location
from volume_stream.volumes.watcher import VolumeWatcher

__all__ = ["Daemon"]

log = logging.getLogger("volume_stream.daemon")


class Daemon:
    """Runs the listeners, refreshes and pipelines a `DaemonConfig` describes.

    Args:
        config: The configuration.
        catalog: The catalog to use (default: `connect(config.warehouse)`).
        metrics: Where to count (default: a fresh registry).
        open_watcher: Builds a running `VolumeWatcher` for a volume (default:
            `catalog.watcher`); tests hand in watchers over their own listeners.

    Example:
        >>> daemon = Daemon(DaemonConfig.load("volume-stream.toml"))
        >>> daemon.run()          # blocks until SIGTERM/SIGINT; returns the exit code
        0
    """

    def __init__(self, config: DaemonConfig, *, catalog: Catalog | None = None,
                 metrics: DaemonMetrics | None = None,
                 open_watcher: Callable[[str], VolumeWatcher] | None = None) -> None:
        self.config = config
        self._stop = threading.Event()
        self.catalog = catalog or self._retrying("opening the warehouse", lambda: connect(
            config.warehouse, storage_options=config.storage_options))
        self.metrics = metrics or DaemonMetrics()
        #: the counters and pending changes the status page charts, one sample per stats pass
        self.timeline = Timeline()
        #: the facts of the status page, kept between its polls and the statistics passes;
        #: the passes bring every volume up to date (every stats_interval_s), so a poll of the
        #: page spends only a little time freshening the stalest ones between them
        self.status = StatusSource(self.catalog, live=self.live_status, timeline=self.timeline,
                                   refresh_budget_s=0.05)
        self._open_watcher = open_watcher or self.catalog.watcher
        #: the one Spark session of in-process pipelines and of the Spark Connect server
        self.spark = SharedSpark(config.spark, master=config.spark_master)
        self._spark_thread: threading.Thread | None = None
        self.runners: dict[str, VolumeRunner] = {}
        self.pipelines: dict[str, PipelineRunner] = {}
        self.server: MetricsServer | None = None
        self.shard_api: Any = None
        self._stats_thread: threading.Thread | None = None
        self._started = False
        #: start() finished: from here on a failure is not a failure to start
        self.running = False
        self._signals = 0

    def __repr__(self) -> str:
        return f"Daemon({self.catalog!r}, volumes={sorted(self.config.volumes)})"

    # ------------------------------------------------------------------ set-up
    def prepare(self) -> None:
        """Create missing volumes and streams; check existing ones match the configuration.

        Raises:
            ConfigError: a volume is missing and has no location, or exists elsewhere; a
                stream exists on another volume.
        """
        for name, vcfg in self.config.volumes.items():
            if vcfg.enabled:
                self._ensure_volume(name, vcfg)
                for stream, scfg in vcfg.streams.items():
                    self._ensure_stream(stream, name, scfg.mode, scfg.show_initial_rows)

    def _ensure_volume(self, name: str, cfg: VolumeConfig) -> None:
        existing = {v["name"]: v for v in self.catalog.list_volumes()}
        where = f"[volumes.{name}]"
        wanted = None
        if cfg.location is not None:
            try:
                wanted = normalize_location(cfg.location)
            except InvalidInputError as exc:
                raise ConfigError(f"{where} location: {exc}") from exc
        missing = queue_missing(cfg, existing.get(name))
        if missing:
            raise ConfigError(f"{where} notification: {missing}")
        if name not in existing:
            if wanted is None:
                raise ConfigError(
                    f"{where}: volume {name!r} is not in the warehouse {self.catalog.warehouse.root}"
                    f" (it has: {', '.join(sorted(existing)) or 'none'}) and no 'location' is "
                    f"given to create it")
            options: dict[str, Any] = {"data_retention_days": cfg.data_retention_days,
                                       **cfg.options}
            if cfg.deletion_vectors is not None:
                options["deletion_vectors"] = cfg.deletion_vectors
            if cfg.include:
                options["include"] = list(cfg.include)
            if cfg.exclude:
                options["exclude"] = list(cfg.exclude)
            try:
                self.catalog.create_volume(name, wanted, recursive=cfg.recursive,
                                           notification=cfg.notification_object(), **options)
                return
            except AlreadyExistsError:  # another daemon created it meanwhile
                existing = {v["name"]: v for v in self.catalog.list_volumes()}
        stored = existing[name]
        if wanted is not None and stored["location"] != wanted:
            raise ConfigError(f"{where}: volume {name!r} exists at {stored['location']}, but the "
                              f"configuration says {wanted}; fix the location or drop the volume")
        if cfg.notification is not None:
            stored_type = stored.get("notification") or "LOCAL"
            if stored_type != cfg.notification.get("type"):
                log.warning("%s: the configured notification %s differs from the warehouse's %s; "
                            "the warehouse's is used (recreate the volume to change it)",
                            where, cfg.notification.get("type"), stored_type)

    def _ensure_stream(self, stream: str, volume: str, mode: str, initial: bool) -> None:
        found = {s["name"]: s for s in self.catalog.list_streams()}
        if stream not in found:
            try:
                self.catalog.create_stream(stream, volume, mode=mode, show_initial_rows=initial)
                log.info("created stream %s on %s (%s)", stream, volume, mode,
                         extra={"volume": volume, "stream": stream})
                return
            except AlreadyExistsError:
                found = {s["name"]: s for s in self.catalog.list_streams()}
        if found[stream].get("volume") != volume:
            raise ConfigError(f"[volumes.{volume}.streams] {stream}: stream {stream!r} exists on "
                              f"volume {found[stream].get('volume')!r}, not {volume!r}")

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Daemon:
        """Prepare, then start the metrics endpoint, the volume loops and the pipelines."""
        if self._started:
            raise RuntimeError(f"{self!r} was already started")
        self._started = True
        self._retrying("preparing volumes and streams", self.prepare)
        cfg = self.config
        if cfg.metrics.enabled:
            status = self.status if cfg.metrics.status_page else None
            token = Settings().ui_token
            with _binding(f"{cfg.metrics.host}:{cfg.metrics.port}", "[metrics] port"):
                self.server = MetricsServer(
                    self.metrics, health=self.health, ready=self.readiness,
                    host=cfg.metrics.host, port=cfg.metrics.port, status=status,
                    token=token.get_secret_value() if token else None).start()
        if cfg.shard_api.enabled:
            try:
                with _binding(cfg.shard_api.listen, "[shard_api] listen"):
                    self.shard_api = _shard_api(self.catalog, cfg).start()
            except ConfigError:
                if self.server is not None:
                    self.server.stop()
                raise
            log.info("shard API on %s", self.shard_api.url)
        for name, vcfg in cfg.volumes.items():
            if vcfg.enabled:
                runner = VolumeRunner(name, vcfg, self._open_watcher, self.metrics, cfg.daemon,
                                      cfg.dead_letter_dir, self._stop,
                                      storage_options=cfg.storage_options)
                self.runners[name] = runner
                runner.start()
        for name, pcfg in cfg.pipelines.items():
            if pcfg.enabled:
                pipeline = PipelineRunner(name, pcfg, cfg.warehouse, self.metrics, self._stop,
                                          spark_master=cfg.spark_master, spark=self.spark,
                                          storage_options=cfg.storage_options)
                self.pipelines[name] = pipeline
                pipeline.start()
        self._stats_thread = threading.Thread(target=self._stats_loop, daemon=True,
                                              name="volume-stream-daemon-stats")
        self._stats_thread.start()
        if cfg.spark.connect_port is not None:  # warm Spark for `sql --remote`, off the
            self._spark_thread = threading.Thread(  # listeners' path: they need no Spark
                target=self._start_spark, daemon=True, name="volume-stream-daemon-spark")
            self._spark_thread.start()
        log.info("daemon started: volumes %s, pipelines %s, warehouse %s",
                 sorted(self.runners), sorted(self.pipelines), cfg.warehouse,
                 extra={"pid": os.getpid()})
        self.running = True
        return self

    def _retrying(self, what: str, step: Callable[[], Any]) -> Any:
        """`step()`, retried with the loops' backoff while it fails transiently (a store that
        answers 503 or drops the link as the daemon starts); other errors are raised at once."""
        failures = 0
        while True:
            try:
                return step()
            except Exception as exc:
                if not is_transient(exc) or self._stop.is_set():
                    raise
                failures += 1
                tuning = self.config.daemon
                delay = min(tuning.backoff_max_s,
                            tuning.backoff_initial_s * 2 ** min(failures - 1, 30))
                log.warning("daemon: %s failed (%s), retrying in %.2fs: %s", what,
                            type(exc).__name__, delay, exc, extra={"failures": failures})
                if self._stop.wait(delay):
                    raise

    def _start_spark(self) -> None:
        try:
            self.spark.get()
        except Exception as exc:
            log.error("daemon: Spark (for Spark Connect on port %s) did not start: %s",
                      self.config.spark.connect_port, exc)

    def stop(self) -> None:
        """Ask every loop to finish its batch and return (does not wait; see `join`)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every loop (at most `timeout` seconds in all); True if all ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        threads: list[Any] = [*self.runners.values(), *self.pipelines.values()]
        done = True
        for runner in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done &= runner.join(left)
        if self._stats_thread is not None:
            self._stats_thread.join(5)
        if self._spark_thread is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._spark_thread.join(left)
        for what, stop in (("Spark", self.spark.stop), ("the metrics server", self._stop_server),
                           ("the shard API", self._stop_shard_api)):
            try:  # each part stops even if another could not
                stop()
            except Exception as exc:
                done = False
                log.error("daemon: stopping %s failed: %s: %s", what, type(exc).__name__, exc,
                          exc_info=True)
        if not done:
            stuck = [t.name for t in threads if t.alive]
            log.error("daemon: %s did not stop within %.0fs", stuck, timeout or 0)
        return done

    def _stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()

    def _stop_shard_api(self) -> None:
        if self.shard_api is not None:
            self.shard_api.stop()
            self.shard_api = None

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join(self.config.daemon.shutdown_timeout_s)

    def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT, stop cleanly. Returns the process exit code:
        0 after a clean stop, 1 if some loop did not stop within `shutdown_timeout_s`."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not self._stop.wait(1.0):
                pass
            log.info("daemon stopping: finishing the batches in hand")
            ok = self.join(self.config.daemon.shutdown_timeout_s)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        log.info("daemon stopped", extra={"clean": ok})
        return 0 if ok else 1

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal %s: exiting now (uncommitted events come back from the "
                        "queue or the next start's refresh)", signal.Signals(signum).name)
            os._exit(128 + signum)
        log.info("received %s: stopping", signal.Signals(signum).name)
        self._stop.set()

    # ------------------------------------------------------------------ probes
    def health(self) -> tuple[bool, dict[str, Any]]:
        """Liveness: every loop thread is alive and beating."""
        volumes = {n: r.healthy() for n, r in self.runners.items()}
        pipelines = {n: p.alive or self.stopping for n, p in self.pipelines.items()}
        ok = all(volumes.values()) and all(pipelines.values())
        return ok, {"volumes": volumes, "pipelines": pipelines}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Readiness: every volume is listening, its start refresh is done, it is not failing."""
        volumes = {n: r.status() for n, r in self.runners.items()}
        ok = not self.stopping and all(s["ready"] for s in volumes.values())
        return ok, {"volumes": volumes,
                    "pipelines": {n: p.status() for n, p in self.pipelines.items()}}

    def live_status(self) -> dict[str, Any]:
        """What the status page adds under a daemon: each volume's listener (state, backend,
        last refresh) and each pipeline's runs."""
        volumes = {}
        for name, runner in self.runners.items():
            notification = self.config.volumes[name].notification or {}
            volumes[name] = {**runner.status(), "backend": notification.get("type", "LOCAL")}
        return {"volumes": volumes,
                "pipelines": {n: p.status() for n, p in self.pipelines.items()}}

    # ------------------------------------------------------------------ stats
    def _stats_loop(self) -> None:
        while True:
            try:
                self.update_stats()
            except Exception as exc:
                log.warning("daemon: updating statistics failed: %s", exc)
            if self._stop.wait(self.config.daemon.stats_interval_s):
                return

    def update_stats(self) -> None:
        """Refresh the gauges that need a look at the tables: versions, files, pending changes.

        Reading a stream's pending changes costs O(changes), never O(files).
        """
        m = self.metrics
        pending_total = 0
        # the status page's kept facts: only commits made since the last look are read, and
        # a stream costs O(new changes) once per (offset, version)
        for row in self.status.volumes():
            if row["name"] in self.runners and row.get("error"):
                log.warning("daemon: statistics of volume %s: %s", row["name"], row["error"])
            elif row["name"] in self.runners:
                m.directory_version.labels(row["name"]).set(row["version"])
                m.directory_files.labels(row["name"]).set(row["files"])
        for row in self.status.streams():
            if row["on"] != "volume" or row["source"] not in self.runners:
                continue
            if row.get("error"):  # dropped meanwhile, or its volume was replaced
                log.debug("stream %s: %s", row["name"], row["error"])
                m.forget_stream(row["name"], row["source"])
                continue
            pending = -1 if row["stale"] else row["pending_changes"]
            m.stream_pending.labels(row["name"], row["source"]).set(pending)
            pending_total += max(pending, 0)
        self.timeline.record({**m.totals(), "pending": pending_total})


#: the notification an object-store volume listens with, by its location's scheme
_QUEUE_OF = {"s3": "AWS_SQS (queue_url = ...)", "s3a": "AWS_SQS (queue_url = ...)",
             "oss": "ALIYUN_MNS (queue_name = ...)",
             "gs": "GCP_PUBSUB (subscription = ...)",
             "abfss": "AZURE_STORAGE_QUEUE (queue_name = ...)",
             "az": "AZURE_STORAGE_QUEUE (queue_name = ...)"}


def queue_missing(cfg: VolumeConfig, stored: dict[str, Any] | None) -> str | None:
    """Why an object-store volume cannot listen (no queue in the file nor in the warehouse,
    or a queue of another store's kind), or None. Without it the daemon would retry opening
    its listener for ever."""
    location = str(cfg.location or (stored or {}).get("location") or "")
    scheme = location.split("://", 1)[0].lower() if "://" in location else ""
    if scheme not in _QUEUE_OF:
        return None
    kind = _QUEUE_OF[scheme]
    note = cfg.notification or (stored or {}).get("notification")
    if not note:
        return (f"volume on {location} has no notification queue to listen to: add "
                f"notification = {{ type = {kind} }}, or enabled = false to only refresh it "
                f"by hand")
    # the file's is a table; the warehouse listing gives the stored one's type
    given = str(note.get("type", "") if isinstance(note, dict) else note).upper()
    if scheme in ("abfss", "az", "gs") and given != kind.split()[0]:
        return f"volume on {location} listens to a {kind.split()[0]} queue, not {given}"
    return None


@contextmanager
def _binding(address: str, setting: str) -> Iterator[None]:
    """A port already taken (another daemon on this configuration?) or not ours to bind is a
    ConfigError naming the address and the setting, not an OSError traceback."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        why = {errno.EADDRINUSE: "is already in use (is another daemon running with this "
                                 "configuration?)",
               errno.EACCES: "may not be bound by this user",
               errno.EADDRNOTAVAIL: "is not an address of this machine"}[exc.errno]
        raise ConfigError(f"cannot listen on {address}: it {why}; stop the other process or "
                          f"change {setting}") from exc


def _shard_api(catalog: Catalog, cfg: DaemonConfig) -> Any:
    """The `[shard_api]` server (not started); the secret comes from the environment."""
    from volume_stream.serve.server import ShardApiServer, is_loopback, parse_listen

    api = cfg.shard_api
    keys = None
    if api.require_signature:
        key_id = os.environ.get("VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID")
        secret = os.environ.get("VOLUME_STREAM_SHARD_API_SECRET")
        if not key_id or not secret:
            raise ConfigError("[shard_api] require_signature needs the key in "
                              "VOLUME_STREAM_SHARD_API_ACCESS_KEY_ID and "
                              "VOLUME_STREAM_SHARD_API_SECRET (never in the file)")
        keys = {key_id: secret}
    host, port = parse_listen(api.listen)
    if keys is None and not api.allow_anonymous and not is_loopback(host):
        raise ConfigError(f"[shard_api] listen = {api.listen!r} is not a loopback address: "
                          f"set require_signature = true (the key in the environment), or "
                          f"allow_anonymous = true to serve it to anyone who can reach it")
    return ShardApiServer(catalog, host, port, keys=keys, region=api.region,
                          account_id=api.account_id, auto_split_s=api.auto_split_s,
                          allow_anonymous=api.allow_anonymous)
