"""What watching a run on the /dtrain page costs: the same run with no dashboard and with the
page open in a browser, alternating.

    python tools/measure_page_cost.py [--workers 16] [--repeats 5] [--dashboard]
                                      [-- DTRAIN_ARGS...]

Runs ``python -m dtrain --workers W --set cluster.layout=flat DTRAIN_ARGS`` (default
arguments: iris, 3,000 epochs: a shorter run is mostly the page's loading) ``--repeats``
times in each condition, alternating: *none*, no dashboard (``cluster.dashboard_address =
""``); *page*, a dashboard with /dtrain open in headless Chromium from before the first
step to the end; with ``--dashboard`` also *dashboard*, one served with no page open.
Prints each run's training ms per step over the whole run (``summary.json``: ``seconds``
over ``steps_run``) and over its second half of epochs (``metrics.jsonl``: the page long
loaded), the head process's CPU per step (``head_cpu_ms_per_step``: the driver, the
scheduler and the page's server), their medians, and the medians of the paired
differences from *none*.  Needs Debian's ``chromium`` and ``chromium-driver``.  Timings
only: not a test.
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


def _steady(run: Path) -> float:
    """Milliseconds per step over the run's second half of epochs (``metrics.jsonl``): the
    page long loaded, the cluster long started."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = rows[len(rows) // 2:]
    return 1000.0 * sum(r["seconds"] for r in rows) / sum(r["steps"] for r in rows)


def one(workers: int, extra: list[str], mode: str, browser) -> tuple[float, float, float]:
    """One run's training milliseconds per step, over the whole run and over its second half
    (:func:`_steady`), and the head process's CPU milliseconds per step (the driver with the
    scheduler, the dashboard and the page's server inside it): ``mode`` none, dashboard or
    page."""
    page = mode == "page"
    out = Path(tempfile.mkdtemp(prefix="dtrain-pagecost-"))
    port = _free_port()
    dash = ["--dashboard-address", f"127.0.0.1:{port}"] if mode != "none" else \
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
        return (1000.0 * summary["seconds"] / summary["steps_run"], _steady(out / "run"),
                summary["head_cpu_ms_per_step"])
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
    parser.add_argument("--dashboard", action="store_true",
                        help="also runs that serve the dashboard with no page open")
    parser.add_argument("extra", nargs="*", default=["--set", "train.epochs=3000"])
    args = parser.parse_args()
    browser = _browser()
    modes = ("none", "dashboard", "page") if args.dashboard else ("none", "page")
    got: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    try:
        for i in range(args.repeats):
            for name in modes if i % 2 == 0 else modes[::-1]:
                whole, steady, head = one(args.workers, args.extra, name, browser)
                got[name].append((whole, steady, head))
                print(f"run {i + 1} {name:9s} {whole:.3f} ms/step, second half {steady:.3f}, "
                      f"head CPU {head:.3f} ms/step", flush=True)
    finally:
        browser.quit()
    for at, what in ((0, "whole run"), (1, "second half"), (2, "head CPU")):
        none = statistics.median(x[at] for x in got["none"])
        print(f"{what}: median ms/step " +
              ", ".join(f"{m} {statistics.median(x[at] for x in got[m]):.3f}" for m in modes))
        for m in modes[1:]:
            diff = statistics.median(x[at] - n[at] for x, n in zip(got[m], got["none"]))
            print(f"  {m}: median paired difference from none {diff:+.3f} ms/step "
                  f"({100 * diff / none:+.1f} %)")


if __name__ == "__main__":
    main()
