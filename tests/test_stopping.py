"""Early stopping, the best epoch, going on from a finished run, and starting from one.

The promises are about bytes: a run that stops early, or keeps its best epoch, has the
parameters a straight run of that many epochs has, on any strategy and any number of
workers, after any kill and resume; a finished run taken to more epochs has the bytes of
a straight run of them."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dtrain
from conftest import REPO
from dtrain import cli
from dtrain.core.config import TrainConfig
from dtrain.training.stopping import Watch, needed_states, watched

EARLY = ["train.epochs=120", "train.patience=4", "train.min_delta=0.002", "train.keep_best=true",
         "cluster.dashboard_address="]


def _train(client, sets: list[str], out: Path) -> dtrain.RunResult:
    return dtrain.train(dtrain.load_config(None, sets), client=client, out=out, echo=None)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [
    "allreduce",
    pytest.param("parameter-server", marks=pytest.mark.slow),
    pytest.param("local-sgd", marks=pytest.mark.slow),
    pytest.param("model-parallel", marks=pytest.mark.slow),
    pytest.param("serial", marks=pytest.mark.slow)])
def test_keep_best_gives_the_best_epochs_bytes_on_every_strategy(strategy, client, tmp_path):
    sets = [*EARLY, f"graph.strategy={strategy}"]
    early = _train(client, sets, tmp_path / "early")
    s = early.summary
    assert s["best_epoch"] < s["stopped_early"] == s["epochs_run"] < 120, s
    assert len(early.metrics) == s["epochs_run"] and s["params_from_epoch"] == s["best_epoch"]
    assert s["best_val_loss"] == min(r["val_loss"] for r in early.metrics)
    model = json.loads((tmp_path / "early" / "model.json").read_text())["training"]
    assert model["best_epoch"] == s["best_epoch"] and model["stopped_early"] == s["stopped_early"]
    straight = _train(client, [f"train.epochs={s['best_epoch']}", f"graph.strategy={strategy}",
                               "cluster.dashboard_address="], tmp_path / "straight")
    assert (tmp_path / "early" / "params.npz").read_bytes() == \
        (tmp_path / "straight" / "params.npz").read_bytes()
    assert s["test_accuracy"] == straight.summary["test_accuracy"]
    # a finished run that early stopping ended does not go on
    with pytest.raises(dtrain.UserError, match="was stopped early after epoch"):
        dtrain.resume(tmp_path / "early", config=dtrain.load_config(
            tmp_path / "early" / "config.toml", ["train.epochs=200"]))


@pytest.mark.slow
def test_without_keep_best_the_stop_epochs_parameters_are_kept(client, tmp_path):
    sets = [s for s in EARLY if "keep_best" not in s] + ["train.monitor=train_loss",
                                                        "train.min_delta=0.01"]
    early = _train(client, sets, tmp_path / "early")
    stop = early.summary["stopped_early"]
    assert stop and early.summary["params_from_epoch"] is None and early.summary["monitor"] == \
        "train_loss"
    _train(client, [f"train.epochs={stop}", "cluster.dashboard_address="], tmp_path / "straight")
    assert (tmp_path / "early" / "params.npz").read_bytes() == \
        (tmp_path / "straight" / "params.npz").read_bytes()


@pytest.mark.slow
def test_early_stopping_is_the_same_on_one_and_three_workers(client, tmp_path):
    runs = {}
    for n in (1, 3):
        with LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None) as lc, \
                Client(lc) as c:
            runs[n] = _train(c, [*EARLY, "data.shards=6"], tmp_path / f"w{n}")
    assert runs[1].summary["stopped_early"] == runs[3].summary["stopped_early"]
    assert runs[1].metrics == [dict(r, seconds=a["seconds"], samples_per_second=a[
        "samples_per_second"]) for r, a in zip(runs[3].metrics, runs[1].metrics)]
    assert (tmp_path / "w1" / "params.npz").read_bytes() == \
        (tmp_path / "w3" / "params.npz").read_bytes()


@pytest.mark.parametrize("keep_best", [True, False])
@pytest.mark.parametrize("monitor", ["val_loss", "train_loss"])
def test_a_window_brings_back_only_the_states_its_watch_keeps(keep_best, monitor):
    """:func:`needed_states` run on each window's evaluations as the worker runs it (from
    the watch as it stood before the window) leaves the states that the driver's watch
    keeps, the same objects as if every state had come back: the best epoch's and the
    stop epoch's, two at most a window, over losses with ties, NaNs and plateaus."""
    rng = np.random.default_rng(11)
    for trial in range(300):
        cfg = TrainConfig(epochs=200, patience=int(rng.integers(1, 6)), keep_best=keep_best,
                          monitor=monitor, min_delta=float(rng.choice([0.0, 0.01, 0.1])))
        n = int(rng.integers(1, 40))
        losses = np.round(rng.uniform(0, 1, n), 1)                   # ties
        losses[rng.random(n) < 0.1] = np.nan
        evs = [{"epoch": e + 1, "loss": float(v), "train_loss": float(v), "state": object()}
               for e, v in enumerate(losses)]
        everything, trimmed = Watch(cfg), Watch(cfg)
        last_all = last_trimmed = None
        for ev in evs:
            last_all = ev["state"]
            if everything.see(watched(ev, True), ev["state"]):
                break
        cuts = sorted({0, n, *rng.integers(0, n, 3).tolist()})
        for lo, hi in zip(cuts, cuts[1:]):
            window = needed_states(dataclasses.replace(trimmed, best_state=None), evs[lo:hi],
                                   True)
            assert sum("state" in ev for ev in window) <= 2
            for ev in window:
                last_trimmed = ev.get("state")
                if trimmed.see(watched(ev, True), last_trimmed):
                    break
            if trimmed.stopped:
                break
        assert (trimmed.stopped, trimmed.best_epoch) == (everything.stopped,
                                                         everything.best_epoch), trial
        assert trimmed.best_state is everything.best_state, trial
        if everything.stopped:
            assert last_trimmed is last_all, trial


def test_a_checkpoint_without_the_best_state_goes_on(client, tmp_path):
    """A checkpoint with no best epoch's state (dtrain 0.1 wrote none) while the rows it
    replays name a best epoch: the run goes on (the driver's check for states that did not
    come looks only at the epochs it drains) and keeps the best epoch it trains."""
    _train(client, ["train.epochs=3", "train.keep_best=true", "cluster.dashboard_address="],
           tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoint.npz"
    with np.load(ckpt) as f:
        assert "best" in f.files
        kept = {k: f[k] for k in f.files if k != "best"}
    np.savez(ckpt, **kept)
    on = dtrain.resume(tmp_path / "run", client=client, echo=None, config=dtrain.load_config(
        tmp_path / "run" / "config.toml", ["train.epochs=6"]))
    s = on.summary
    assert [r["epoch"] for r in on.metrics] == list(range(1, 7))
    assert s["best_epoch"] > 3 and s["params_from_epoch"] == s["best_epoch"], s


@pytest.mark.slow
def test_a_fused_window_fetches_only_the_states_kept_with_the_bytes_of_every_state(tmp_path):
    """One worker: each window of five epochs is one task; it brings the driver the best and
    the stop epoch's states only, and the run stops, keeps and ends as the same run with a
    task per step (whose evaluations each bring their state) does."""
    sets = [*EARLY, "graph.window=35", "cluster.workers=1"]       # iris: 7 steps an epoch
    runs = {}
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as lc, \
            Client(lc) as c:
        for fuse in ("true", "false"):
            runs[fuse] = _train(c, [*sets, f"graph.fuse_steps={fuse}"], tmp_path / fuse)
    fused, each = runs["true"].summary, runs["false"].summary
    assert fused["fused_windows"] > 1 and each["fused_windows"] == 0
    assert (fused["stopped_early"], fused["best_epoch"]) == (each["stopped_early"],
                                                             each["best_epoch"])
    assert each["epoch_states_fetched"] == each["epochs_run"]
    assert 0 < fused["epoch_states_fetched"] <= 2 * fused["fused_windows"] < \
        fused["epochs_run"]
    assert (tmp_path / "true" / "params.npz").read_bytes() == \
        (tmp_path / "false" / "params.npz").read_bytes()
    assert [r["val_loss"] for r in runs["true"].metrics] == \
        [r["val_loss"] for r in runs["false"].metrics]


@pytest.mark.slow
def test_a_run_killed_inside_its_patience_window_resumes_to_the_same_bytes(client, tmp_path):
    """Killed (SIGKILL, driver and workers) two epochs after its best, with a checkpoint per
    epoch: the resumed run stops where the uninterrupted one did, with its bytes."""
    sets = [*EARLY, "graph.window=7"]                      # iris: an epoch per window
    whole = _train(client, sets, tmp_path / "whole")
    best = whole.summary["best_epoch"]
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "dtrain", "--out", str(out),
                             *(a for s in sets for a in ("--set", s))], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("epoch") and int(line.split()[1].split("/")[0]) == best + 2:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert not (out / "summary.json").exists()
    resumed = dtrain.resume(out, client=client, echo=None)
    assert resumed.summary["best_epoch"] == best
    assert resumed.summary["stopped_early"] == whole.summary["stopped_early"]
    assert (out / "params.npz").read_bytes() == (tmp_path / "whole" / "params.npz").read_bytes()


@pytest.mark.slow
def test_a_finished_run_goes_on_to_the_bytes_of_a_straight_run(client, tmp_path, capfd):
    sets = ["optim.name=adam", "optim.lr=0.01", "optim.schedule=step", "optim.decay_every=3",
            "cluster.dashboard_address="]
    _train(client, [*sets, "train.epochs=4"], tmp_path / "short")
    _train(client, [*sets, "train.epochs=9"], tmp_path / "straight")
    code = cli.main(["--resume", str(tmp_path / "short"), "--set", "train.epochs=9",
                     "--set", "cluster.workers=1"])
    out = capfd.readouterr().out
    assert code == 0 and f"going on with {tmp_path / 'short'}: epochs 5 to 9" in out
    assert (tmp_path / "short" / "params.npz").read_bytes() == \
        (tmp_path / "straight" / "params.npz").read_bytes()
    rows = [json.loads(r) for r in (tmp_path / "short" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 10))
    assert json.loads((tmp_path / "short" / "summary.json").read_text())["epochs"] == 9
    # the same number again, or fewer, is refused
    assert cli.main(["--resume", str(tmp_path / "short"), "--set", "train.epochs=9"]) == 2
    assert "already finished its 9 epochs" in capfd.readouterr().err


def test_going_on_with_a_cosine_schedule_says_what_differs(client, tmp_path, capfd):
    _train(client, ["optim.schedule=cosine", "train.epochs=2", "cluster.dashboard_address="],
           tmp_path / "run")
    assert cli.main(["--resume", str(tmp_path / "run"), "--set", "train.epochs=3"]) == 0
    out = capfd.readouterr().out
    assert "optim.schedule = 'cosine' depends on train.epochs" in out
    assert "differs from a straight 3-epoch run" in out


def test_init_from_starts_from_the_runs_parameters_and_normalization(client, tmp_path, capfd):
    source = tmp_path / "source"
    _train(client, ["train.epochs=5", "cluster.dashboard_address="], source)
    # fine-tune on other data (the digits' first four pixels... no: iris rows of one split)
    tuned = _train(client, ["train.epochs=1", "optim.lr=1e-12", f"model.init_from={source}",
                            "data.seed=7", "optim.name=momentum",
                            "cluster.dashboard_address="], tmp_path / "tuned")
    before, after = np.load(source / "params.npz"), tuned.params
    for name in before.files:                       # a step of 1e-12 moves nothing visible
        np.testing.assert_allclose(after[name], before[name], rtol=0, atol=1e-9)
    spec = json.loads((tmp_path / "tuned" / "model.json").read_text())
    assert spec["normalization"] == json.loads((source / "model.json").read_text())[
        "normalization"]                            # data.seed=7 would fit other statistics
    assert spec["training"]["init_from"] == str(source)
    code = cli.main(["--init-from", str(source), "--set", "model.layers=[4, 32, 3]",
                     "--out", str(tmp_path / "mismatch")])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "mismatch").exists()
    assert "its network is [4, 16, 3] but model.layers = [4, 32, 3] (W1 is (16, 4) there " \
           "and (32, 4) here)" in err[0]
