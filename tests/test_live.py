"""Watching a run: readable task names, step events, the /dtrain page, Prometheus gauges.

Everything runs on real clusters: the page is fetched over HTTP and rendered
in headless Chromium while a real ``python -m dtrain`` trains.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest
from bokeh.models import ColumnDataSource
from dask.task_spec import DataNode, TaskRef
from distributed import Client, LocalCluster

import dtrain
from conftest import REPO
from dtrain.core import events, internals, keys
from dtrain.core.keys import kind_of, parse, run_of
from dtrain.data.shards import load_shard
from dtrain.observe import livepage, runlog
from dtrain.observe.runlog import RunLog
from dtrain.taskgraph.dataparallel import window_graph
from dtrain.taskgraph.placement import place
from dtrain.training.plan import plan
from helpers.browser import bokeh_figures, errors, open_browser, screenshot
from helpers.live import free_port, gauge, get, stop


# --- names --------------------------------------------------------------------------------

def test_every_key_the_graph_builds_reads_back():
    p = plan(dtrain.load_config(None, ["data.shards=5", "graph.fuse_update=false",
                                       "train.batch_size=1000"]))
    where = place(["a", "b"], 5)
    shards = [TaskRef(keys.make(keys.LOAD_SHARD, i, run="12345678")) for i in range(5)]
    val = TaskRef(keys.make(keys.LOAD_VAL, run="12345678"))
    win = window_graph([p.schedule[0]], p.initial_state(), shards, val, where, p.recipe,
                       "12345678")             # an all-digit run id must not look like a number
    seen = {k: (kind_of(k), parse(k).numbers, run_of(k)) for k in [*win.dsk, val.key,
                                                                      shards[3].key]}
    assert seen["forward-backward-0-4-12345678"] == ("forward-backward", [0, 4], "12345678")
    assert seen["reduce-0-3-0-12345678"] == ("reduce", [0, 3, 0], "12345678")
    assert seen["update-0-0-12345678"] == ("update", [0, 0], "12345678")   # replicated: + shard
    assert kind_of("update-7-12345678") == "update" and parse("update-7-r").numbers == [7]
    assert not parse("update-7-r").replicated and parse("update-7-0-r").replicated
    assert parse("reduce-12f0-1-0-r").step == 12 and parse("reduce-12f0-1-0-r").tree == \
        ("12f0", "1")                                               # a model-parallel tree
    assert seen["evaluate-1-12345678"] == ("evaluate", [1], "12345678")
    assert seen["load-val-12345678"] == ("load-val", [], "12345678")
    assert seen["load-shard-3-12345678"] == ("load-shard", [3], "12345678")
    assert kind_of("frobnicate-3") is None and kind_of(("x", 1)) is None
    assert kind_of("forward-3-0-1-r") == "forward"                  # model-parallel keys too
    assert kind_of("back-combine-3-0-r") == "back-combine"
    assert [keys.make(*astuple, run="r") for astuple in
            [(keys.REDUCE, 3, 1, 0), (keys.LOAD_TEST,)]] == ["reduce-3-1-0-r", "load-test-r"]
    with pytest.raises(ValueError, match="forward-backward"):
        keys.prefixes((keys.FORWARD,))      # "forward-" starts forward-backward keys too


def test_key_split_keeps_forward_backward_whole():
    """dask's key_split drops "backward" (8 letters starting a-f look like hex); the one
    distributed's modules use once dtrain relabels them keeps dtrain's kinds and leaves every
    other key as dask names it."""
    import distributed.diagnostics.task_stream as task_stream

    original = dask.utils.key_split
    assert original("forward-backward-3-1-ab12cd34") == "forward"      # the quirk
    assert "distributed.diagnostics.task_stream.key_split" in \
        internals.relabel_tasks(kind_of, keys.COLORS)
    wrapped = task_stream.key_split
    assert internals.unwrapped(wrapped) is original
    assert wrapped("forward-backward-3-1-ab12cd34") == "forward-backward"
    assert wrapped("load-shard-2-ab12cd34") == "load-shard"
    assert wrapped("evaluate-test-ab12cd34") == "evaluate-test"
    for key in ("x-1", ("x-2", 1), b"hello-world-1", "ae05086432ca935f6eba409a8ecd4896",
                "forward-backwards", "reduce", None):
        assert wrapped(key) == original(key), key


def _task_names(dask_scheduler) -> dict:
    """On the scheduler: its task prefixes, and the task stream's labels and colours."""
    from distributed.diagnostics.task_stream import rectangles

    rects = rectangles(dask_scheduler.get_task_stream())
    return {"prefixes": sorted(dask_scheduler.task_prefixes),
            "stream": sorted(set(zip(rects["name"], rects["color"])))}


def _train_and_read_names(client: Client, sets: list[str]) -> dict:
    client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.get_task_stream_index())
    dtrain.train(dtrain.load_config(None, sets), client=client, echo=None)
    return client.run_on_scheduler(_task_names)


def test_task_stream_and_prefixes_say_forward_backward():
    # a cluster of its own: a model-parallel run elsewhere in the session leaves real
    # "forward" prefixes on a shared scheduler
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as client:
        names = _train_and_read_names(client, ["train.epochs=1", "graph.fuse_shards=false",
                                               "graph.fuse_steps=false"])   # every step
    assert {"forward-backward", "reduce", "update", "load-shard", "evaluate"} <= \
        set(names["prefixes"])
    assert "forward" not in names["prefixes"]
    stream = dict(names["stream"])
    assert stream["forward-backward"] == "#0072B2" and stream["update"] == "#D55E00"
    assert stream["reduce"] == "#E69F00"


# --- events -------------------------------------------------------------------------------

def _run_topics(client: Client) -> set[str]:
    return {t for t in client.get_events() if events.run_of_topic(t)}


@pytest.mark.parametrize("every, gap, expected_steps", [
    (3, 0, [3, 6, 7, 9, 12, 14]), (0, 0, []),
    (3, 60, [3, 14]),         # at most one a minute: the first, then only the run's last
])
def test_update_tasks_send_step_events(client, every, gap, expected_steps):
    """Every ``every`` steps and at each epoch's end (7 steps per epoch here), at most one
    per ``gap`` seconds but for the run's last; the driver adds start, one row per epoch,
    and end."""
    before = _run_topics(client)
    result = dtrain.train(dtrain.load_config(None, [
        "train.epochs=2", f"graph.step_events={every}", f"graph.step_event_gap={gap}",
        "graph.window=4"]), client=client, echo=None)
    (topic,) = _run_topics(client) - before
    msgs = [m for _, m in client.get_events(topic)]
    kinds = [m["kind"] for m in msgs]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("epoch") == 2
    steps = [m for m in msgs if m["kind"] == "step"]
    assert [m["step"] for m in steps] == expected_steps
    if steps:
        last = steps[-1]
        assert last["epoch"] == 2 and last["seen"] == 105
        assert last["epoch_loss"] == pytest.approx(result.metrics[-1]["train_loss"], rel=1e-12)
        assert last["epoch_accuracy"] == result.metrics[-1]["train_accuracy"]


def test_update_outside_a_worker_sends_nothing():
    """The reporting update is the plain update wherever no worker runs it (dask.get)."""
    states = []
    for every in (1, 0):
        p = plan(dtrain.load_config(None, [f"graph.step_events={every}", "data.shards=2"]))
        run = f"run{every}"
        shards = [DataNode(keys.make(keys.LOAD_SHARD, i, run=run), load_shard(src))
                  for i, src in enumerate(p.sources)]
        win = window_graph([p.schedule[t] for t in range(3)], p.initial_state(),
                           [TaskRef(s.key) for s in shards], None, place(["w"], 2), p.recipe,
                           run)
        assert (win.dsk[win.ends[0]].args[0].events is not None) == bool(every)
        states.append(dask.get({**win.dsk, **{s.key: s for s in shards}}, win.ends[0]))
    assert (states[0].vector == states[1].vector).all()


def test_a_curve_of_the_page_holds_at_most_its_limit_every_kth_row_in_order():
    source = ColumnDataSource({"x": [], "y": []})
    curve = livepage.Thinned(source, limit=10)
    for lo in range(0, 100, 7):
        xs = list(range(lo, min(lo + 7, 100)))
        curve.add({"x": xs, "y": [2 * x for x in xs]})
        assert list(source.data["x"]) == list(range(0, xs[-1] + 1, curve.every))
        assert len(source.data["x"]) <= 10
    assert curve.every == 16
    assert list(source.data["y"]) == [2 * x for x in range(0, 100, 16)]
    curve.clear()
    curve.add({"x": [5, 6], "y": [0, 1]})
    assert dict(source.data) == {"x": [5, 6], "y": [0, 1]} and curve.every == 1


class OnePlugin:
    """What the page reads of the scheduler's plugin: one run, one worker."""

    def __init__(self, log):
        self.log = log

    def latest(self):
        return self.log

    def worker_names(self):
        return {"w0": "0"}

    def nthreads(self):
        return {"w0": 1}


def test_the_scheduler_keeps_the_newest_epoch_rows_and_the_page_follows_them(monkeypatch):
    monkeypatch.setattr(runlog, "EPOCH_ROWS", 5)
    log = RunLog("r1")
    page = livepage.LivePage(OnePlugin(log))

    def epochs(lo, hi):
        for e in range(lo, hi):
            log.on_event({"kind": "epoch", "epoch": e, "train_loss": 1.0 / e})

    epochs(1, 13)
    assert len(log.epochs) == 5 and log.epochs_seen == 12 and log.epochs[-1]["epoch"] == 12
    page.update(now=0.0)
    assert list(page.epochs.data["epoch"]) == [8, 9, 10, 11, 12]
    epochs(13, 16)
    page.update(now=1.0)
    assert list(page.epochs.data["epoch"]) == list(range(8, 16))


def test_the_page_redraws_its_header_and_busy_panel_at_their_own_pace():
    log = RunLog("r1")
    log.on_event({"kind": "start", "dataset": "iris", "strategy": "allreduce", "workers": 1,
                  "epochs": 9, "steps_per_epoch": 10, "train_samples": 100})

    def step(n):
        log.on_event({"kind": "step", "t": float(n), "epoch": 1, "seen": 10 * n, "step": n,
                      "loss": 1.0, "epoch_loss": 1.0})

    page = livepage.LivePage(OnePlugin(log))
    step(1)
    page.update(now=100.0)
    assert "step 1/90" in page.header.text
    step(2)
    log.tasks.append(("forward-backward-2-0-r1", "w0", 1, "compute", time.time() - 1,
                      time.time()))
    page.update(now=100.0 + livepage.REFRESH_MS / 1000)       # the curves, not the header
    assert list(page.steps.data["step"]) == [1, 2] and "step 1/90" in page.header.text
    assert page.busy.data["forward-backward"] == [0.0]        # nor the busy panel yet
    page.update(now=100.0 + livepage.SPANS_EVERY)
    assert page.busy.data["forward-backward"][0] > 0 and "step 1/90" in page.header.text
    page.update(now=100.0 + livepage.HEADER_EVERY)
    assert "step 2/90" in page.header.text
    step(3)
    log.on_event({"kind": "end"})
    page.update(now=100.0 + livepage.HEADER_EVERY + 0.1)      # the end: at once
    assert "step 3/90" in page.header.text and "finished" in page.header.text


def test_busy_shares_from_task_records():
    log = RunLog("r")
    now = 100.0
    log.tasks.extend([("forward-backward-0-0-r", "w0", 1, "compute", 91.0, 93.0),
                      ("update-0-r", "w0", 1, "compute", 93.0, 94.0),
                      ("update-0-r", "w0", 1, "transfer", 92.5, 93.0),
                      ("forward-backward-0-1-r", "w1", 1, "compute", 85.0, 95.0)])
    shares = log.busy(now, {"w0": 1, "w1": 2}, window=10.0)
    assert shares["w0"] == pytest.approx({"forward-backward": 0.2, "update": 0.1,
                                          "transfer": 0.05, "idle": 0.65})
    assert shares["w1"] == pytest.approx({"forward-backward": 0.25, "idle": 0.75})


# --- the page, while a real run trains ----------------------------------------------------

@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """``python -m dtrain`` on an embedded LocalCluster, long enough to be watched; yields
    the dashboard's base URL once /dtrain answers and steps are flowing."""
    port, tmp = free_port(), tmp_path_factory.mktemp("live")
    log = open(tmp / "stdout.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--set", "train.epochs=5000",
                             "--workers", "2",      # two workers: a busy bar and a gauge each
                             "--out", str(tmp / "run"), "--dashboard-address",
                             f"127.0.0.1:{port}"], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while not gauge(get(f"{base}/metrics")[1], "step"):
            assert proc.poll() is None, (tmp / "stdout.txt").read_text()
            assert time.monotonic() < deadline, "no steps reported within 90 s"
            time.sleep(0.5)
        yield base
        assert proc.poll() is None, "the run should still be training"
    finally:
        stop(proc)
        log.close()


def test_curl_dtrain_while_training(training):
    status, page = get(f"{training}/dtrain")
    assert status == 200
    assert "dtrain live training page" in page and "static/js/bokeh.min.js" in page
    assert re.search(r'"token": ?"[\w.-]+"', page)                  # a Bokeh server session
    assert 'href="dtrain"' in get(f"{training}/status")[1]          # in the navigation bar


def test_prometheus_gauges_next_to_dask_metrics(training):
    first = get(f"{training}/metrics")[1]
    assert "dask_scheduler_workers" in first                         # distributed's own
    deadline = time.monotonic() + 60
    while True:
        later = get(f"{training}/metrics")[1]
        moved = (gauge(later, "step") or 0) > (gauge(first, "step") or 0)
        if (moved and gauge(later, "val_accuracy") is not None) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert gauge(later, "step") > gauge(first, "step")
    assert 0 <= gauge(later, "val_accuracy") <= 1
    assert gauge(later, "samples_per_second") > 0 and gauge(later, "train_loss") > 0
    assert 0 <= gauge(later, "train_accuracy") <= 1
    assert re.search(r'^dtrain_worker_busy_fraction\{run="\w+",worker="1"\} ', later, re.M)


LAST_STEP_JS = ("const s = Bokeh.documents[0].get_model_by_name('dtrain-steps').data.step;"
                " return [s.length, s[s.length - 1]]")     # the curves' points, the newest step


@pytest.mark.slow
def test_live_page_renders_and_updates_in_chromium(training):
    with open_browser() as browser:
        browser.get(f"{training}/dtrain")
        bokeh_figures(browser, 5)
        first = browser.execute_script(LAST_STEP_JS)
        time.sleep(2.5 * livepage.REFRESH_MS / 1000)
        later = bokeh_figures(browser, 5)
        last = browser.execute_script(LAST_STEP_JS)
        screenshot(browser, "live-page.png")
        header = browser.execute_script(
            "return Bokeh.documents[0].get_model_by_name('dtrain-header').text")
        assert errors(browser) == []
    drawn = {f["name"]: f for f in later if f["width"] > 100 and f["height"] > 100}
    assert set(drawn) == {"dtrain-loss", "dtrain-accuracy", "dtrain-rate", "dtrain-busy",
                          "dtrain-spans"}
    assert last[1] > first[1] > 0                                      # points keep coming,
    assert 0 < last[0] <= livepage.POINTS                              # at most so many
    assert drawn["dtrain-busy"]["rows"][0] == 2                        # one bar per worker
    assert "training" in header and "iris, allreduce on 2 worker(s)" in header
    assert "train_acc" in header and re.search(r"val_acc [\d.]+ \(epoch \d+\)", header)


# --- a scheduler in another process -------------------------------------------------------

@pytest.mark.slow
def test_plugin_reaches_a_scheduler_in_another_process(tmp_path):
    """``dask scheduler`` + ``dask worker`` processes; the driver registers the plugin, which
    then serves /dtrain and /metrics there and names the tasks readably."""
    port, info = free_port(), tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler",
                               "--host", "127.0.0.1", "--port", "0", "--scheduler-file",
                               str(info), "--dashboard-address", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True,      # _task_names runs there:
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})]
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(info),
             "--nworkers", "2", "--nthreads", "1", "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + 60
        while not info.exists():
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            names = _train_and_read_names(client, ["train.epochs=3",
                                                   "graph.fuse_steps=false"])   # every step
            pid = client.run_on_scheduler(os.getpid)
        assert pid != os.getpid()
        assert "forward-backward" in names["prefixes"] and "forward" not in names["prefixes"]
        status, page = get(f"http://127.0.0.1:{port}/dtrain")
        assert status == 200 and "dtrain live training page" in page
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
        assert gauge(metrics, "step") == 21 and gauge(metrics, "epoch") == 3
    finally:
        for proc in reversed(procs):
            stop(proc)
