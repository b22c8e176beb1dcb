"""The benchmark suite: its workloads are valid dtrain runs, its commands say bad arguments
in one line, and ``python -m benchmarks --quick`` runs every contender for real, with the
same maths (the tables' arithmetic: test_benchmark_tables.py)."""
from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys

import pytest

from benchmarks import report
from benchmarks.contenders import BY_NAME, CONTENDERS, LOCAL_SGD_SYNC_EVERY, Tools
from benchmarks.workloads import load_workloads
from conftest import REPO
from dtrain.core.errors import UserError
from dtrain.taskgraph import cores
from dtrain.training.plan import plan


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("quick", [False, True])
def test_every_workload_is_a_valid_dtrain_run(quick, shared_data):
    """Each workload, at 1 and 4 workers, is a config dtrain accepts and plans against the
    real data (features and classes match the files, the sizes are the issue's)."""
    workloads = load_workloads(quick)
    assert list(workloads) == ["P1", "P2", "P3", "P4", "fullbatch", "weak", "in784",
                               "in3248", "in12544", "lenet", "iris"]
    sizes = {}
    for wl in workloads.values():
        for n in (1, 4):
            cfg = wl.config_for(n, "allreduce", n, shared_data)
            p = plan(cfg)
            assert cfg.data.shards == n and cfg.model.dtype == "float32"
            assert cfg.model.activation == ("relu" if wl.name == "lenet" else "sigmoid")
            assert cfg.optim.name == "sgd"
            sizes[wl.name, n] = (p.train_samples, min(cfg.train.batch_size, p.train_samples),
                                 tuple(cfg.model.layers))
    big = workloads["in12544"]
    assert "at most 2 workers" in big.cannot_run(4, shared_data)
    assert big.cannot_run(2, shared_data) is None
    assert "pass --data-dir" in workloads["P1"].cannot_run(1, shared_data / "nowhere")
    assert workloads["iris"].cannot_run(4, shared_data / "nowhere") is None     # bundled data
    if not quick:
        assert sizes["P1", 1] == (20000, 8192, (784, 1024, 10))
        assert sizes["P2", 1] == (10000, 1024, (784, 1024, 10))
        assert sizes["P3", 1] == (10000, 256, (784, 128, 10))
        assert sizes["P4", 1] == (20000, 8192, (784, 2048, 2048, 10))
        assert sizes["fullbatch", 4] == (60000, 60000, (784, 1024, 10))
        assert [sizes["weak", n][0] for n in (1, 4)] == [5000, 20000]      # 5k per worker
        assert [sizes[f"in{d}", 1][2] for d in (784, 3248, 12544)] == [(784, 10), (3248, 10),
                                                                       (12544, 10)]
        assert sizes["iris", 1][1:] == (4, (4, 30, 20, 3))
        assert sizes["lenet", 4][:2] == (10000, 64)           # issue 52: LeNet-5, batch 64
        assert plan(workloads["lenet"].config_for(1, "allreduce", 1, shared_data)).net.shapes \
            == [(6, 1, 5, 5), (16, 6, 5, 5), (120, 400), (84, 120), (10, 84)]


def test_every_dtrain_strategy_has_a_contender_with_its_own_config(shared_data):
    """local-sgd averages every 4 steps, model-parallel splits into one slice per worker
    (skipped, with a note, where there is no hidden layer to split), and dtrain-threads is one
    worker process whose N threads hold the N shards; dtrain plans each of them."""
    workloads = load_workloads(quick=True)
    tools = Tools(None, False, False, False, True)
    local, split, threads = (BY_NAME[n] for n in ("dtrain-local-sgd", "dtrain-model-parallel",
                                                   "dtrain-threads"))
    for n in (1, 2, 4):
        cfg = local.config_for(workloads["P3"], n, shared_data)
        assert (cfg.graph.strategy, cfg.graph.sync_every, cfg.cluster.workers, cfg.data.shards) \
            == ("local-sgd", LOCAL_SGD_SYNC_EVERY, n, n)
        cfg = split.config_for(workloads["iris"], n, shared_data)
        assert (cfg.graph.strategy, cfg.graph.slices, cfg.cluster.workers) == ("model-parallel", n, n)
        assert split.unavailable(tools, cfg) is None
        plan(cfg)
        cfg = threads.config_for(workloads["P3"], n, shared_data)
        assert (cfg.graph.strategy, cfg.cluster.workers, cfg.cluster.threads_per_worker,
                cfg.data.shards) == ("allreduce", 1, n, n)
        assert plan(cfg).builder.place(["only"]).leaves == ("only",) * n     # shards share it
        assert (threads.processes(n), threads.busy(n)) == (2, n + 1)
        assert (BY_NAME["dtrain-allreduce"].processes(n), BY_NAME["dtrain-allreduce"].busy(n)) \
            == (n + 1, n + 1)
    for name in ("in784", "in3248", "in12544"):     # the config itself is refused
        with pytest.raises(UserError, match="splits hidden layers, but .* has none"):
            split.config_for(workloads[name], 2, shared_data)
    assert [c.synchronous for c in (local, split, threads)] == [False, True, True]
    # the layout study: python -m dtrain's own shape here, fusion forced off and on, the chain
    default, tasks, fused = (BY_NAME[n] for n in ("dtrain-default", "dtrain-threads-tasks",
                                                   "dtrain-threads-fused"))
    cfg = default.config_for(workloads["iris"], 4, shared_data)
    assert (cfg.cluster.workers, cfg.cluster.threads_per_worker, cfg.cluster.layout) == \
        (0, 0, "hybrid")
    cores = report.cores()
    assert default.processes(4) == 2 and default.busy(4) == min(cores, 4) + 1
    graphs = [c.config_for(workloads["iris"], 4, shared_data).graph for c in (threads, tasks, fused)]
    assert [g.fuse_shards for g in graphs] == ["auto", "false", "true"]
    assert [g.fuse_steps for g in graphs] == [True, False, False]   # else one task a window each
    assert (tasks.processes(4), tasks.busy(4)) == (2, 5)
    # under mpiexec every worker rank is a worker (the flat layout), as the table says
    assert BY_NAME["dtrain-mpi-allreduce"].config_for(workloads["P3"], 2, shared_data) \
        .cluster.layout == "flat"
    chain, chain_threads = BY_NAME["dask-chain"], BY_NAME["dask-chain-threads"]
    assert not chain.trains and chain.processes(4) == 5 and chain_threads.processes(4) == 2
    assert chain.formula_bytes(9, 4, 4, 11) == 2 * 3 * 44 and \
        chain_threads.formula_bytes(9, 4, 4, 11) == 0
    # pencil-and-paper bytes per step for the others: P = 9 parameters of 4 bytes
    # P = 9 parameters of 4 bytes; dtrain's buffer has P + 2 = 11 numbers
    assert BY_NAME["mpi-allreduce"].formula_bytes(9, 4, 1, 11) == 0
    assert BY_NAME["mpi-allreduce"].formula_bytes(9, 4, 4, 11) == 2 * 3 * 44  # 2 (W - 1) buffers
    assert BY_NAME["mpi-allreduce"].formula_bytes(9, 4, 2, 11) == 2 * 44
    assert BY_NAME["mpi-ps"].formula_bytes(9, 4, 2, 11) == 2 * (44 + 36)  # gather + broadcast
    assert BY_NAME["torch-ddp"].formula_bytes(9, 4, 2, 11) == 2 * 36
    assert BY_NAME["dtrain-allreduce"].formula_bytes(9, 4, 2, 11) is None  # dtrain measures
    floor = BY_NAME["dask-floor"]              # each worker fetches every other's buffer
    assert [floor.formula_bytes(9, 4, n, 11) for n in (1, 2, 4)] == [0, 2 * 44, 12 * 44]
    assert not floor.trains and not floor.synchronous and floor.processes(2) == 3
    cfg = floor.config_for(workloads["P3"], 2, shared_data)     # dtrain-allreduce's cluster
    assert cfg == BY_NAME["dtrain-allreduce"].config_for(workloads["P3"], 2, shared_data)


def test_a_ddp_rank_that_dies_in_teardown_after_its_last_file_fails_nothing(tmp_path):
    """torch-ddp's launcher: a rank that exited non-zero before its last file failed the run;
    one that died after writing it (gloo's teardown, now and then) did not."""
    from types import SimpleNamespace

    from benchmarks.torch_ddp import finished

    files = [tmp_path / f"rss-{r}.json" for r in range(4)]
    for r in (0, 2, 3):
        files[r].write_text("1.0")
    ranks = [SimpleNamespace(exitcode=c) for c in (0, 1, -6, 0)]
    assert finished(ranks, files) == ([1], [2])
    assert finished([SimpleNamespace(exitcode=0)] * 4, files) == ([], [])


@pytest.mark.slow
def test_a_stopped_benchmark_writes_the_runs_it_finished_marked_partial(tmp_path, shared_data):
    """SIGTERM (``timeout``, a lent machine's budget) after the first run: the tables of the
    runs done are written, headed PARTIAL, and the exit is 130, not 0."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "--quick", "--workloads", "P3",
                             "--workers", "1,2", "--contenders", "serial", "--repeat", "3",
                             "--data-dir", str(shared_data), "--out", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert first.startswith("[1/6] P3 1w serial: ok"), first + err
    assert proc.returncode == 130, err
    assert "stopped after 1 of 6 runs" in err or "stopped after 2 of 6 runs" in err, err
    assert "Traceback" not in err
    text = (tmp_path / "results.md").read_text()
    assert text.startswith("PARTIAL (stopped after ") and "| 1 | serial |" in text


@pytest.mark.slow
def test_bad_arguments_are_one_line_and_exit_2():
    for args, words in ((["--workloads", "P9"], "unknown workload P9"),
                        (["--workers", "0,2"], "--workers"),
                        (["--contenders", "mpi"], "unknown contender mpi"),
                        (["--repeat", "two"], "--repeat: invalid int value")):
        proc = _bench(*args, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("benchmarks: error: ") and words in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def _expected_skips() -> dict[str, str]:
    """Contenders that may skip here, and the words their note must hold."""
    tools = Tools.discover()
    skips = {}
    if importlib.util.find_spec("torch") is None:
        skips["torch-ddp"] = "torch is not installed"
    if not tools.mpiexec or not tools.mpi4py:
        skips |= dict.fromkeys(["mpi-allreduce", "mpi-ps", "dtrain-mpi-allreduce",
                                "dtrain-mpi-ps"], "needs mpiexec and mpi4py")
    elif not tools.scheduler_rank:
        skips |= dict.fromkeys(["dtrain-mpi-allreduce", "dtrain-mpi-ps"], "--scheduler-rank")
    if not tools.gpu:
        skips |= {c.name: "no NVIDIA GPU here" for c in CONTENDERS if c.on_gpu}
    return skips


# Contenders whose one-worker run checks nothing more than another's (how workers talk to
# each other: -tcp, -segments, the chain on threads; a worker's shard tasks fused or not;
# one rank's parameter server or DDP): at 2 workers only (``--contenders name@2``), 8 fewer
# runs, a minute of CI less.
AT_TWO_ONLY = {"dtrain-allreduce-tcp", "dtrain-allreduce-segments", "dtrain-mpi-allreduce-tcp",
               "dask-chain-threads", "dtrain-threads-tasks", "dtrain-threads-fused",
               "dtrain-mpi-ps", "torch-ddp"}


@pytest.mark.slow
def test_quick_benchmark_runs_every_contender_with_the_same_maths(tmp_path, mnist_dir):
    """``--quick`` for real: every contender that can run here runs at 2 workers, and all but
    :data:`AT_TWO_ONLY` at 1 too (``--contenders name@2``), on the
    same data; each one that computes the synchronous step (all but local SGD) ends with the
    serial reference's parameters to float32 rounding; dtrain's rows report the bytes Dask
    moved per step, as its graphs predict; the table, results.json/.md and the HTML plots
    say so."""
    out = tmp_path / "results"
    only = ",".join(c.name + ("@2" if c.name in AT_TWO_ONLY else "") for c in CONTENDERS)
    proc = _bench("--quick", "--out", str(out), "--data-dir", str(mnist_dir.parent),
                  "--contenders", only)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert {(r["workers"], r["contender"]) for r in rows} == \
        {(n, c.name) for n in (1, 2) for c in CONTENDERS
         if n == 2 or c.name not in AT_TWO_ONLY}
    assert {r["workload"] for r in rows} == {"P3"}

    skips = _expected_skips()
    for r in rows:
        name = r["contender"]
        if name in skips:
            assert r["status"] in ("ok", "skipped") and skips[name] in r["note"]
            continue
        assert r["status"] == "ok", (name, r["note"])
        assert r["epoch_s"] > 0 and r["worker_mb"] > 0 and r["steps"] == 10
        if BY_NAME[name].on_gpu:                # a GPU's sums: its rounding, not the CPU's
            continue
        assert r["synchronous"] == BY_NAME[name].synchronous
        if not BY_NAME[name].trains:            # the floor: the step graph, no maths
            assert r["params_delta"] is None and r["final_train_loss"] is None
        elif r["synchronous"]:                  # local SGD is another algorithm: not checked
            assert r["params_delta"] < 1e-5, (name, r["workers"], r["params_delta"])
            serial = next(s for s in rows
                          if s["contender"] == "serial" and s["workers"] == r["workers"])
            assert r["final_train_loss"] == pytest.approx(serial["final_train_loss"], rel=1e-4)
        else:
            assert r["params_delta"] is not None and r["final_train_loss"] > 0
        if name.startswith("dtrain-"):
            # Dask's transfer records: at least what the graph counts (a busy machine may move
            # more, e.g. a value fetched twice), and nothing where one process holds it all
            assert r["bytes_source"] == "measured", (name, r["bytes_source"])
            predicted, measured = r["bytes_predicted_per_step"], r["bytes_per_step"]
            assert measured >= predicted, (name, r["workers"], predicted, measured)
            assert (measured > 0) == (predicted > 0), (name, r["workers"], measured)
        elif name != "serial":                  # pencil and paper; a lone allreduce rank: 0
            moves = (r["workers"] > 1 and not BY_NAME[name].threads) or name == "mpi-ps"
            assert r["bytes_source"] == "formula" and (r["bytes_per_step"] > 0) == moves
        assert r["busy"] >= r["processes"]
        assert r["oversubscribed"] == (r["busy"] > report.cores())
        if r["driver_mb"] is not None and BY_NAME[name].trains:   # it reads file headers,
            # never the data (~130 MiB; the floor's workers hold none either)
            assert r["driver_mb"] < r["worker_mb"] - 100, (name, r["driver_mb"], r["worker_mb"])
    ran = [r for r in rows if r["status"] == "ok"]
    assert {r["contender"] for r in ran} >= {"serial", "dtrain-allreduce", "dtrain-ps",
                                             "dtrain-threads", "dtrain-local-sgd",
                                             "dtrain-model-parallel", "dask-floor"}
    assert all(r["params_delta"] == 0.0 for r in ran if r["contender"] == "serial")
    at = {(r["workers"], r["contender"]): r for r in ran}
    assert at[2, "dtrain-allreduce"]["bytes_per_step"] > 0             # two worker processes
    assert at[2, "dtrain-threads"]["bytes_per_step"] == 0              # one, two threads
    assert (at[2, "dtrain-threads"]["processes"], at[2, "dtrain-threads"]["busy"]) == (2, 3)

    table = proc.stdout
    for r in ran:
        assert f"| {r['workers']} | {r['contender']} | {r['processes']}" in table
    assert "### Strong scaling (same data)" in table
    assert "| bytes/step |" in table and " (n/c) |" in table
    assert "| workload | measure | goal | dtrain-default | dtrain-allreduce | dtrain-threads | " \
           "dtrain-mpi-allreduce | dask-floor |" in table
    # the layout study: python -m dtrain's own shape is one process here; the chain's tasks
    assert "### Layouts side by side (issue 22)" in table and "### Layout goal" in table
    assert at[2, "dtrain-default"]["processes"] == 2 and at[2, "dtrain-default"]["tasks_per_step"]
    assert at[2, "dask-chain"]["tasks_per_step"] == 4 and at[2, "dtrain-threads-tasks"][
        "tasks_per_step"] > at[2, "dtrain-threads-fused"]["tasks_per_step"]
    assert (out / "results.md").read_text().strip() in table
    page = (out / "results.html").read_text()
    assert "Bokeh" in page and "P3 (strong scaling): speedup" in page
    assert "P3 (strong scaling): efficiency" in page and "dtrain-allreduce" in page
    assert "dtrain-model-parallel" in page and "dtrain-threads" in page
    curves = {s["contender"] for s in results["scaling"]}
    assert curves == {r["contender"] for r in ran} - {"serial"} - AT_TWO_ONLY
    assert not list(out.glob("runs/**/params.npz"))             # compared, then deleted


def _module(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name, args, says", [
    ("innode", ["0"], "'0' is not a shard count"),
    ("innode", ["2", "--shapes", "P9"], "unknown shape P9"),
    ("estimators", ["--epochs", "-1"], "'-1' is not a whole number"),
    ("estimators", ["--bogus"], "unrecognized arguments: --bogus"),
    ("oneworker", ["--epochs", "1"], "--epochs must be at least 2"),
    ("oneworker", ["--only", "P9"], "invalid choice: 'P9'"),
    ("oneworker", ["--only", "P3-1", "--data-dir", "/nowhere"], "no MNIST under /nowhere/mnist"),
    ("lenet_step", ["--batch", "0"], "'0' is not a whole number >= 1"),
])
def test_the_side_benchmarks_say_bad_arguments_in_one_line(name, args, says):
    proc = _module(name, *args, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"python -m benchmarks.{name}: error: ") and says in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_one_worker_table_puts_each_run_beside_its_serial_run():
    """`python -m benchmarks.oneworker --only iris`: a dtrain run and a serial run, their
    medians a step and the ratio judged against the goal (2 for iris)."""
    proc = _module("oneworker", "--only", "iris", "--repeat", "1", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| iris |")]
    _, serial, ours, ratio, goal = [c.strip() for c in row.strip("|").split("|")]
    # the cells are rounded (ms to 0.001: 0.3 % of iris's 0.15 ms; the ratio to 0.01)
    assert float(ratio) == pytest.approx(float(ours) / float(serial), rel=0.01, abs=0.005)
    assert goal == f"<= 2 {'yes' if float(ratio) <= 2 else 'NO'}"
    assert "784-2048-2048-10" not in proc.stdout          # --only: the big net is skipped


@pytest.mark.slow
def test_the_estimator_benchmark_runs():
    proc = _module("estimators", "--epochs", "2", "--repeat", "1", "--rows", "3000",
                   timeout=600)
    assert proc.returncode == 0, proc.stderr
    minibatch, lbfgs = proc.stdout.split('### solver="lbfgs"')
    ratios = [line for line in minibatch.splitlines() if line.startswith("| digits |")
              or line.startswith("| synthetic")]
    assert len(ratios) == 2, proc.stdout
    rows = [line for line in lbfgs.splitlines() if line.startswith(("| iris", "| digits",
                                                                     "| regression"))]
    assert len(rows) == 9 and sum(" yes" in r or " NO" in r for r in rows) == 6, lbfgs
    dask_part = minibatch.split("Where the partitions sit")[1]
    assert ("| dtrain" in dask_part and "| dask-ml Incremental |" in dask_part) or \
        "dask-ml is not installed" in dask_part
    if "| dtrain" in dask_part:     # synchronous on 2 workers, the bytes of 1 worker's fit
        assert dask_part.count("| allreduce | yes |") == 2, dask_part


def test_the_in_node_table_times_every_way_of_using_the_cores():
    """`python -m benchmarks.innode 2 --shapes P3`: one row, 128 rows per shard, a
    positive time in each column (threads, core processes where they run, processes,
    the whole batch)."""
    proc = _module("innode", "2", "--shapes", "P3", timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    header = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[:2] for r in rows] == [["P3", "128"]]
    cells = dict(zip(header, rows[0]))
    assert {"threads", "whole batch, 1 thread", "processes (median / slowest)"} <= set(cells)
    assert "dtrain core processes" in cells or sys.platform != "linux"
    times = [float(v) for k, v in cells.items() if k not in ("shape", "rows per shard")
             for v in v.split(" / ")]
    assert all(t > 0 for t in times), cells
    if cores.supported():           # the core processes' wait beside what it replaced
        trip = re.search(r"and back: ([\d.]+) us with cores.wait; ([\d.]+) us with "
                         r"Connection.poll and time.sleep\(0\)", proc.stdout)
        assert trip and 0 < float(trip[1]) and 0 < float(trip[2]), proc.stdout
