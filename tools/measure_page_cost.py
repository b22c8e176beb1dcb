"""What watching a run on the /dtrain page costs: the same run with no dashboard and with the
page open in a browser, alternating.

    python tools/measure_page_cost.py [--workers 16] [--repeats 5] [-- DTRAIN_ARGS...]

Runs ``python -m dtrain --workers W --set cluster.layout=flat DTRAIN_ARGS`` (default
arguments: iris, 300 epochs) ``--repeats`` times in each condition, alternating: *none*,
no dashboard (``cluster.dashboard_address = ""``); *page*, a dashboard with /dtrain open in
headless Chromium from before the first step to the end (it refreshes once a second and
receives every window's spans).  Prints each run's training ms per step (``summary.json``:
``seconds`` over ``steps_run``), the medians, and the median of the paired differences.
Needs Debian's ``chromium`` and ``chromium-driver``.  Timings only: not a test.
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        sys.exit("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def one(workers: int, extra: list[str], page: bool, browser) -> float:
    """One run's training milliseconds per step."""
    out = Path(tempfile.mkdtemp(prefix="dtrain-pagecost-"))
    port = _free_port()
    dash = ["--dashboard-address", f"127.0.0.1:{port}"] if page else \
        ["--set", 'cluster.dashboard_address=""']
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--workers", str(workers),
                             "--set", "cluster.layout=flat", *dash, *extra,
                             "--out", str(out / "run")], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        if page:
            while proc.poll() is None and not _answers(f"http://127.0.0.1:{port}/dtrain"):
                time.sleep(0.1)
            if proc.poll() is None:     # the page open until the run ends
                threading.Thread(target=browser.get, args=(f"http://127.0.0.1:{port}/dtrain",),
                                 daemon=True).start()
        if proc.wait() != 0:
            sys.exit(f"the run failed (exit {proc.returncode})")
        summary = json.loads((out / "run" / "summary.json").read_text())
        return 1000.0 * summary["seconds"] / summary["steps_run"]
    finally:
        if page:
            try:
                browser.get("about:blank")
            except Exception:
                pass
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("extra", nargs="*", default=["--set", "train.epochs=300"])
    args = parser.parse_args()
    browser = _browser()
    got: dict[str, list[float]] = {"none": [], "page": []}
    try:
        for i in range(args.repeats):
            for name in ("none", "page") if i % 2 == 0 else ("page", "none"):
                ms = one(args.workers, args.extra, name == "page", browser)
                got[name].append(ms)
                print(f"run {i + 1} {name:4s} {ms:.3f} ms/step", flush=True)
    finally:
        browser.quit()
    diffs = [p - n for p, n in zip(got["page"], got["none"])]
    none, page = statistics.median(got["none"]), statistics.median(got["page"])
    diff = statistics.median(diffs)
    print(f"median ms/step: none {none:.3f}, page {page:.3f}; median paired difference "
          f"{diff:+.3f} ms/step ({100 * diff / none:+.1f} %)")


if __name__ == "__main__":
    main()
