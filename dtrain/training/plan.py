"""The plan of a run: everything fixed before the first step, checked before any cluster starts.

:func:`plan` reads the dataset's sizes (file headers, not the data), checks
the model against them, cuts the shards, and asks the run's strategy
(:mod:`dtrain.taskgraph.strategies`) for its recipe and graph builder.  The
:class:`Schedule` says which rows of which shard make up every step, and at
what learning rate.
"""
from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field

from dtrain.core.config import Config, OptimConfig
from dtrain.core.errors import UserError
from dtrain.data import prepare
from dtrain.data.shards import ShardSource, epoch_bounds, shard_ranges, sources
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step, TrainState, learning_rate
from dtrain.taskgraph import strategies
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.strategies import Builder, Strategy

CHAIN_BYTES = 64 << 20   # states a worker may hold between kept ones (graph.state_every)


class Schedule:
    """Every step of a run: minibatch rows per shard, learning rate, epoch edges.

    Parameters
    ----------
    shard_sizes
        Rows in each shard.
    batch_size
        Global minibatch (clamped to the training set: full batch).
    cfg
        Learning-rate schedule.
    epochs
        Number of epochs.
    """

    def __init__(self, shard_sizes: list[int], batch_size: int, cfg: OptimConfig, epochs: int):
        self.bounds = epoch_bounds(shard_sizes, min(batch_size, sum(shard_sizes)))
        self.steps_per_epoch = self.bounds.shape[0] - 1
        self.epochs = epochs
        self.rates = [learning_rate(cfg, e, epochs) for e in range(epochs)]

    def __len__(self) -> int:
        return self.steps_per_epoch * self.epochs

    def samples(self, first: int, stop: int) -> int:
        """Training samples in steps ``first`` to ``stop - 1``."""
        per_step = (self.bounds[1:] - self.bounds[:-1]).sum(axis=1)          # (steps,)
        per_epoch = int(per_step.sum())

        def before(t: int) -> int:                  # samples in steps 0 .. t - 1
            epochs, into = divmod(t, self.steps_per_epoch)
            return epochs * per_epoch + int(per_step[:into].sum())
        return before(stop) - before(first)

    def __getitem__(self, index: int) -> Step:
        if not 0 <= index < len(self):
            raise IndexError(index)
        epoch, t = divmod(index, self.steps_per_epoch)
        lo, hi = self.bounds[t], self.bounds[t + 1]
        return Step(index, epoch, t, self.rates[epoch], int((hi - lo).sum()), t == 0,
                    t == self.steps_per_epoch - 1,
                    tuple((int(a), int(b)) for a, b in zip(lo, hi)))


@dataclass
class Plan:
    """Everything fixed before the first step: sizes, model, optimizer, schedule, and the
    strategy's recipe and graph builder (None for a strategy that runs in the driver)."""

    config: Config
    info: prepare.DatasetInfo
    ranges: list[tuple[int, int]]
    net: Network
    opt: Optimizer
    schedule: Schedule
    strategy: Strategy = field(init=False)
    recipe: Recipe = field(init=False)
    builder: Builder | None = field(init=False)
    run: str = field(init=False, default_factory=lambda: uuid.uuid4().hex[:8])  # ends every key

    def __post_init__(self) -> None:
        cfg = self.config
        self.strategy = strategies.get(cfg.graph.strategy)
        runs_as = self.strategy.runs_as(cfg)
        seed = cfg.data.seed if cfg.data.shuffle and self.schedule.steps_per_epoch > 1 else None
        recipe = runs_as.recipe(cfg, self.net, self.opt, seed, len(self.ranges))
        # a worker remembers the states between kept ones: at most CHAIN_BYTES of them
        self.recipe = dataclasses.replace(recipe, state_every=max(
            1, min(cfg.graph.state_every, CHAIN_BYTES // recipe.state_bytes)))
        self.builder = runs_as.builder(self.recipe, cfg, self.sources)

    @property
    def sources(self) -> list[ShardSource]:
        """Every shard's loading record."""
        return sources(self.config.data, self.ranges, self.info.train, self.config.model.dtype)

    @property
    def leaves(self) -> int:
        """The leaves of its reduce tree: shards, or a model-parallel net's slices."""
        return self.config.graph.slices if self.strategy.leaf == "slice" else len(self.ranges)

    @property
    def train_samples(self) -> int:
        return self.ranges[-1][1]

    def initial_state(self) -> TrainState:
        return self.opt.init_state(self.net.init(self.config.model.seed))


def plan(config: Config) -> Plan:
    """Check the config against the data and build the schedule; no cluster needed."""
    info = prepare.describe(config.data)
    layers = config.model.layers
    if layers[0] != info.features:
        raise UserError(f"model.layers[0] = {layers[0]} but {info.name} has {info.features} input "
                        f"features; set model.layers = [{info.features}, ..., {info.classes}]")
    if layers[-1] != info.classes:
        raise UserError(f"model.layers[-1] = {layers[-1]} but {info.name} has {info.classes} "
                        f"classes; set model.layers = [{info.features}, ..., {info.classes}]")
    ranges = shard_ranges(info.train, config.data.replicate, config.data.shards)
    net = Network.from_config(config.model)
    opt = Optimizer(config.optim, net, config.model.l2)
    schedule = Schedule([b - a for a, b in ranges], config.train.batch_size, config.optim,
                        config.train.epochs)
    return Plan(config, info, ranges, net, opt, schedule)
