"""Typed run configuration: TOML files, ``--set`` overrides, validation.

A config is seven sections (``data``, ``model``, ``optim``, ``train``, ``graph``,
``cluster``, ``track``), each a frozen dataclass.  Anything wrong is reported as one
:class:`~dtrain.core.errors.UserError` line that names the key, the bad value and what
would be accepted.  Three modules, each importing only those before it:

* :mod:`~dtrain.core.config.schema`: the sections, every field declared with its default,
  its rule and its doc string (the configuration reference is generated from it), and
  :data:`STRATEGIES`, the values of ``graph.strategy``;
* :mod:`~dtrain.core.config.rules`: :class:`Config`, the sections together, made by
  :func:`from_dict`; the rules across keys, each strategy's among them
  (:data:`~dtrain.core.config.rules.STRATEGY_RULES`); the values derived from others;
* :mod:`~dtrain.core.config.loading`: TOML files, ``--set`` overrides and relative paths,
  :func:`load_config`.

What is valid is known here, below every other layer: the strategy objects
(:mod:`dtrain.taskgraph.strategies`) are listed under the same names, and nothing they do
is needed to check a config.  The names below are the public ones, imported from here.
"""
from __future__ import annotations

from dtrain.core.config.loading import (CONFIG_DIR, DEFAULT_CONFIG, apply_overrides,
                                        load_config, local_store_uri, parse_override,
                                        read_toml)
from dtrain.core.config.rules import Config, epochs_decide, from_dict
from dtrain.core.config.schema import (DATASETS, LABEL_LOSSES, REBALANCE, SECTIONS,
                                       STRATEGIES, VALUE_DATASETS, VALUE_LOSSES,
                                       ClusterConfig, DataConfig, GraphConfig, ModelConfig,
                                       OptimConfig, TrackConfig, TrainConfig)
from dtrain.core.errors import ConfigError

__all__ = ["CONFIG_DIR", "DATASETS", "DEFAULT_CONFIG", "LABEL_LOSSES", "REBALANCE",
           "SECTIONS", "STRATEGIES", "VALUE_DATASETS", "VALUE_LOSSES", "ClusterConfig",
           "Config", "ConfigError", "DataConfig", "GraphConfig", "ModelConfig", "OptimConfig",
           "TrackConfig", "TrainConfig", "apply_overrides", "epochs_decide", "from_dict",
           "load_config", "local_store_uri", "parse_override", "read_toml"]
