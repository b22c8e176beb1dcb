"""The training strategies: one object each, listed once, in :data:`STRATEGIES`.

A strategy holds everything that differs between the ways dtrain trains: its
name, the rules it puts on a config, the workers and MPI ranks it needs, the
fan-in of its reduce tree, what a leaf of that tree sends (its communication
accounting), the graph builder that makes its windows, and its pictures in
``graphs/``.  Nothing else in dtrain compares strategy names: the config
checks ``graph.strategy`` against this list (:data:`dtrain.core.config.STRATEGIES`),
the plan asks the strategy for its recipe and builder, MPI for its ranks,
the pictures for their gallery.  A new strategy is a new class here (and its
builder, if no existing one fits) and one entry in the list.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from dtrain.core import config as core_config
from dtrain.core import layerspec
from dtrain.core.config import Config
from dtrain.core.errors import ConfigError
from dtrain.data.shards import ShardSource
from dtrain.maths.model import Network
from dtrain.maths.optim import ROUND_TAIL, Optimizer
from dtrain.taskgraph.dataparallel import DataParallel, add_round
from dtrain.taskgraph.modelparallel import ModelParallel
from dtrain.taskgraph.recipe import Recipe

Builder = DataParallel | ModelParallel


class Strategy:
    """What every strategy says about itself; the defaults are a data-parallel strategy."""

    name: ClassVar[str]
    about: ClassVar[str]                    # one line, for the docs
    min_workers: ClassVar[int] = 1          # Dask workers it needs
    in_process: ClassVar[bool] = False      # runs in the driver, without Dask
    leaf: ClassVar[str] = "shard"           # a leaf of its reduce tree: a shard, or a slice
    on_gpu: ClassVar[bool] = True           # its leaves may run on GPU workers
    workers_word: ClassVar[str] = "the head + 1 worker"      # its MPI ranks, in words
    # its pictures in graphs/: file name -> --set overrides (on GALLERY_BASE)
    pictures: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def ranks(self) -> int:
        """MPI ranks it needs: the head (scheduler and driver) and its workers."""
        return 1 + self.min_workers

    def check(self, cfg: Config, source: str) -> None:
        """Raise :class:`~dtrain.core.errors.ConfigError` for a config it cannot run."""
        if cfg.optim.name == "lbfgs":
            raise ConfigError(f"optim.name = 'lbfgs' in {source} computes each loss and "
                              f"gradient over the whole training set with allreduce's reduce "
                              f"tree, not graph.strategy = '{self.name}'; use graph.strategy = "
                              f"'allreduce'")
        if cfg.graph.update == "replicated":
            raise ConfigError(f"graph.update = 'replicated' in {source} needs graph.strategy = "
                              f"'allreduce' (every worker trains and updates), not "
                              f"'{self.name}'; use graph.update = 'root' or 'auto'")

    def runs_as(self, cfg: Config) -> Strategy:
        """The strategy that actually runs ``cfg`` (itself, unless a simpler one is exact)."""
        return self

    def fan_in(self, cfg: Config, shards: int) -> int:
        """The reduce tree's fan-in, normalised once: ``graph.fan_in`` capped at the leaves."""
        return max(2, min(cfg.graph.fan_in, shards))

    def replicated(self, cfg: Config) -> bool:
        """Whether every worker applies each update itself."""
        return cfg.graph.update == "replicated"

    def leaf_bytes(self, net: Network, opt: Optimizer) -> int:
        """What a leaf sends up the reduce tree: a gradient buffer ``[grad | loss | correct]``."""
        return net.buffer_size * np.dtype(net.dtype).itemsize

    def recipe(self, cfg: Config, net: Network, opt: Optimizer, shuffle_seed: int | None,
               shards: int) -> Recipe:
        g = cfg.graph
        return Recipe(net, opt, shuffle_seed, fan_in=self.fan_in(cfg, shards),
                      leaf_bytes=self.leaf_bytes(net, opt), fuse_update=g.fuse_update,
                      step_events=g.step_events, replicated=self.replicated(cfg),
                      state_every=g.state_every, fuse_shards=g.fuse_shards,
                      step_event_gap=g.step_event_gap,
                      keep_states=core_config.epochs_decide(cfg.train, cfg.optim),
                      cores=cfg.cluster.cores, fuse_steps=g.fuse_steps,
                      root_sum=g.fuse_steps and g.reduce == "tree")

    def builder(self, recipe: Recipe, cfg: Config,
                sources: Sequence[ShardSource]) -> Builder | None:
        """The graph builder of a run (None: it runs without a graph)."""
        return DataParallel(recipe, sources)

    def describe(self, cfg: Config, recipe: Recipe) -> str:
        """What its pictures' titles add after the name."""
        return f", fan-in {recipe.fan_in}"


class AllReduce(Strategy):
    name = "allreduce"
    about = "every worker trains its shards; a tree reduce of the gradients, fan-in k"
    pictures = {
        "allreduce-fan-in-2": ("graph.fan_in=2",),
        "allreduce-fan-in-4": ("graph.fan_in=4",),
        "allreduce-task-per-shard": ("graph.fan_in=2", "graph.fuse_shards=false"),
        "allreduce-root-update": ("graph.fan_in=2", "graph.update=root"),
    }

    def check(self, cfg: Config, source: str) -> None:
        pass

    def replicated(self, cfg: Config) -> bool:
        return cfg.graph.update in ("replicated", "auto")


class ParameterServer(Strategy):
    name = "parameter-server"
    about = "a head worker that holds no shard reduces every gradient and updates"
    min_workers = 2
    workers_word = "the head + a parameter-server worker + 1 trainer"
    pictures = {"parameter-server": ()}

    def fan_in(self, cfg: Config, shards: int) -> int:
        return max(shards, 2)                       # one flat level

    def builder(self, recipe: Recipe, cfg: Config,
                sources: Sequence[ShardSource]) -> Builder:
        return DataParallel(recipe, sources, server=True)

    def describe(self, cfg: Config, recipe: Recipe) -> str:
        return ""


_ADAPTIVE = ("optim.schedule = 'adaptive' in {1} decides the rate from each epoch's training "
             "loss inside the update, which graph.strategy = '{0}' splits; use another "
             "schedule or strategy")


class LocalSGD(Strategy):
    name = "local-sgd"
    about = "each shard runs graph.sync_every steps alone, then the tree averages the states"
    pictures = {"local-sgd": ("graph.sync_every=4",)}

    def check(self, cfg: Config, source: str) -> None:
        super().check(cfg, source)
        if cfg.optim.schedule == "adaptive" and cfg.graph.sync_every > 1:
            raise ConfigError(_ADAPTIVE.format(self.name, source))

    def runs_as(self, cfg: Config) -> Strategy:
        # a one-step round is the synchronous step: run it as one, which is exact for every
        # optimizer (averaging Adam's moments would not be)
        return STRATEGIES["allreduce"] if cfg.graph.sync_every == 1 else self

    def leaf_bytes(self, net: Network, opt: Optimizer) -> int:
        # a whole weighted state with its loss, correct count and weight
        return (net.size * (1 + opt.slots) + ROUND_TAIL) * np.dtype(net.dtype).itemsize

    def recipe(self, cfg: Config, net: Network, opt: Optimizer, shuffle_seed: int | None,
               shards: int) -> Recipe:
        recipe = super().recipe(cfg, net, opt, shuffle_seed, shards)
        return dataclasses.replace(recipe, sync_every=cfg.graph.sync_every)   # rounds

    def builder(self, recipe: Recipe, cfg: Config,
                sources: Sequence[ShardSource]) -> Builder:
        return DataParallel(recipe, sources, unit=add_round)

    def describe(self, cfg: Config, recipe: Recipe) -> str:
        return f", one round of {cfg.graph.sync_every} steps"


class ModelParallelStrategy(Strategy):
    name = "model-parallel"
    about = "each hidden layer's units split into graph.slices slices; activations cross"
    leaf = "slice"
    on_gpu = False
    pictures = {"model-parallel": ("graph.slices=4",),
                "model-parallel-deep": ("graph.slices=4", "model.layers=[4, 16, 8, 12, 3]")}

    def check(self, cfg: Config, source: str) -> None:
        super().check(cfg, source)
        if cfg.optim.schedule == "adaptive":
            raise ConfigError(_ADAPTIVE.format(self.name, source))
        layers, slices = cfg.model.layers, cfg.graph.slices
        if not layerspec.dense_only(layers):
            raise ConfigError(f"graph.strategy = 'model-parallel' splits dense layers only, but "
                              f"model.layers in {source} has "
                              f"{layerspec.show(next(v for v in layers if not isinstance(v, int)))}; "
                              f"use a data-parallel strategy (allreduce, parameter-server, "
                              f"local-sgd)")
        if cfg.cluster.device == "gpu":
            raise ConfigError(f"graph.strategy = 'model-parallel' runs on CPU workers only, but "
                              f"cluster.device = 'gpu' in {source}; use cluster.device = 'cpu' "
                              f"or a data-parallel strategy")
        hidden = layers[1:-1:2]
        if not hidden:
            raise ConfigError(f"graph.strategy = 'model-parallel' splits hidden layers, but "
                              f"model.layers = {list(layers)} has none in {source}; add one, "
                              f"e.g. [{layers[0]}, 64, {layers[-1]}]")
        if slices > min(hidden):
            raise ConfigError(f"graph.slices = {slices} but the narrowest split layer has "
                              f"{min(hidden)} units in {source}; use at most {min(hidden)} "
                              f"slices")

    def fan_in(self, cfg: Config, shards: int) -> int:
        return max(2, min(cfg.graph.fan_in, cfg.graph.slices))     # a tree over the slices

    def builder(self, recipe: Recipe, cfg: Config,
                sources: Sequence[ShardSource]) -> Builder:
        return ModelParallel(recipe, cfg.graph.slices, sources)

    def describe(self, cfg: Config, recipe: Recipe) -> str:
        return f", {cfg.graph.slices} slices"


class Serial(Strategy):
    name = "serial"
    about = "the reference: one process, no Dask, each global minibatch in one piece"
    min_workers = 0
    in_process = True
    workers_word = "the head"

    def builder(self, recipe: Recipe, cfg: Config,
                sources: Sequence[ShardSource]) -> None:
        return None


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    AllReduce(), ParameterServer(), LocalSGD(), ModelParallelStrategy(), Serial())}
core_config.STRATEGIES.update(STRATEGIES)      # graph.strategy is checked against these


def get(name: str) -> Strategy:
    """The strategy called ``name`` (a validated config's ``graph.strategy``)."""
    return STRATEGIES[name]
