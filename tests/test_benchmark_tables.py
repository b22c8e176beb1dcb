"""The benchmark suite's arithmetic and tables: medians, ratios to the anchors, scaling,
the goals each table judges, the parameters' distance from the reference (no run: the
rows are made up here)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import report
from benchmarks.run import Run, params_delta


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
