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
from dtrain.core.layerspec import parse

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


# --- image folders in colour --------------------------------------------------------------

def _colour_folder(root, per_class: int = 24, size=(10, 12)) -> None:
    """Two classes of noisy PNGs, told apart by where the red is: the top half or the
    bottom half (their mean colour is the same)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    h, w = size
    for name in ("top", "bottom"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 60, (h, w, 3))
            half = slice(0, h // 2) if name == "top" else slice(h // 2, h)
            pixels[half, :, 0] += 150
            pixels[:, :, 2] += 80
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")


def test_colour_images_are_rows_of_channel_planes(tmp_path):
    """(C, H, W): the red plane, then the green, then the blue, as a convolution (and
    PyTorch, and ONNX) takes them."""
    from PIL import Image

    from dtrain.data.readers import read_image
    Image.fromarray(np.full((3, 4, 3), (10, 20, 30), np.uint8)).save(tmp_path / "a.png")
    row = read_image(tmp_path / "a.png", (3, 4), grayscale=False)
    assert row.tolist() == [10.0] * 12 + [20.0] * 12 + [30.0] * 12
    assert read_image(tmp_path / "a.png", (3, 4), False, channels_first=False)[:3].tolist() \
        == [10.0, 20.0, 30.0]


def test_a_convolutional_net_trains_on_a_folder_of_colour_pngs(client, tmp_path):
    """An image folder resized to ``model.input_shape`` (no data.image_size: colour, 8x8),
    trained, then predicted from the folder by the saved run."""
    _colour_folder(tmp_path / "pngs")
    sets = ["data.dataset=image-folder", f"data.path={tmp_path / 'pngs'}",
            "data.split=[0.75, 0.25, 0]", "data.shards=2", "model.input_shape=[3, 8, 8]",
            "model.layers=[{conv = 4, kernel = 3, padding = 1}, {pool = 'avg', size = 2}, "
            "'flatten', 64, 2]", "model.activation=relu", "train.epochs=15",
            "train.batch_size=8", "optim.name=adam", "optim.lr=0.01"]
    cfg = dtrain.load_config(None, sets)
    assert cfg.data.image_size == (8, 8) and cfg.data.grayscale is False
    result = dtrain.train(cfg, client=client, echo=None, out=tmp_path / "run")
    assert result.metrics[-1]["val_accuracy"] >= 0.9
    doc = json.loads((tmp_path / "run" / "model.json").read_text())
    assert doc["training"]["channels_first"] is True and doc["features"]["count"] == 192
    proc = run_cli("predict", str(tmp_path / "run"), "--data", str(tmp_path / "pngs"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 49
    predicted = [line.split(",")[0] for line in lines[1:]]        # folders in name order
    right = sum(p == t for p, t in zip(predicted, ["bottom"] * 24 + ["top"] * 24))
    assert right >= 44, predicted


# --- what a user sees: the step picture and the live page show the layers ---------------

def test_the_step_picture_and_the_live_page_show_the_layers():
    from dtrain.core import layerspec
    from dtrain.observe.livepage import LivePage
    from dtrain.observe.runlog import RunLog
    from dtrain.training.pictures import step_picture
    cfg = dtrain.load_config(REPO / "configs" / "mnist-cnn.toml")
    line = layerspec.describe(cfg.model.layers, cfg.model.input_shape)
    assert line == ("1x28x28 > conv 6@5x5 pad 2 > max-pool 2 > conv 16@5x5 > max-pool 2 > "
                    "flatten 400 > 120 > 84 > 10")
    assert f"(layers {line})" in step_picture(cfg).title
    log = RunLog("r")
    log.on_event({"kind": "start", "run": "r", "dataset": "mnist", "strategy": "allreduce",
                  "epochs": 12, "steps_per_epoch": 125, "train_samples": 8000, "layers": line})
    assert f"layers {line}" in LivePage._header(log)
    assert layerspec.describe((784, 128, 10)) == "784-128-10"


# --- GPUs: CuPy runs the same maths --------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("float64", 1e-10)])
def test_gpu_and_cpu_gradients_of_lenet_agree_to_rounding(dtype, tolerance):
    """The same buffer from CuPy as from NumPy, dropout included (its masks are drawn on
    the host from the key, so they are the same bytes)."""
    from dtrain.core import arrays, layerspec
    from dtrain.maths.model import Network
    cp = arrays.cupy()
    if cp is None:
        pytest.skip("no CUDA GPU: " + arrays.gpu_problem())
    layers = tuple(layerspec.parse(v) for v in (
        {"conv": 6, "kernel": 5, "padding": 2}, {"pool": "max", "size": 2},
        {"conv": 16, "kernel": 5}, {"pool": "avg", "size": 2}, "flatten", 400,
        {"dropout": 0.3}, 120, 84, 10))
    net = Network(layers, "relu", "cross-entropy", dtype, input_shape=(1, 28, 28))
    rng = np.random.default_rng(0)
    params, x, y = net.init(0), rng.standard_normal((32, 784)).astype(dtype), \
        rng.integers(0, 10, 32)
    noise = (((0, 0, 0), 20), ((0, 0, 1), 12))
    cpu = net.loss_and_grad(params, x, y, noise=noise)
    gpu = cp.asnumpy(net.loss_and_grad(cp.asarray(params), cp.asarray(x), cp.asarray(y),
                                       noise=noise))
    assert np.abs(gpu - cpu).max() / np.abs(cpu).max() < tolerance


@pytest.mark.gpu
def test_a_convolutional_run_on_a_gpu_agrees_with_the_cpu_to_float32_rounding(tmp_path):
    from dtrain.core import arrays
    if arrays.cupy() is None:
        pytest.skip("no CUDA GPU: " + arrays.gpu_problem())
    sets = [*DIGITS_CONV, "model.dtype=float32", "cluster.workers=1"]
    gpu = dtrain.train(dtrain.load_config(None, sets + ["cluster.device=gpu"]), echo=None,
                       out=tmp_path / "gpu")
    cpu = dtrain.train(dtrain.load_config(None, sets), echo=None, out=tmp_path / "cpu")
    for name, value in cpu.params.items():
        np.testing.assert_allclose(gpu.params[name], value, rtol=1e-3, atol=1e-4)
    assert gpu.summary["work_split"]["0"]["device"] == "gpu"


def test_a_csv_of_images_is_checked_against_input_shape(tmp_path):
    """CSV rows of C x H x W numbers: the file's columns against model.input_shape, before
    any worker reads them."""
    from dtrain.core.config import DataConfig
    from dtrain.core.errors import DataError
    from dtrain.training.collections import check_files
    path = tmp_path / "images.csv"
    path.write_text("\n".join(",".join(["0.5"] * 16 + [str(i % 2)]) for i in range(6)) + "\n")
    cfg = DataConfig(dataset="csv", path=str(path))
    layers = (parse({"conv": 2, "kernel": 3}), parse("flatten"), 8, 2)
    check_files(cfg, layers, (1, 4, 4))
    with pytest.raises(DataError, match=r"model.input_shape = \[1, 4, 5\] holds 20 features "
                                        r"but .*images.csv has 16 feature columns"):
        check_files(cfg, layers, (1, 4, 5))


def test_init_from_a_convolutional_run_starts_from_its_parameters(client, tmp_path):
    """--init-from (model.init_from): the run's filters and weights as the start, its
    input shape checked."""
    _run(client, tmp_path, "first", "train.epochs=1")
    cfg = dtrain.load_config(None, [*DIGITS_CONV, "train.epochs=1",
                                    f"model.init_from={tmp_path / 'first'}"])
    from dtrain.training.plan import plan
    p = plan(cfg)
    with np.load(tmp_path / "first" / "params.npz") as f:
        assert p.init[:f["W1"].size].tobytes() == f["W1"].ravel().tobytes()
    other = dtrain.load_config(None, [*DIGITS_CONV[:1], "model.input_shape=[1, 4, 16]",
                                      *DIGITS_CONV[2:], f"model.init_from={tmp_path / 'first'}"])
    with pytest.raises(dtrain.UserError, match=r"its network takes images \[1, 8, 8\] but "
                                               r"model.input_shape = \[1, 4, 16\]"):
        plan(other)
