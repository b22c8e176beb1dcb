"""The benchmarks' models checked against dtrain itself: the performance model counts the
tasks dtrain's graphs hold and adds up; the layout model counts tasks and transfers per step
for each layout and strategy, and runs and checks itself against measured runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO
from dtrain.training.plan import plan


@pytest.mark.parametrize("workers, k", [(1, 2), (2, 2), (3, 2), (4, 2), (7, 2), (9, 3), (16, 4)])
def test_the_performance_model_counts_the_tasks_dtrain_builds(workers, k):
    """tasks_per_step(W, k) is what one step of dtrain's allreduce graph holds (its
    forward-backward, reduce and update tasks; the state literal and evaluations aside)."""
    from dask.task_spec import TaskRef

    from benchmarks.model import tasks_per_step
    from dtrain import load_config
    from dtrain.taskgraph.dataparallel import window_graph
    from dtrain.taskgraph.placement import place

    p = plan(load_config(None, [f"data.shards={workers}", f"graph.fan_in={k}",
                                "train.epochs=1"]))
    names = [f"w{i}" for i in range(workers)]
    placement = place(names, workers)
    win = window_graph([p.schedule[1]], p.initial_state(),
                       [TaskRef(f"load-shard-{i}") for i in range(workers)],
                       TaskRef("load-val"), placement, p.recipe, "run")
    step = [key for key in win.dsk if key.startswith(("forward-backward", "reduce", "update"))]
    assert len(step) == tasks_per_step(workers, k)


def test_the_performance_model_adds_up():
    from benchmarks.model import predict

    c = {"hop": 1e-3, "fetch": 2e-3, "bandwidth": 1e9, "task": 0.0}
    # W = 1: two hops, forward-backward of the whole batch (6 * 100 * 1000 / 1e9), update
    assert predict(c, 1, 100, 1000, 8000, 4004, 1e9, 1e-4) == pytest.approx(2e-3 + 6e-4 + 1e-4)
    # W = 4, k = 2: broadcast (hop + fetch + 3 states), fb of 25 rows, 2 levels, update
    expect = (3e-3 + 3 * 8e-6) + 1.5e-4 + 2 * (3e-3 + 4.004e-6) + 1e-4
    assert predict(c, 4, 100, 1000, 8000, 4004, 1e9, 1e-4) == pytest.approx(expect)
    # the scheduler bound: 7 tasks of 10 ms each
    assert predict(dict(c, task=1e-2), 4, 100, 1000, 8000, 4004, 1e9, 1e-4) == pytest.approx(7e-2)


@pytest.mark.slow
def test_the_performance_model_runs_and_checks_itself():
    """`python -m benchmarks.model` measures its constants, predicts, trains to compare
    (at 1 and 2 workers, and the layout model in both layouts), and predicts 64 and 256
    cores (``--scales``), marked as predictions; an unknown workload is a one-line error."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.model", "--workloads", "iris",
                           "--epochs", "2", "--widths", "1,2", "--check-models", "tiny",
                           "--scales", "64,256"],      # 1,024 cores: the same code, slower
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| iris |")]
    measured = [row for row in rows if len(row) == 10]          # W, ..., measured / predicted
    assert [row[2].strip() for row in measured] == ["1", "2"]
    assert all(float(row[8]) > 0 for row in measured)
    checks = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| tiny |")
              and "prediction" not in line]
    assert [(r[2].strip(), r[3].strip()) for r in checks] == \
        [("hybrid", "1"), ("hybrid", "2"), ("flat", "1"), ("flat", "2")]
    # the graph's tasks per step (a long run's) and the run's (its 80 steps' edges): close
    assert all(abs(float(r[4]) - float(r[5])) <= 0.05 for r in checks), checks
    assert all(float(r[9]) > 0 for r in checks)                 # measured / predicted
    scale = [row for row in rows if len(row) == 13]
    assert {row[3].strip() for row in scale} == {"64", "256"}
    assert {row[5].strip() for row in scale} == {"hybrid", "flat"}
    assert all("(prediction)" in row[8] for row in scale)
    bad = subprocess.run([sys.executable, "-m", "benchmarks.model", "--workloads", "P9"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("benchmarks.model: error: unknown")
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("layout, strategy, tasks, transfers", [
    ((1, 16, True), "allreduce", 0.0, 0.0),             # one node: a window is one task
    ((1, 2, False), "allreduce", 2 + 2 / 8, 2.0),        # a task per worker, partials swapped
    ((4, 16, True), "allreduce", 4 + 2 + 4 / 8, 8.0),    # 4 nodes: a task each, 2 sums
    ((1, 16, True), "local-sgd", 0.0, 0.0),              # one node: the rounds in one task
    ((1, 16, False), "local-sgd", (16 + 14 + 1) / 8, (15 + 15) / 8),   # the tree's root
    # is the average; the state goes out to 15 workers, 15 partial sums cross
    ((4, 16, True), "parameter-server", 65.0, 68.0),     # one flat level: nothing fuses
])
def test_the_layout_model_counts_tasks_and_transfers_per_step(layout, strategy, tasks,
                                                              transfers):
    """Counted on dtrain's own graph for the layout (a shard per core; hybrid: a worker per
    node), each step through the scheduler (``cut=False``): the fused step of a node's
    shards is what makes hybrid cheap.  Cut as the engine runs a window that spans workers,
    the scheduler sees no task and no transfer a step; the crossings become messages."""
    from benchmarks.costmodel import Layout, count

    step = count((16, 16, 2), 8, Layout(*layout), strategy, cut=False)
    assert (step.tasks, step.transfers) == (pytest.approx(tasks), pytest.approx(transfers))
    assert step.fused == (layout[2] and strategy != "parameter-server")
    cut = count((16, 16, 2), 8, Layout(*layout), strategy)
    assert (cut.tasks, cut.transfers) == (0.0, 0.0)
    spans = layout[0] > 1 or not layout[2]
    assert (cut.chains is not None) == spans and (cut.bytes > 0) == spans


def test_the_layout_model_adds_up():
    """T = max(critical path + compute, scheduler CPU, all CPU / cores); the path of a
    hybrid step on one node is no hop at all (its window is one task), a flat one's a hop and
    a fetch per tree level."""
    from benchmarks.costmodel import Layout, count, predict, rows_for_negligible

    c = {"hop": 1e-3, "fetch": 2e-3, "bandwidth": 1e12, "task": 1e-4, "transfer": 1e-4,
         "task_cpu": 4e-3, "transfer_cpu": 1e-3}
    hybrid, flat = Layout(1, 16, True), Layout(1, 16, False)
    one, many = count((16, 16, 2), 8, hybrid), count((16, 16, 2), 8, flat, cut=False)
    assert one.path(c, c) == 0.0 and one.tasks == 0.0          # one task a window
    # 16 workers, fan-in 2: the leaves, 3 levels of sums (16 -> 2 partials), each step's
    # leaves read the partials: 4 hops and 4 fetches a step
    assert many.path(c, c) == pytest.approx(4 * (1e-3 + 2e-3))
    params = 16 * 16 + 16 + 16 * 2 + 2
    p1 = predict(c, one, hybrid, params, 8, 1e9, 0.0, cores=16)
    fb = 6 * 8 * params / 1e9                                   # tiny: in turn, one thread
    assert p1["compute"] == pytest.approx(16 * fb)
    assert p1["sched"] == pytest.approx(one.tasks * 1e-4)
    assert p1["cpu"] == pytest.approx((one.tasks * 4e-3 + 16 * fb) / 16)
    assert p1["seconds"] == max(p1["path"], p1["sched"], p1["cpu"])
    p2 = predict(c, many, flat, params, 8, 1e9, 0.0, cores=2)  # 16 processes on 2 cores
    assert p2["bound"] == "cpu" and p2["seconds"] > 10 * p1["seconds"]
    assert p1["overhead"] == 0.0 and rows_for_negligible(p1, params, 1e9, 8) == 8  # as is
    two = count((16, 16, 2), 8, Layout(2, 16, True), cut=False)     # two nodes: hops again
    p3 = predict(c, two, Layout(2, 16, True), params, 8, 1e9, 0.0)
    need = rows_for_negligible(p3, params, 1e9, 8)
    assert 6 * need * params / 1e9 == pytest.approx(9 * p3["overhead"])   # 10 %: 9x compute
    # cut as the engine runs it: no scheduler work a step, the path a step's compute (the
    # node's 16 shards side by side) and its messages' (a 50 us wire: the two nodes swap
    # their partial sums, one message a step on the path)
    cut = count((16, 16, 2), 8, Layout(2, 16, True))
    p4 = predict({**c, "p2p_alpha": 50e-6, "p2p_bandwidth": 1e12}, cut, Layout(2, 16, True),
                 params, 8, 1e9, 0.0)
    assert p4["sched"] == 0.0 and p4["bound"] == "path"
    assert p4["path"] == pytest.approx(fb + 50e-6, rel=1e-3), p4


def test_the_across_table_takes_the_drivers_pace_where_it_is_the_slower():
    from benchmarks.costacross import markdown_across
    row = {"model": "P3", "nodes": 256, "cores": 4096, "compute": 1e-3, "allreduce": 3.5e-3,
           "dtrain": 7e-3, "mpi": 3.4e-3, "schedule": "halving"}
    fast, slow = (markdown_across([dict(row, driver=d)]).splitlines()[-1].split(" | ")
                  for d in (1e-3, 14e-3))
    assert fast[4:9] == ["7.00", "halving", "1.000", "3.40", "3.50"] and fast[9] == "2.00 |"
    assert slow[6] == "14.000" and slow[9] == "4.00 |"     # the driver's 14 ms, against 3.5


def test_the_described_step_is_the_nodes_work_plus_the_chosen_sum():
    """costacross.described: one node is its compute alone; on more, the schedule the engine
    would pick (a halving for P3's buffer on a 10 GB/s network) and its simulated time on top,
    growing with log2 of the nodes, not with the nodes."""
    from benchmarks.costacross import described, strong_rows
    from benchmarks.costmodel import Wire
    wire = Wire(12e-6, 5e9, 2e-6).across(2e-6, 10e9)
    one, none = described((784, 128, 10), 16, 1, 16, wire, 50e9, 1e-4, 0.1e-9)
    at = {n: described((784, 128, 10), 16, n, 16, wire, 50e9, 1e-4, 0.1e-9) for n in (4, 64)}
    assert none == "none" and all(s.startswith("halving") for _, s in at.values())
    assert one < at[4][0] < at[64][0] < one + 3 * (at[4][0] - one)
    rows = strong_rows({"dtrain": Wire(12e-6, 5e9, 2e-6)}, {"P3": ((784, 128, 10), 16, 50e9,
                                                                  1e-4)}, 2e-6, 10e9, 0.1e-9,
                       (1, 2, 4))["P3"]
    assert [r["nodes"] for r in rows] == [1, 2, 4] and rows[0]["dtrain_speedup"] == 1.0
    assert rows[2]["rows_per_core"] == rows[0]["rows_per_core"] // 4
