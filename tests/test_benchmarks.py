"""The benchmark suite: its workloads are valid dtrain runs, its arithmetic is right, and
``python -m benchmarks --quick`` runs every contender for real, with the same maths."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from benchmarks import report
from benchmarks.contenders import BY_NAME, CONTENDERS, LOCAL_SGD_SYNC_EVERY, Tools
from benchmarks.run import Run, params_delta
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


def _run(workload, workers, contender, seconds, status="ok", delta=None, steps=10,
         processes=None, **extra):
    r = Run(workload, workers, contender, 0, processes or workers + 1, status, epoch_seconds=seconds,
            steps_per_epoch=steps, train_samples=1000, worker_mb=[100.0, 120.0][:workers],
            train_mb=3.0, network="4-3", batch_size=10,
            driver_mb=50.0, params_delta=delta, train_loss=[0.5] * len(seconds), **extra)
    return vars(r) | {"timed": r.timed}


def test_rows_medians_ratios_scaling_and_targets():
    """The table's arithmetic on known numbers: the warm-up epoch is dropped, ratios are to
    the same cell's serial and mpi4py runs, speedup and efficiency follow their definitions."""
    wl = SimpleNamespace(name="w", scaling="strong", targets={"mpi_ratio": 1.5, "step_ms": 10.0})
    weak = SimpleNamespace(name="v", scaling="weak", targets={})
    runs = [_run("w", 1, "serial", [9.0, 4.0, 4.0, 5.0]),
            _run("w", 1, "mpi-allreduce", [9.0, 4.0]),
            _run("w", 1, "dtrain-allreduce", [9.0, 5.0, 6.0, 7.0]),
            _run("w", 2, "serial", [9.0, 4.0]),
            _run("w", 2, "mpi-allreduce", [9.0, 2.0]),
            _run("w", 2, "dtrain-allreduce", [9.0, 2.5, 2.5], delta=3e-7),
            _run("w", 2, "torch-ddp", [1.0], status="skipped"),
            _run("w", 1, "dtrain-threads", [9.0, 4.0], processes=2, busy=2, comm_bytes=0.0,
                 comm_source="measured"),
            _run("w", 2, "dtrain-threads", [9.0, 3.0], processes=2, busy=3, comm_bytes=0.0,
                 comm_source="measured"),
            _run("w", 2, "dtrain-local-sgd", [9.0, 2.0], delta=2e-2, synchronous=False,
                 comm_bytes=3 * 2**20, comm_source="measured", comm_bytes_predicted=3 * 2**20),
            _run("w", 2, "dask-floor", [9.0, 2.0], synchronous=False),
            _run("v", 1, "mpi-ps", [1.0, 2.0]), _run("v", 2, "mpi-ps", [1.0, 2.5])]
    runs[4] |= {"comm_bytes": 1536.0, "comm_source": "formula"}      # mpi-allreduce at 2
    runs[5] |= {"comm_bytes": 2048.0, "comm_source": "measured", "comm_bytes_predicted": 2000.0}
    rows = report.aggregate(runs, n_cores=2)
    at = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    d1, d2 = at["w", 1, "dtrain-allreduce"], at["w", 2, "dtrain-allreduce"]
    assert d1["epoch_s"] == 6.0 and d1["vs_serial"] == 1.5 and d1["vs_mpi"] == 1.5
    assert d1["ms_per_step"] == 600.0 and d1["extra_ms_per_step_vs_mpi"] == pytest.approx(200.0)
    assert d2["vs_mpi"] == 1.25 and d2["params_delta"] == 3e-7 and d2["oversubscribed"]
    assert not at["w", 1, "serial"]["oversubscribed"] and at["w", 1, "serial"]["epoch_s"] == 4.0
    assert at["w", 2, "torch-ddp"]["status"] == "skipped" and at["w", 2, "torch-ddp"]["epoch_s"] is None
    assert d2["samples_per_s"] == 400.0 and d2["worker_mb"] == 120.0 and d2["driver_mb"] == 50.0
    assert (d2["bytes_per_step"], d2["bytes_source"], d2["bytes_predicted_per_step"]) == \
        (2048.0, "measured", 2000.0)
    assert at["w", 2, "mpi-allreduce"]["bytes_source"] == "formula"
    assert at["w", 1, "serial"]["bytes_per_step"] is None
    t1, t2 = at["w", 1, "dtrain-threads"], at["w", 2, "dtrain-threads"]
    assert (t2["processes"], t2["busy"], t2["oversubscribed"]) == (2, 3, True)    # threads count
    assert (t1["busy"], t1["oversubscribed"], t2["bytes_per_step"]) == (2, False, 0.0)
    assert not at["w", 2, "dtrain-local-sgd"]["synchronous"] and d2["synchronous"]

    curves = {(s["workload"], s["contender"]): s["points"] for s in report.scaling(rows, [wl, weak])}
    assert ("w", "serial") not in curves                        # the reference does not scale
    assert [(p["speedup"], p["efficiency"]) for p in curves["w", "dtrain-allreduce"]] == \
        [(1.0, 1.0), (2.4, 1.2)]
    assert [(p["efficiency"], p["speedup"]) for p in curves["v", "mpi-ps"]] == [(1.0, 1.0), (0.8, 1.6)]

    found = report.targets(rows, [wl])
    checks = {(t["what"], t["contender"]): t for t in found}
    assert {c for _, c in checks} == {"dtrain-allreduce", "dtrain-threads", "dask-floor"}
    assert checks["mpi_ratio", "dtrain-allreduce"]["value"] == 1.25
    assert checks["mpi_ratio", "dtrain-allreduce"]["met"] is True
    assert checks["step_ms", "dtrain-allreduce"]["value"] == 250.0
    assert checks["step_ms", "dtrain-allreduce"]["met"] is False
    assert checks["mpi_ratio", "dtrain-threads"]["value"] == 1.5

    # the tables: bytes/step, (n/c) for local SGD, the targets side by side
    results = {"meta": {"cores": 2, "repeat": 1, "workers": [1, 2]}, "rows": rows,
               "workloads": {"w": {"title": "t", "epochs": 4, "scaling": "strong", "study": ""}},
               "targets": found, "scaling": []}
    (_, header, body, foot), (title, theader, tbody, _), *rest = report.tables(results)
    assert [t[0].split(" (")[0].split(":")[0] for t in rest] == \
        ["Layouts side by side", "Layout goal", "Across workers"]
    cell = {(b[0], b[1]): dict(zip(header, b)) for b in body}
    assert cell["2", "dtrain-allreduce"]["bytes/step"] == "2 KiB"
    assert cell["2", "mpi-allreduce"]["bytes/step"] == "~1.5 KiB"
    assert cell["2", "dtrain-local-sgd"]["bytes/step"] == "3 MiB"
    assert cell["2", "dtrain-threads"]["bytes/step"] == "0 B"
    assert cell["1", "serial"]["bytes/step"] == "-"
    assert cell["2", "dtrain-local-sgd"]["params vs serial"] == "2.0e-02 (n/c)"
    assert cell["2", "dtrain-allreduce"]["params vs serial"] == "3.0e-07"
    assert (cell["2", "dtrain-threads"]["procs"], cell["1", "dtrain-threads"]["procs"]) == ("2*", "2")
    assert "(n/c): not comparable" in foot and "bytes/step" in foot
    assert title.startswith("Targets") and theader == \
        ["workload", "measure", "goal", "dtrain-default", "dtrain-allreduce", "dtrain-threads",
         "dtrain-mpi-allreduce", "dask-floor"]
    assert tbody == [["w", "dtrain / mpi4py Allreduce", "<= 1.5", "-", "1.25 yes", "1.50 yes",
                      "-", "1.00 yes"],
                     ["w", "ms per step", "<= 10", "-", "250.00 NO", "300.00 NO", "-",
                      "200.00 NO"]]
    assert cell["2", "dask-floor"]["params vs serial"] == "-"


def test_layout_tables_put_hybrid_beside_flat_mpi_and_the_chain():
    """The side-by-side table per shard count (ratios to mpi4py and to the chain of the same
    width), and the 16-shard goal: the default layout >= 5 times faster than flat."""
    from benchmarks import layouts

    runs = [_run("iris", 16, "dtrain-allreduce", [1.0, 1.0], processes=17,
                 overhead_ms=90.0, tasks_per_step=33.0, transfers_per_step=31.0),
            _run("iris", 16, "dtrain-default", [1.0, 0.15], processes=2, busy=3,
                 overhead_ms=14.0, tasks_per_step=1.0, transfers_per_step=0.0),
            _run("iris", 16, "dtrain-threads", [1.0, 0.25], processes=2, busy=17),
            _run("iris", 16, "mpi-allreduce", [1.0, 0.05], processes=16),
            _run("iris", 16, "dask-chain", [1.0, 0.5], processes=17, tasks_per_step=32.0),
            _run("iris", 2, "dtrain-allreduce", [1.0, 0.2]),
            _run("iris", 2, "dtrain-default", [1.0, 0.1])]
    rows = report.aggregate(runs, n_cores=2)
    results = {"meta": {"cores": 2, "repeat": 1, "workers": [2, 16]}, "rows": rows,
               "workloads": {"iris": {"title": "t", "epochs": 2, "scaling": "strong",
                                      "study": ""}}, "targets": [], "scaling": []}
    (t1, h1, b1, _), (t2, h2, b2, _) = layouts.tables(results)
    cell = {(b[1], b[2]): dict(zip(h1, b)) for b in b1}
    assert cell["16", "dtrain-allreduce"]["ms/step"] == "100.00"     # 1 s / 10 steps
    assert cell["16", "dtrain-allreduce"]["overhead ms/step"] == "90.00"
    assert cell["16", "dtrain-allreduce"]["tasks/step"] == "33.00"
    assert cell["16", "dtrain-default"]["x MPI"] == "3.00"
    assert cell["16", "dtrain-allreduce"]["x chain"] == "2.00"
    assert cell["16", "dtrain-allreduce"]["procs"] == "17*"
    assert [b[2] for b in b1 if b[1] == "16"] == ["dtrain-default", "dtrain-threads",
                                                   "dtrain-allreduce", "mpi-allreduce",
                                                   "dask-chain"]
    goal = {b[1]: dict(zip(h2, b)) for b in b2}
    assert goal["16"]["flat / default"] == "6.67" and goal["16"]["goal"] == ">= 5: yes"
    assert goal["16"]["flat / hybrid"] == "4.00" and goal["2"]["goal"] == "-"
    checks = layouts.goal_checks(rows)
    assert [(c["shards"], c["met"]) for c in checks] == [(2, None), (16, True)]


def test_params_delta_is_relative_to_the_reference(tmp_path):
    import numpy as np
    ref = {"W1": np.array([[2.0, -4.0]], dtype=np.float32), "b1": np.zeros(1, dtype=np.float32)}
    np.savez(tmp_path / "ref.npz", **ref)
    np.savez(tmp_path / "same.npz", **ref)
    np.savez(tmp_path / "off.npz", W1=ref["W1"] + np.float32(0.004), b1=ref["b1"])
    np.savez(tmp_path / "other.npz", W1=ref["W1"])
    assert params_delta(tmp_path / "same.npz", tmp_path / "ref.npz") == 0.0
    assert params_delta(tmp_path / "off.npz", tmp_path / "ref.npz") == pytest.approx(1e-3, rel=1e-3)
    assert params_delta(tmp_path / "other.npz", tmp_path / "ref.npz") == float("inf")


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


def test_the_estimator_table_judges_each_goal():
    from benchmarks.estimators import table
    rows = [{"set": "digits", "rows": 1437, "epochs": 200, "sklearn_s": 0.7, "dtrain_s": 1.28,
             "ratio": 1.83, "sklearn_acc": 0.97, "dtrain_acc": 0.98},
            {"set": "synthetic", "rows": 160_000, "epochs": 20, "sklearn_s": 6.9,
             "dtrain_s": 9.0, "ratio": 1.30, "sklearn_acc": 0.96, "dtrain_acc": 0.96}]
    dask = [{"who": "dtrain MLPClassifier", "seconds": 3.9, "passes": 20, "accuracy": 0.990,
             "strategy": "allreduce", "same_bytes": True},
            {"who": "dask-ml Incremental", "seconds": 12.5, "passes": 20, "accuracy": 0.999}]
    text = table(rows, dask)
    assert "| 1.83 NO |" in text and "| 1.30 yes |" in text
    assert "| allreduce | yes | 0.31 x" in text
    assert "| allreduce | NO |" in table(rows, [{**dask[0], "same_bytes": False}, dask[1]])
    # faster, but more than half a point less accurate: not met
    assert "0.31 x, NO" in text
    dask[0]["accuracy"] = 0.995
    assert "0.31 x, yes" in table(rows, dask)
    assert table(rows, "dask-ml is not installed").endswith("dask-ml is not installed")


def test_the_lbfgs_table_judges_time_and_loss():
    from benchmarks.estimators import lbfgs_table

    def row(who, seconds, ratio, loss, loss_ratio):
        return {"set": "digits", "who": who, "rows": 1797, "seconds": seconds, "ratio": ratio,
                "iterations": 53, "objective": loss, "loss_ratio": loss_ratio, "goal": 2.0}
    text = lbfgs_table([row("scikit-learn", 0.6, 1.0, 2e-5, 1.0),
                        row("dtrain", 1.3, 2.17, 2.01e-5, 1.005),
                        row("dtrain normalize=standardize", 0.3, 0.5, 3e-5, 1.5)])
    assert "| 2.17 (<= 2) NO | 2.01e-05 | 1.0050 yes |" in text
    assert "| 0.50 (<= 2) yes | 3e-05 | 1.5000 NO |" in text
    assert "| 0.600 | | 2e-05 | |" in text             # scikit-learn's own row: no verdict


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


def test_the_across_workers_table_and_goals_read_the_schedulers_count():
    """Issue 36's table: dtrain's ratios to MPI and DDP in one run, the scheduler's own
    count of tasks per step, per worker, and the head process's CPU per step; each goal
    checked where its cell ran."""
    from benchmarks import across
    rows = [{"workload": wl, "workers": n, "contender": c, "epoch_s": e,
             "sched_tasks_per_step": t, "head_cpu_ms": 0.125 if t else None}
            for wl, n, c, e, t in [("P3", 2, "mpi-allreduce", 0.04, None),
                                   ("P3", 2, "torch-ddp", 0.2, None),
                                   ("P3", 2, "dtrain-allreduce", 0.05, 0.1),
                                   ("P3", 4, "mpi-allreduce", 0.08, None),
                                   ("P3", 4, "dtrain-allreduce", 0.16, 0.8),
                                   ("iris", 2, "mpi-allreduce", 0.01, None),
                                   ("iris", 2, "dtrain-allreduce", 0.02, 0.05)]]
    m = across.measures(rows, "P3", 2, "dtrain-allreduce")
    assert m == {"x MPI": pytest.approx(1.25), "x DDP": pytest.approx(0.25),
                 "scheduler tasks / step / worker": pytest.approx(0.05),
                 "head CPU ms / step": pytest.approx(0.125)}
    checks = {(c["workload"], c["workers"], c["what"]): c for c in across.goal_checks(rows)}
    assert checks["P3", 2, "x MPI"]["met"] and not checks["P3", 4, "x MPI"]["met"]
    assert checks["iris", 2, "x MPI"]["met"] and checks["iris", 2, "x MPI"]["goal"] == 3.0
    assert not checks["P3", 4, "scheduler tasks / step / worker"]["met"]      # 0.8 / 4 > 0.1
    assert ("P3", 4, "x DDP") not in checks                    # DDP did not run at 4
    results = {"rows": rows, "workloads": {"P3": {}, "iris": {}}}
    (title, header, body, _), (goal_title, _, goal_body, _) = across.tables(results)
    assert title.startswith("Across workers") and goal_title.startswith("Across workers")
    assert body[0][:2] == ["P3", "2"] and "1.25 / 0.25 / 0.050 / 0.125" in body[0]
    assert sum(line[-1] == "NO" for line in goal_body) == 2
