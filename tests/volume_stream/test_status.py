"""The status facts (`StatusSource`), the page and its JSON twins over real HTTP, the token
rule, `status`/`ui`/`volume describe`/`stream list` through the real CLI, and the page as a
real daemon serves it beside /metrics. Real warehouses and files under tmp_path; no Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

import volume_stream as vs
from volume_stream.cli import app
from volume_stream.config.daemon import DaemonConfig
from volume_stream.daemon import Daemon
from volume_stream.errors import ConfigError
from volume_stream.serve.status import StatusSource
from volume_stream.serve.ui import HttpServer, check_listen, status_app


def wait_for(predicate, timeout=30.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=15) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def warehouse(tmp_path):
    """A warehouse with volume `land` (a.txt written, rewritten and deleted; b.txt) and a stream
    created before the last two commits."""
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("land", data)
    (data / "a.txt").write_text("one")
    cat.refresh("land")                                   # v1: insert a
    cat.create_stream("s", on_volume="land")
    (data / "a.txt").write_text("one, longer")
    os.utime(data / "a.txt", (time.time() + 5, time.time() + 5))
    (data / "b.txt").write_text("bee")
    cat.refresh("land")                                   # v2: update a, insert b
    (data / "a.txt").unlink()
    cat.refresh("land")                                   # v3: delete a
    return cat, data


def test_facts_of_volumes_streams_change_logs_and_a_files_history(warehouse):
    cat, _ = warehouse
    cat.enable_change_log("land", shards=2)
    source = StatusSource(cat)
    facts = source.status()
    assert json.loads(json.dumps(facts)) == facts  # plain JSON
    (vol,) = facts["volumes"]
    assert (vol["name"], vol["files"], vol["bytes"], vol["version"]) == ("land", 1, 3, 3)
    assert vol["last_commit"] and vol["listener"] is None and not facts["daemon"]
    (stream,) = facts["streams"]
    assert (stream["offset"], stream["latest_version"], stream["stale"]) == (1, 3, False)
    assert stream["pending_changes"] == cat.describe_stream("s")["pending_changes"] > 0
    assert stream["staleness_s"] >= 0 and stream["waiting_since"]
    (log,) = facts["change_logs"]
    assert (log["volume"], log["open_shards"], log["enabled"]) == ("land", 2, True)
    assert facts["summary"]["pending_changes"] == stream["pending_changes"]

    history = source.file_history("land", "/a.txt")
    assert [(c["_commit_version"], c["_change_type"]) for c in history["changes"]] == [
        (1, "insert"), (2, "update_preimage"), (2, "update_postimage"), (3, "delete")]
    assert history["versions"] == [1, 2, 3] and not history["exists"]
    assert all(c["_commit_timestamp"] for c in history["changes"])
    b = source.file_history("land", "b.txt")
    assert b["exists"] and b["current"]["size"] == 3 and b["versions"] == [2]
    with pytest.raises(vs.NotFoundError):
        source.file_history("nope", "a.txt")


def test_a_files_history_has_its_row_at_every_version_and_the_records_it_made(warehouse):
    cat, _ = warehouse
    source = StatusSource(cat)
    history = source.file_history("land", "a.txt")
    # time travel: the row as of each version that changed it (gone at the delete)
    rows = {r["version"]: r["row"] for r in history["rows"]}
    assert sorted(rows) == [1, 2, 3] and rows[3] is None
    assert (rows[1]["size"], rows[1]["_image_version"]) == (3, 1)
    assert (rows[2]["size"], rows[2]["_image_version"]) == (len("one, longer"), 2)
    assert all(r["committed"] for r in history["rows"])
    # what a stream reading one commit at a time received from it
    # (the version read, and the record's __commit_version: an old image carries its own)
    assert [(r["read_at"], r["__commit_version"], r["__change_type"])
            for r in history["records"]] == [(1, 1, "INSERT"), (2, 1, "UPDATE_BEFORE"),
                                             (2, 2, "UPDATE_AFTER"), (3, 2, "DELETE")]
    assert history["matches"] == []
    # part of a name lists the paths of the latest version that contain it
    assert source.file_history("land", "B.T")["matches"] == ["b.txt"]
    assert source.file_history("land", "zzz")["matches"] == []
    with pytest.raises(vs.InvalidInputError, match="relative to the volume"):
        source.file_history("land", "/")


def test_a_files_history_takes_the_path_exactly_spaces_included(warehouse):
    """Issue 34 item 10: " a.txt" is not a.txt, and "b.txt " (a real name) has its history."""
    cat, data = warehouse
    (data / "b.txt ").write_text("spaced")
    cat.refresh("land")
    source = StatusSource(cat)
    spaced = source.file_history("land", "b.txt ")
    assert spaced["exists"] and spaced["current"]["relative_path"] == "b.txt "
    assert spaced["current"]["size"] == len("spaced") and spaced["versions"] == [4]
    assert source.file_history("land", "b.txt")["current"]["size"] == 3
    lead = source.file_history("land", " a.txt")
    assert lead["path"] == " a.txt" and lead["versions"] == [] and not lead["exists"]
    assert source.file_history("land", "/b.txt ")["versions"] == [4]


def test_chart_series_from_the_history_and_the_timeline():
    from datetime import UTC, datetime

    from volume_stream.serve.charts import BUCKET_PREFIX, Timeline, charts, quantile

    assert quantile(0.5, {0.1: 0, 1.0: 10, float("inf"): 10}) == pytest.approx(0.55)
    assert quantile(0.95, {1.0: 0, float("inf"): 4}) == 1.0  # past the last bound
    assert quantile(0.5, {}) is None and quantile(0.5, {1.0: 0}) is None
    now = 1_800_000_000.0 - 1_800_000_000.0 % 60 + 30       # half past a minute
    clock = iter(range(10**6))
    timeline = Timeline(min_gap_s=2, clock=lambda: next(clock))
    for i, (received, count, total, fast) in enumerate([(0, 0, 0.0, 0), (50, 4, 0.4, 4),
                                                        (80, 6, 2.4, 5)]):
        timeline.record({"events_received": received, "events_applied": received,
                         "commit_seconds_count": count, "commit_seconds_sum": total,
                         f"{BUCKET_PREFIX}0.25": fast, f"{BUCKET_PREFIX}+Inf": count,
                         "pending": 10 * i}, at=now - 150 + 60 * i)
    timeline.record({"pending": 99}, at=now - 29)
    timeline.record({"pending": 98}, at=now - 28.5)  # < 2 s after the one before: replaces it
    assert [v["pending"] for _, v in timeline.points()] == [0, 10, 20, 98]
    commits = [datetime.fromtimestamp(now - 5, UTC), datetime.fromtimestamp(now - 65, UTC),
               datetime.fromtimestamp(now - 3600 * 2, UTC)]          # the last is too old
    c = charts([(commits, True)], timeline, now=now)
    assert len(c["minutes"]) == 60 and c["minutes"][-1] == now - 30
    assert c["commits"][-2:] == [1, 1] and sum(c["commits"]) == 2
    assert c["events_received"][-3:] == [None, 50, 30] and c["daemon"]
    assert c["latency_mean_s"][-2:] == [0.1, 1.0]
    assert c["latency_p95_s"][-2] == pytest.approx(0.2375)   # all 4 commits under 0.25 s
    assert c["latency_p95_s"][-1] == 0.25                    # 1 of 2 over: the last bound
    assert c["pending"] == [0, 10, 20, 98] and c["pending_times"][0] == now - 150
    # a history cut at its last 200 commits says nothing of the minutes before them
    partial = charts([([datetime.fromtimestamp(now - 65, UTC)], False)], None, now=now)
    assert partial["commits"][:59] == [None] * 59 and partial["commits"][-1] == 0
    assert not partial["sampled"] and not partial["daemon"]


def test_page_and_its_json_twins_over_http(warehouse):
    cat, _ = warehouse
    with HttpServer(status_app(StatusSource(cat))) as server:
        base = server.url
        status, ctype, html = get(f"{base}/")
        assert status == 200 and ctype.startswith("text/html")
        assert 'hx-trigger="every 2s"' in html and "/static/htmx.min.js" in html
        assert "http://" not in html.replace(base, "") and "https://" not in html
        status, ctype, body = get(f"{base}/status.json")
        assert ctype == "application/json" and json.loads(body)["volumes"][0]["name"] == "land"
        status, _, fragment = get(f"{base}/", {"HX-Request": "true"})
        assert status == 200 and "<html" not in fragment and "count-files" in fragment
        for page in ("/volumes/land", "/streams/s", "/files?volume=land&path=a.txt"):
            status, _, html = get(base + page)
            assert status == 200 and "<html" in html, page
            path, _, query = page.partition("?")
            status, _, body = get(f"{base}{path}.json{'?' + query if query else ''}")
            assert status == 200 and json.loads(body), page
        assert json.loads(get(f"{base}/streams/s.json")[2])["records"]
        status, _, body = get(f"{base}/volumes/nope.json")
        assert status == 404 and "nope" in json.loads(body)["error"]
        assert get(f"{base}/volumes/nope")[0] == 404
        assert get(f"{base}/files.json")[0] == 400
        status, _, js = get(f"{base}/static/htmx.min.js")
        assert status == 200 and "htmx" in js
        for static in ("uPlot.iife.min.js", "uPlot.min.css", "charts.js", "uPlot.LICENSE"):
            assert get(f"{base}/static/{static}")[0] == 200, static
        with urllib.request.urlopen(f"{base}/static/charts.js", timeout=15) as resp:
            assert "max-age" in resp.headers["Cache-Control"]  # a reload asks for HTML only


def test_a_token_guards_every_request_and_non_loopback_needs_one(warehouse):
    cat, _ = warehouse
    with pytest.raises(ConfigError, match="VOLUME_STREAM_UI_TOKEN"):
        check_listen("0.0.0.0", None)
    check_listen("0.0.0.0", "t0ken")
    check_listen("127.0.0.1", None)
    with HttpServer(status_app(StatusSource(cat), token="t0ken")) as server:
        for page in ("/", "/status.json", "/static/htmx.min.js", "/volumes/land"):
            assert get(server.url + page)[0] == 401, page
        assert get(server.url + "/?token=wrong")[0] == 401
        assert get(server.url + "/status.json", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(server.url + "/status.json", {"Authorization": "Bearer t0ken"})[0] == 200
        status, _, html = get(server.url + "/?token=t0ken")
        assert status == 200 and "htmx.min.js?token=t0ken" in html  # links keep it


def test_status_describe_and_lists_through_the_cli(warehouse):
    cat, _ = warehouse
    wh = ["--warehouse", str(cat.warehouse.root)]
    runner = CliRunner()
    # docs/status.md's "status_cli" block
    result = runner.invoke(app, ["status", "--json", *wh])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.output)
    assert set(facts) == set(StatusSource(cat).status())
    assert facts["volumes"][0]["files"] == 1
    result = runner.invoke(app, ["status", *wh])
    assert result.exit_code == 0 and "land" in result.output and "pending" in result.output
    (row,) = [json.loads(x) for x in runner.invoke(app, ["stream", "list", "--json", *wh]
                                                   ).output.splitlines()]
    assert row["pending_changes"] > 0 and row["stale"] is False and row["volume"] == "land"
    (vol,) = [json.loads(x) for x in runner.invoke(app, ["volume", "list", "--json", *wh]
                                                   ).output.splitlines()]
    assert vol["last_commit"]
    result = runner.invoke(app, ["volume", "describe", "land", "--json", *wh])
    described = json.loads(result.output)
    assert described["bytes"] == 3 and described["history"][0]["version"] == 3
    assert described["streams"] == ["s"]


def test_ui_refuses_a_public_address_without_a_token_in_one_line(warehouse, tmp_path):
    cat, _ = warehouse
    env = {k: v for k, v in os.environ.items() if k != "VOLUME_STREAM_UI_TOKEN"}
    proc = subprocess.run([sys.executable, "-m", "volume_stream.cli", "ui", "--listen",
                           "0.0.0.0:0", "--warehouse", str(cat.warehouse.root)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: the status page would serve 0.0.0.0")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_daemon_serves_the_page_beside_metrics(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "x.txt").write_text("x")
    monkeypatch.setenv("VOLUME_STREAM_UI_TOKEN", "s3cret")
    cfg = DaemonConfig.from_mapping({
        "warehouse": str(tmp_path / "wh"), "metrics": {"port": 0},
        "daemon": {"stats_interval_s": 0.2},
        "volumes": {"land": {"location": str(data), "max_wait_s": 0.1,
                             "notification": {"type": "LOCAL", "debounce_s": 0.05},
                             "streams": {"s": {}}}}})
    with Daemon(cfg) as daemon:
        wait_for(lambda: daemon.readiness()[0])
        base, auth = daemon.server.url, {"Authorization": "Bearer s3cret"}
        assert get(f"{base}/status.json")[0] == 401
        assert get(f"{base}/metrics")[0] == 200 and get(f"{base}/readyz")[0] == 200
        facts = json.loads(get(f"{base}/status.json", auth)[2])
        (vol,) = facts["volumes"]
        assert facts["daemon"] and vol["listener"]["state"] == "listening"
        assert vol["listener"]["backend"] == "LOCAL" and "(start)" in vol["listener"]["last_refresh"]
        (data / "y.txt").write_text("y")
        wait_for(lambda: json.loads(get(f"{base}/status.json", auth)[2])["volumes"][0]["files"]
                 == 2)
        status, _, html = get(f"{base}/?token=s3cret")
        assert status == 200 and "listening" in html
        # the charts: the daemon's counters sampled at each statistics pass
        charts = wait_for(lambda: (c := json.loads(get(f"{base}/status.json", auth)[2])
                                   ["charts"])["daemon"] and sum(
            v or 0 for v in c["events_received"]) >= 1 and c)
        assert sum(charts["commits"]) >= 2 and charts["pending"]
        assert any(v is not None for v in charts["latency_mean_s"])
        assert "/static/uPlot.iife.min.js" in html and 'id="chart-data"' in html


def test_a_public_metrics_port_without_a_token_serves_metrics_but_not_the_page(warehouse):
    from volume_stream.daemon.metrics import DaemonMetrics, MetricsServer

    cat, _ = warehouse
    with MetricsServer(DaemonMetrics(), host="0.0.0.0", port=0,
                       status=StatusSource(cat)) as server:
        status, _, body = get(f"{server.url}/")
        assert status == 403 and "VOLUME_STREAM_UI_TOKEN" in json.loads(body)["error"]
        assert get(f"{server.url}/status.json")[0] == 404
        assert get(f"{server.url}/metrics")[0] == 200


def test_kept_facts_match_describe_as_commits_arrive(tmp_path):
    """The page's kept, incremental facts (serve.facts) say what `describe_stream` and a full
    read say, for every mode and offset, commit after commit, and after a consume."""
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("land", data)
    source = StatusSource(cat, min_interval_s=0)
    (data / "a.txt").write_text("a")
    cat.refresh("land")
    cat.create_stream("std", on_volume="land")
    cat.create_stream("app", on_volume="land", mode="APPEND_ONLY")
    cat.create_stream("init", on_volume="land", show_initial_rows=True)
    steps = [lambda: (data / "b.txt").write_text("bb"),
             lambda: (data / "a.txt").write_text("a, longer"),
             lambda: (data / "b.txt").unlink(),
             lambda: (data / "c.txt").write_text("ccc")]
    for i, step in enumerate(steps):
        step()
        cat.refresh("land")
        if i == 1:
            with cat.consume("std"):
                pass
        facts = source.status()
        by_name = {s["name"]: s for s in facts["streams"]}
        for name in ("std", "app", "init"):
            described = cat.describe_stream(name)
            assert by_name[name]["pending_changes"] == described["pending_changes"], (i, name)
            assert by_name[name]["latest_version"] == described["latest_version"]
        (vol,) = facts["volumes"]
        assert vol["bytes"] == sum(p.stat().st_size for p in data.iterdir()), i
        assert vol["files"] == len(list(data.iterdir()))


def test_streams_past_one_page_come_those_needing_a_look_first():
    from volume_stream.serve.ui import STREAMS_PER_PAGE, _streams_page

    rows = [{"name": f"s{i:04d}", "pending_changes": i % 7, "stale": i == 5,
             "error": "gone" if i == 9 else None} for i in range(2 * STREAMS_PER_PAGE + 1)]
    first = _streams_page(rows, "1")
    assert [r["name"] for r in first["rows"][:2]] == ["s0009", "s0005"]  # error, then stale
    pending = [r["pending_changes"] for r in first["rows"][2:]]
    assert pending == sorted(pending, reverse=True)
    assert (first["pages"], first["first"], first["last"], first["total"]) == (3, 1, 100, 201)
    last = _streams_page(rows, "99")                                       # clamped
    assert (last["page"], len(last["rows"]), last["first"]) == (3, 1, 201)
    assert _streams_page(rows, "x")["page"] == 1
    few = rows[:3]                                                          # one page: by name
    assert _streams_page(few, 1)["rows"] == few and _streams_page(few, 1)["pages"] == 1
