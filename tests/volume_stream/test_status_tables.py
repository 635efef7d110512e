"""The status page's additions of issue 34: SQL tables with their streams and change logs, a
stream's consumed batches, a time range, thousands separators, a working JSON link on every
page, and charts that span their range (one sample is not years wide, a gap is not a line).
Real warehouses, files and HTTP; no Spark."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime
from html import unescape

import pyarrow as pa
import pytest

import volume_stream as vs
from volume_stream.serve.charts import GAP_S, RANGES, Timeline, charts
from volume_stream.serve.status import StatusSource
from volume_stream.serve.ui import HttpServer, status_app


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def warehouse(tmp_path):
    """Volume `land` with 1,200 files, stream `s` on it with one batch consumed, table `t` keyed
    by `k` with change tracking, a stream and a change log on it."""
    data = tmp_path / "data"
    data.mkdir()
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("land", data)
    cat.create_stream("s", on_volume="land")
    for i in range(1200):
        (data / f"f{i:04d}.txt").write_text("x")
    cat.refresh("land")
    with cat.consume("s") as batch:
        assert batch.records.num_rows == 1200
    cat.sql("CREATE TABLE t (k INT, v STRING, PRIMARY KEY (k))")
    cat.sql("ALTER TABLE t SET TBLPROPERTIES ('change_tracking' = 'true')")
    cat.tables.insert("t", pa.table({"k": pa.array([1, 2], pa.int32()), "v": ["a", "b"]}))
    cat.sql("CREATE STREAM ts ON TABLE t")
    cat.enable_change_log("t")
    return cat


def test_tables_consumed_batches_and_separators_in_the_page_and_its_json(warehouse):
    cat = warehouse
    with HttpServer(status_app(StatusSource(cat))) as server:
        base = server.url
        facts = json.loads(get(f"{base}/status.json")[1])
        (table,) = facts["tables"]
        assert (table["name"], table["key"], table["change_tracking"], table["streams"]) == (
            "t", ["k"], True, ["ts"])
        assert table["version"] == cat.tables.version("t") and table["columns"] == 2
        assert table["change_log"]["open_shards"] == 1 and table["change_log"]["enabled"]
        assert facts["summary"]["tables"] == 1 and facts["summary"]["files"] == 1200
        html = get(f"{base}/")[1]
        assert re.search(r'id="count-files">1,200<', html)
        assert 'data-table="t"' in html and "/streams/ts" in html

        stream = json.loads(get(f"{base}/streams/s.json")[1])
        (batch,) = stream["consumed"]
        assert (batch["batch_id"], batch["start"], batch["end"], batch["rows"]) == (0, 0, 1, 1200)
        assert datetime.fromisoformat(batch["at"])
        html = get(f"{base}/streams/s")[1]
        assert re.search(r'data-batch="0">.*?\(0, 1\].*?1,200', html)
        # a stream's description does not carry the list
        assert "consumed" not in cat.describe_stream("s")


def test_every_pages_json_link_opens_its_twin(warehouse):
    with HttpServer(status_app(StatusSource(warehouse))) as server:
        base = server.url
        for page in ("/", "/?range=6h", "/volumes/land", "/streams/s",
                     "/files?volume=land&path=f0001.txt"):
            status, html = get(base + page)
            assert status == 200, page
            href = unescape(re.search(r'id="json-link" href="([^"]+)"', html).group(1))
            status, body = get(base + href)
            assert status == 200 and isinstance(json.loads(body), dict), (page, href)
        assert re.search(r'id="json-link" href="/status.json"', get(base + "/")[1])


def test_the_time_range_picks_the_charts_span(warehouse):
    with HttpServer(status_app(StatusSource(warehouse))) as server:
        base = server.url
        for name, seconds in RANGES.items():
            c = json.loads(get(f"{base}/status.json?range={name}")[1])["charts"]
            assert (c["range"], c["to"] - c["from"], len(c["minutes"])) == (name, seconds, 60)
        assert json.loads(get(f"{base}/status.json")[1])["charts"]["range"] == "1h"
        status, body = get(f"{base}/status.json?range=2y")
        assert status == 400 and "15m, 1h, 6h, 24h" in json.loads(body)["error"]
        html = get(f"{base}/?range=6h")[1]
        assert "Activity in the last 6h" in html and "<option selected>6h</option>" in html


def test_charts_span_their_range_and_break_the_line_at_a_gap():
    now = 1_800_000_000.0
    timeline = Timeline()
    timeline.record({"pending": 5}, at=now - 1)
    one = charts([], timeline, now=now)  # a fresh page: one sample, an hour wide all the same
    assert one["to"] - one["from"] == 3600 and one["from"] <= now - 1 < one["to"]
    assert one["pending"] == [5] and one["minutes"][0] == one["from"]
    # nobody looked for 30 minutes: a gap (None), not a steady climb from 5 to 50
    timeline.record({"pending": 50}, at=now + 1800)
    two = charts([], timeline, now=now + 1800)
    assert two["pending"] == [5, None, 50]
    assert two["pending_times"][0] < two["pending_times"][1] < two["pending_times"][2]
    assert two["pending_times"][2] - two["pending_times"][0] > GAP_S
    # samples 2 s apart stay one line
    for i in range(1, 5):
        timeline.record({"pending": 50 + i}, at=now + 1800 + 2 * i)
    assert charts([], timeline, now=now + 1810)["pending"][2:] == [50, 51, 52, 53, 54]


def test_a_timeline_keeps_a_day_the_last_hour_at_every_sample():
    start = 1_800_000_000.0
    timeline = Timeline()
    for i in range(0, 3 * 3600, 2):            # three hours, a sample every 2 s
        timeline.record({"pending": i, "events_received": i}, at=start + i)
    points = timeline.points()
    fine = [t for t, _ in points if t >= points[-1][0] - 3600]
    coarse = [t for t, _ in points if t < points[-1][0] - 3600]
    assert 1700 < len(fine) <= 1801 and 110 < len(coarse) <= 130  # 2 h at ~one a minute
    # (the newest coarse sample is the one being thinned into: closer to the one before it)
    assert all(56 <= b - a <= 62 for a, b in zip(coarse, coarse[1:-1], strict=False))
    c = charts([([datetime.fromtimestamp(start + 60, UTC)], True)], timeline,
               now=start + 3 * 3600, span_s=RANGES["6h"])
    assert c["step_s"] == 360 and sum(c["commits"]) == 1
    # the counter's increases survive the thinning: every event of the range is counted
    assert sum(v or 0 for v in c["events_received"]) == pytest.approx(3 * 3600 - 2, abs=2)
