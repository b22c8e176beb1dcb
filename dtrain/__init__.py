"""dtrain: data-parallel neural-network training where every minibatch is a Dask task graph.

>>> import dtrain
>>> cfg = dtrain.load_config("configs/iris.toml", ["train.epochs=5"])   # doctest: +SKIP
>>> result = dtrain.train(cfg)                                          # doctest: +SKIP
>>> result.summary["test_accuracy"]                                     # doctest: +SKIP

The package is layered; ``ARCHITECTURE.md`` says what each part holds and
where a change belongs.
"""
from __future__ import annotations

from dtrain.core.config import Config, load_config
from dtrain.core.errors import Diverged, UserError
from dtrain.core.version import __version__
from dtrain.training.trainer import RunResult, resume, train

__all__ = ["Config", "Diverged", "RunResult", "UserError", "__version__", "load_config", "resume",
           "train"]
