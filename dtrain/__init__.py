"""dtrain: data-parallel neural-network training where every minibatch is a Dask task graph.

>>> import dtrain
>>> cfg = dtrain.load_config("configs/iris.toml", ["train.epochs=5"])   # doctest: +SKIP
>>> result = dtrain.train(cfg)                                          # doctest: +SKIP
>>> result.summary["test_accuracy"]                                     # doctest: +SKIP
>>> model = dtrain.load(result.out)                                     # doctest: +SKIP
>>> clf = dtrain.MLPClassifier(max_iter=50).fit(X, y)                   # doctest: +SKIP

The public names below are imported when first used: a worker that unpickles
a task of ``dtrain.taskgraph`` imports that part, not the trainer, the
reports and their Bokeh.  The package is layered; ``ARCHITECTURE.md`` says
what each part holds and where a change belongs.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dtrain.core.errors import Diverged, Stopped, UserError
from dtrain.core.version import __version__

if TYPE_CHECKING:
    from dtrain.core.config import Config, load_config
    from dtrain.estimators.mlp import MLPClassifier, MLPRegressor
    from dtrain.inference.model import Model, load
    from dtrain.training.trainer import RunResult, resume, train

# public name -> the module that defines it
_LAZY = {"Config": "dtrain.core.config", "load_config": "dtrain.core.config",
         "Model": "dtrain.inference.model", "load": "dtrain.inference.model",
         "RunResult": "dtrain.training.trainer", "resume": "dtrain.training.trainer",
         "train": "dtrain.training.trainer",
         "MLPClassifier": "dtrain.estimators.mlp", "MLPRegressor": "dtrain.estimators.mlp"}

__all__ = ["Config", "Diverged", "MLPClassifier", "MLPRegressor", "Model", "RunResult",
           "Stopped", "UserError", "__version__", "load", "load_config", "resume", "train"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'dtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
