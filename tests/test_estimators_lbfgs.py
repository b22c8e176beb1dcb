"""``solver="lbfgs"`` (:mod:`dtrain.maths.lbfgs`, a full-batch step per iteration) beside
scikit-learn's: it classifies digits and reaches scikit-learn's loss on the same problem, judges
``tol`` and ``max_fun`` as scikit-learn does, goes on with ``warm_start``, gives the same bytes
on two workers as in one task on one, and runs from the command line.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from distributed import Client, LocalCluster
from sklearn import neural_network as sk
from sklearn.exceptions import ConvergenceWarning

import dask.dataframe as dd
import dtrain
from helpers.estimators_common import BOTH, _digits, _frame, _iris, _quiet, _same_bytes
from helpers.estimators_common import _close_the_embedded_cluster  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


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
