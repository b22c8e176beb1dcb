"""dtrain: data-parallel neural-network training where every minibatch is a Dask task graph.

>>> import dtrain
>>> cfg = dtrain.load_config("configs/iris.toml", ["train.epochs=5"])   # doctest: +SKIP
>>> result = dtrain.train(cfg)                                          # doctest: +SKIP
>>> result.summary["test_accuracy"]                                     # doctest: +SKIP
>>> clf = dtrain.MLPClassifier(max_iter=50).fit(X, y)                   # doctest: +SKIP

The package is layered; ``ARCHITECTURE.md`` says what each part holds and
where a change belongs.
"""
from __future__ import annotations

from dtrain.core.config import Config, load_config
from dtrain.core.errors import Diverged, UserError
from dtrain.core.version import __version__
from dtrain.inference.model import Model, load
from dtrain.training.trainer import RunResult, resume, train

__all__ = ["Config", "Diverged", "MLPClassifier", "MLPRegressor", "Model", "RunResult",
           "UserError", "__version__", "load", "load_config", "resume", "train"]

_ESTIMATORS = ("MLPClassifier", "MLPRegressor")     # imported on first use (scikit-learn's API)


def __getattr__(name: str) -> object:
    if name in _ESTIMATORS:
        from dtrain.estimators import mlp

        return getattr(mlp, name)
    raise AttributeError(f"module 'dtrain' has no attribute {name!r}")
