"""dtrain: data-parallel neural-network training where every minibatch is a Dask task graph.

>>> import dtrain
>>> cfg = dtrain.load_config("configs/iris.toml", ["train.epochs=5"])   # doctest: +SKIP
>>> result = dtrain.train(cfg)                                          # doctest: +SKIP
>>> result.summary["test_accuracy"]                                     # doctest: +SKIP
"""
from __future__ import annotations

from dtrain.config import Config, load_config
from dtrain.errors import UserError
from dtrain.trainer import RunResult, train

__all__ = ["Config", "RunResult", "UserError", "load_config", "train"]
__version__ = "0.1.0"
