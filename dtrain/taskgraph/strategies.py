"""The training strategies: one object each, listed once, in :data:`STRATEGIES`.

A strategy holds everything that differs between the ways dtrain trains once a
config is valid: its name, the workers and MPI ranks it needs, the fan-in of its
reduce tree, what a leaf of that tree sends (its communication accounting), the
graph builder that makes its windows, and its pictures in ``graphs/``.  The plan
asks the strategy for its recipe and builder, MPI for its ranks, the pictures
for their gallery.  What a config may say is decided below this layer, by the
config itself: ``graph.strategy``'s values are
:data:`dtrain.core.config.STRATEGIES`, the same names in the same order as
:data:`STRATEGIES` here (``tests/test_config.py``), and each strategy's rules
on the rest of a config are :data:`dtrain.core.config.rules.STRATEGY_RULES`.
A new strategy is a new class here (and its builder, if no existing one fits),
one entry in the list, and its name and rules in the config.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from dtrain.core.config import Config, epochs_decide
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
                      auto_update=self.replicated(cfg) and g.update == "auto",
                      state_every=g.state_every, fuse_shards=g.fuse_shards,
                      step_event_gap=g.step_event_gap,
                      keep_states=epochs_decide(cfg.train, cfg.optim),
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


class LocalSGD(Strategy):
    name = "local-sgd"
    about = "each shard runs graph.sync_every steps alone, then the tree averages the states"
    pictures = {"local-sgd": ("graph.sync_every=4",)}

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


def get(name: str) -> Strategy:
    """The strategy called ``name`` (a validated config's ``graph.strategy``)."""
    return STRATEGIES[name]
