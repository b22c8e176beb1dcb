"""Convolutional nets end to end: every promise the dense layers keep (the same bytes on
any number of workers, each strategy, checkpoints and resume, ``dtrain.load``, predict,
evaluate) and ``configs/mnist-cnn.toml``'s accuracy as it ships."""
from __future__ import annotations

import json

import numpy as np
import pytest
from distributed import Client, LocalCluster

import dtrain
from conftest import REPO, run_cli

# 8x8 digits through a convolution, max pooling and dropout: seconds, every layer kind
DIGITS_CONV = ["data.dataset=digits", "model.input_shape=[1, 8, 8]",
               "model.layers=[{conv = 4, kernel = 3, padding = 1}, {pool = 'max', size = 2}, "
               "'flatten', 64, {dropout = 0.25}, 10]",
               "model.activation=relu", "data.shards=6", "train.batch_size=64",
               "train.epochs=2", "optim.name=momentum", "optim.lr=0.05"]


def _run(client, tmp_path, name: str, *sets: str):
    cfg = dtrain.load_config(None, [*DIGITS_CONV, *sets])
    result = dtrain.train(cfg, client=client, echo=None, out=tmp_path / name)
    return result, (tmp_path / name / "params.npz").read_bytes()


@pytest.mark.parametrize("strategy", ["allreduce", "local-sgd"])
def test_a_convolutional_run_is_the_same_bytes_on_one_and_two_workers(client, tmp_path,
                                                                       strategy):
    """Dropout's masks come from the seed, the step and the shard, so where a shard runs
    changes no bit: one worker (threads of this process) and the fixture's two processes."""
    _, two = _run(client, tmp_path, "two", f"graph.strategy={strategy}")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as lc, Client(lc) as c:
        result, one = _run(c, tmp_path, "one", f"graph.strategy={strategy}")
    assert one == two
    assert result.metrics[-1]["val_accuracy"] > 0.7


def test_a_convolutional_run_is_a_model_to_load_predict_and_evaluate(client, tmp_path):
    """model.json keeps the layers and the input shape; ``dtrain.load`` predicts what the
    network computed in training (the run's test accuracy), and evaluate agrees."""
    result, _ = _run(client, tmp_path, "run")
    model = dtrain.load(tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "model.json").read_text())
    assert doc["network"]["input_shape"] == [1, 8, 8]
    assert doc["network"]["layers"][0] == {"conv": 4, "kernel": 3, "stride": 1, "padding": 1}
    assert model.n_features_in_ == 64
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    proba = model.predict_proba(X)
    assert proba.shape == (len(X), 10)
    np.testing.assert_allclose(proba.sum(axis=1), 1, rtol=1e-6)
    assert (model.predict(X) == y).mean() > 0.7
    assert abs(model.score(X, y) - (model.predict(X) == y).mean()) < 1e-12


def test_a_convolutional_run_resumes_to_the_bytes_of_an_uninterrupted_one(client, tmp_path):
    """A run of 1 epoch taken on to 2 by --resume: the bytes of 2 epochs at once (the
    checkpoint keeps the state; dropout's masks need nothing but the step)."""
    _, whole = _run(client, tmp_path, "whole")
    _run(client, tmp_path, "half", "train.epochs=1")
    cfg = dtrain.load_config(None, [*DIGITS_CONV])
    dtrain.resume(tmp_path / "half", config=cfg, client=client, echo=None)
    assert (tmp_path / "half" / "params.npz").read_bytes() == whole


@pytest.mark.slow
def test_mnist_cnn_as_it_ships_reaches_0975(mnist_dir, tmp_path):
    """``python -m dtrain --config configs/mnist-cnn.toml --set data.path=...``: LeNet-5 on
    the MNIST 10k files, test accuracy >= 0.975; its ONNX export, run by onnxruntime on
    MNIST images, gives ``predict_proba``'s probabilities within 1e-4."""
    out = tmp_path / "run"
    proc = run_cli("--config", "configs/mnist-cnn.toml", "--set", f"data.path={mnist_dir}",
                   "--out", str(out), "--dashboard-address", "", timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_accuracy"] >= 0.975, summary["test_accuracy"]
    model = dtrain.load(out)
    assert model.net.walk[-1].layer == 10
    ort = pytest.importorskip("onnxruntime")
    from dtrain.data.readers import image_rows, read_idx
    from dtrain.inference.export import to_onnx
    from dtrain.inference.saved import read_run
    x = image_rows(read_idx(mnist_dir / "t10k-images-idx3-ubyte.gz"))[:2000]   # (N, 784)
    graph = to_onnx(*read_run(out), dtype="float32")
    session = ort.InferenceSession(graph.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    probabilities, label = session.run(["probabilities", "label"],
                                       {"input": x.astype(np.float32)})
    assert np.abs(probabilities - model.predict_proba(x)).max() <= 1e-4
    assert (label == model.predict(x)).mean() > 0.999


@pytest.mark.slow
def test_mnist_cnn_one_and_two_flat_worker_processes_give_the_same_bytes(mnist_dir, tmp_path):
    blobs = {}
    for workers in (1, 2):
        out = tmp_path / str(workers)
        proc = run_cli("--config", "configs/mnist-cnn.toml", "--set", f"data.path={mnist_dir}",
                       "--set", "train.epochs=1", "--set", "cluster.layout=flat",
                       "--workers", str(workers), "--out", str(out), "--dashboard-address", "",
                       cwd=REPO, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert json.loads((out / "summary.json").read_text())["workers"] == workers
        blobs[workers] = (out / "params.npz").read_bytes()
    assert blobs[1] == blobs[2]
