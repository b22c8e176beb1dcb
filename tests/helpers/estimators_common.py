"""What the estimator tests share: iris as the tests take it, a quick classifier, and
the embedded cluster closed with each module."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from distributed import Client
from sklearn.datasets import load_iris

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
