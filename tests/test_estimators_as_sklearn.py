"""The estimators beside scikit-learn's MLPs: each documented behaviour run on
both with the same arguments and data, most of them scikit-learn's own tests
(``sklearn/neural_network/tests/test_mlp.py``) run on dtrain's estimators too.

1 ``solver="lbfgs"``; 2 ``learning_rate="adaptive"`` stops; 3 the regressor's early
stopping on R^2; 4 ``n_iter_no_change=np.inf``; 5 float32; 6 errors as ``ValueError``;
7 a diverging fit with early stopping; 8 ``verbose``; 9 one class; 10 ``loss="poisson"``;
11 the default stop."""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest
from distributed import Client, LocalCluster
from sklearn import neural_network as sk
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import ConvergenceWarning

import dask.array as da
import dask.dataframe as dd
import dtrain
from conftest import REPO
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)
from helpers.estimators_common import _frame, _iris, _same_bytes

BOTH = [pytest.param((sk.MLPClassifier, dtrain.MLPClassifier), id="classifier"),
        pytest.param((sk.MLPRegressor, dtrain.MLPRegressor), id="regressor")]


def _digits(n: int | None = None, binary: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    if binary:
        x, y = x[y < 2], y[y < 2]
    return (x[:n], y[:n]) if n else (x, y)


def _quiet(fit, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit(*args, **kwargs)


def sklearn_stop(losses: list[float], patience: float, tol: float) -> int | None:
    """The epoch after which scikit-learn's rule stops a fit with these training losses
    (``_update_no_improvement_count``: more than ``patience`` epochs whose loss is not
    below the best before it by ``tol``), or None."""
    best, count = math.inf, 0
    for epoch, loss in enumerate(losses, start=1):
        count = count + 1 if loss > best - tol else 0
        best = min(best, loss)
        if count > patience:
            return epoch
    return None


# --- 1: solver="lbfgs" ------------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["relu", *(pytest.param(a, marks=pytest.mark.slow)
                                                  for a in ("identity", "logistic", "tanh"))])
def test_lbfgs_classifies_digits_as_scikit_learns(activation, client):
    """scikit-learn's test_lbfgs_classification: solver='lbfgs' on 150 digits, both above
    0.95."""
    x, y = _digits()
    params = {"solver": "lbfgs", "hidden_layer_sizes": 50, "max_iter": 150, "shuffle": True,
              "random_state": 1, "activation": activation}
    for est in (sk.MLPClassifier(**params), dtrain.MLPClassifier(client=client, **params)):
        _quiet(est.fit, x[:150], y[:150])
        assert est.score(x[:150], y[:150]) > 0.95
        assert est.predict(x[150:]).dtype.kind == y.dtype.kind
    assert est.summary_["solver"]["name"] == "lbfgs" and est.best_loss_ is not None


@pytest.mark.slow
def test_lbfgs_reaches_scikit_learns_loss_on_the_same_problem(client):
    """On the same problem (by default, lbfgs normalizes nothing: scikit-learn's initial
    weights on scikit-learn's inputs) dtrain's L-BFGS reaches scikit-learn's objective, the
    mean loss plus alpha's term, within 1%, in the same iterations, and both converge
    (scipy's gtol)."""
    x, y = _digits(300)
    theirs = sk.MLPClassifier(solver="lbfgs", random_state=0).fit(x, y)
    ours = dtrain.MLPClassifier(solver="lbfgs", random_state=0, client=client).fit(x, y)
    penalty = 0.5 * 1e-4 * sum((c * c).sum() for c in ours.coefs_) / len(y)
    assert ours.loss_ + penalty <= theirs.loss_ * 1.01
    assert ours.summary_["solver"]["status"] == 0 and ours.n_iter_ == theirs.n_iter_ < 200


def test_lbfgs_judges_tol_in_the_units_of_x(client):
    """``tol`` is scipy's ``gtol`` on the problem as given: the features 128 times larger
    give the same standardized inputs (a power of two: the same bytes), so the same
    iterates, but a gradient 128 times larger in X's units, so the fit goes on longer, its
    loss curve the first's and more (scipy's test on the standardized problem stopped both
    at once, on digits ~7 times above scikit-learn's objective)."""
    x, y = _iris()
    fits = [_quiet(dtrain.MLPClassifier(solver="lbfgs", hidden_layer_sizes=(8,), random_state=0,
                                        tol=1e-3, normalize="standardize",
                                        client=client).fit, x * c, y)
            for c in (1.0, 128.0)]
    short, long = (f.loss_curve_ for f in fits)
    assert fits[0].summary_["solver"]["status"] == 0, fits[0].summary_["solver"]
    assert len(short) < len(long) and long[:len(short)] == short


@pytest.mark.parametrize("estimators", BOTH)
def test_lbfgs_max_fun_limits_it_with_scikit_learns_warning(estimators, client):
    """scikit-learn's test_lbfgs_*_maxfun: max_fun=10 stops both, with a
    ConvergenceWarning, at most 10 iterations in."""
    theirs, ours = estimators
    x, y = _digits(100)
    params = {"solver": "lbfgs", "hidden_layer_sizes": 50, "max_iter": 150, "max_fun": 10,
              "random_state": 1, "tol": 0.0}
    for est in (theirs(**params), ours(client=client, **params)):
        with pytest.warns(ConvergenceWarning, match="lbfgs failed to converge"):
            est.fit(x, y)
        assert est.n_iter_ <= 10
    assert est.summary_["solver"]["evaluations"] <= 12


@pytest.mark.parametrize("estimators", BOTH)
def test_lbfgs_warm_start_goes_to_max_iter_and_has_no_partial_fit(estimators, client):
    """scikit-learn's test_mlp_warm_start_no_convergence (lbfgs, n_iter_no_change=np.inf)
    and test_learning_rate_warmstart: partial_fit is absent for lbfgs."""
    theirs, ours = estimators
    x, y = _iris()
    for make in (theirs, lambda **p: ours(client=client, **p)):
        est = make(solver="lbfgs", warm_start=True, max_iter=10, n_iter_no_change=np.inf,
                   random_state=0)
        with pytest.warns(ConvergenceWarning):
            est.fit(x, y)
        assert est.n_iter_ == 10
        est.set_params(max_iter=20)
        with pytest.warns(ConvergenceWarning):
            est.fit(x, y)
        assert est.n_iter_ == 20
        est.set_params(tol=1e9)                 # a start that meets gtol: no iteration
        _quiet(est.fit, x, y)
        assert est.n_iter_ == 0 and np.isfinite(est.loss_)
        assert hasattr(make(solver="sgd"), "partial_fit")
    assert len(est.loss_curve_) == 30 and est.t_ == 0      # three fits' iterations; t_ as theirs
    assert not hasattr(sk.MLPClassifier(solver="lbfgs"), "partial_fit")
    # scikit-learn's regressor means the same, but its available_if never calls the check
    assert not hasattr(ours(solver="lbfgs"), "partial_fit")


@pytest.mark.slow
def test_lbfgs_gives_the_same_bytes_on_two_workers_as_in_one_task_on_one():
    """A dask.dataframe of 8 partitions on 2 workers: scipy on the driver, each evaluation
    a graph over both; on 1 worker: the whole loop as one task there.  The same bytes."""
    ddf = dd.from_pandas(_frame(), npartitions=8)
    fits = []
    for n in (2, 1):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as c:
            df = c.persist(ddf)
            est = dtrain.MLPClassifier(solver="lbfgs", hidden_layer_sizes=(8,), max_iter=25,
                                       random_state=0, client=c)
            fits.append(_quiet(est.fit, df, "species"))
            assert est.summary_["workers"] == n and est.summary_["shards"] == 8
            assert est.summary_["solver"]["one_task"] == (n == 1)
    assert _same_bytes(*fits) and fits[0].loss_curve_ == fits[1].loss_curve_


def test_lbfgs_from_the_command_line(client, tmp_path):
    """The shipped config trains iris by L-BFGS (here on the 2-worker client: scipy on the
    driver); bad combinations are one line each."""
    from dtrain.core.config import CONFIG_DIR

    cfg = dtrain.load_config(CONFIG_DIR / "iris-lbfgs.toml", ["train.epochs=15"])
    result = dtrain.train(cfg, client=client, out=tmp_path / "run", echo=None)
    solver = result.summary["solver"]
    assert solver["iterations"] == len(result.metrics) == 15 and solver["status"] == 1
    assert result.summary["test_accuracy"] > 0.8
    with pytest.raises(dtrain.UserError, match="keeps no checkpoint"):   # no L-BFGS memory kept
        dtrain.resume(tmp_path / "run", config=dtrain.load_config(
            tmp_path / "run" / "config.toml", ["train.epochs=30"]))
    for sets, words in [(["train.patience=3"], "set train.patience = 0"),
                        (["graph.strategy=local-sgd"], "use graph.strategy = 'allreduce'"),
                        (["optim.schedule=step"], "set optim.schedule = 'constant'")]:
        with pytest.raises(dtrain.UserError, match=re.escape(words)):
            dtrain.load_config(CONFIG_DIR / "iris-lbfgs.toml", sets)


# --- 2: learning_rate="adaptive" ends where scikit-learn's ends -------------------------------

def test_adaptive_stops_where_the_rate_falls_to_zero(client):
    """scikit-learn's test_adaptive_learning_rate: the fit stops once the rate would fall at
    or below 1e-6, rather than running out max_iter at rate 0."""
    x, y = [[3, 2], [1, 6]], [1, 0]
    params = {"tol": 0.5, "max_iter": 3000, "solver": "sgd", "learning_rate": "adaptive",
              "random_state": 0}
    theirs = sk.MLPClassifier(**params).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        ours = dtrain.MLPClassifier(client=client, **params).fit(x, y)
    assert theirs.n_iter_ < 3000 and ours.n_iter_ < 3000
    assert ours.summary_["stopped_because"] == "rate"
    # no epoch after the first improves by tol = 0.5, so every 11th epoch (more than
    # n_iter_no_change = 10) lowers the rate by 5: 0.001 to 3.2e-7 in five, and the sixth
    # time it is at or below 1e-6: the fit ends there
    assert ours.n_iter_ == 1 + 6 * (10 + 1) == theirs.n_iter_


# --- 3: the regressor's early stopping watches R^2 --------------------------------------------

def test_regressor_early_stopping_records_and_stops_on_r2(client):
    """scikit-learn's test_preserve_feature_names data: 10 rows of a constant target,
    early_stopping with validation_fraction=0.2: both stop after n_iter_no_change + 2
    epochs of R^2 0, with validation_scores_ recorded and no ConvergenceWarning."""
    rng = np.random.RandomState(0)
    x = pd.DataFrame(data=rng.randn(10, 2), columns=["colname_a", "colname_b"])
    y = pd.Series(data=np.full(10, 1), name="colname_y")
    theirs = sk.MLPRegressor(early_stopping=True, validation_fraction=0.2).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # no UserWarning, no ConvergenceWarning
        ours = dtrain.MLPRegressor(early_stopping=True, validation_fraction=0.2,
                                   client=client).fit(x, y)
    assert ours.n_iter_ == theirs.n_iter_ == 12
    assert ours.validation_scores_ == theirs.validation_scores_ == [0.0] * 12
    assert ours.best_validation_score_ == theirs.best_validation_score_ == 0.0
    assert ours.best_loss_ is None is theirs.best_loss_


@pytest.mark.slow
def test_regressor_early_stopping_as_scikit_learns_test(client):
    """scikit-learn's test_early_stopping and test_mlp_warm_start_with_early_stopping, for
    the regressor: R^2 scores, the best of them, and a warm start's second fit adds its
    own."""
    x, y = _digits(100, binary=True)
    est = dtrain.MLPRegressor(tol=0.2, max_iter=3000, solver="sgd", early_stopping=True,
                              random_state=0, client=client).fit(x, y)
    scores, best = est.validation_scores_, est.best_validation_score_
    assert est.max_iter > est.n_iter_ == len(scores) and est.best_loss_ is None
    assert max(scores) == best and best + 0.2 > scores[-2] and best + 0.2 > scores[-1]
    x, y = _iris()
    for make in (sk.MLPRegressor, lambda **p: dtrain.MLPRegressor(client=client, **p)):
        warm = make(max_iter=10, random_state=0, warm_start=True, early_stopping=True)
        _quiet(warm.fit, x, y)
        first = len(warm.validation_scores_)
        warm.set_params(max_iter=20)
        _quiet(warm.fit, x, y)
        assert len(warm.validation_scores_) > first


# --- 4: n_iter_no_change=np.inf ---------------------------------------------------------------

@pytest.mark.parametrize("early_stopping", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_n_iter_no_change_inf_never_stops(early_stopping, client):
    """scikit-learn's test_n_iter_no_change_inf (fewer epochs): a tolerance no epoch meets
    and n_iter_no_change=np.inf (accepted, not an integer) run to max_iter."""
    x, y = _digits(100, binary=True)
    params = {"tol": 1e9, "max_iter": 40, "solver": "sgd", "n_iter_no_change": np.inf,
              "early_stopping": early_stopping, "random_state": 0}
    theirs = _quiet(sk.MLPClassifier(**params).fit, x, y)
    ours = _quiet(dtrain.MLPClassifier(client=client, **params).fit, x, y)
    assert ours.n_iter_ == theirs.n_iter_ == 40


# --- 5: float32 trains in float32 -------------------------------------------------------------

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


# --- 6: errors users catch as ValueError ------------------------------------------------------

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


# --- 7: a diverging fit with early stopping ---------------------------------------------------

def test_a_diverging_fit_with_early_stopping_keeps_the_best_parameters(client):
    """scikit-learn's test_mlp_diverging_loss: no error, the last validation score NaN; dtrain
    ends the fit there, warns, and keeps the best epoch's (finite) parameters rather than
    raising dtrain.Diverged."""
    x, y = _iris()
    params = {"hidden_layer_sizes": 100, "activation": "identity", "solver": "sgd",
              "alpha": 0.0001, "learning_rate": "constant", "learning_rate_init": 1,
              "shuffle": True, "max_iter": 20, "early_stopping": True, "n_iter_no_change": 10,
              "random_state": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        theirs = _quiet(sk.MLPRegressor(**params).fit, x, y)
        with pytest.warns(ConvergenceWarning, match="diverged"):
            ours = dtrain.MLPRegressor(client=client, **params).fit(x, y)
    for est in (theirs, ours):
        assert str(est.validation_scores_[-1]) == str(np.nan)
        assert isinstance(est.validation_scores_[-1], float)
        assert np.isfinite(est.predict(x)).all()
    s = ours.summary_
    assert s["stopped_because"] == "diverged" and s["params_from_epoch"] == s["best_epoch"]
    assert ours.best_validation_score_ == ours.validation_scores_[s["best_epoch"] - 1]


# --- 8: verbose prints scikit-learn's lines ---------------------------------------------------

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


# --- 9: one class -----------------------------------------------------------------------------

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


# --- 10: loss="poisson" -----------------------------------------------------------------------

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


# --- 11: the default stop ---------------------------------------------------------------------

@pytest.mark.parametrize("n_iter_no_change", [5, *(pytest.param(n, marks=pytest.mark.slow)
                                                   for n in (2, 10))])
def test_the_training_loss_stops_a_fit_by_scikit_learns_rule(n_iter_no_change, client):
    """scikit-learn's test_n_iter_no_change: each fit stops where scikit-learn's rule,
    applied to its own training losses, stops it (more than n_iter_no_change epochs not
    below the best by tol); dtrain's rule stopped only after epochs without an improvement
    on the last improvement, and ran on past slow descents."""
    x, y = _digits(100, binary=True)
    params = {"tol": 0.01, "max_iter": 3000, "solver": "sgd",
              "n_iter_no_change": n_iter_no_change, "random_state": 0}
    theirs = sk.MLPClassifier(**params).fit(x, y)
    assert theirs._no_improvement_count == n_iter_no_change + 1
    ours = dtrain.MLPClassifier(client=client, **params).fit(x, y)
    assert ours.n_iter_ == sklearn_stop(ours.loss_curve_, n_iter_no_change, 0.01) < 3000


@pytest.mark.slow
def test_the_default_fit_on_digits_stops_as_scikit_learns(client):
    """MLPClassifier(random_state=0) on digits stops at 130 epochs in scikit-learn; dtrain's
    stops by the same rule, before max_iter and without a ConvergenceWarning."""
    x, y = _digits()
    theirs = sk.MLPClassifier(random_state=0).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        ours = dtrain.MLPClassifier(random_state=0, client=client).fit(x, y)
    assert theirs.n_iter_ < 200 and ours.n_iter_ < 200
    assert ours.n_iter_ == sklearn_stop(ours.loss_curve_, 10, 1e-4)
    assert ours.score(x, y) >= theirs.score(x, y) - 0.01
