"""The estimators in scikit-learn's machinery and by its names: clone, pipelines, grid search
(also in joblib's workers) and cross-validation, pickling, NotFittedError, scikit-learn's own
estimator checks; the parameters and fitted attributes as scikit-learn names them and as the
documentation's tables list them; ``random_state``, ``verbose``; the parameters dtrain cannot
train with, and the errors users catch as scikit-learn's ``ValueError``.
"""
from __future__ import annotations

import pickle
import re
import warnings

import numpy as np
import pytest
from sklearn import neural_network as sk
from sklearn.base import clone, is_classifier
from sklearn.datasets import load_iris
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import dtrain
from conftest import REPO
from helpers.estimators_common import FEATURES, QUICK, _clf, _frame, _iris, _quiet, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- scikit-learn's machinery -----------------------------------------------------------------

def test_clone_keeps_the_client_and_copies_the_rest(client):
    clf = _clf(client, hidden_layer_sizes=[8, 4]).fit(*_iris())
    twin = clone(clf)
    assert twin.client is client and twin.hidden_layer_sizes == [8, 4]
    assert twin.hidden_layer_sizes is not clf.hidden_layer_sizes
    assert not hasattr(twin, "classes_")
    assert twin.get_params()["max_iter"] == 20


def test_pipeline_grid_search_and_cross_validation(client):
    x, y = _iris()
    pipe = make_pipeline(StandardScaler(), _clf(client, max_iter=10)).fit(x, y)
    assert pipe.score(x, y) >= 0.8
    grid = GridSearchCV(_clf(client, max_iter=10), {"hidden_layer_sizes": [(4,), (8,)]},
                        cv=2).fit(x, y)
    assert grid.best_params_["hidden_layer_sizes"] in [(4,), (8,)]
    assert grid.best_estimator_.client is client and grid.score(x, y) >= 0.8
    scores = cross_val_score(_clf(client, max_iter=10), x, y, cv=3)
    assert scores.shape == (3,) and scores.min() >= 0.7


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


def test_pickling_drops_the_client_and_keeps_the_model(client):
    x, y = _iris()
    clf = _clf(client).fit(x, y)
    back = pickle.loads(pickle.dumps(clf))
    assert back.client is None and clf.client is client
    np.testing.assert_array_equal(back.predict_proba(x), clf.predict_proba(x))


@pytest.mark.parametrize("method", ["predict", "predict_proba", "score"])
def test_calls_before_fit_raise_not_fitted(method):
    x, y = _iris()
    args = (x, y) if method == "score" else (x,)
    with pytest.raises(NotFittedError):
        getattr(dtrain.MLPClassifier(), method)(*args)


# --- scikit-learn's estimator checks ----------------------------------------------------------

CHECKED = [dtrain.MLPClassifier(max_iter=20), dtrain.MLPRegressor(max_iter=20),
           dtrain.MLPClassifier(), dtrain.MLPRegressor()]


ALL_CHECKS = parametrize_with_checks(CHECKED)


# what the fast tier runs of them, at max_iter=20
QUICK_CHECKS = {"check_regressors_train", "check_estimators_nan_inf", "check_dtype_object",
                "check_sample_weight_equivalence_on_dense_data"}


def _only(mark: pytest.MarkDecorator, max_iter: int, names: set[str]) -> pytest.MarkDecorator:
    """``parametrize_with_checks``'s parametrization, cut to the checks named, of the
    estimators with ``max_iter``."""
    argnames, values = mark.args[:2]
    ids = mark.kwargs["ids"]            # a check's name, with its variant's arguments if any
    kept = [v for v in values if v[0].max_iter == max_iter and ids(v[1]) in names]
    return pytest.mark.parametrize(argnames, kept, **mark.kwargs)


def _check(estimator, check) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


@pytest.mark.slow
@ALL_CHECKS
def test_scikit_learns_estimator_checks(estimator, check):
    """Every check of scikit-learn's, on both estimators with the defaults and with
    max_iter=20, on the embedded cluster; each check its own test.  Nothing is declared
    expected to fail: the checks skipped (array-API input without SCIPY_ARRAY_API, no
    decision_function) are skipped for scikit-learn's own MLPs too."""
    _check(estimator, check)


@_only(ALL_CHECKS, 20, QUICK_CHECKS)
def test_scikit_learns_checks_that_failed_before(estimator, check):
    """The fast tier's share of the checks above: NaN and inf named, an integer y as
    objects, R^2 after 20 epochs, sample weights as repeated rows."""
    _check(estimator, check)


# --- parameters and fitted attributes ---------------------------------------------------------

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


def test_verbose_prints_scikit_learns_lines(client, capsys):
    """scikit-learn's test_verbose_sgd, and lines a script parses as it parses
    scikit-learn's, in place of dtrain's epoch table."""
    x, y = [[3, 2], [1, 6]], [1, 0]
    pattern = re.compile(r"Iteration (\d+), loss = (\d+\.\d{8})")
    for make in (sk.MLPClassifier, lambda **p: dtrain.MLPClassifier(client=client, **p)):
        clf = make(solver="sgd", max_iter=2, verbose=10, hidden_layer_sizes=2)
        _quiet(clf.fit, x, y)
        clf.partial_fit(x, y)
        lines = capsys.readouterr().out.splitlines()
        assert [int(pattern.fullmatch(line).group(1)) for line in lines] == [1, 2, 1]
    assert float(pattern.fullmatch(lines[-1]).group(2)) == pytest.approx(clf.loss_, abs=1e-8)
    x, y = _iris()
    _quiet(dtrain.MLPClassifier(max_iter=3, verbose=True, early_stopping=True,
                                client=client).fit, x, y)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and all(re.fullmatch(r"Validation score: \d\.\d{6}", line)
                                   for line in lines[1::2])


@pytest.mark.parametrize("params, message", [
    ({"solver": "lbfgs", "strategy": "local-sgd"}, "strategy = 'local-sgd' with solver = "
                                                    "'lbfgs'"),
    ({"activation": "softplus"}, "activation = 'softplus': must be"),
    ({"learning_rate_init": 0}, "learning_rate_init = 0: must be a number > 0"),
    ({"hidden_layer_sizes": (8, 0)}, "hidden_layer_sizes"),
    ({"strategy": "model-parallel"}, "strategies that train on partitions where they sit"),
    ({"learning_rate": "optimal"}, "learning_rate = 'optimal': must be 'constant', "
                                   "'invscaling' or 'adaptive'"),
    ({"max_fun": 0}, "max_fun = 0: must be an integer >= 1"),
    ({"solver": "sgd", "learning_rate": "adaptive", "strategy": "local-sgd", "sync_every": 4},
     "optim.schedule = 'adaptive'"),
    ({"loss": "huber"}, "loss = 'huber': must be 'squared_error' or 'poisson'"),
    ({"n_iter_no_change": 0}, r"n_iter_no_change = 0: must be an integer >= 1"),
])
def test_parameters_dtrain_cannot_train_with(params, message, client):
    make = dtrain.MLPRegressor if "loss" in params else dtrain.MLPClassifier
    with pytest.raises(ValueError, match=message):
        make(client=client, **{**QUICK, **params}).fit(*_iris())


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


# --- errors users catch as ValueError ---------------------------------------------------------

def _fails_alike(theirs, ours, x, y, match: str) -> str:
    """Both raise a ValueError matching ``match``; dtrain's text (which must name no config
    key) is returned."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=match):
            theirs.fit(x, y)
        with pytest.raises(ValueError, match=match) as caught:
            ours.fit(x, y)
    text = str(caught.value)
    assert not re.search(r"\b(train|data|optim|model|graph)\.\w+", text), text
    assert "\n" not in text
    return text


def test_huge_inputs_raise_scikit_learns_value_error(client):
    """scikit-learn's test_nonfinite_params: scikit-learn's ValueError, not dtrain.Diverged."""
    rng = np.random.RandomState(0)
    x = np.finfo(np.float64).max * rng.uniform(size=(10, 2))
    y = rng.standard_normal(size=10)
    _fails_alike(sk.MLPRegressor(), dtrain.MLPRegressor(client=client), x, y,
                 "Solver produced non-finite parameter weights. The input data may contain "
                 "large values and need to be preprocessed.")


def test_a_validation_set_too_small_is_a_value_error_naming_the_parameter(client):
    """scikit-learn's test_minimum_input_sample_size and test_early_stopping_stratified
    a ValueError that names the estimator's parameter, not the config keys behind it
    (train.patience, data.split)."""
    from sklearn.datasets import make_regression

    x, y = make_regression(n_samples=2, n_features=5, random_state=0)
    text = _fails_alike(sk.MLPRegressor(early_stopping=True, random_state=0),
                        dtrain.MLPRegressor(early_stopping=True, random_state=0, client=client),
                        x, y, "validation set is too small")
    assert "validation_fraction" in text
    x, y = [[1, 2], [2, 3], [3, 4], [4, 5]], [0, 0, 0, 1]
    with pytest.raises(ValueError, match="least populated class"):
        sk.MLPClassifier(early_stopping=True).fit(x, y)
    with pytest.raises(ValueError, match="validation_fraction") as caught:
        dtrain.MLPClassifier(early_stopping=True, client=client).fit(x, y)
    assert not isinstance(caught.value, dtrain.UserError) or "train." not in str(caught.value)


def test_one_class_is_refused_in_one_line_saying_what_scikit_learn_does(client):
    """scikit-learn fits a constant classifier; dtrain refuses, saying so, and the
    parameter tables say so too."""
    x, y = load_iris(return_X_y=True)                  # the first 50 rows are setosa, 0
    assert (_quiet(sk.MLPClassifier(max_iter=5).fit, x[:10], y[:10]).predict(x) == 0).all()
    with pytest.raises(ValueError, match=r"y holds 1 class \(0\).*scikit-learn's "
                                         r"MLPClassifier fits one that always predicts it"):
        dtrain.MLPClassifier(max_iter=5, client=client).fit(x[:10], y[:10])
    docs = (REPO / "docs" / "python-and-dask.md").read_text()
    assert re.search(r"\| `classes_` \| differs: .*one class.*refused", docs)
