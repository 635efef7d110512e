"""The status page in a real browser (Debian's chromium driven by Playwright) against a real
`volume-stream ui` process: a new file shows up without a reload, in the counts and in the
charts (uPlot), a stream and a file's history open, nothing outside the page's own server is
requested, every control has a label, axe-core (vendored in tests/vendor, with its licence)
finds no serious or critical violation on any page, and the keyboard alone reaches and opens
the stream links and the file search. Saves a screenshot (to docs/images/status.png with
VS_UPDATE_SCREENSHOT=1, else beside the test's files).

One `ui` process and one browser serve every test of the module (each test opens its own page).

Skipped where /usr/bin/chromium is missing (`.ci/run` installs it: apt-get install chromium).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import volume_stream as vs

CHROMIUM = Path("/usr/bin/chromium")
AXE = Path(__file__).resolve().parents[1] / "vendor" / "axe.min.js"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "status.png"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install "
                                                     "chromium)"),
    pytest.mark.timeout(120),
]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A warehouse with a refreshed volume and a stream, and `volume-stream ui` serving it."""
    tmp_path = tmp_path_factory.mktemp("ui")
    data = tmp_path / "landing"
    (data / "2026" / "01").mkdir(parents=True)
    (data / "2026" / "01" / "orders.csv").write_text("id,total\n1,10\n")
    cat = vs.connect(tmp_path / "wh")
    cat.create_volume("landing", data)
    cat.refresh("landing")
    cat.create_stream("new_orders", on_volume="landing")
    env = {k: v for k, v in os.environ.items() if k != "VOLUME_STREAM_UI_TOKEN"}
    # docs/status.md's 'status_serve' block: `volume-stream ui --warehouse ...`
    proc = subprocess.Popen([sys.executable, "-m", "volume_stream.cli", "ui", "--listen",
                             "127.0.0.1:0", "--warehouse", str(tmp_path / "wh")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().strip()  # the URL alone, once it is listening
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read()
        yield cat, data, url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def unlabelled(page) -> list[str]:
    """Visible inputs, selects and buttons without a label, an aria-label or text."""
    return page.evaluate("""() => [...document.querySelectorAll('input, select, button')]
        .filter(el => el.type !== 'hidden')
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                      && !(el.tagName === 'BUTTON' && el.textContent.trim()))
        .map(el => el.outerHTML)""")


def serious_violations(page, context: str = "document") -> list[dict]:
    """axe-core's violations of serious or critical impact on the page (or `context`)."""
    if not page.evaluate("typeof axe !== 'undefined'"):
        # inline (no request leaves the page's server); read here, not by Playwright, whose
        # file reads run on executor threads that would outlive the test
        page.add_script_tag(content=AXE.read_text())
    found = page.evaluate(f"""async () => (await axe.run({context}, {{resultTypes: ['violations']}}))
        .violations.map(v => ({{id: v.id, impact: v.impact, help: v.help,
                               nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}}))""")
    return [v for v in found if v["impact"] in ("serious", "critical")]


def chart_points(page, chart: str, series: int) -> list:
    return page.evaluate(f"window.statusCharts['{chart}'].data[{series}]")


def test_status_page_updates_live_and_opens_a_stream_and_a_file(ui, browser, tmp_path):
    cat, data, url = ui
    requested: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.on("request", lambda r: requested.append(r.url))
        page.goto(url)
        assert page.text_content("#count-files") == "1"
        assert unlabelled(page) == []
        page.wait_for_function("window.statusCharts && Object.keys(window.statusCharts)"
                               ".length === 2")
        assert page.locator("#charts canvas").count() == 2  # latency: under a daemon only
        assert "measured by the daemon" in page.text_content("#chart-latency")
        commits_before = sum(v or 0 for v in chart_points(page, "chart-commits", 1))
        assert commits_before >= 1  # the refresh that made version 1, from the history
        page.evaluate("window.notReloaded = true")

        (data / "2026" / "01" / "returns.csv").write_text("id\n7\n")
        cat.refresh("landing")
        page.wait_for_function(
            "document.querySelector('#count-files').textContent === '2'", timeout=15000)
        page.wait_for_function(
            "document.querySelector('tr[data-stream=\"new_orders\"] [data-pending]')"
            ".textContent.trim() === '1'", timeout=15000)
        # the same polls feed the charts: one more commit, pending changes sampled at 1
        page.wait_for_function(
            f"window.statusCharts['chart-commits'].data[1].reduce((a, b) => a + (b || 0), 0)"
            f" === {commits_before + 1}", timeout=15000)
        page.wait_for_function(
            "window.statusCharts['chart-pending'].data[1].slice(-1)[0] === 1", timeout=15000)
        assert page.evaluate("window.notReloaded") is True  # polled, not reloaded
        assert page.locator("#charts canvas").count() == 2  # kept across polls, not redrawn
        shot = SCREENSHOT if os.environ.get("VS_UPDATE_SCREENSHOT") else \
            tmp_path / "status.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(page.screenshot(full_page=True))
        assert shot.stat().st_size > 10_000

        page.click("text=new_orders")
        page.wait_for_selector("#stream-pending")
        assert page.text_content("#stream-pending").strip() == "1"
        assert "2026/01/returns.csv" in page.text_content("#records ~ table")

        page.goto(url)
        page.select_option("#volume-select", "landing")
        page.fill("#path-input", "2026/01/returns.csv")
        page.click("button:has-text('show history')")
        page.wait_for_selector("#file-state")
        assert "present" in page.text_content("#file-state")
        assert page.locator("tr[data-version]").count() == 1
        assert page.locator("tr[data-row-version]").count() == 1   # its row, by time travel
        assert page.locator("tr[data-record='INSERT']").count() == 1
        assert unlabelled(page) == []
    finally:
        page.close()
    foreign = [u for u in requested if not u.startswith(url.rstrip("/"))]
    assert requested and foreign == []


def test_axe_finds_no_serious_violation_on_any_page(ui, browser):
    _, _, url = ui
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        # (the volume page is built of the same parts as the stream page and the search form)
        for path in ("/", "/streams/new_orders", "/files?volume=landing&path=2026/01/orders.csv"):
            page.goto(url.rstrip("/") + path)
            page.wait_for_selector("main#live")
            assert serious_violations(page) == [], path
        # the check sees what it should: an input without a label is a critical violation
        page.evaluate("""() => { const probe = document.createElement('div'); probe.id = 'probe';
            probe.innerHTML = '<input type=text>'; document.body.append(probe); }""")
        assert [v["id"] for v in serious_violations(page, "'#probe'")] == ["label"]
    finally:
        page.close()


def tab_to(page, selector: str, limit: int = 80) -> None:
    """Press Tab until the focused element matches `selector` (the keyboard alone)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(f"document.activeElement.matches({selector!r})"):
            return
    raise AssertionError(f"{limit} presses of Tab never reached {selector}")


def test_the_keyboard_reaches_and_opens_the_stream_links_and_the_search(ui, browser):
    _, _, url = ui
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(url)
        page.wait_for_function("window.statusCharts !== undefined")
        tab_to(page, "#stream-link-new_orders")
        # the page refreshes itself under the focus: the link keeps it (htmx, by its id)
        shown = page.text_content("#generated-at")
        page.wait_for_function(
            f"document.querySelector('#generated-at').textContent !== {shown!r}")
        assert page.evaluate("document.activeElement.id") == "stream-link-new_orders"
        page.keyboard.press("Enter")
        page.wait_for_url("**/streams/new_orders")
        page.wait_for_selector("#stream-pending")

        page.goto(url)
        tab_to(page, "#path-input")
        page.keyboard.type("orders")           # part of a name: the search lists the paths
        page.keyboard.press("Enter")
        page.wait_for_url("**/files?**")
        page.wait_for_selector("#matches")
        tab_to(page, "ul[aria-labelledby=matches] a")
        page.keyboard.press("Enter")
        page.wait_for_selector("tr[data-row-version]")
        assert "present" in page.text_content("#file-state")
    finally:
        page.close()


def test_the_charts_span_the_hour_from_zero_and_the_json_link_opens(ui, browser):
    """Issue 34 item 13: a fresh page's pending chart (one sample or few) spans the same hour
    as the others, its y-axis from 0 to just above its samples, and "JSON" opens the twin."""
    _, _, url = ui
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(url)
        page.wait_for_function("window.statusCharts && window.statusCharts['chart-pending']")
        scales = page.evaluate("""() => Object.fromEntries(Object.entries(window.statusCharts)
            .map(([id, u]) => [id, [u.scales.x.min, u.scales.x.max, u.scales.y.min,
                                    u.scales.y.max]]))""")
        data = page.evaluate("JSON.parse(document.getElementById('chart-data').textContent)")
        for chart, (x0, x1, y0, y1) in scales.items():
            assert (x0, x1) == (data["from"], data["to"]) and x1 - x0 == 3600, chart
            assert y0 == 0 and y1 > 0, chart
        pending = [v for v in data["pending"] if v is not None]
        assert pending and scales["chart-pending"][3] <= max(1, max(pending) * 1.1) + 1e-9
        page.click("#json-link")
        page.wait_for_load_state()
        assert page.url.endswith("/status.json")
        assert '"volumes"' in page.content()
    finally:
        page.close()
