"""End-to-end training on real LocalClusters of worker processes."""
from __future__ import annotations

import json
import threading

import dask
import numpy as np
import psutil
import pytest
from distributed import Client, LocalCluster, get_task_stream

import dtrain
from helpers.transfers import assert_moved_as_predicted
from dtrain.deploy import tuning
from dtrain.deploy.workers import worker_addresses
from dtrain.taskgraph import collective
from dtrain.taskgraph.placement import place
from dtrain.training import heldout
from dtrain.training.course import window_steps, windows
from dtrain.training.engines import DaskEngine
from dtrain.training.plan import plan

QUICK = ["train.epochs=4", "optim.name=momentum", "data.shards=5", "graph.fan_in=2"]


def _train(client, sets, out=None):
    return dtrain.train(dtrain.load_config(None, sets), client=client, out=out, echo=None)


def _bytes_and_rows(client, name: str, sets: list[str], tmp_path) -> tuple[bytes, list]:
    """A QUICK run's params.npz and its (train loss, train accuracy) per epoch."""
    r = _train(client, QUICK + sets, tmp_path / name)
    return ((tmp_path / name / "params.npz").read_bytes(),
            [(m["train_loss"], m["train_accuracy"]) for m in r.metrics])


def _all_the_same(runs: dict[str, tuple[bytes, list]]) -> None:
    """Every run's params.npz the 2-worker run's bytes; the running train loss and accuracy
    are sums in the gradient buffer: equal too."""
    blob, rows = runs["2 workers"]
    assert {n: r[0] == blob for n, r in runs.items()} == dict.fromkeys(runs, True)
    assert all(r[1] == rows for r in runs.values()), runs


def test_bit_identical_whatever_the_window_and_fusion(client, tmp_path):
    """Same config and shards on the fixture's 2 workers: params.npz is byte-for-byte equal
    with a worker's shards in one task or in a task each, and whatever the window length or
    update fusion."""
    variants = {"2 workers": [], "window 3": ["graph.window=3"],
                "steps not fused": ["graph.fuse_steps=false"],
                "unfused": ["graph.fuse_update=false"],
                "one task per shard": ["graph.fuse_shards=false"]}
    _all_the_same({name: _bytes_and_rows(client, name, extra, tmp_path)
                   for name, extra in variants.items()})


@pytest.mark.slow
def test_bit_identical_whatever_the_worker_count(client, tmp_path):
    """... and on any mix of worker processes and threads (processes x threads: 1x1, 3x1,
    1x3, 2x2, beside the fixture's 2x1), a worker's shards in one task or a task each."""
    runs = {"2 workers": _bytes_and_rows(client, "2 workers", [], tmp_path)}
    for procs, threads in ((1, 1), (3, 1), (1, 3), (2, 2)):
        with LocalCluster(n_workers=procs, threads_per_worker=threads, processes=True,
                          dashboard_address=None) as lc, Client(lc) as c:
            for fuse in ("true", "false") if threads > 1 else ("auto",):
                name = f"{procs}x{threads} fuse {fuse}"
                runs[name] = _bytes_and_rows(c, name, [f"graph.fuse_shards={fuse}"], tmp_path)
                summary = json.loads((tmp_path / name / "summary.json").read_text())
                assert summary["workers"] == procs and summary["threads"] == procs * threads
    _all_the_same(runs)


@pytest.mark.slow
def test_a_run_with_segmented_sums_has_the_trees_bytes(tmp_path):
    """graph.reduce = segments on 3 worker processes (a net wide enough to cut): the tree's
    params.npz and epochs, its windows' sums reduced in segments, and the bytes it sends
    what its graphs say; described windows with replicated updates (their sum by the
    schedule the engine picks; auto's choice but where 3 workers share 2 cores) send what
    their programs say."""
    wide = ["model.layers=[4, 2048, 3]"]
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        runs = {"2 workers": _bytes_and_rows(c, "tree", [*wide, "graph.update=replicated"],
                                             tmp_path),                     # (the key
                "segments": _bytes_and_rows(c, "segments", [*wide, "graph.reduce=segments"],
                                            tmp_path)}                      # _all_the_same reads)
        said: list[str] = []                                # 133 numbers: too few to cut
        dtrain.train(dtrain.load_config(None, [*QUICK, "graph.reduce=segments"]), client=c,
                     out=tmp_path / "narrow", echo=said.append)
    assert any("graph.reduce = segments changed nothing" in line for line in said), said
    _all_the_same(runs)
    tree, cut = (json.loads((tmp_path / n / "summary.json").read_text())
                 for n in ("tree", "segments"))
    assert tree["segmented_windows"] == 0 and cut["segmented_windows"] == cut["spanned_windows"] > 0
    assert_moved_as_predicted(cut)
    assert tree["described_windows"] > 0 and tree["step_sum"] in collective.SCHEDULES
    assert_moved_as_predicted(tree)     # (the messages exactly: test_describe)


@pytest.mark.slow
def test_a_window_longer_than_the_peer_timeout_is_waited_for_not_run_again():
    """On workers of two threads the next window starts while the one before runs and waits
    for it on its mesh: a window that runs longer than the peer timeout (cluster.timeout = 1
    s, windows of 6,000 steps of some 2 s) is waited for, not taken for a lost peer, which
    would end both windows and run them again."""
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        r = dtrain.train(dtrain.load_config(None, [
            "cluster.timeout=1", "graph.window=6000", "train.epochs=500",
            "train.batch_size=4", "data.shards=2"]), client=c, out=None, echo=None)
    s = r.summary
    assert s["spanned_windows"] == 3 and s["window_reruns"] == [], s["window_reruns"]


def test_a_windows_ends_are_picked_while_the_next_window_runs():
    """On workers of one thread a window's task leaves the pool as it starts
    (``fuse.leave_pool``): the task that picks its end and meta out runs as soon as it
    ended, while the next window (launched ahead) runs, so the driver can launch the one
    after.  In the pool they ran only once the next window's task ended, and every second
    window edge waited for the driver."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        with get_task_stream(c) as ts:
            r = dtrain.train(dtrain.load_config(None, [
                "graph.window=300", "train.epochs=44", "train.batch_size=4",
                "data.shards=2"]), client=c, out=None, echo=None)   # 1,188 steps
    assert r.summary["spanned_windows"] == 4 and r.summary["window_reruns"] == []
    ended: dict[int, list[float]] = {}
    kept: dict[int, float] = {}                 # kept-<stop>: the end, with the meta
    for task in ts.data:
        stop = max(s["stop"] for s in task["startstops"] if s["action"] == "compute")
        if task["key"].startswith("window-"):
            ended.setdefault(int(task["key"].split("-")[1]), []).append(stop)
        elif task["key"].startswith("kept-"):
            kept[int(task["key"].split("-")[1])] = stop
    assert sorted(ended) == [0, 300, 600, 900] and sorted(kept) == [300, 600, 900, 1188]
    picked = dict(zip(sorted(ended), (kept[k] for k in sorted(kept))))
    for first in (0, 300, 600):
        assert picked[first] < min(ended[first + 300]), (first, picked, ended)


def _helper_threads() -> int:
    return sum(t.name.startswith("dtrain-shards") for t in threading.enumerate())


def _core_processes() -> int:
    return sum("dtrain.taskgraph.cores" in " ".join(c.cmdline())
               for c in psutil.Process().children())


def test_a_workers_shards_share_one_task_and_its_cores(tmp_path):
    """One worker with 2 threads holding 4 shards: one forward-backward task per step, its
    shards computed on both cores (each shard is worth one), in a core process it starts
    (cluster.cores = processes) or on its threads, and the same bytes as one task per shard."""
    wide = QUICK + ["model.layers=[4,5000,3]", "train.batch_size=64", "data.shards=4",
                    "train.epochs=2", "graph.fuse_steps=false"]   # 16 rows a shard: 4 MFLOP
    counts, blobs = {}, {}
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        for fuse, cores in (("true", "threads"), ("true", "processes"), ("false", "threads")):
            with get_task_stream(c) as ts:
                r = _train(c, wide + [f"graph.fuse_shards={fuse}", f"cluster.cores={cores}"],
                           tmp_path / fuse / cores)
            counts[fuse] = sum(t["key"].startswith("forward-backward-") for t in ts.data)
            blobs[fuse, cores] = (tmp_path / fuse / cores / "params.npz").read_bytes()
            if fuse == "true":
                helpers = c.run(_helper_threads if cores == "threads" else _core_processes)
                assert helpers.popitem()[1] >= 1, cores
    assert counts == {"true": r.summary["steps"], "false": 4 * r.summary["steps"]}
    assert len(set(blobs.values())) == 1, list(blobs)


def test_serial_is_the_reference(client):
    dist = _train(client, QUICK)
    serial = _train(None, QUICK + ["graph.strategy=serial"])
    for name, value in serial.params.items():
        np.testing.assert_allclose(dist.params[name], value, rtol=1e-12, atol=1e-14)
    assert serial.summary["workers"] == 0
    for a, b in zip(dist.metrics, serial.metrics):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12)
        assert a["train_accuracy"] == b["train_accuracy"]
        assert a["val_accuracy"] == b["val_accuracy"]


def test_parameter_server_agrees_with_allreduce(client):
    ps = _train(client, QUICK + ["graph.strategy=parameter-server"])
    ar = _train(client, QUICK + ["graph.fan_in=3"])
    for name, value in ar.params.items():
        np.testing.assert_allclose(ps.params[name], value, rtol=1e-10, atol=1e-12)
    assert ps.summary["strategy"] == "parameter-server" and ps.summary["workers"] == 2


def test_default_job_learns_iris(client, tmp_path):
    result = dtrain.train(dtrain.load_config(), client=client, out=tmp_path, echo=None)
    assert result.summary["test_accuracy"] >= 0.90
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["checkpoint.npz", "config.toml", "metrics.jsonl", "model.json", "params.npz",
                     "report.html", "summary.json", "timeline.json"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 41))
    for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "seconds",
                "samples_per_second"):
        assert all(isinstance(r[key], float) for r in rows), key
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] / 2
    assert rows[-1]["train_accuracy"] > max(0.85, rows[0]["train_accuracy"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["shards"] == 4 and summary["strategy"] == "allreduce"
    assert summary["train_samples"] == 105 and summary["seconds"] > 0
    saved = np.load(tmp_path / "params.npz")
    assert sorted(saved.files) == ["W1", "W2", "b1", "b2"] and saved["W1"].shape == (16, 4)
    assert dtrain.load_config(tmp_path / "config.toml") == dtrain.load_config()


def test_shards_are_built_on_their_workers(client):
    p = plan(dtrain.load_config(None, ["data.shards=4"]))
    cluster = DaskEngine(p, client).cluster   # the data and its placement
    placement = cluster.place()
    assert placement == place(worker_addresses(client), 4)
    heldout.load(client, p, placement, cluster.data, cluster.key)   # waits for the loads
    where = client.who_has(cluster.data)
    assert [where[f.key] for f in cluster.data] == [(w,) for w in placement.leaves]
    assert all(f.key.startswith("load-shard-") for f in cluster.data)
    ours = {f.key for f in cluster.data}                    # (earlier runs' keys may linger)
    held = client.run(lambda dask_worker: sorted(k for k in dask_worker.data if k in ours))
    assert sorted(k for v in held.values() for k in v) == sorted(ours)   # one copy each
    keys = [f.key for f in cluster.data]
    assert cluster.place() == placement                     # same workers: nothing moves
    assert [f.key for f in cluster.data] == keys            # and nothing is reloaded


def test_a_windows_annotations_are_tables_not_closures(client, monkeypatch):
    """What dtrain asks of the scheduler per key (worker, executor, GPU resource) goes as
    plain tables: Dask sends callable annotations to the scheduler, and a closure over the
    window made the client cloudpickle the whole window a second time on its event loop
    (0.1-0.2 s a window of 1,000 fused steps before the scheduler saw it)."""
    import pickle

    seen = []
    real = client.get

    def spy(dsk, wanted, **kw):
        seen.append((dict(dsk), dask.get_annotations()))
        return real(dsk, wanted, **kw)

    monkeypatch.setattr(client, "get", spy)
    _train(client, ["train.epochs=2"])
    windows_seen = [(dsk, a) for dsk, a in seen if "executor" in a]
    assert windows_seen
    for dsk, given in windows_seen:
        data = pickle.dumps(given)                      # plain pickle: no function by value
        assert len(data) < 2000 + 200 * len(dsk), len(data)
        for key in dsk:
            assert given["executor"](key) in (tuning.INLINE, "default")
            assert given["resources"](key) == {}              # no GPU here


def test_replicate_and_full_batch(client):
    r = _train(client, ["train.epochs=3", "data.replicate=3", "train.batch_size=100000"])
    assert r.summary["train_samples"] == 315 and r.summary["steps"] == 3
    assert r.summary["batch_size"] == 315


def test_stochastic_gradient_descent(client):
    r = _train(client, ["train.epochs=1", "train.batch_size=1", "data.shards=2",
                        "graph.window=64", "optim.lr=0.01"])
    assert r.summary["steps"] == 105


@pytest.mark.slow
def test_mnist_reaches_92_percent(client, mnist_dir):
    cfg = dtrain.load_config("configs/mnist.toml", [f"data.path={mnist_dir}"])
    r = dtrain.train(cfg, client=client, echo=None)
    assert r.summary["test_accuracy"] >= 0.92


@pytest.mark.parametrize("shards", [pytest.param(1, marks=pytest.mark.slow), 4])
def test_every_epoch_takes_time_and_the_epochs_fit_in_the_run(client, tmp_path, shards):
    """Windows of 10 steps, epochs of 27, the next window launched ahead: on one worker (1
    shard) and across both (4), every epoch's seconds and rate are positive and together
    no longer than the run (a fused window that came back without its end time would give
    epochs of -1.8e9 s and negative rates)."""
    import time

    cfg = dtrain.load_config(None, ["train.batch_size=4", "train.epochs=30", "graph.window=10",
                                    f"data.shards={shards}"])
    began = time.perf_counter()
    dtrain.train(cfg, client=client, out=tmp_path / "run", echo=None)
    took = time.perf_counter() - began
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 30
    assert all(r["seconds"] > 0 and r["samples_per_second"] > 0 for r in rows), \
        [(r["epoch"], r["seconds"]) for r in rows if not r["seconds"] > 0]
    assert sum(r["seconds"] for r in rows) <= took


def test_windows_last_about_a_second_unless_fixed():
    """graph.window = 0 (the default): the first window 100 steps, then a second's worth at
    the rate so far, 100 to 1000 steps (400 before any window was timed), a tail shorter
    than 100 steps or than the window before it in that window; a fixed window is kept;
    local SGD rounds stay whole."""
    auto = plan(dtrain.load_config(None, ["train.epochs=200"]))           # 1400 steps
    assert [window_steps(auto, r) for r in (None, 0.05, 0.004, 0.0001)] == [100, 100, 250, 1000]
    rates = iter([None, 0.002, 0.01, 0.0001])
    assert [len(w) for w in windows(auto, 0, lambda: next(rates))] == [100, 500, 100, 700]
    # a window sized while the first still runs (launched ahead, no rate yet): 4 x 100 steps
    rates = iter([None, None, 0.0001])
    assert [len(w) for w in windows(auto, 0, lambda: next(rates))] == [100, 400, 900]
    assert window_steps(auto, None, first=False) == 400
    # no window shorter than the first: a tail of fewer steps joins the window before it
    short = plan(dtrain.load_config(None, ["train.epochs=23"]))           # 161 steps
    assert [len(w) for w in windows(short, 0)] == [161]                 # not 100 and 61
    assert [len(w) for w in windows(short, 63)] == [98]                 # resumed at step 63
    assert [len(w) for w in windows(short, 0, lambda: 0.1)] == [161]    # slow steps alike
    # ... nor a tail shorter than the window before it: 602 steps, 100 and 502, not 100,
    # 400 and 102 (the second window sized before the first was timed)
    six = plan(dtrain.load_config(None, ["train.epochs=86"]))
    assert [len(w) for w in windows(six, 0)] == [100, 502]
    rates = iter([None, 0.001])                 # a window of 1000 steps would leave 300
    assert [len(w) for w in windows(auto, 0, lambda: next(rates))] == [100, 1300]
    rates = iter([None, 0.002, 0.00135])                # the third: 741 steps, 59 left
    assert [len(w) for w in windows(auto, 0, lambda: next(rates))] == [100, 500, 800]
    fixed = plan(dtrain.load_config(None, ["train.epochs=200", "graph.window=30"]))
    assert {window_steps(fixed, r) for r in (None, 0.0001)} == {30}
    rounds = plan(dtrain.load_config(None, ["graph.strategy=local-sgd", "graph.window=5",
                                            "graph.sync_every=4", "train.epochs=2"]))
    assert [len(w) for w in windows(rounds, 0)] == [7, 7]              # 7 steps an epoch


@pytest.mark.parametrize("strategy", ["allreduce", "parameter-server", "local-sgd"])
def test_bytes_between_workers_match_dasks_transfer_records(client, strategy):
    """What the graph says must cross between workers is what Dask's transfers moved."""
    r = _train(client, ["train.epochs=2", f"graph.strategy={strategy}", "graph.window=5"])
    s = r.summary
    assert s["comm_bytes_per_step"] > 0
    assert_moved_as_predicted(s)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_local_sgd_with_one_step_rounds_is_allreduce(client, optimizer):
    """A one-step round runs as the synchronous step (Adam included: averaging its moments
    would not be); tests/test_optim.py checks that the round's own maths agrees too."""
    base = ["train.epochs=3", f"optim.name={optimizer}", "data.shards=3", "graph.fan_in=3"]
    local = _train(client, base + ["graph.strategy=local-sgd", "graph.sync_every=1"])
    sync = _train(client, base)
    assert local.summary["strategy"] == "local-sgd"
    for name, value in sync.params.items():
        assert local.params[name].tobytes() == value.tobytes()


@pytest.mark.slow
def test_local_sgd_is_reproducible_and_learns(client, tmp_path):
    """The same bytes on 2 processes, on one process with 1 or 2 threads, with a worker's
    rounds in one task (the shards on its threads) or in a task each."""
    sets = ["train.epochs=30", "graph.strategy=local-sgd", "graph.sync_every=4"]
    a = _train(client, sets, tmp_path / "a")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        _train(c, sets + ["graph.window=9"], tmp_path / "b")
    tasks = {}
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        for fuse in ("true", "false"):
            r = _train(c, sets + [f"graph.fuse_shards={fuse}", "graph.fuse_steps=false"],
                       tmp_path / fuse)
            tasks[fuse] = r.summary["tasks_per_step"]
    blobs = {d: (tmp_path / d / "params.npz").read_bytes() for d in ("a", "b", "true", "false")}
    assert len(set(blobs.values())) == 1
    assert a.summary["test_accuracy"] >= 0.9
    # a round of 4 steps: 4 shards and 3 sums (+ the average) unfused, 1 task (+ 1) fused
    assert tasks["true"] < tasks["false"] / 3


@pytest.mark.parametrize("strategy", ["allreduce", "model-parallel", "serial"])
def test_every_epoch_is_reported_without_a_validation_split(client, strategy):
    r = _train(client if strategy != "serial" else None,
               ["train.epochs=3", "data.split=[0.9, 0.0, 0.1]", f"graph.strategy={strategy}"])
    assert [m["epoch"] for m in r.metrics] == [1, 2, 3]
    assert all(m["val_accuracy"] is None and m["train_loss"] > 0 for m in r.metrics)
    assert all(0 < m["train_accuracy"] <= 1 for m in r.metrics)


def test_a_run_keeps_the_process_objects_out_of_full_collections_and_gives_them_back(client):
    """While a Dask run trains, what the process held before is frozen (``gc.freeze``: full
    collections walked a driver's 400,000 objects, 0.17 s each with the GIL held, stalling
    the scheduler beside it); once it ends, nothing stays frozen."""
    import gc
    during: list[int] = []
    assert gc.get_freeze_count() == 0
    dtrain.train(dtrain.load_config(None, ["train.epochs=2", "cluster.dashboard_address="]),
                 client=client, echo=lambda line: during.append(gc.get_freeze_count()))
    assert max(during, default=0) > 10_000, during      # the epoch lines: while it trains
    assert gc.get_freeze_count() == 0


def test_the_test_splits_evaluation_sends_the_state_where_the_kept_one_is_gone(client):
    """The end of a run evaluates the state the root worker kept; where that worker holds
    none (lost and started again), the same graph goes again with the state sent, once the
    scheduler has forgotten the failed keys (sent at once, the same keys would bring back
    the first graph's failure)."""
    from dtrain.core import keys
    from dtrain.deploy.workers import forgotten

    p = plan(dtrain.load_config(None, ["data.shards=4"]))
    cluster = DaskEngine(p, client).cluster   # the data and its placement
    placement = cluster.place()
    held = heldout.load(client, p, placement, cluster.data, cluster.key)
    state = p.initial_state()
    ours = [keys.make(keys.STATE, len(p.schedule), run=p.run),
            keys.make(keys.EVALUATE_TEST, run=p.run)]
    sent = heldout.evaluate_test(client, p, p.run, state, held.test, placement)
    for attempt in range(10):                   # no worker keeps a state of step 10**6
        forgotten(client, ours, 10)             # (else the last call's state is taken)
        assert heldout.evaluate_test(client, p, p.run, state, held.test, placement,
                                     kept=10**6, attempt=attempt) == sent
