"""The status page in a real browser (Debian's chromium driven by Playwright) against a real
`volume-stream ui` process: a new file shows up without a reload, a stream and a file's history
open, nothing outside the page's own server is requested, every control has a label. Saves a
screenshot (to docs/images/status.png with VS_UPDATE_SCREENSHOT=1, else beside the test's files).

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
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "status.png"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install "
                                                     "chromium)"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def ui(tmp_path):
    """A warehouse with a refreshed volume and a stream, and `volume-stream ui` serving it."""
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


def unlabelled(page) -> list[str]:
    """Visible inputs, selects and buttons without a label, an aria-label or text."""
    return page.evaluate("""() => [...document.querySelectorAll('input, select, button')]
        .filter(el => el.type !== 'hidden')
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')
                      && !(el.tagName === 'BUTTON' && el.textContent.trim()))
        .map(el => el.outerHTML)""")


def test_status_page_updates_live_and_opens_a_stream_and_a_file(ui, tmp_path):
    from playwright.sync_api import sync_playwright

    cat, data, url = ui
    requested: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requested.append(r.url))
            page.goto(url)
            assert page.text_content("#count-files") == "1"
            assert unlabelled(page) == []
            page.evaluate("window.notReloaded = true")

            (data / "2026" / "01" / "returns.csv").write_text("id\n7\n")
            cat.refresh("landing")
            page.wait_for_function(
                "document.querySelector('#count-files').textContent === '2'", timeout=15000)
            page.wait_for_function(
                "document.querySelector('tr[data-stream=\"new_orders\"] [data-pending]')"
                ".textContent.trim() === '1'", timeout=15000)
            assert page.evaluate("window.notReloaded") is True  # polled, not reloaded
            shot = SCREENSHOT if os.environ.get("VS_UPDATE_SCREENSHOT") else \
                tmp_path / "status.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
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
            assert unlabelled(page) == []
        finally:
            browser.close()
    foreign = [u for u in requested if not u.startswith(url.rstrip("/"))]
    assert requested and foreign == []
