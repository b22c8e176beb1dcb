"""End-to-end training on real LocalClusters of worker processes."""
from __future__ import annotations

import json

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dtrain
from dtrain import cluster, graph
from dtrain.trainer import DaskEngine, plan

QUICK = ["train.epochs=4", "optim.name=momentum", "data.shards=5", "graph.fan_in=2"]


def _train(client, sets, out=None):
    return dtrain.train(dtrain.load_config(None, sets), client=client, out=out, echo=None)


def test_bit_identical_whatever_the_worker_count(client, tmp_path):
    """Same config and shards: params.npz is byte-for-byte equal on 1, 2 and 3 workers, and
    whatever the window length or update fusion."""
    blobs = {}
    for n in (1, 3):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as lc, Client(lc) as c:
            _train(c, QUICK, tmp_path / f"w{n}")
            blobs[f"{n} workers"] = (tmp_path / f"w{n}" / "params.npz").read_bytes()
    variants = {"2 workers": [], "window 3": ["graph.window=3"],
                "unfused": ["graph.fuse_update=false"]}
    for name, extra in variants.items():
        _train(client, QUICK + extra, tmp_path / name)
        blobs[name] = (tmp_path / name / "params.npz").read_bytes()
    reference = blobs["2 workers"]
    assert {name: blob == reference for name, blob in blobs.items()} == dict.fromkeys(blobs, True)


def test_serial_is_the_reference(client):
    dist = _train(client, QUICK)
    serial = _train(None, QUICK + ["graph.strategy=serial"])
    for name, value in serial.params.items():
        np.testing.assert_allclose(dist.params[name], value, rtol=1e-12, atol=1e-14)
    assert serial.summary["workers"] == 0
    for a, b in zip(dist.metrics, serial.metrics):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12)
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
    assert files == ["config.toml", "metrics.jsonl", "params.npz", "report.html", "summary.json",
                     "timeline.json"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 41))
    for key in ("train_loss", "val_loss", "val_accuracy", "seconds", "samples_per_second"):
        assert all(isinstance(r[key], float) for r in rows), key
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] / 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["shards"] == 4 and summary["strategy"] == "allreduce"
    assert summary["train_samples"] == 105 and summary["seconds"] > 0
    saved = np.load(tmp_path / "params.npz")
    assert sorted(saved.files) == ["W1", "W2", "b1", "b2"] and saved["W1"].shape == (16, 4)
    assert dtrain.load_config(tmp_path / "config.toml") == dtrain.load_config()


def test_shards_are_built_on_their_workers(client):
    p = plan(dtrain.load_config(None, ["data.shards=4"]))
    engine = DaskEngine(p, client)
    placement = graph.place(cluster.worker_addresses(client), 4, "allreduce")
    shards, val, test = engine._load(placement)
    where = client.who_has(shards)
    assert [where[f.key] for f in shards] == [(w,) for w in placement.shards]
    assert all(f.key.startswith("load-shard-") for f in shards)
    sizes = client.run(lambda dask_worker: sorted(k for k in dask_worker.data if "load-shard" in k))
    assert sum(len(v) for v in sizes.values()) == 4


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
