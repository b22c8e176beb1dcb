"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``), driven by Selenium.

Tests that load a page call :func:`open_browser` (skips cleanly where either
program is missing) and :func:`bokeh_figures` to see what Bokeh rendered.
Screenshots go to the git-ignored ``test-artifacts/``.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import REPO

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1400,1500")

# Every Bokeh figure on the page: its name, rendered size and rows of data per renderer.
FIGURES_JS = """
if (typeof Bokeh === "undefined" || !Bokeh.index) { return null; }
return [...Bokeh.index.all_views()].filter(v => v.model.type === "Figure").map(v => {
  const box = v.el.getBoundingClientRect();
  return {name: v.model.name, width: box.width, height: box.height,
          rows: v.model.renderers.filter(r => r.data_source)
                 .map(r => r.data_source.get_length() || 0)};
});
"""


@contextlib.contextmanager
def open_browser() -> Iterator[Any]:
    """A headless Chromium session; skips the test when Chromium or its driver is absent."""
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    profile = tempfile.mkdtemp(prefix="dtrain-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def bokeh_figures(driver: Any, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The page's Bokeh figures, once ``count`` of them are laid out (or what is there at
    ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        figs = driver.execute_script(FIGURES_JS) or []
        laid_out = [f for f in figs if f["width"] > 0 and f["height"] > 0]
        if len(laid_out) >= count or time.monotonic() > deadline:
            return figs
        time.sleep(0.25)


def errors(driver: Any) -> list[str]:
    """JavaScript errors and failed loads the page reported to the console."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))
