"""The estimators as scikit-learn users expect them (issue 28): learning as scikit-learn's
MLPs learn, sample weights, the parameters and fitted attributes scikit-learn names,
multilabel, several targets and sparse input, the logistic output through a saved model,
the command line and ONNX, the documentation's tables, and ``strategy="auto"``."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from sklearn.base import is_classifier
from sklearn.model_selection import GridSearchCV

import dask.array as da
import dask.dataframe as dd
import dtrain
from conftest import REPO
from dtrain.core.config import ClusterConfig
from helpers.estimators_common import FEATURES, QUICK, SPECIES, _clf, _frame, _iris, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- issue 28: as scikit-learn users expect them ----------------------------------------------

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


@pytest.mark.filterwarnings("ignore:Got `batch_size` larger than sample size")
def test_sample_weights_are_repeated_rows(client):
    """Item 2: integer weights train as the rows repeated that many times (a weight 0 as the
    row left out): the normalization, the loss, the gradient and alpha's term; in fit and
    partial_fit."""
    x, y = _iris()
    w = np.random.default_rng(3).integers(0, 4, len(y))
    full = {"batch_size": 1000, "max_iter": 5, "solver": "adam", "learning_rate_init": 0.01}
    weighted = _clf(client, **full).fit(x, y, sample_weight=w)
    repeated = _clf(client, **full).fit(x.repeat(w, axis=0), y.repeat(w))
    np.testing.assert_allclose(weighted.predict_proba(x), repeated.predict_proba(x), rtol=1e-9)
    assert weighted.loss_curve_ == pytest.approx(repeated.loss_curve_, rel=1e-9)
    step = _clf(client, **full).partial_fit(x, y, sample_weight=w, classes=[0, 1, 2])
    once = _clf(client, **full).partial_fit(x.repeat(w, axis=0), y.repeat(w), classes=[0, 1, 2])
    np.testing.assert_allclose(step.predict_proba(x), once.predict_proba(x), rtol=1e-9)
    ones = _clf(client, max_iter=3).fit(x, y, sample_weight=np.ones(len(y)))
    np.testing.assert_allclose(ones.predict_proba(x), _clf(client, max_iter=3).fit(x, y)
                               .predict_proba(x), rtol=1e-9)             # weights 1: as none


def test_sample_weights_of_dask_inputs_travel_with_their_partitions(client):
    x, y = _iris()
    w = np.random.default_rng(3).integers(0, 4, len(y)).astype(float)
    in_memory = _clf(client, max_iter=3, shards=3).fit(x, y, sample_weight=w)
    arrays = _clf(client, max_iter=3).fit(da.from_array(x, chunks=(50, 4)),
                                          da.from_array(y, chunks=50),
                                          sample_weight=da.from_array(w, chunks=50))
    frame = dd.from_pandas(pd.DataFrame(x).assign(label=y, w=w), npartitions=3)
    frames = _clf(client, max_iter=3).fit(frame[[0, 1, 2, 3]], frame["label"],
                                          sample_weight=frame["w"])
    assert _same_bytes(in_memory, arrays) and _same_bytes(in_memory, frames)


@pytest.mark.parametrize("weights, message", [
    (-np.ones(150), "NaN, infinite or negative"),
    (np.zeros(150), "(?i)sample weights must contain at least one non-zero"),
    (np.ones(149), "149"),
    ((_iris()[1] == 2).astype(float), "leaves 1 class of positive weight"),
])
def test_bad_sample_weights_say_what_is_wrong(weights, message, client):
    with pytest.raises(ValueError, match=message):
        _clf(client, max_iter=2).fit(*_iris(), sample_weight=weights)


def test_the_parameters_a_grid_search_names(client):
    """Item 3: learning_rate, power_t, nesterovs_momentum, max_fun and the regressor's loss
    are parameters (so GridSearchCV can search them) and reach the run's config."""
    from dtrain.estimators import settings

    x, y = _iris()
    grid = GridSearchCV(_clf(client, solver="sgd", max_iter=5),
                        {"learning_rate": ["constant", "invscaling", "adaptive"]},
                        cv=2).fit(x, y)
    assert len(grid.cv_results_["params"]) == 3 and grid.best_score_ > 0.5
    for name in ("learning_rate", "power_t", "nesterovs_momentum", "max_fun"):
        assert name in dtrain.MLPClassifier().get_params()
    assert dtrain.MLPRegressor().get_params()["loss"] == "squared_error"
    shape = settings.Shape(4, 3, 150, 4)

    def optim(**params):
        est = dtrain.MLPClassifier(**params)
        return settings.config(est, shape, "cross-entropy", incremental=False).optim

    sgd = optim(solver="sgd", learning_rate="invscaling", power_t=0.25)
    assert (sgd.name, sgd.nesterov, sgd.schedule, sgd.power_t) == ("momentum", True,
                                                                   "invscaling", 0.25)
    adaptive = optim(solver="sgd", learning_rate="adaptive", n_iter_no_change=3, tol=0.01)
    assert (adaptive.schedule, adaptive.patience, adaptive.min_delta, adaptive.gamma) == \
        ("adaptive", 3, 0.01, 0.2)
    assert optim(solver="adam", learning_rate="adaptive").schedule == "constant"  # as sklearn
    assert optim(solver="sgd", nesterovs_momentum=False).nesterov is False
    assert optim(solver="sgd", momentum=0.0).name == "sgd"
    assert dtrain.MLPClassifier(max_fun=7, **QUICK, client=client).fit(x, y).n_iter_ == 20
    nesterov = _clf(client, solver="sgd", max_iter=3).fit(x, y)
    classical = _clf(client, solver="sgd", max_iter=3, nesterovs_momentum=False).fit(x, y)
    assert not _same_bytes(nesterov, classical)


def test_fitted_attributes_as_scikit_learn_names_them(client):
    """Item 4: loss_; two classes as one logistic output ((h, 1) last layer, n_outputs_ 1)
    and predict_proba's two columns from it; float32 rows give float32 probabilities."""
    x, y = _iris()
    two = y != 2
    clf = _clf(client).fit(x[two], y[two])
    assert clf.loss_ == clf.loss_curve_[-1]
    assert (clf.n_outputs_, clf.out_activation_) == (1, "logistic")
    assert [c.shape for c in clf.coefs_] == [(4, 8), (8, 1)] and clf.intercepts_[-1].shape == (1,)
    proba = clf.predict_proba(x[two])
    assert proba.shape == (100, 2) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert (clf.classes_[(proba[:, 1] > 0.5).astype(int)] == clf.predict(x[two])).all()
    assert clf.score(x[two], y[two]) == 1.0
    assert clf.predict_proba(x[two].astype(np.float32)).dtype == np.float32
    three = _clf(client).fit(x, y)
    assert (three.n_outputs_, three.out_activation_) == (3, "softmax")
    assert three.predict_proba(x.astype(np.float32)).dtype == np.float32
    reg = dtrain.MLPRegressor(client=client, max_iter=5).fit(x[:, :3], x[:, 3])
    assert reg.predict(x[:, :3].astype(np.float32)).dtype == np.float32


def test_three_rows_fit(client):
    """Item 5: the default shard count follows the data: three rows fit, where four shards
    would not."""
    x, y = _iris()
    clf = dtrain.MLPClassifier(client=client, max_iter=5).fit(x[[0, 60, 120]], y[[0, 60, 120]])
    assert clf.summary_["shards"] == 1 and clf.predict(x[:2]).shape == (2,)   # a tiny step
    assert dtrain.MLPClassifier().shards == "auto"


@pytest.mark.slow
def test_grid_search_with_n_jobs_trains_in_joblib_workers():
    """Item 6: in a loky worker the embedded cluster is an in-process one (worker processes
    cannot start there: "cannot find context for 'loky'"), and the search gives what the
    same search gives in this process."""
    x, y = _iris()
    search = {"alpha": [1e-4, 1e-2]}
    made = [GridSearchCV(dtrain.MLPClassifier(**QUICK), search, cv=2, n_jobs=n,
                         error_score="raise").fit(x, y) for n in (2, 1)]
    assert made[0].cv_results_["mean_test_score"].tolist() == \
        made[1].cv_results_["mean_test_score"].tolist()
    assert made[0].best_score_ > 0.8


def test_an_in_process_cluster_trains_the_same_bytes(client):
    """Item 6: what a process that cannot start worker processes gets (this one can): one
    worker of threads in the process, training the bytes a cluster of processes trains."""
    from dtrain.estimators import cluster

    assert cluster.can_start_processes()
    with cluster.in_process(ClusterConfig()) as lc, Client(lc, set_as_default=False) as c:
        info = c.scheduler_info()["workers"]
        assert len(info) == 1 and next(iter(info)).startswith("inproc://")
        fitted = _clf(c, max_iter=3).fit(*_iris())
    assert _same_bytes(fitted, _clf(client, max_iter=3).fit(*_iris()))


def test_random_state_none_draws_a_fresh_seed_per_fit(client):
    """Item 7: None is a fresh seed each fit, drawn from NumPy's global random state as
    scikit-learn draws it; an integer keeps the bytes."""
    x, y = _iris()

    def fit(**params):
        return _clf(client, max_iter=2, **params).fit(x, y)

    assert not _same_bytes(fit(random_state=None), fit(random_state=None))
    np.random.seed(5)
    first = fit(random_state=None)
    np.random.seed(5)
    assert _same_bytes(first, fit(random_state=None))
    assert _same_bytes(fit(random_state=3), fit(random_state=3))


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


def test_sparse_x_is_made_dense_block_by_block(client):
    """Item 8: a scipy.sparse X trains as its dense rows (the same bytes) and predicts."""
    from scipy import sparse

    x, y = _iris()
    x = np.where(x < 1.5, 0.0, x)
    dense = _clf(client).fit(x, y)
    for kind in (sparse.csr_matrix, sparse.csc_array):
        fitted = _clf(client).fit(kind(x), y)
        assert _same_bytes(fitted, dense)
        assert (fitted.predict(kind(x)) == dense.predict(x)).all()


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


# --- the documentation's tables of parameters and attributes ----------------------------------

def _docs_table(header: str) -> dict[str, str]:
    """The rows of docs/python-and-dask.md's table whose first column is headed ``header``:
    name -> what it says (a row may name several, ``a``, ``b``)."""
    import re

    text = (REPO / "docs" / "python-and-dask.md").read_text()
    block = re.search(rf"\| {header} \| in dtrain \|\n\| --- \| --- \|\n((?:\|.*\n)+)", text)
    assert block, f"docs/python-and-dask.md has no table headed '{header}'"
    rows = {}
    for line in block.group(1).splitlines():
        names, what = (c.strip() for c in line.strip("|").split("|", 1))
        for name in re.findall(r"`(\w+)`", names):
            rows[name] = what
    return rows


def _says_how(rows: dict[str, str]) -> None:
    import re

    for name, what in rows.items():
        assert re.match(r"(same\b|differs: \S|not supported: \S)", what), (name, what)


def test_the_docs_list_every_scikit_learn_parameter():
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    rows = _docs_table("parameter")
    theirs = set(MLPClassifier().get_params()) | set(MLPRegressor().get_params())
    assert set(rows) == theirs
    _says_how(rows)
    assert theirs <= set(dtrain.MLPClassifier().get_params()) | \
        set(dtrain.MLPRegressor().get_params())
    assert set(MLPRegressor().get_params()) <= set(dtrain.MLPRegressor().get_params())
    assert set(MLPClassifier().get_params()) == \
        set(dtrain.MLPClassifier().get_params()) - set(_OURS)


_OURS = ("client", "strategy", "sync_every", "fan_in", "dtype", "normalize", "shards", "rebalance",
         "out")


def test_the_docs_list_every_fitted_attribute(client):
    """Every attribute a fitted scikit-learn MLP has (early stopping or not, string column
    names), in the table; each one dtrain has, ours has too."""
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    df = _frame()
    x, y = df[FEATURES], df["species"]
    theirs = set()
    for est in (MLPClassifier(max_iter=5), MLPClassifier(max_iter=5, early_stopping=True),
                MLPRegressor(max_iter=5)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = est.fit(x, y if is_classifier(est) else x["petal width"])
        theirs |= {k for k in vars(fitted) if k.endswith("_") and not k.startswith("_")}
    rows = _docs_table("attribute")
    assert set(rows) == theirs
    _says_how(rows)
    ours = _clf(client, max_iter=2).fit(x, y)
    missing = [k for k in theirs if not rows[k].startswith("not supported")
               and not hasattr(ours, k)]
    assert not missing, missing


def test_auto_keeps_the_synchronous_step_on_partitions_spread_over_workers(client):
    """strategy="auto" is scikit-learn's synchronous step wherever the partitions sit: the
    same dask.dataframe fit on the client's two workers (each window a task per worker,
    the sums worker to worker) and on a one-worker cluster gives the same bytes."""
    from distributed import futures_of, wait
    df = _frame()
    params = {**QUICK, "random_state": 0, "max_iter": 30}
    ddf = client.persist(dd.from_pandas(df, npartitions=4))
    wait(futures_of(ddf))
    assert len({min(w) for w in client.who_has(futures_of(ddf)).values() if w}) == 2
    spread = dtrain.MLPClassifier(client=client, **params).fit(ddf, "species")
    assert spread.summary_["strategy"] == "allreduce"
    assert spread.summary_["spanned_windows"] > 0 and spread.summary_["workers"] == 2
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as one:
        alone = dtrain.MLPClassifier(client=one, **params).fit(
            one.persist(dd.from_pandas(df, npartitions=4)), "species")
        assert alone.summary_["spanned_windows"] == 0
    for a, b in zip(spread.coefs_ + spread.intercepts_, alone.coefs_ + alone.intercepts_):
        assert a.tobytes() == b.tobytes()
    x = df[FEATURES]
    assert spread.predict_proba(x).tobytes() == alone.predict_proba(x).tobytes()
