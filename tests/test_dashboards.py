"""deploy/grafana and deploy/prometheus agree with the daemon: every metric the dashboard and
the alerting rules name is one `volume_stream/daemon/metrics.py` registers (read from its
registry, with the suffixes Prometheus's client adds), and the rules pass `promtool check
rules` where Debian's `prometheus` package put promtool (else their structure is checked here).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from volume_stream.daemon.metrics import DaemonMetrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "volume-stream.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
#: series Prometheus makes itself, not the daemon
PROMETHEUS_OWN = {"up"}
_SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
             "histogram": ("_bucket", "_sum", "_count", "_created")}


def exported() -> set[str]:
    """Every series name the daemon's registry can export."""
    names = set()
    for family in DaemonMetrics().registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: identifiers before a selector, a range or the
    end, that are not functions, keywords or label names inside braces."""
    no_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    no_groupings = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "",
                          no_labels)
    no_strings = re.sub(r'"[^"]*"', "", no_groupings)
    keywords = {"and", "or", "unless", "bool", "offset"}
    return {m.group(0) for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", no_strings)
            if not re.match(r"\s*\(", no_strings[m.end():])  # a function or aggregation
            and not re.match(r"\d", no_strings[m.end():m.end() + 1] or "x")
            and not (m.start() and no_strings[m.start() - 1].isdigit())  # 5m, 1h
            and m.group(0) not in keywords}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    return exprs


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_metric_names_are_read_from_the_registry():
    names = exported()
    assert {"volume_stream_commit_seconds_bucket", "volume_stream_events_received_total",
            "volume_stream_stream_pending_changes", "volume_stream_volume_ready"} <= names
    assert metric_names('histogram_quantile(0.95, sum by (le) (rate(a_bucket{v=~"x"}[5m])))'
                        ) == {"a_bucket"}
    assert metric_names("time() - b_seconds") == {"b_seconds"}


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_metric_used_is_one_the_daemon_exports(source):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    assert exprs
    known = exported() | PROMETHEUS_OWN
    for expr in exprs:
        used = metric_names(expr.replace("label_values(", "(").replace(", volume)", ")"))
        assert used, f"no metric in {expr!r}"
        assert used <= known, f"{sorted(used - known)} in {expr!r} are not exported"


def test_dashboard_covers_what_operators_watch():
    text = DASHBOARD.read_text()
    dash = json.loads(text)
    assert dash["uid"] == "volume-stream" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for metric in ("volume_stream_last_commit_timestamp_seconds", "volume_stream_queue_backlog",
                   "volume_stream_stream_pending_changes", "volume_stream_commit_seconds_bucket",
                   "volume_stream_batch_events", "volume_stream_errors_total",
                   "volume_stream_volume_ready", "volume_stream_pipeline_runs_total"):
        assert metric in text, metric
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24


def test_alerts_cover_the_failures_and_pass_promtool():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = {r["alert"]: r for g in groups for r in g["rules"]}
    assert {"VolumeStreamStreamStale", "VolumeStreamPendingChangesGrowing",
            "VolumeStreamListenerDown", "VolumeStreamPipelineFailing",
            "VolumeStreamDaemonNotReady"} <= set(rules)
    assert rules["VolumeStreamPendingChangesGrowing"]["for"] == "15m"
    for name, rule in rules.items():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"], name
        assert rule["expr"].count("(") == rule["expr"].count(")"), name
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus); the "
                    "structure was checked above")
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
