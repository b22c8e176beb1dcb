"""The steps inside windows as spans: what a chain keeps of the tasks it ran (checked against
the chain itself: every step, on its worker, in order), and what the page, the report and the
summary make of them (dtrain.observe.spans, the scheduler's RunLog)."""
from __future__ import annotations

import pytest

from dtrain.core import keys
from dtrain.observe import spans
from dtrain.observe.runlog import RunLog
from dtrain.taskgraph import fuse, passes
from helpers.windows_here import RUN, built, cut_over_mesh, inputs, run_cut, run_here


def _tasks(chain, rows):
    """The spans of ``rows`` that are tasks of ``chain`` (not parts timed inside one)."""
    pairs = {(n[0], k or "other") for n, k in zip(chain.nodes, chain.kinds)}
    return [r for r in rows if r[:2] in pairs]


def _steps(keys_: list[str]) -> list[int]:
    """The steps whose forward-backward tasks ``keys_`` holds, in the order they appear."""
    return list(dict.fromkeys(keys.parse(k).step for k in keys_
                              if keys.kind_of(k) == keys.FORWARD_BACKWARD))


def _fused(win):
    """``win`` (steps 0-13, on one worker) through the passes, as the engine submits it."""
    return passes.optimize(win, passes.Options(RUN, 0, 14)).win


def test_a_fused_window_keeps_every_task_it_ran_in_order_as_spans():
    p, win = built(["graph.update=root"])
    fused = _fused(win)
    got = run_here(fused, inputs(p))
    ran = got[fused.meta]
    (worker, start, end, seconds, rows), = ran.spans         # one chain, here not on a worker
    chain = fused.steps_fused
    tasks = _tasks(chain, rows)
    assert worker == "" and [r[0] for r in tasks] == [n[0] for n in chain.nodes]
    assert [r[1] for r in tasks] == [k or "other" for k in chain.kinds]
    # a group's sum timed inside its forward-backward, drawn after it
    inner = [(i, r) for i, r in enumerate(rows) if r not in tasks]
    assert inner and all(r[1] == "reduce" and rows[i - 1][0] == r[0] and
                         rows[i - 1][2] <= r[2] <= r[3] <= rows[i - 1][3] for i, r in inner)
    assert seconds["reduce/forward-backward"] > 0
    assert _steps([r[0] for r in rows]) == list(range(14))     # every step, in order
    times = [t for r in tasks for t in r[2:]]
    assert times == sorted(times) and start <= times[0] and times[-1] <= end
    assert seconds == ran.seconds and seconds["forward-backward"] > 0
    assert abs(end - ran.ended) < 1e-3


def test_a_long_window_keeps_whole_steps_of_a_sample():
    p, win = built(["graph.update=root"])
    chain = _fused(win).steps_fused
    per_step = len(chain.nodes) // 14
    ran = fuse.run_chain(chain, *(inputs(p)[k] for k in chain.inputs), spans=3 * per_step)
    rows = ran.spans[0][4]
    assert len(rows) < len(chain.nodes) // 2                # a sample ...
    kept = _steps([r[0] for r in rows])
    assert kept[0] == 0 and len(kept) >= 3 and kept == sorted(kept)
    for step in kept:                                       # ... of whole steps
        mine = [r[0] for r in _tasks(chain, rows) if keys.parse(r[0]).step == step
                and keys.kind_of(r[0]) in (keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE)]
        whole = [n[0] for n in chain.nodes if keys.parse(n[0]).step == step
                 and keys.kind_of(n[0]) in (keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE)]
        assert mine == whole
    assert {keys.kind_of(r[0]) for r in rows} >= {keys.STATE, keys.EVALUATE}   # always kept
    assert ran.seconds["forward-backward"] > sum(r[3] - r[2] for r in rows
                                                 if r[1] == "forward-backward")   # all timed


def test_a_window_across_workers_brings_each_workers_spans_of_its_own_chain():
    p, win = built(["graph.update=replicated"], workers=("w0", "w1"))
    done, nodes = cut_over_mesh(p, win, ["w0", "w1"])
    cut = done.win
    got = run_cut(cut, nodes, inputs(p))
    ran = got[cut.meta]
    assert len(ran.spans) == 2
    by_piece = {cut.where[name][0]: cut.dsk[name].args[0].chain.open() for name in cut.pieces}
    for group in ran.spans:
        rows = group[4]
        # which chain: the one whose tasks these are, every one of them in its order
        mine = [c for c in by_piece.values() if [(n[0], k or "other") for n, k in
                                                   zip(c.nodes, c.kinds)] ==
                [r[:2] for r in _tasks(c, rows)]]
        assert len(mine) == 1
        assert _steps([r[0] for r in rows]) == list(range(14))
        assert {spans.kind_of(r[1]) for r in rows} >= {"forward-backward", "update"}
        times = [t for r in _tasks(mine[0], rows) for t in r[2:]]
        assert times == sorted(times)
    assert len({tuple(r[0] for r in g[4]) for g in ran.spans}) == 2      # two chains


# --- what the page, the report and the summary make of them --------------------------------

def _group(worker, start, fb=0.5, reduce=0.2, wait=0.1):
    rows = (("forward-backward-0-0-r", "forward-backward", start, start + fb),
            ("allreduce-0-w0-r", "allreduce", start + fb, start + fb + reduce),
            ("allreduce-0-w0-r", spans.RECV_WAIT, start + fb, start + fb + wait),
            ("update-0-0-r", "update", start + fb + reduce, start + 1.0))
    seconds = {"forward-backward": fb, "allreduce": reduce, "recv-wait/allreduce": wait,
               "update": 1.0 - fb - reduce, "critical": 1.0}
    return (worker, start, start + 1.0, seconds, rows)


def test_shares_take_the_waits_out_of_the_sum_they_were_timed_in():
    got = spans.shares(_group("w", 0.0)[3])
    assert got == pytest.approx({"forward-backward": 0.5, "reduce": 0.1, "update": 0.3,
                                 "evaluate": 0, "send": 0, "recv-wait": 0.1, "other": 0})
    assert spans.kind_of("recv") == "recv-wait" and spans.kind_of("kept") == "other"


def test_busy_comes_from_the_windows_that_ended_and_idle_is_between_them():
    log = RunLog("r")
    log.on_spans([_group("w0", 100.0), _group("w1", 100.0)])
    log.on_spans([_group("w0", 102.0)])                     # w1 sat out the second window
    shares = log.busy(200.0, {"w0": 1, "w1": 1}, window=2.0)   # the 2 s before 103
    assert shares["w0"]["forward-backward"] == pytest.approx(0.25)
    assert shares["w0"]["idle"] == pytest.approx(0.5)
    assert shares["w1"]["forward-backward"] == 0 and shares["w1"]["idle"] == 1
    assert sum(shares["w0"].values()) == pytest.approx(1.0)
    shares = log.busy(200.0, {"w0": 1, "w1": 1}, window=10.0)  # not before the first window
    assert shares["w0"]["forward-backward"] == pytest.approx(1 / 3)
    assert shares["w1"]["idle"] == pytest.approx(2 / 3)
    half = log.busy(102.5, {"w0": 1}, window=1.0)["w0"]     # half of a window inside
    assert half["forward-backward"] == pytest.approx(0.25) and half["idle"] == pytest.approx(0.5)
    rows = log.recent_spans(2.5)
    assert {r[0] for r in rows} == {"w0", "w1"}
    assert all([r[2] for r in rows if r[0] == w] == sorted(r[2] for r in rows if r[0] == w)
               for w in ("w0", "w1"))
    assert [r[2] for r in log.recent_spans(1.0)] == [102.0, 102.5, 102.5, 102.7]


def test_the_page_columns_name_the_step_the_shard_and_the_worker():
    cols = spans.columns(spans.flatten([_group("tcp://a:1", 5.0)]), {"tcp://a:1": "0"})
    assert set(cols) >= {"worker", "kind", "start", "end", "key"}
    assert cols["worker"] == ["worker 0"] * 4
    assert cols["kind"] == ["forward-backward", "reduce", "recv-wait", "update"]
    assert cols["start"][0] == 5000.0 and cols["ms"][0] == 500.0
    assert cols["step"] == [0, 0, 0, 0] and cols["shard"] == [0, -1, -1, -1]


def test_the_summary_shares_and_the_reports_sample_stay_bounded():
    totals, sample = spans.Totals(), spans.Sample(keep=4)
    for i in range(20):
        groups = [_group("a", 10.0 + 2 * i)]
        totals.add(groups)
        sample.add(groups)
    row = totals.summary({"a": "0"})["0"]
    assert row["forward-backward"] == pytest.approx(0.5 * 20 / 39, abs=1e-4)
    assert row["idle"] == pytest.approx(19 / 39, abs=1e-4)
    assert sum(row.values()) == pytest.approx(1.0, abs=1e-3)
    rec = sample.record()
    assert len(rec["windows"]) <= 4 and rec["windows_seen"] == 20
    starts = [w[0][2] for w in rec["windows"]]
    assert starts[0] == 10.0 and starts == sorted(starts) and starts[-1] >= 10.0 + 2 * 8


# --- the Dask dashboard: a window's bar, the Progress panel's steps ------------------------

def test_the_progress_panel_counts_steps_beside_the_window_tasks():
    from distributed.dashboard.components import scheduler as components

    from dtrain.core import internals
    from dtrain.observe import live

    assert internals.add_progress_rows(live._progress_rows)
    plugin = live.DtrainPlugin()
    log = plugin.runs["r"] = RunLog("r")
    log.on_event({"kind": "start", "steps_per_epoch": 7, "epochs": 10, "train_samples": 70})
    log.on_event({"kind": "step", "step": 21, "epoch": 3, "seen": 70, "t": 1.0,
                  "loss": 0.1, "epoch_loss": 0.1, "epoch_accuracy": 0.5})
    live._PLUGINS.add(plugin)
    try:
        msg = {s: {"window": 1} for s in ("memory", "erred", "released", "processing",
                                          "waiting", "queued", "no_worker")}
        msg["all"] = {"window": 7}
        quads = components.progress_quads(msg)
    finally:
        live._PLUGINS.discard(plugin)
    done = dict(zip(quads["name"], quads["done"]))
    assert done["steps"] == "21 / 70" and "window" in done
    assert keys.color(keys.WINDOW) not in (keys.color(keys.FORWARD_BACKWARD),
                                           keys.color(keys.UPDATE))
    assert keys.kind_of(f"window-0-13-w0-{RUN}") == keys.WINDOW


def test_the_report_draws_a_sample_of_windows_and_each_workers_time_by_kind():
    from dtrain.observe import htmlreport
    from dtrain.observe.taskcharts import spans_data

    totals, sample = spans.Totals(), spans.Sample(keep=2)
    for i in range(5):
        groups = [_group("a", 10.0 + 2 * i), _group("b", 10.1 + 2 * i)]
        totals.add(groups)
        sample.add(groups)
    timeline = {"spans": sample.record(), "workers": {"a": "0", "b": "1"}}
    lanes, cols, note = spans_data(timeline)
    assert lanes == ["steps 0-0, worker 0", "steps 0-0, worker 1",
                     "steps 0-0 (window 2), worker 0", "steps 0-0 (window 2), worker 1"]
    assert cols["start"][0] == 0.0 and "2 of the run's 5 windows" in note
    run = htmlreport.RunData("r", {"data": {"dataset": "iris"}},
                             [{"epoch": 1, "train_loss": 1.0}],
                             {"worker_time_shares": totals.summary({"a": "0", "b": "1"})},
                             timeline)
    body, roots = htmlreport.build([run])
    assert "spans-0" in roots and roots["spans-0"].name == "report-spans-0"
    assert "time by kind, per worker" in body and "recv-wait" in body
