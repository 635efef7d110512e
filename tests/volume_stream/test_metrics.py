"""The metrics registry and the HTTP endpoint (/metrics, /healthz, /readyz) over real sockets."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from volume_stream.daemon.metrics import DaemonMetrics, MetricsServer


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def samples(body: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_registries_are_separate_and_render_prometheus_text():
    a, b = DaemonMetrics(), DaemonMetrics()
    a.events_received.labels("landing").inc(3)
    a.stream_pending.labels("s", "landing").set(7)
    a.commit_seconds.labels("landing").observe(0.02)
    got = samples(a.render())
    assert got[("volume_stream_events_received_total", (("volume", "landing"),))] == 3
    assert got[("volume_stream_stream_pending_changes",
                (("stream", "s"), ("volume", "landing")))] == 7
    assert got[("volume_stream_commit_seconds_count", (("volume", "landing"),))] == 1
    assert ("volume_stream_events_received_total", (("volume", "landing"),)) \
        not in samples(b.render())
    a.forget_stream("s", "landing")
    a.forget_stream("s", "landing")  # twice is fine
    assert not any(name == "volume_stream_stream_pending_changes"
                   for name, _ in samples(a.render()))


def test_endpoint_serves_metrics_and_probes():
    metrics = DaemonMetrics()
    metrics.directory_version.labels("landing").set(12)
    state = {"ready": False}
    server = MetricsServer(metrics, port=0,
                           health=lambda: (True, {"volumes": {"landing": True}}),
                           ready=lambda: (state["ready"], {"why": "starting"}))
    with server:
        base = server.url
        status, ctype, body = get(f"{base}/metrics")
        assert status == 200 and ctype.startswith("text/plain")
        assert samples(body)[("volume_stream_directory_version", (("volume", "landing"),))] == 12
        status, ctype, body = get(f"{base}/healthz")
        assert (status, ctype) == (200, "application/json")
        assert json.loads(body) == {"ok": True, "volumes": {"landing": True}}
        status, _, body = get(f"{base}/readyz")
        assert status == 503 and json.loads(body) == {"ok": False, "why": "starting"}
        state["ready"] = True
        assert get(f"{base}/readyz?verbose=1")[0] == 200
        status, _, body = get(f"{base}/nope")
        assert status == 404 and b"/metrics" in body
    with pytest.raises(OSError):  # the port is released after stop
        get(f"{base}/healthz")


def test_failing_probe_answers_503_not_a_crash():
    def broken():
        raise RuntimeError("probe exploded")

    with MetricsServer(DaemonMetrics(), port=0, health=broken) as server:
        status, _, body = get(f"{server.url}/healthz")
        assert status == 503 and "probe exploded" in json.loads(body)["error"]
        assert get(f"{server.url}/metrics")[0] == 200  # still serving


def test_port_in_use_raises_at_start():
    with MetricsServer(DaemonMetrics(), port=0) as first:
        with pytest.raises(OSError):
            MetricsServer(DaemonMetrics(), port=first.port).start()
