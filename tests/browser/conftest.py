"""A real browser for the pages tokenwire serves: Debian's chromium, headless, driven by
Selenium through Debian's own chromedriver (the Makefile installs both where missing; Selenium
is given their paths, so nothing downloads a browser)."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SCREENSHOTS = os.environ.get("TOKENWIRE_SCREENSHOTS")
"""A folder to keep each view's screenshot in (docs/inspector when the docs' are made again)."""


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("TOKENWIRE_TEST_REQUIRE_MODELS"):
            pytest.fail("chromium and chromedriver are not installed (make test installs them)")
        pytest.skip("chromium and chromedriver are not installed (make test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--hide-scrollbars", "--no-first-run"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    d.set_script_timeout(60)
    try:
        yield d
    finally:
        d.quit()


def screenshot(browser: object, name: str, tmp: Path) -> Path:
    """The whole page as it stands (chromium's own capture, beyond the window), kept in `tmp`
    (and in TOKENWIRE_SCREENSHOTS when set): a PNG."""
    folder = Path(SCREENSHOTS) if SCREENSHOTS else tmp
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    cdp = browser.execute_cdp_cmd  # type: ignore[attr-defined]
    size = cdp("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = cdp("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
        "x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 3000), "scale": 1}})
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
