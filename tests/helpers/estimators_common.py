"""What the estimator tests share: iris and digits as the tests take them, a quick classifier,
scikit-learn's MLPs beside dtrain's, scikit-learn's stopping rule, and the embedded cluster
closed with each module."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from distributed import Client
from sklearn import neural_network as sk
from sklearn.datasets import load_digits, load_iris
from sklearn.exceptions import ConvergenceWarning

import dtrain

SPECIES = np.array(["setosa", "versicolor", "virginica"])
FEATURES = ["sepal length", "sepal width", "petal length", "petal width"]
QUICK = {"hidden_layer_sizes": (8,), "max_iter": 20, "learning_rate_init": 0.05, "random_state": 0,
         "strategy": "allreduce"}     # the synchronous step wherever the data sits (auto: below)


@pytest.fixture(scope="module", autouse=True)
def _close_the_embedded_cluster():
    """Closed with the module, while pytest's streams are open (not at exit, after them)."""
    from dtrain.estimators import cluster

    yield
    cluster.close_embedded()


def _iris() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_iris(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))     # classes mixed in every shard
    return x[order], y[order]


def _frame() -> pd.DataFrame:
    x, y = _iris()
    df = pd.DataFrame(x, columns=FEATURES)
    df["species"] = SPECIES[y]
    return df


def _clf(client: Client | None = None, **params) -> dtrain.MLPClassifier:
    return dtrain.MLPClassifier(client=client, **{**QUICK, **params})


def _same_bytes(a: dtrain.MLPClassifier, b: dtrain.MLPClassifier) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in
               zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_))


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
