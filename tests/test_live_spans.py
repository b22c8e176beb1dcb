"""The steps inside windows on the /dtrain page, while a real run trains: headless Chromium
reads the page's Bokeh document and finds the ``dtrain-busy`` and ``dtrain-spans`` sources
filled from the windows' own timings, on a 2-worker flat cluster, on one worker (a window
fused into one task) and under ``mpiexec ... --scheduler-rank 0``."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from helpers import mpirun
from helpers.browser import errors, open_browser, screenshot
from helpers.live import free_port, gauge, get, stop

# The page's sources by name: the data of each ColumnDataSource named dtrain-*.
SOURCES_JS = """
if (typeof Bokeh === "undefined" || !Bokeh.documents || !Bokeh.documents.length) return null;
const doc = Bokeh.documents[0];
const models = doc.all_models ? [...doc.all_models] : [...doc._all_models.values()];
const out = {};
for (const m of models) {
  if (m.type !== "ColumnDataSource" || !m.name || !m.name.startsWith("dtrain-")) continue;
  const entries = m.data instanceof Map ? [...m.data.entries()] : Object.entries(m.data);
  out[m.name] = Object.fromEntries(entries.map(([k, v]) => [k, Array.from(v)]));
}
return out;
"""
WORK = {"forward-backward", "reduce", "update"}   # on one worker the reduce is the group's
# sum, timed inside its forward-backward task

def _watch(cmd: list[str], tmp_path, port: int, workers: int, shot: str,
           env: dict[str, str] | None = None, work: set[str] = WORK) -> dict:
    """Start ``cmd`` (a run with its dashboard on ``port``), open /dtrain once steps flow, and
    read its sources until the busy panel and the spans hold every worker's work; returns
    the sources then."""
    log = open(tmp_path / "stdout.txt", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not gauge(get(f"{base}/metrics")[1], "step"):
            assert proc.poll() is None, (tmp_path / "stdout.txt").read_text()
            assert time.monotonic() < deadline, "no steps reported within 120 s"
            time.sleep(0.5)
        with open_browser() as browser:
            browser.get(f"{base}/dtrain")
            deadline = time.monotonic() + 60
            while True:
                got = browser.execute_script(SOURCES_JS) or {}
                if _complete(got, workers, work) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            screenshot(browser, shot)
            assert _complete(got, workers, work) or _check(got, workers, work)
            assert errors(browser) == []
        assert proc.poll() is None, "the run should still be training"
        return got
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        stop(proc)
        log.close()


def _complete(got: dict, workers: int, work: set[str]) -> bool:
    busy, spans = got.get("dtrain-busy"), got.get("dtrain-spans")
    if not busy or not spans or len(busy["worker"]) < workers:
        return False
    kinds: dict[str, set] = {}
    for w, k in zip(spans["worker"], spans["kind"]):
        kinds.setdefault(w, set()).add(k)
    return all(s > 0 for s in busy["forward-backward"]) and len(kinds) >= workers and \
        all(work <= k for k in kinds.values())


def _check(got: dict, workers: int, work: set[str] = WORK) -> None:
    busy, spans = got["dtrain-busy"], got["dtrain-spans"]
    assert len(busy["worker"]) == workers
    assert all(s > 0 for s in busy["forward-backward"]), busy
    assert all(0 <= s <= 1 for p in busy if p != "worker" for s in busy[p])
    assert set(spans) >= {"worker", "kind", "start", "end", "key"}
    by_worker: dict[str, set] = {}
    for w, k in zip(spans["worker"], spans["kind"]):
        by_worker.setdefault(w, set()).add(k)
    assert len(by_worker) == workers and all(work <= k for k in by_worker.values()), by_worker
    assert all(a <= b for a, b in zip(spans["start"], spans["end"]))


def _run_args(port: int, tmp_path, *sets: str, epochs: int = 5000) -> list[str]:
    return ["--set", f"train.epochs={epochs}", *(a for s in sets for a in ("--set", s)),
            "--out", str(tmp_path / "run"), "--dashboard-address", f"127.0.0.1:{port}"]


@pytest.mark.slow
def test_the_page_shows_the_steps_inside_windows_on_two_flat_workers(tmp_path):
    port = free_port()
    got = _watch([sys.executable, "-m", "dtrain", "--workers", "2",
                  *_run_args(port, tmp_path, "cluster.layout=flat")], tmp_path, port, 2,
                 "live-spans-flat.png")
    _check(got, 2)


@pytest.mark.slow
def test_the_page_shows_the_steps_inside_a_window_fused_on_one_worker(tmp_path):
    port = free_port()
    got = _watch([sys.executable, "-m", "dtrain", "--workers", "1",
                  *_run_args(port, tmp_path, epochs=100_000)], tmp_path, port, 1,
                 "live-spans-fused.png")
    _check(got, 1)


@pytest.mark.slow
@pytest.mark.mpi
def test_the_page_shows_the_steps_inside_windows_under_mpiexec(tmp_path):
    port = free_port()
    got = _watch(mpirun.command(3, *_run_args(port, tmp_path, "cluster.layout=flat")),
                 tmp_path, port, 2,
                 "live-spans-mpi.png", env=mpirun.environment())
    _check(got, 2)
