"""CPU and GPU workers: placement, resources, calibration and the split, tested on CPUs.

No GPU is needed: workers that advertise a ``GPU`` resource but have no CUDA device run the
same code with NumPy, which is what lets these tests check the dispatch (resources, weighted
placement, calibration, host/device flags) on any machine.  The maths on real GPUs is covered
by the ``gpu``-marked tests, which skip where CuPy finds no device.
"""
from __future__ import annotations

import numpy as np
import pytest
from dask.task_spec import TaskRef
from distributed import Client

import dtrain
from dtrain.core import arrays
from dtrain.core.config import CONFIG_DIR, ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy.devices import require_gpu
from dtrain.deploy.local import local_gpu_cluster
from dtrain.observe.console import split_lines
from dtrain.observe.htmlreport import work_split_table
from dtrain.taskgraph.dataparallel import window_graph
from dtrain.taskgraph.placement import Worker, blocks, choices, place
from dtrain.training.plan import plan


def test_weighted_placement_gives_fast_workers_more_shards():
    ws = [Worker("gpu", True, 9.0), Worker("cpu", False, 1.0)]
    p = place(ws, 10)
    assert p.leaves == ("gpu",) * 9 + ("cpu",) and p.root == "gpu" and p.gpus == {"gpu"}
    assert place(["a", "b"], 5).leaves == ("a", "a", "a", "b", "b")


@pytest.mark.parametrize("weights, shards, expected", [
    ((5.0, 1.0), 4, [4, 0]),          # proportional (3, 1) would make the GPU wait: 1.0 > 0.8
    ((9.0, 1.0), 10, [9, 1]),         # fine enough to split by speed
    ((1.0, 1.0), 5, [3, 2]), ((1.0, 1.0, 1.0), 4, [1, 2, 1]),   # equal: as even as it gets
    ((2.0, 1.0), 6, [4, 2]),
])
def test_blocks_let_no_kind_wait_for_the_other(weights, shards, expected):
    counts = blocks(weights, shards)
    assert counts == expected and sum(counts) == shards
    slowest = max(n / w for n, w in zip(counts, weights) if n)
    # no other split into contiguous blocks finishes sooner
    import itertools
    for cut in itertools.product(range(shards + 1), repeat=len(weights) - 1):
        c = [*cut, shards - sum(cut)]
        if c[-1] >= 0:
            assert max(n / w for n, w in zip(c, weights) if n) >= slowest - 1e-12


def test_values_leave_the_gpu_only_to_cross_workers():
    p = plan(dtrain.load_config(None, ["data.shards=4", "graph.update=root",
                                      "graph.fuse_shards=false"]))
    placement = place([Worker("g", True), Worker("c", False)], 4)
    win = window_graph([p.schedule[0], p.schedule[1]], p.initial_state(),
                       [TaskRef(f"s{i}") for i in range(4)], None, placement, p.recipe, "r")
    def host(key: str) -> bool:                        # the flag each task's record was given
        return win.dsk[key].args[0].host
    assert [host(f"forward-backward-0-{i}-r") for i in range(4)] == [False, False, False, False]
    assert host("reduce-0-1-0-r") is False                # summed on g, consumed on g
    assert host("reduce-0-1-2-r") is True                 # made on c, consumed by g's update
    assert host("update-0-r") is True                     # the state goes to worker c too
    single = place([Worker("g", True)], 4)
    win = window_graph([p.schedule[0], p.schedule[1]], p.initial_state(),
                       [TaskRef(f"s{i}") for i in range(4)], None, single, p.recipe, "r")
    assert host("update-0-r") is False                    # one GPU: the state stays on it
    assert host("update-1-r") is True                     # but the driver takes the last one
    # replicated updates: the partial sums go to every worker, the states stay where they are
    p = plan(dtrain.load_config(None, ["data.shards=4", "graph.update=replicated",
                                      "graph.state_every=1", "graph.fuse_shards=false"]))
    win = window_graph([p.schedule[t] for t in range(3)], p.initial_state(),
                       [TaskRef(f"s{i}") for i in range(4)], None, placement, p.recipe, "r")
    assert [host(f"forward-backward-0-{i}-r") for i in range(4)] == [False] * 4
    assert host("reduce-0-1-0-r") is True and host("reduce-0-1-2-r") is True
    assert host("update-0-0-r") is False and host("update-0-2-r") is False
    assert host("reduce-2-1-0-r") is False                # after the last step, only g reads
    assert host("update-2-0-r") is True                   # the window's end, for the driver
    # a worker's shards in one task: g's sum stays on g for its update, c's crosses
    p = plan(dtrain.load_config(None, ["data.shards=4", "graph.update=root"]))
    win = window_graph([p.schedule[0]], p.initial_state(),
                       [TaskRef(f"s{i}") for i in range(4)], None, placement, p.recipe, "r")
    assert [host(f"forward-backward-0-{i}-r") for i in (0, 2)] == [False, True]


def test_no_gpu_is_one_clear_error():
    if arrays.cupy() is not None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(UserError, match="cluster.device = 'gpu' but there is no GPU here: Cu"):
        require_gpu("cluster.device = 'gpu'")
    # model.dtype = "auto" (the default): float32 where the run uses GPUs
    assert dtrain.load_config({"cluster": {"device": "gpu"}}).model.dtype == "float32"
    for shipped in ("iris", "digits"):                  # the shipped configs say "auto" too
        cfg = dtrain.load_config(CONFIG_DIR / f"{shipped}.toml", ["cluster.device=gpu"])
        assert cfg.model.dtype == "float32"
        assert dtrain.load_config(CONFIG_DIR / f"{shipped}.toml").model.dtype == "float64"
    assert dtrain.load_config({"cluster": {"device": "auto"}}).model.dtype == "float64"
    assert dtrain.load_config({"cluster": {"device": "gpu"},
                               "model": {"dtype": "float64"}}).model.dtype == "float64"


@pytest.mark.slow
def test_mixed_cluster_places_by_measured_speed_and_marks_gpu_tasks(tmp_path):
    """Workers that say they have a GPU (the GPU this machine has, else two that only say
    so) and one that does not: the run calibrates every worker, predicts each assignment's
    step, takes the fastest, says which and why, restricts the GPU workers' maths to the
    GPU resource, and reports the split.  Without a real GPU (all NumPy) it ends with the
    bytes of a CPU-only run, wherever the shards went."""
    real = arrays.gpu_count()
    gpus = real or 2
    cfg = ClusterConfig(workers=gpus + 1, device="auto", dashboard_address="")
    sets = ["train.epochs=2", "data.shards=6"]
    with local_gpu_cluster(cfg, gpus=gpus) as sc, Client(sc) as c:
        c.wait_for_workers(gpus + 1)
        env = c.run(lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(v for v in env.values() if v) == [str(i) for i in range(gpus)]
        restricted = []

        def echo(line: str) -> None:          # look at the scheduler while the run is going
            restricted.extend(c.run_on_scheduler(lambda dask_scheduler: [
                (k, dict(ts.resource_restrictions or {})) for k, ts in dask_scheduler.tasks.items()
                if k.startswith(("forward-backward-", "window-"))]))

        r = dtrain.train(dtrain.load_config(None, sets + ["cluster.device=auto"]), client=c,
                         out=tmp_path / "mixed", echo=echo)
    choice = r.summary["device_choice"]
    predicted = choice["predicted_step_ms"]
    assert choice["chose"] == min(predicted, key=predicted.get) and choice["why"]
    assert set(predicted) == {"all workers", "GPUs only", "CPUs only"}
    split = r.summary["work_split"]
    assert sum(v["leaves"] for v in split.values()) == 6
    assert {v["device"] for v in split.values() if v["leaves"]} == \
        {"all workers": {"gpu", "cpu"}, "GPUs only": {"gpu"}, "CPUs only": {"cpu"}}[
            choice["chose"]]
    (line,) = split_lines(r.summary)                   # the console and report.html say it
    assert line.startswith("work split: worker")
    page = (tmp_path / "mixed" / "report.html").read_text()
    assert work_split_table(r.summary) in page
    assert all(v["samples_per_second"] > 0 for v in split.values())
    gpu_held = any(v["device"] == "gpu" and v["leaves"] for v in split.values())
    assert restricted and (any(res == {"GPU": 1} for _, res in restricted) or not gpu_held)
    dtrain.train(dtrain.load_config(None, sets), out=tmp_path / "cpu", echo=None)
    if not real:
        assert (tmp_path / "mixed" / "params.npz").read_bytes() == \
            (tmp_path / "cpu" / "params.npz").read_bytes()


@pytest.mark.parametrize("sync, expected", [(0.01, "GPUs only"), (0.0, "all workers")])
def test_the_fastest_predicted_assignment_wins(sync, expected):
    """From given calibrations: a GPU 10x a CPU worker's speed.  With round trips between
    workers to pay, the GPU alone is fastest; were they free, the CPU's help would win."""
    gpu, cpu = Worker("g", True, 10_000.0, 1, 0.0005), Worker("c", False, 1_000.0, 4)
    ranked = choices([gpu, cpu], 16, 64, sync)
    assert ranked[0].name == expected
    by = {c.name: c for c in ranked}
    assert by["GPUs only"].seconds == pytest.approx(0.0005 + 16 * 64 / 10_000)
    assert by["CPUs only"].seconds == pytest.approx(16 * 64 / 1_000)
    assert by["all workers"].counts == (15, 1) or by["all workers"].counts == (14, 2)
    assert by["all workers"].seconds == pytest.approx(
        max(gpu.seconds(by["all workers"].counts[0] * 64),
            cpu.seconds(by["all workers"].counts[1] * 64)) + sync)


def test_a_tiny_net_leaves_the_gpu_out():
    """A GPU's kernel launches cost a tiny net more than its maths: the CPU alone wins."""
    gpu, cpu = Worker("g", True, 1e6, 1, 0.002), Worker("c", False, 50_000.0, 8)
    assert choices([gpu, cpu], 4, 4, 0.003)[0].name == "CPUs only"


def test_more_gpu_workers_than_gpus_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    cfg = ClusterConfig(workers=2, device="gpu", dashboard_address="")
    with pytest.raises(UserError, match=r"^2 GPU worker\(s\) asked for, but this machine shows "
                                        r"1 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0\): one worker per"):
        local_gpu_cluster(cfg, gpus=2)


def test_a_gpu_resource_without_a_usable_gpu_is_one_clear_error(tmp_path):
    """device = 'gpu' trusts no resource label: a worker that says GPU but cannot load CuPy
    stops the run at once (exit 2 from the CLI), naming the worker and the reason."""
    if arrays.cupy() is not None:
        pytest.skip("this machine has a GPU")
    cfg = ClusterConfig(workers=1, device="gpu", dashboard_address="")
    with local_gpu_cluster(cfg, gpus=1) as sc, Client(sc) as c:
        c.wait_for_workers(1)
        with pytest.raises(UserError, match=r"worker 0 advertises a GPU resource and cannot "
                                            r"compute on a GPU: CuPy cannot be imported"):
            dtrain.train(dtrain.load_config(None, ["cluster.device=gpu", "train.epochs=1"]),
                         client=c, out=tmp_path / "r", echo=None)
    assert not (tmp_path / "r" / "summary.json").exists()


def test_device_gpu_needs_a_worker_with_a_gpu(client):
    with pytest.raises(UserError, match="none of the 2 workers advertises a GPU resource"):
        dtrain.train(dtrain.load_config(None, ["cluster.device=gpu", "train.epochs=1"]),
                     client=client, echo=None)


@pytest.mark.gpu
def test_gpu_and_cpu_agree_to_float32_rounding(tmp_path):
    """On a real GPU: the same run on CPU and GPU, compared parameter by parameter."""
    if arrays.cupy() is None:
        pytest.skip("no CUDA GPU: " + arrays.gpu_problem())
    sets = ["train.epochs=3", "model.dtype=float32", "data.shards=2", "cluster.workers=1"]
    gpu = dtrain.train(dtrain.load_config(None, sets + ["cluster.device=gpu"]), echo=None)
    cpu = dtrain.train(dtrain.load_config(None, sets), echo=None)
    for name, value in cpu.params.items():
        np.testing.assert_allclose(gpu.params[name], value, rtol=1e-3, atol=1e-5)
    assert gpu.summary["work_split"]["0"]["device"] == "gpu"
