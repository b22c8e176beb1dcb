"""What the estimators learn to predict, as scikit-learn's MLPs do on the same data: classes,
values (squared error; ``loss="poisson"``, the Poisson GLM), several labels (a logistic output
each) or several targets, in the input's dtype; and a logistic output through a saved model, the
command line and ONNX.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import neural_network as sk

import dask.array as da
import dtrain
from helpers.estimators_common import BOTH, SPECIES, _clf, _digits, _iris, _quiet, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- classes and values -----------------------------------------------------------------------

def _check_data() -> tuple[np.ndarray, np.ndarray]:
    """check_regressors_train's data: 200 rows, 10 standardized features, y scaled."""
    from sklearn.preprocessing import scale
    from sklearn.utils.estimator_checks import _regression_dataset

    x, y = _regression_dataset()
    return x, scale(y)


@pytest.mark.parametrize("epochs", [20, pytest.param(200, marks=pytest.mark.slow)])
def test_the_regressor_learns_as_well_as_scikit_learns(epochs, client):
    """Item 1: R^2 on the estimator check's data at 20 and 200 epochs, beside scikit-learn's
    MLPRegressor with the same seed.  scikit-learn's initial weights, Adam and half the
    squared error make the same path, up to the shards' summing order."""
    from sklearn.neural_network import MLPRegressor

    x, y = _check_data()
    ours = dtrain.MLPRegressor(client=client, max_iter=epochs, random_state=0).fit(x, y)
    theirs = MLPRegressor(max_iter=epochs, random_state=0).fit(x, y)
    assert ours.score(x, y) == pytest.approx(theirs.score(x, y), abs=1e-4)
    assert ours.out_activation_ == "identity" and ours.n_outputs_ == 1


def test_regressor_fits_values_and_scores_r2(client):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 3))
    y = x @ np.array([1.5, -2.0, 0.5]) + 0.1 * rng.normal(size=400)
    reg = dtrain.MLPRegressor(client=client, hidden_layer_sizes=(16,), max_iter=60,
                              learning_rate_init=0.01).fit(x, y)
    assert not hasattr(reg, "classes_") and reg.predict(x).shape == (400,)
    assert reg.score(x, y) > 0.9
    X, Y = da.from_array(x, chunks=100), da.from_array(y, chunks=100)
    assert abs(reg.score(X, Y) - reg.score(x, y)) < 1e-9


def test_poisson_regression_is_the_poisson_glm(client, tmp_path):
    """scikit-learn's test_mlp_vs_poisson_glm_equivalent: one identity hidden unit, lbfgs,
    Poisson loss: the GLM's predictions; the model's exp output goes through dtrain.load and
    the ONNX export."""
    import onnxruntime as ort
    from sklearn.linear_model import PoissonRegressor

    from dtrain.inference.export import write_onnx

    n = 100
    rng = np.random.default_rng(42)
    x = np.linspace(0, 1, n)
    y = rng.poisson(np.exp(x + 1))
    x = x.reshape(n, -1)
    glm = PoissonRegressor(alpha=0, tol=1e-7).fit(x, y)
    params = {"loss": "poisson", "hidden_layer_sizes": (1,), "activation": "identity",
              "alpha": 0, "solver": "lbfgs", "tol": 1e-7}
    theirs = sk.MLPRegressor(random_state=np.random.RandomState(43), **params).fit(x, y)
    ours = dtrain.MLPRegressor(random_state=43, client=client, out=tmp_path / "run",
                               **params).fit(x, y)
    np.testing.assert_allclose(theirs.predict(x), glm.predict(x), rtol=1e-4)
    np.testing.assert_allclose(ours.predict(x), glm.predict(x), rtol=1e-4)
    assert ours.out_activation_ == theirs.out_activation_ == "exp"
    model = dtrain.load(tmp_path / "run")
    np.testing.assert_array_equal(model.predict(x), ours.predict(x))
    path = write_onnx(model.spec, ours._params, tmp_path / "m.onnx", dtype="float64")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx,) = session.run(["variable"], {"input": x})
    np.testing.assert_allclose(onnx[:, 0], ours.predict(x), rtol=1e-12)
    # negative targets: scikit-learn's fit gives a NaN loss, silently; dtrain refuses them
    assert math.isnan(_quiet(sk.MLPRegressor(loss="poisson", max_iter=5).fit, x, y - 3.0).loss_)
    with pytest.raises(ValueError, match="negative"):
        dtrain.MLPRegressor(loss="poisson", client=client).fit(x, y - 3.0)
    with pytest.raises(ValueError, match="the Poisson loss learns targets >= 0"):
        dtrain.MLPRegressor(loss="poisson", client=client, max_iter=2).fit(
            da.from_array(x, chunks=50), da.from_array(y - 3.0, chunks=50))


@pytest.mark.parametrize("dtype", [np.float32, pytest.param(np.float64,
                                                              marks=pytest.mark.slow)])
@pytest.mark.parametrize("estimators", BOTH)
def test_parameters_and_predictions_keep_the_input_dtype(estimators, dtype, client):
    """scikit-learn's test_mlp_param_dtypes: coefs_, intercepts_ and a regressor's
    predictions in X's dtype."""
    x, y = _digits()
    x = x.astype(dtype)
    params = {"alpha": 1e-5, "hidden_layer_sizes": (5, 3), "random_state": 1, "max_iter": 50,
              "tol": 1e-1}
    for est in (estimators[0](**params), estimators[1](client=client, **params)):
        _quiet(est.fit, x[:300], y[:300])
        assert all(c.dtype == dtype for c in est.coefs_ + est.intercepts_)
        if not hasattr(est, "predict_proba"):
            assert est.predict(x[300:]).dtype == dtype
    assert est.summary_["parameters"] and est.model_.spec.dtype == np.dtype(dtype).name


# --- several labels, several targets ----------------------------------------------------------

def test_multilabel_indicators_get_a_logistic_output_per_label(client):
    """Item 8: a sigmoid output per label; predict gives y's indicators and dtype."""
    from sklearn.datasets import make_multilabel_classification

    x, y = make_multilabel_classification(n_samples=120, n_features=5, n_classes=4,
                                          random_state=0)
    clf = dtrain.MLPClassifier(client=client, max_iter=60, learning_rate_init=0.01,
                               random_state=0).fit(x, y)
    assert (clf.n_outputs_, clf.out_activation_, clf.classes_.tolist()) == \
        (4, "logistic", [0, 1, 2, 3])
    predicted = clf.predict(x)
    assert predicted.shape == (120, 4) and predicted.dtype == y.dtype
    assert set(np.unique(predicted)) <= {0, 1}
    proba = clf.predict_proba(x)
    assert proba.shape == (120, 4) and ((proba > 0.5) == predicted).all()
    assert clf.score(x, y) == np.mean((predicted == y).all(axis=1)) > 0.3
    lazy = clf.predict(da.from_array(x, chunks=40))
    assert (lazy.compute() == predicted).all()


def test_several_regression_targets(client):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 4))
    y = np.stack([x @ [1.0, -1.0, 0.5, 0.0], np.tanh(x[:, 0]) + x[:, 3]], axis=1)
    reg = dtrain.MLPRegressor(client=client, hidden_layer_sizes=(16,), max_iter=30,
                              learning_rate_init=0.02, random_state=0).fit(x, y)
    assert reg.n_outputs_ == 2 and reg.predict(x).shape == (300, 2)
    assert reg.score(x, y) > 0.9
    X, Y = da.from_array(x, chunks=100), da.from_array(y, chunks=(100, 2))
    assert abs(reg.score(X, Y) - reg.score(x, y)) < 1e-9
    dask_fit = dtrain.MLPRegressor(client=client, hidden_layer_sizes=(16,), max_iter=5,
                                   random_state=0, shards=3, strategy="allreduce").fit(X, Y)
    memory_fit = dtrain.MLPRegressor(client=client, hidden_layer_sizes=(16,), max_iter=5,
                                     random_state=0, shards=3, strategy="allreduce").fit(x, y)
    assert _same_bytes(dask_fit, memory_fit)


# --- the logistic output kind: a saved model, the command line, ONNX --------------------------

@pytest.mark.parametrize("multilabel", [False, True], ids=["two-classes", "multilabel"])
def test_a_logistic_run_loads_predicts_and_exports(multilabel, client, tmp_path):
    """dtrain.load(run) predicts as the estimator did; the ONNX export's probabilities and
    labels are dtrain's (two classes: both columns from one output; multilabel: each
    label's indicator)."""
    import json

    import onnxruntime as ort

    from dtrain.inference.export import write_onnx

    x, y = _iris()
    if multilabel:
        y = np.stack([y == 0, y == 2, x[:, 0] > 5.8], axis=1).astype(np.int64)
        names = [0, 1, 2]
    else:
        x, y = x[y != 0], SPECIES[y[y != 0]]
        names = ["versicolor", "virginica"]
    clf = _clf(client, out=tmp_path / "run").fit(x, y)
    doc = json.loads((tmp_path / "run" / "model.json").read_text())
    assert doc["network"]["output"] == "logistic" and doc["network"]["layers"][-1] == \
        (3 if multilabel else 1)
    model = dtrain.load(tmp_path / "run")
    np.testing.assert_array_equal(model.predict(x), clf.predict(x))
    np.testing.assert_allclose(model.predict_proba(x), clf.predict_proba(x), rtol=1e-12)
    assert model.score(x, y) == clf.score(x, y)
    if not multilabel:
        assert model.classes_.tolist() == names
    path = write_onnx(model.spec, clf._params, tmp_path / "m.onnx", dtype="float64")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    label, proba = session.run(["label", "probabilities"], {"input": x})
    np.testing.assert_allclose(proba, clf.predict_proba(x), rtol=1e-12, atol=1e-12)
    assert label.tolist() == clf.predict(x).tolist()


def test_the_command_line_trains_two_classes_on_one_logistic_output(tmp_path, capfd):
    """model.loss = "binary-cross-entropy" with model.layers[-1] = 1; the default keeps two
    softmax outputs; three classes are refused in one line."""
    import json

    from dtrain import cli

    sets = ["data.dataset=synthetic", "data.classes=2", "data.samples=300",
            "model.layers=[20, 8, 1]", "model.loss=binary-cross-entropy",
            "graph.strategy=serial", "train.epochs=5", "optim.lr=0.5"]
    result = dtrain.train(dtrain.load_config(None, sets), out=tmp_path / "run", echo=None)
    assert result.summary["test_accuracy"] > 0.7 and result.model.output == "logistic"
    code = cli.main(["evaluate", str(tmp_path / "run")])
    out = capfd.readouterr().out
    assert code == 0 and f"accuracy {result.summary['test_accuracy']:.4f}" in out
    doc = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    assert doc["loss"] == result.summary["test_loss"]
    code = cli.main([*sum((["--set", v] for v in sets[:-1]), []), "--set",
                     "model.layers=[20, 8, 2]", "--set", "model.loss=cross-entropy",
                     "--out", str(tmp_path / "softmax"), "--set", "train.epochs=1"])
    capfd.readouterr()
    assert code == 0
    assert json.loads((tmp_path / "softmax" / "model.json").read_text())["network"][
        "output"] == "softmax"
    code = cli.main(["--set", "model.loss=binary-cross-entropy", "--set", "model.layers=[4,8,1]",
                     "--out", str(tmp_path / "iris"), "--dashboard-address", ""])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "learns two classes (one logistic output) but " \
        "iris has 3" in err[0]
