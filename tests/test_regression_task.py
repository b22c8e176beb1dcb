"""Regression: model.loss = "squared-error", identity outputs against real-valued targets.

The maths against finite differences and scikit-learn's metrics; a synthetic regression
that learns; every strategy on real LocalClusters, byte-identical whatever the worker
count; a CSV with a numeric target column through ``python -m dtrain`` and its predict,
evaluate and export commands (onnxruntime runs the export); bad input, one line and exit 2.
"""
from __future__ import annotations

import csv
import json
import pickle
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from distributed import Client, LocalCluster
from sklearn import metrics as skm

import dtrain
from conftest import run_cli
from dtrain import cli
from dtrain.core import events
from dtrain.core.events import StepEvents
from dtrain.core.modelfile import ModelFileError, ModelSpec, Normalization
from dtrain.data.readers import synthetic_rows
from dtrain.maths.model import Network, squared_error
from dtrain.maths.optim import Step, TrainState
from dtrain.maths.scores import TargetSums
from dtrain.training.plan import plan

SYNTHETIC = ["data.dataset=synthetic", "model.loss=squared-error", "data.features=6",
             "data.targets=2", "model.layers=[6,16,2]", "data.samples=600",
             "data.split=[0.7, 0.1, 0.2]", "train.batch_size=32", "optim.name=momentum",
             "optim.lr=0.05", "data.shards=5", "train.epochs=3", "cluster.dashboard_address="]
FEATURES = ("rooms", "age", "distance")


# --- the maths ---------------------------------------------------------------------------

def test_squared_error_is_half_the_summed_squares_and_its_gradient_the_residual():
    rng = np.random.default_rng(0)
    z, t = rng.standard_normal((7, 3)), 3 * rng.standard_normal((7, 3))
    loss, dz = squared_error(np, z, t)
    assert loss == pytest.approx(0.5 * ((z - t) ** 2).sum(), rel=1e-14)
    eps, numeric = 1e-6, np.empty_like(z)
    for i in np.ndindex(z.shape):
        e = np.zeros_like(z)
        e[i] = eps
        numeric[i] = (squared_error(np, z + e, t)[0] - squared_error(np, z - e, t)[0]) / (2 * eps)
    np.testing.assert_allclose(dz, numeric, rtol=1e-7, atol=1e-7)   # cancellation: |loss| ~ 50


@pytest.mark.parametrize("layers", [(4, 1), (4, 6, 3), (4, 5, 5, 2)], ids=["0h", "1h", "2h"])
def test_network_gradient_matches_central_differences(layers):
    """The whole network's buffer, as the optimizer reads it (sum / batch), against central
    differences of the mean loss; the correct-count slot stays 0."""
    net = Network(layers, "tanh", "squared-error", "float64")
    rng = np.random.default_rng(5)
    params = net.init(2) + 0.1 * rng.standard_normal(net.size)
    x, t = rng.standard_normal((11, layers[0])), 2 * rng.standard_normal((11, layers[-1]))
    buf = net.loss_and_grad(params, x, t)
    assert buf.shape == (net.size + 2,) and buf[net.size + 1] == 0

    def mean_loss(p: np.ndarray) -> float:
        return float(net.loss_and_grad(p, x, t)[net.size]) / len(t)

    eps, numeric = 1e-6, np.empty(net.size)
    for i in range(net.size):
        e = np.zeros(net.size)
        e[i] = eps
        numeric[i] = (mean_loss(params + e) - mean_loss(params - e)) / (2 * eps)
    np.testing.assert_allclose(buf[:net.size] / len(t), numeric, rtol=1e-6, atol=1e-8)
    loss, correct, rows = net.evaluate(params, x, t, chunk=4)
    assert (correct, rows) == (0, 11) and loss == pytest.approx(buf[net.size], rel=1e-12)
    halves = net.loss_and_grad(params, x[:5], t[:5]) + net.loss_and_grad(params, x[5:], t[5:])
    np.testing.assert_allclose(halves, buf, rtol=1e-12, atol=1e-14)   # shards add up


def test_float32_targets_stay_float32():
    net = Network((3, 4, 2), "relu", "squared-error", "float32")
    x = np.ones((5, 3), np.float32)
    assert net.loss_and_grad(net.init(0), x, np.ones((5, 2))).dtype == np.float32


def test_target_sums_merged_over_parts_give_scikit_learns_figures():
    """Per target and averaged over targets, from parts summed in any grouping; a constant
    target scores R^2 1 if predicted exactly, else 0, as scikit-learn does."""
    rng = np.random.default_rng(1)
    t = rng.standard_normal((50, 3)) * [1, 10, 0.1] + [0, 100, -5]
    z = t + rng.standard_normal((50, 3)) * [0.3, 2, 0.05]
    cuts = [0, 7, 8, 30, 50]
    sums = [TargetSums.of(z[a:b], t[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
    merged = (sums[0] + sums[1]) + (sums[2] + sums[3])
    want = {"mse": skm.mean_squared_error, "rmse": skm.root_mean_squared_error,
            "mae": skm.mean_absolute_error, "r2": skm.r2_score}
    for name, fn in want.items():
        np.testing.assert_allclose(getattr(merged, name)(), fn(t, z, multioutput="raw_values"),
                                   rtol=1e-12)
        assert merged.overall()[name] == pytest.approx(fn(t, z), rel=1e-12)
    flat = np.full((4, 1), 2.0)
    assert TargetSums.of(flat, flat).r2()[0] == 1.0 == skm.r2_score(flat, flat)
    assert TargetSums.of(flat + 1, flat).r2()[0] == 0.0 == skm.r2_score(flat, flat + 1)


# --- the config and the model file -------------------------------------------------------

def test_the_loss_decides_the_targets_and_a_changed_loss_decides_again():
    cfg = dtrain.load_config(None, SYNTHETIC)
    assert (cfg.data.target, cfg.model.loss) == ("value", "squared-error")
    assert dtrain.load_config().data.target == "class"
    assert dtrain.load_config(cfg.to_dict()) == cfg              # config.toml reads back
    back = cfg.replace(model={"loss": "cross-entropy", "layers": [6, 16, 3]})
    assert back.data.target == "class"
    with pytest.raises(dtrain.UserError, match="data.target = 'class' in replace"):
        back.replace(data={"target": "class"}, model={"loss": "squared-error"})


def test_model_json_names_targets_in_place_of_classes():
    """An optional field of version 1: a regressor's file round-trips, a classifier's is as
    before, and a file that mixes them up is refused in one line."""
    spec = ModelSpec((3, 4, 2), "tanh", "squared-error", "float64", Normalization(), (),
                     ("rooms", "age", "dist"), {"epochs": 2}, ("price", "tax"))
    doc = json.loads(spec.to_json())
    assert doc["version"] == 1 and doc["targets"] == ["price", "tax"] and "classes" not in doc
    assert doc["network"]["output"] == "identity"
    assert ModelSpec.from_dict(doc) == spec and ModelSpec.from_dict(doc).regression
    classifier = ModelSpec((3, 2), "tanh", "cross-entropy", "float64", Normalization(), (0, 1))
    assert "targets" not in json.loads(classifier.to_json())
    with pytest.raises(ModelFileError, match="1 targets for 2 outputs"):
        ModelSpec.from_dict({**doc, "targets": ["price"]})
    with pytest.raises(ModelFileError, match="'cross-entropy' has classes, not targets"):
        ModelSpec.from_dict({**doc, "network": {**doc["network"], "loss": "cross-entropy"},
                             "classes": [0, 1]})


# --- training ------------------------------------------------------------------------------

def test_a_synthetic_regression_learns_and_reports_no_accuracy(tmp_path):
    """The serial reference on the seeded synthetic regression: R^2 > 0.9 on its test
    split, no accuracy anywhere, targets named y0, y1 in model.json."""
    cfg = dtrain.load_config(None, [*SYNTHETIC, "graph.strategy=serial", "train.epochs=30",
                                    "data.samples=3000", "optim.name=adam", "optim.lr=0.01"])
    assert cfg.data.target == "value"
    result = dtrain.train(cfg, out=tmp_path, echo=None)
    s = result.summary
    assert s["test_r2"] > 0.9, s
    assert s["test_accuracy"] is None and s["final_train_accuracy"] is None
    assert 0 < s["test_mae"] < s["test_rmse"] < 1
    assert all(r["train_accuracy"] is None and r["val_accuracy"] is None for r in result.metrics)
    assert result.metrics[-1]["val_loss"] < result.metrics[0]["val_loss"] / 2
    doc = json.loads((tmp_path / "model.json").read_text())
    assert doc["version"] == 1 and doc["network"]["output"] == "identity"
    assert doc["targets"] == ["y0", "y1"] and "classes" not in doc
    model = dtrain.load(tmp_path)
    x, t = synthetic_rows(cfg.data, np.arange(2400, 3000))               # the test split
    assert model.score(x, t) == pytest.approx(skm.r2_score(t, model.predict(x)), rel=1e-12)
    assert model.score(x, t) == pytest.approx(s["test_r2"], rel=1e-9)


def _run(client: Client | None, sets: list[str], out: Path) -> dtrain.RunResult:
    return dtrain.train(dtrain.load_config(None, [*SYNTHETIC, *sets]), client=client, out=out,
                        echo=None)


@pytest.mark.slow
def test_bit_identical_on_1_2_3_workers_and_every_strategy_agrees(client, tmp_path):
    """allreduce: params.npz byte for byte the same on 1, 2 and 3 workers (and the running
    train loss too); parameter-server, local-sgd (one step a round) and model-parallel
    train the same regression as the serial reference, as for classification."""
    blobs, losses = {}, {}
    for n in (1, 3):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as lc, Client(lc) as c:
            r = _run(c, [], tmp_path / f"w{n}")
            blobs[n], losses[n] = (tmp_path / f"w{n}" / "params.npz").read_bytes(), \
                [m["train_loss"] for m in r.metrics]
    ref = _run(client, [], tmp_path / "w2")
    assert blobs[1] == blobs[3] == (tmp_path / "w2" / "params.npz").read_bytes()
    assert losses[1] == losses[3] == [m["train_loss"] for m in ref.metrics]
    serial = _run(None, ["graph.strategy=serial"], tmp_path / "serial")
    others = {s: _run(client, [f"graph.strategy={s}", "graph.sync_every=1"], tmp_path / s)
              for s in ("parameter-server", "local-sgd", "model-parallel")}
    for name, r in {"allreduce": ref, **others}.items():
        for k, v in serial.params.items():
            np.testing.assert_allclose(r.params[k], v, rtol=1e-10, atol=1e-12, err_msg=name)
        assert r.summary["test_r2"] == pytest.approx(serial.summary["test_r2"], rel=1e-9)
        assert r.summary["test_accuracy"] is None and r.metrics[-1]["train_accuracy"] is None


def test_step_events_of_a_regression_carry_no_accuracy(client):
    """What the console's progress line and the live page read: None, not 0."""
    assert plan(dtrain.load_config(None, SYNTHETIC)).recipe.events("r").accuracy is False
    assert plan(dtrain.load_config()).recipe.events("r").accuracy is True

    def send(accuracy: bool) -> None:
        step = Step(0, 0, 0, 0.1, 4, True, True, ())
        after = TrainState(np.zeros(3), 2.0, 4, 0)
        events.step_event(StepEvents(f"reg{accuracy}", 0.0, accuracy), step, after, after)

    for accuracy in (False, True):
        client.submit(send, accuracy, pure=False).result()
    got: dict[bool, list] = {}
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:    # events reach the scheduler later
        got = {a: e for a in (False, True)
               if (e := [m for _, m in client.get_events(events.topic(f"reg{a}"))])}
        time.sleep(0.05)
    assert got[False][-1]["epoch_accuracy"] is None
    assert got[True][-1]["epoch_accuracy"] == 0.0
    assert got[False][-1]["epoch_loss"] == 0.5


# --- a CSV through the command line ------------------------------------------------------------

def _houses(path: Path, rows: int = 400, targets: tuple[str, ...] = ("price",),
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A CSV of three features and numeric targets, a header naming them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 3)) * [2, 15, 1] + [4, 40, 0]
    z = (x - [4, 40, 0]) / [2, 15, 1]
    t = np.stack([30 + 5 * z[:, 0] - 3 * np.tanh(z[:, 1]) + z[:, 2] ** 2, 2 * z[:, 2] - z[:, 0]],
                 axis=1)[:, :len(targets)] + 0.05 * rng.standard_normal((rows, len(targets)))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*FEATURES, *targets])
        w.writerows([*map(repr, a.tolist()), *map(repr, b.tolist())] for a, b in zip(x, t))
    return x, t


@pytest.fixture(scope="module")
def houses(tmp_path_factory) -> tuple[Path, Path]:
    """A regression trained from a CSV by ``python -m dtrain`` (the serial strategy: the
    strategies on clusters are tested above): its CSV, its run."""
    tmp = tmp_path_factory.mktemp("houses")
    _houses(tmp / "houses.csv")
    out = tmp / "run"
    proc = run_cli("--set", "data.dataset=csv", "--set", f"data.path={tmp / 'houses.csv'}",
                   "--set", "model.loss=squared-error", "--set", "model.layers=[3, 16, 1]",
                   "--set", "train.epochs=30", "--set", "train.batch_size=40",
                   "--set", "optim.name=sgd", "--set", "optim.lr=0.1",
                   "--set", "graph.strategy=serial", "--out", str(out), timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "test_r2 " in proc.stdout and "test_accuracy" not in proc.stdout
    assert "train_acc -" in proc.stdout and "val_acc -" in proc.stdout
    return tmp / "houses.csv", out


def _main(capfd, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    seen = capfd.readouterr()
    return code, seen.out, seen.err


def test_a_csv_regression_trains_and_predicts_through_the_cli(houses, tmp_path, capfd):
    path, run = houses
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test_r2"] > 0.9 and summary["test_accuracy"] is None
    spec = json.loads((run / "model.json").read_text())
    assert spec["targets"] == ["price"] and spec["features"]["names"] == list(FEATURES)
    code, out, err = _main(capfd, "predict", str(run), "--data", str(path), "--out",
                           str(tmp_path / "p.csv"))
    assert code == 0, err
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "price" and len(lines) == 401
    model = dtrain.load(run)
    x = np.loadtxt(path, delimiter=",", skiprows=1)[:, :3]
    assert model.predict(x).shape == (400,)
    assert [float(v) for v in lines[1:]] == model.predict(x).tolist()      # exact text
    assert not hasattr(model, "predict_proba") and not hasattr(model, "classes_")
    with pytest.raises(AttributeError, match="has no predict_proba"):
        model.predict_proba(x)


def test_evaluate_gives_the_summarys_figures_and_scikit_learns(houses, tmp_path, capfd):
    """On the run's own test split: the summary's test loss and R^2 to the last bit.  On a
    CSV: MSE, RMSE, MAE and R^2 as scikit-learn computes them."""
    path, run = houses
    summary = json.loads((run / "summary.json").read_text())
    code, out, err = _main(capfd, "evaluate", str(run))
    assert code == 0, err
    doc = json.loads((run / "evaluation.json").read_text())
    assert doc["loss"] == summary["test_loss"] and doc["r2"] == summary["test_r2"]
    assert doc["rmse"] == summary["test_rmse"] and doc["mae"] == summary["test_mae"]
    assert "confusion" not in out and "accuracy" not in out and "price" in out
    code, out, err = _main(capfd, "evaluate", str(run), "--data", str(path), "--out",
                           str(tmp_path / "e.json"))
    assert code == 0, err
    doc = json.loads((tmp_path / "e.json").read_text())
    data = np.loadtxt(path, delimiter=",", skiprows=1)
    x, t = data[:, :3], data[:, 3]
    z = dtrain.load(run).predict(x)
    assert doc["samples"] == 400 and doc["targets"] == ["price"]
    assert doc["r2"] == pytest.approx(skm.r2_score(t, z), rel=1e-12)
    assert doc["per_target"]["price"]["mae"] == pytest.approx(skm.mean_absolute_error(t, z),
                                                              rel=1e-12)
    assert doc["rmse"] == pytest.approx(skm.root_mean_squared_error(t, z), rel=1e-12)


@pytest.mark.slow
def test_evaluate_in_parts_on_a_cluster_gives_the_figures_of_the_whole(houses, tmp_path):
    """Four parts, four tasks on an embedded cluster, their sums merged: the same figures
    as one pass in this process."""
    path, run = houses
    whole = run_cli("evaluate", str(run), "--data", str(path), "--out", str(tmp_path / "1.json"))
    cut = run_cli("evaluate", str(run), "--data", str(path), "--chunk-rows", "100",
                  "--workers", "2", "--out", str(tmp_path / "4.json"), timeout=240)
    assert whole.returncode == 0 and cut.returncode == 0, whole.stderr + cut.stderr
    one, parts = (json.loads((tmp_path / f"{n}.json").read_text()) for n in (1, 4))
    assert parts["samples"] == one["samples"] == 400
    for k in ("mse", "rmse", "mae", "r2", "loss"):
        assert parts[k] == pytest.approx(one[k], rel=1e-12), k


def test_the_onnx_export_of_a_regression_runs_in_onnxruntime(houses, tmp_path, capfd):
    path, run = houses
    code, out, err = _main(capfd, "export", str(run), "--format", "onnx", "--out",
                           str(tmp_path / "m.onnx"), "--dtype", "float64")
    assert code == 0 and "1 target)" in out, out + err
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["variable"]
    x = np.loadtxt(path, delimiter=",", skiprows=1)[:, :3]
    (got,) = session.run(None, {"input": x})
    assert got.shape == (400, 1)
    np.testing.assert_allclose(got[:, 0], dtrain.load(run).predict(x), rtol=1e-12, atol=1e-12)


def test_several_target_columns_by_name(tmp_path, capfd):
    """data.label names two target columns; predict writes one column per target, named
    after it, and evaluate finds them in a CSV by the names the model knows."""
    path = tmp_path / "two.csv"
    x, t = _houses(path, rows=300, targets=("price", "tax"))
    cfg = dtrain.load_config(None, ["data.dataset=csv", f"data.path={path}",
                                    "data.label=price, tax", "model.loss=squared-error",
                                    "model.layers=[3, 16, 2]", "graph.strategy=serial",
                                    "train.epochs=40", "optim.name=momentum",
                                    "optim.lr=0.01"])
    result = dtrain.train(cfg, out=tmp_path / "run", echo=None)
    assert result.summary["test_r2"] > 0.8, result.summary
    model = dtrain.load(tmp_path / "run")
    assert model.targets_.tolist() == ["price", "tax"] and model.predict(x).shape == (300, 2)
    code, out, err = _main(capfd, "predict", str(tmp_path / "run"), "--data", str(path),
                           "--out", str(tmp_path / "p.csv"))
    assert code == 0, err
    rows = list(csv.reader((tmp_path / "p.csv").read_text().splitlines()))
    assert rows[0] == ["price", "tax"] and len(rows) == 301
    np.testing.assert_array_equal(np.array(rows[1:], dtype=float), model.predict(x))
    report = model.evaluate(x, t)
    assert report.to_dict()["r2"] == pytest.approx(skm.r2_score(t, model.predict(x)), rel=1e-12)
    assert list(report.to_dict()["per_target"]) == ["price", "tax"]


# --- bad input ----------------------------------------------------------------------------------

def _text_target(tmp: Path) -> list[str]:
    path = tmp / "words.csv"
    _houses(path, rows=20)
    lines = path.read_text().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",expensive"
    path.write_text("\n".join(lines) + "\n")
    return ["--set", "data.dataset=csv", "--set", f"data.path={path}",
            "--set", "model.loss=squared-error", "--set", "model.layers=[3, 8, 1]"]


def _one_target_two_outputs(tmp: Path) -> list[str]:
    _houses(tmp / "ok.csv", rows=20)
    return ["--set", "data.dataset=csv", "--set", f"data.path={tmp / 'ok.csv'}",
            "--set", "model.loss=squared-error", "--set", "model.layers=[3, 8, 2]"]


BAD = [
    ("a target that is not a number", _text_target,
     "words.csv: line 6, target column price: 'expensive' is not a number; a regression"),
    ("a regression on a dataset of classes", lambda t: ["--set", "model.loss=squared-error"],
     "learns real-valued targets, but dataset 'iris' has classes"),
    ("classes asked of a regression loss",
     lambda t: ["--set", "model.loss=squared-error", "--set", "data.target=class",
                "--set", "data.dataset=synthetic", "--set", "model.layers=[20, 1]"],
     "data.target = 'class' in"),
    ("more outputs than targets", _one_target_two_outputs,
     "model.layers[-1] = 2 but ok.csv has 1 targets"),
]


@pytest.mark.parametrize("make_args, message", [pytest.param(a, m, id=n) for n, a, m in BAD])
def test_bad_regression_input_gets_one_line_and_exit_2(tmp_path, make_args, message, capfd):
    out = tmp_path / "run"
    code = cli.main([*make_args(tmp_path), "--out", str(out), "--dashboard-address", ""])
    err = capfd.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtrain: error: "), err
    assert message in lines[0], lines[0]
    assert not (out / "summary.json").exists()


def test_a_regressor_is_picklable_and_says_what_it_is(tmp_path):
    """What Dask ships to the workers for a lazy predict, and what a user sees."""
    dtrain.train(dtrain.load_config(None, [*SYNTHETIC, "graph.strategy=serial",
                                           "train.epochs=1"]), out=tmp_path, echo=None)
    model = pickle.loads(pickle.dumps(dtrain.load(tmp_path)))
    assert repr(model).endswith("targets=['y0', 'y1'])") and model.regression
