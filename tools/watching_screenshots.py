"""Regenerate the screenshots of docs/watching.md: the dashboard's /status and /dtrain pages
while a run with windows trains.

    python tools/watching_screenshots.py [OUT_DIR]

Starts ``python -m dtrain`` (iris, 2 single-thread workers: ``cluster.layout = flat``,
windows of one task per worker) with its dashboard on a free port of 127.0.0.1, waits for
its first steps and for the /dtrain page's spans, and saves ``watching-status.png`` and
``watching-dtrain.png`` (default: ``docs/figures``), then stops the run.  Needs Debian's
``chromium`` and ``chromium-driver`` (Selenium comes with the ``test`` extra).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZE = (1400, 1150)
SPANS_ROWS_JS = """
if (typeof Bokeh === "undefined" || !Bokeh.documents || !Bokeh.documents.length) return 0;
const doc = Bokeh.documents[0];
const models = doc.all_models ? [...doc.all_models] : [...doc._all_models.values()];
const m = models.find(m => m.type === "ColumnDataSource" && m.name === "dtrain-spans");
return m ? m.get_length() || 0 : 0;
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:
            return any(line.startswith("dtrain_step{") and float(line.split()[-1]) > 0
                       for line in r.read().decode().splitlines())
    except (OSError, ValueError):
        return False


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        sys.exit("needs Debian's chromium and chromium-driver (apt-get install chromium "
                 "chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--window-size={SIZE[0]},{SIZE[1]}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    port, tmp = _free_port(), Path(tempfile.mkdtemp(prefix="dtrain-shots-"))
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtrain", "--workers", "2", "--set", "cluster.layout=flat",
         "--set", "train.epochs=5000", "--out", str(tmp / "run"),
         "--dashboard-address", f"127.0.0.1:{port}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _steps(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("the run reported no steps within 120 s")
            time.sleep(0.5)
        browser = _browser()
        try:
            browser.get(f"{base}/dtrain")
            deadline = time.monotonic() + 60
            while not browser.execute_script(SPANS_ROWS_JS) and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(3)                       # a few windows' spans, the busy panel full
            browser.save_screenshot(str(out / "watching-dtrain.png"))
            browser.get(f"{base}/status")
            time.sleep(8)                       # the task stream fills over a few windows
            browser.save_screenshot(str(out / "watching-status.png"))
        finally:
            browser.quit()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
    for name in ("watching-status.png", "watching-dtrain.png"):
        print(f"screenshot: {out / name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "figures")
