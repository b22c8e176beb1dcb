"""When a fit stops, as scikit-learn's MLPs stop on the same data: the training loss's rule
(``tol``, ``n_iter_no_change``, also ``np.inf``), early stopping on the validation score (R^2
for the regressor), ``learning_rate="adaptive"`` until the rate falls too low, and a diverging
fit that keeps its best parameters.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn import neural_network as sk
from sklearn.exceptions import ConvergenceWarning

import dtrain
from helpers.estimators_common import _clf, _digits, _iris, _quiet, sklearn_stop
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


# --- the training loss's rule -----------------------------------------------------------------

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


# --- early stopping on the validation score ---------------------------------------------------

@pytest.mark.slow
def test_early_stopping_on_the_validation_or_the_training_loss(client):
    x, y = _iris()
    # scikit-learn's rule: no epoch after the first improves by tol, and the fit stops
    # after more than n_iter_no_change of them
    early = _clf(client, early_stopping=True, n_iter_no_change=2, tol=5.0, max_iter=50)
    early.fit(x, y)
    assert early.n_iter_ == 4 and early.summary_["stopped_early"] == 4
    assert early.best_loss_ is None and len(early.validation_scores_) == 4
    assert early.summary_["val_samples"] == 15          # round(0.1 * rows) of each partition (one)
    plain = _clf(client, n_iter_no_change=3, tol=10.0, max_iter=50).fit(x, y)
    assert plain.n_iter_ == 5 and plain.validation_scores_ is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        _clf(client, n_iter_no_change=3, tol=10.0, max_iter=50).fit(x, y)
    with pytest.warns(ConvergenceWarning):
        _clf(client, max_iter=2).fit(x, y)


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


# --- learning_rate="adaptive" -----------------------------------------------------------------

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
