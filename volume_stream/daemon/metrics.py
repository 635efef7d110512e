"""What the daemon reports: Prometheus metrics and an HTTP endpoint for them and for probes.

`DaemonMetrics` holds the daemon's metrics in its own `CollectorRegistry` (so two daemons in one
process, or a test, never share counters). `MetricsServer` serves, on one port:

    GET /metrics   Prometheus text format
    GET /healthz   liveness: 200 while every loop is alive and beating, else 503
    GET /readyz    readiness: 200 once every volume is listening and caught up, else 503
    GET /          the status page and its JSON twins (`volume_stream.serve.ui`), if given

Probe bodies are JSON (`{"ok": true, "volumes": {...}}`) so a person can read them too. No
label or value ever holds a credential: labels are volume, stream and pipeline names only.

    metrics = DaemonMetrics()
    server = MetricsServer(metrics, health=lambda: (True, {}), ready=lambda: (True, {}))
    server.start()          # server.port is the bound port (port=0 picks a free one)
    ...
    server.stop()
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from volume_stream.errors import ConfigError
from volume_stream.serve.charts import BUCKET_PREFIX
from volume_stream.serve.status import StatusSource
from volume_stream.serve.ui import HttpServer, check_listen, status_app

__all__ = ["DaemonMetrics", "MetricsServer", "Probe"]

log = logging.getLogger("volume_stream.metrics")

#: A probe returns (ok, details); details are served as JSON.
Probe = Callable[[], tuple[bool, dict[str, Any]]]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0)
#: group commit lets a batch grow with the load (`volume_stream.volumes.batching`)
_BATCH_BUCKETS = (1, 2, 5, 10, 50, 100, 500, 1000, 5000, 10_000, 50_000, 100_000, 500_000,
                  1_000_000)
_BYTES_BUCKETS = tuple(float(1 << k) for k in range(10, 31, 2))  # 1 KiB .. 1 GiB
_SLOW_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)


class DaemonMetrics:
    """The daemon's Prometheus metrics, in a registry of their own.

    Example:
        >>> m = DaemonMetrics()
        >>> m.events_received.labels(volume="landing").inc(3)
        >>> b"volume_stream_events_received_total" in m.render()
        True
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, v = self.registry, ["volume"]
        self.events_received = Counter(
            "volume_stream_events_received", "File events received from the listener.", v,
            registry=r)
        self.events_applied = Counter(
            "volume_stream_events_applied",
            "Rows changed in the directory table (inserts, updates, deletes).", v, registry=r)
        self.events_ignored = Counter(
            "volume_stream_events_ignored",
            "Events that changed nothing: duplicates, older than the table, unchanged images, "
            "messages for other buckets or prefixes.", v, registry=r)
        self.events_filtered = Counter(
            "volume_stream_events_filtered",
            "Events dropped by the volume's recursion and include/exclude filters.", v,
            registry=r)
        self.messages_malformed = Counter(
            "volume_stream_messages_malformed",
            "Messages that could not be parsed (left to the queue's dead-letter policy).", v,
            registry=r)
        self.events_poison = Counter(
            "volume_stream_events_poison",
            "Events that kept failing on their own and were written to the dead-letter file.",
            v, registry=r)
        self.commits = Counter(
            "volume_stream_commits", "Directory-table versions committed by the listener loop.",
            v, registry=r)
        self.commit_seconds = Histogram(
            "volume_stream_commit_seconds",
            "Time to plan and commit one batch of events (conflict retries included).", v,
            buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_events = Histogram(
            "volume_stream_batch_events", "Events per committed batch.", v,
            buckets=_BATCH_BUCKETS, registry=r)
        self.batch_bytes = Histogram(
            "volume_stream_batch_bytes",
            "Estimated memory of the events of one committed batch (capped by "
            "max_batch_bytes).", v, buckets=_BYTES_BUCKETS, registry=r)
        self.batch_latency = Histogram(
            "volume_stream_batch_latency_seconds",
            "From receiving a batch's first event to its commit: the longest any of its events "
            "waited in the daemon.", v, buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_cap = Gauge(
            "volume_stream_batch_cap_events",
            "Events the next batch may hold to commit within target_commit_s, by the commit "
            "times measured so far (-1: no cap yet).", v, registry=r)
        self.errors = Counter(
            "volume_stream_errors", "Failures per stage (receive, apply, ack, refresh, open).",
            ["volume", "stage"], registry=r)
        self.refreshes = Counter(
            "volume_stream_refreshes", "Full-listing refreshes, by reason (start, schedule, "
            "listener).", ["volume", "reason"], registry=r)
        self.refresh_seconds = Histogram(
            "volume_stream_refresh_seconds", "Duration of a full-listing refresh.", v,
            buckets=_SLOW_BUCKETS, registry=r)
        self.queue_backlog = Gauge(
            "volume_stream_queue_backlog",
            "Events or messages waiting in the listener or its queue (as the listener reports).",
            v, registry=r)
        self.directory_version = Gauge(
            "volume_stream_directory_version", "Latest version of the directory table.", v,
            registry=r)
        self.directory_files = Gauge(
            "volume_stream_directory_files", "Files in the latest version of the directory table.",
            v, registry=r)
        self.last_commit = Gauge(
            "volume_stream_last_commit_timestamp_seconds",
            "Unix time of the listener loop's last commit.", v, registry=r)
        self.volume_ready = Gauge(
            "volume_stream_volume_ready", "1 when the volume's listener is up and caught up.", v,
            registry=r)
        self.stream_pending = Gauge(
            "volume_stream_stream_pending_changes",
            "Change records a stream would return now (-1 for a stale stream).",
            ["stream", "volume"], registry=r)
        self.pipeline_runs = Counter(
            "volume_stream_pipeline_runs", "Pipeline runs by outcome (ok, failed, timeout).",
            ["pipeline", "outcome"], registry=r)
        self.pipeline_seconds = Gauge(
            "volume_stream_pipeline_last_run_seconds", "Duration of the pipeline's last run.",
            ["pipeline"], registry=r)

    def forget_stream(self, stream: str, volume: str) -> None:
        """Drop a stream's series (it was dropped from the catalog)."""
        try:
            self.stream_pending.remove(stream, volume)
        except KeyError:
            pass

    def totals(self) -> dict[str, float]:
        """The counters the status page charts, summed over volumes: events received and
        applied, commits, and the commit-latency histogram (`serve.charts` names)."""
        out: dict[str, float] = {"events_received": 0.0, "events_applied": 0.0, "commits": 0.0,
                                 "commit_seconds_sum": 0.0, "commit_seconds_count": 0.0}
        for name, metric in (("events_received", self.events_received),
                             ("events_applied", self.events_applied),
                             ("commits", self.commits), ("commit_seconds", self.commit_seconds)):
            for family in metric.collect():
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = name if sample.name.endswith("_total") else (
                        f"{BUCKET_PREFIX}{sample.labels['le']}"
                        if sample.name.endswith("_bucket")
                        else f"{name}_{sample.name.rsplit('_', 1)[1]}")
                    out[key] = out.get(key, 0.0) + sample.value
        return out

    def render(self) -> bytes:
        """The metrics in Prometheus text format."""
        return generate_latest(self.registry)


def _ok(_: Any = None) -> tuple[bool, dict[str, Any]]:
    return True, {}


class MetricsServer:
    """Serve `/metrics`, `/healthz`, `/readyz` and, given a `StatusSource`, the status page
    (`/`, `/status.json`, ...: `volume_stream.serve.ui`) on one port, from a background thread.

    Args:
        metrics: What `/metrics` renders.
        health: Liveness probe; `/healthz` answers 200 when it returns ok, else 503.
        ready: Readiness probe, likewise for `/readyz`.
        host: Interface to bind (`0.0.0.0` in a container).
        port: Port to bind; 0 picks a free one (see `.port` after `start`).
        status: The status page's facts (None: no page).
        token: With one, the status page answers 401 to a request without it; the metrics and
            probes stay open (Prometheus and the kubelet carry no token). Without one on a
            non-loopback `host` the page is off (403 saying why), the rest is served.

    Example:
        >>> server = MetricsServer(DaemonMetrics(), port=0)
        >>> server.start(); server.port > 0
        True
        >>> server.stop()
    """

    def __init__(self, metrics: DaemonMetrics, *, health: Probe = _ok, ready: Probe = _ok,
                 host: str = "127.0.0.1", port: int = 9108, status: StatusSource | None = None,
                 token: str | None = None) -> None:
        self.metrics = metrics
        self.health = health
        self.ready = ready
        self.host = host
        self._port = port
        self.status = status
        self.token = token
        self._http: HttpServer | None = None

    @property
    def port(self) -> int:
        return self._http.port if self._http else self._port

    @property
    def url(self) -> str:
        return f"http://{self.host if self.host not in ('0.0.0.0', '::') else '127.0.0.1'}:" \
               f"{self.port}"

    def app(self) -> Any:
        """The ASGI app: metrics and probes, and the status page if it may be served."""
        routes = [Route("/metrics", self._metrics), Route("/healthz", self._probe),
                  Route("/readyz", self._probe)]
        source = self.status
        if source is not None:
            try:
                check_listen(self.host, self.token)
            except ConfigError as exc:
                log.warning("status page off: %s", exc)
                source, why = None, {"error": f"status page off: {exc}"}
                routes.append(Route("/", lambda _: JSONResponse(why, 403)))
        return status_app(source, token=self.token, routes=routes,
                          open_paths={"/metrics", "/healthz", "/readyz"})

    def start(self) -> MetricsServer:
        """Bind and serve; raises OSError (e.g. the port is taken) before returning."""
        self._http = HttpServer(self.app(), self.host, self._port,
                                name="volume-stream-metrics-http").start()
        log.info("metrics, /healthz and /readyz%s on %s",
                 ", status page /" if self.status is not None else "", self.url,
                 extra={"port": self.port})
        return self

    def stop(self) -> None:
        """Stop serving and release the port; idempotent."""
        http, self._http = self._http, None
        if http is not None:
            self._port = http.port
            http.stop()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), 200, media_type=CONTENT_TYPE_LATEST)

    def _probe(self, request: Request) -> Response:
        path = request.url.path
        try:
            ok, details = (self.health if path == "/healthz" else self.ready)()
            body = json.dumps({"ok": ok, **details}, default=str)
            status = 200 if ok else 503
        except Exception as exc:  # a probe that fails is an unhealthy probe, not a crash
            log.exception("metrics endpoint %s failed", path)
            body, status = json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}), 503
        return Response(body, status, media_type="application/json")
