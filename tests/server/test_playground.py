"""The playground page in headless Chromium (Debian's system browser, driven by Playwright).

CI installs both: `apt-get install -y chromium` and `pip install playwright` (no `playwright install`:
the system browser is used). Without either, the test skips and says why.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from .conftest import poll_get, wait_until

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("SPECDECODE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("no system Chromium (apt-get install -y chromium, or set SPECDECODE_CHROMIUM)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.set_default_timeout(60_000)
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.errors = errors
        yield page
        browser.close()


def test_generate_colours_tokens_and_shows_stats(live_server, page):
    page.goto(live_server.base_url + "/")
    page.wait_for_function("document.body.dataset.ready === '1'")
    page.select_option("#mode", "completion")
    page.fill("#prompt", "def fibonacci(n):")
    page.select_option("#drafter", "draft")
    page.fill("#k", "3")
    page.fill("#max-tokens", "24")
    page.fill("#temperature", "0")
    page.click("#generate")
    page.wait_for_selector("#output span.tok")
    page.wait_for_function("document.getElementById('status').dataset.state === 'done'")

    spans = page.locator("#output span.tok")
    classes = [spans.nth(i).get_attribute("class") for i in range(spans.count())]
    origins = {c.split()[1] for c in classes}
    assert origins <= {"accepted", "recovered", "bonus", "plain"} and origins & {"accepted", "bonus"}, classes
    # accepted tokens are coloured by their source: here the draft model drafted them all
    assert all(c.split()[2:] == ["from-model"] for c in classes if c.split()[1] == "accepted"), classes
    assert page.locator(".legend .tok.from-store").count() == 1
    assert page.text_content("#output").startswith("\n    ")  # the function body, whitespace intact
    assert re.fullmatch(r"\d\.\d\d", page.text_content("#alpha")), page.text_content("#alpha")
    assert re.fullmatch(r"\d+\.\d\d", page.text_content("#tau"))
    assert re.fullmatch(r"\d+\.\d", page.text_content("#tps"))
    assert page.text_content("#tokens") == "24"
    assert "length" in page.text_content("#status")
    assert page.errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)


def test_stop_button_cancels_the_generation(live_server, page):
    health = lambda: poll_get(live_server.base_url + "/health").json()  # noqa: E731
    page.goto(live_server.base_url + "/")
    page.wait_for_function("document.body.dataset.ready === '1'")
    page.select_option("#mode", "completion")
    page.fill("#prompt", "1, 2, 3, 4, 5, 6, 7,")
    page.select_option("#drafter", "none")
    page.fill("#max-tokens", "500")
    page.click("#generate")
    page.wait_for_selector("#output span.tok")
    page.click("#stop")
    page.wait_for_function("document.getElementById('status').dataset.state === 'stopped'")
    assert wait_until(lambda: health()["running"] == 0, 15), "the server kept generating after Stop"
    assert page.is_enabled("#generate")
