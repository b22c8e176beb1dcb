"""The plan of a run: everything fixed before the first step, checked before any cluster starts.

:func:`plan` reads the dataset's sizes (file headers, not the data), checks
the model against them, cuts the shards, and asks the run's strategy
(:mod:`dtrain.taskgraph.strategies`) for its recipe and graph builder.  The
:class:`Schedule` says which rows of which shard make up every step, and at
what learning rate.
"""
from __future__ import annotations

import dataclasses
import glob
import math
import uuid
from pathlib import Path

import numpy as np
from dataclasses import dataclass, field

from dtrain.core import layerspec
from dtrain.core.config import Config, DataConfig, OptimConfig
from dtrain.core.errors import UserError
from dtrain.core.modelfile import Normalization
from dtrain.inference.saved import read_run
from dtrain.data import partitions, prepare
from dtrain.data.partitions import PartSource, PartSpec
from dtrain.data.shards import ShardSource, epoch_bounds, shard_ranges, sources
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step, TrainState, learning_rate
from dtrain.taskgraph import strategies
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.strategies import Builder, Strategy
from dtrain.training import collections
from dtrain.training.collections import Collection

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
        self.rates = [learning_rate(cfg, e, epochs, sum(shard_sizes)) for e in range(epochs)]
        self._seen: dict[int, tuple[int, tuple[tuple[int, int], ...]]] = {}

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
        count, rows = self._rows(t)
        return Step(index, epoch, t, self.rates[epoch], count, t == 0,
                    t == self.steps_per_epoch - 1, rows)

    def _rows(self, t: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        """Position ``t``'s minibatch size and rows per shard (the same every epoch: read
        once, as each window's graph asks for every step)."""
        found = self._seen.get(t)
        if found is None:
            lo, hi = self.bounds[t], self.bounds[t + 1]
            found = self._seen[t] = (int((hi - lo).sum()),
                                     tuple((int(a), int(b)) for a, b in zip(lo, hi)))
        return found


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
    norm: Normalization | None = None       # a model's own, to start from (model.init_from)
    init: np.ndarray | None = None          # its parameters (P,)
    collection: Collection | None = None    # partitioned data on the workers (plan_on)
    fitted: Normalization | None = None     # its normalization, from its statistics
    part_sources: list[PartSource] | None = None
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
            1, min(cfg.graph.state_every, CHAIN_BYTES // recipe.state_bytes)),
            final_step=len(self.schedule) - 1)
        self.builder = runs_as.builder(self.recipe, cfg, self.sources)

    @property
    def sources(self) -> list[ShardSource] | list[PartSource]:
        """Every shard's loading record."""
        if self.part_sources is not None:
            return self.part_sources
        return sources(self.config.data, self.ranges, self.info.train, self.config.model.dtype,
                       self.norm)

    @property
    def leaves(self) -> int:
        """The leaves of its reduce tree: shards, or a model-parallel net's slices."""
        return self.config.graph.slices if self.strategy.leaf == "slice" else len(self.ranges)

    @property
    def train_samples(self) -> int:
        return self.ranges[-1][1]

    def initial_state(self) -> TrainState:
        """Seeded initial parameters, or ``model.init_from``'s, with a fresh optimizer."""
        params = self.net.init(self.config.model.seed) if self.init is None \
            else self.init.astype(self.net.dtype)
        return self.opt.init_state(params)


def plan(config: Config) -> Plan:
    """Check the config against the data and build the schedule; no cluster needed."""
    if partitioned(config.data):
        raise UserError(f"data.dataset = '{config.data.dataset}' with data.path = "
                        f"{config.data.path!r} is read by the workers: plan it on a cluster "
                        f"(training.collections, plan_on)")
    info = prepare.describe(config.data)
    ranges = shard_ranges(info.train, config.data.replicate, config.data.shards)
    return _plan(config, info, ranges)


def partitioned(cfg: DataConfig) -> bool:
    """Whether the dataset is read partition by partition by the workers (Parquet, or CSV
    files named by a glob) rather than whole by each worker that needs it."""
    return cfg.dataset == "parquet" or (cfg.dataset == "csv" and glob.has_magic(cfg.path))


def plan_on(config: Config, coll: Collection) -> Plan:
    """The plan of a run on a described :class:`~dtrain.training.collections.Collection`:
    each partition a shard, sizes and labels from its statistics."""
    strategy = strategies.get(config.graph.strategy)
    if strategy.in_process or strategy.leaf != "shard":
        raise UserError(f"graph.strategy = '{strategy.name}' does not train on data that "
                        f"stays partitioned on the workers (it needs the whole training set in "
                        f"{'the driver' if strategy.in_process else 'every worker'}); use "
                        f"allreduce, parameter-server or local-sgd")
    stats, regression = coll.stats, config.data.target == "value"
    label = coll.columns.label if isinstance(coll.columns.label, str) and \
        not coll.columns.label.startswith("__") else None
    partitions.check(stats, len(coll.futures), regression, label,
                     "fill or drop those rows, or set data.missing = 'drop' to leave them out")
    labels = coll.targets if regression else stats.labels
    info = prepare.DatasetInfo("collection" if not config.data.path else
                               Path(config.data.path).name, coll.features, len(labels),
                               stats.train, stats.val, stats.test, labels, coll.names,
                               stats.dropped)
    bounds = np.concatenate([[0], np.cumsum(stats.sizes)])
    ranges = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    the_plan = _plan(config, info, ranges)
    spec = collections.with_stats(part_spec(config, coll), stats, config.data.normalize)
    if the_plan.norm is not None:
        spec = dataclasses.replace(spec, norm=the_plan.norm)
    the_plan.collection, the_plan.fitted = coll, spec.norm
    the_plan.part_sources = [PartSource(spec, i, key) for i, key in enumerate(coll.keys)]
    the_plan.builder = the_plan.strategy.runs_as(config).builder(
        the_plan.recipe, config, the_plan.part_sources)
    return the_plan


def part_spec(config: Config, coll: Collection) -> PartSpec:
    """What every partition's tasks share, before the statistics are known."""
    d = config.data
    return PartSpec(coll.columns, tuple(d.split), d.seed, dtype=config.model.dtype,
                    regression=d.target == "value", missing=d.missing)


def _plan(config: Config, info: prepare.DatasetInfo, ranges: list[tuple[int, int]]) -> Plan:
    layers = config.model.layers
    if not layerspec.dense_only(layers):
        _check_images(config, info)
    elif layers[0] != info.features:
        raise UserError(f"model.layers[0] = {layers[0]} but {info.name} has {info.features} input "
                        f"features; set model.layers = [{info.features}, ..., {info.classes}]")
    logistic = config.model.loss == "binary-cross-entropy" and config.data.target == "class"
    if logistic and info.classes != 2:
        raise UserError(f"model.loss = 'binary-cross-entropy' learns two classes (one logistic "
                        f"output) but {info.name} has {info.classes}; use model.loss = "
                        f"'cross-entropy'")
    outputs = 1 if logistic else info.classes       # two classes: one logistic output
    if layers[-1] != outputs:
        what = "targets" if config.data.target == "value" else "classes"
        first = info.features if layerspec.dense_only(layers) else "..."
        raise UserError(f"model.layers[-1] = {layers[-1]} but {info.name} has {info.classes} "
                        f"{what}; set model.layers = [{first}, ..., {outputs}]")
    train = config.train
    if (train.patience or train.keep_best) and train.monitor != "train_loss" and not info.val:
        raise UserError(f"train.patience = {train.patience}, train.keep_best = "
                        f"{str(train.keep_best).lower()} watch the validation "
                        f"{'score' if train.monitor == 'val_score' else 'loss'}, but "
                        f"data.split = {list(config.data.split)} leaves no validation samples; "
                        f"give the split a validation share or set train.monitor = 'train_loss'")
    net = Network.from_config(config.model)
    opt = Optimizer(config.optim, net, config.model.l2, config.train.max_loss,
                    raises=config.train.diverged == "error")
    schedule = Schedule([b - a for a, b in ranges], config.train.batch_size, config.optim,
                        config.train.epochs)
    norm, init = _start_from(config) if config.model.init_from else (None, None)
    return Plan(config, info, ranges, net, opt, schedule, norm, init)


def _check_images(config: Config, info: prepare.DatasetInfo) -> None:
    """A convolutional net's ``model.input_shape`` against the data's rows (and, for
    images, their shape): one line where they differ."""
    shape, d = tuple(config.model.input_shape), config.data
    if d.dataset in ("mnist", "image-folder"):
        size = tuple(d.image_size) or ((28, 28) if d.dataset == "mnist" else ())
        channels = 1 if d.dataset == "mnist" or d.grayscale else 3
        theirs = (channels, *size)
        if size and theirs != shape:
            how = "data.image_size" if d.image_size else "its native size"
            raise UserError(f"model.input_shape = {list(shape)} but the images in {d.path} are "
                            f"{list(theirs)} (channels, height, width: {how}"
                            f"{', data.grayscale' if d.dataset == 'image-folder' else ''}); "
                            f"set model.input_shape = {list(theirs)}")
    if math.prod(shape) != info.features:
        raise UserError(f"model.input_shape = {list(shape)} holds {math.prod(shape)} features "
                        f"but {info.name} has {info.features} a row; set model.input_shape "
                        f"to the rows' (channels, height, width)")


def _start_from(config: Config) -> tuple[Normalization, np.ndarray]:
    """``model.init_from``'s normalization and flat parameters, its layers checked against
    this run's."""
    source = config.model.init_from
    spec, params = read_run(source)
    layers = config.model.layers
    if tuple(layers) != spec.layers:
        theirs, ours = list(zip(spec.layers[1:], spec.layers[:-1])), \
            list(zip(layers[1:], layers[:-1]))
        n, (a, b) = next(((n, ab) for n, ab in enumerate(zip(theirs, ours), start=1)
                          if ab[0] != ab[1]), (len(ours), (None, None)))
        where = f"W{n} is {a} there and {b} here" if a and b else \
            f"it has {len(theirs)} layers, this run {len(ours)}"
        raise UserError(f"--init-from {source}: its network is {list(spec.layers)} but "
                        f"model.layers = {list(layers)} ({where}); use the same layers, or "
                        f"train from scratch without --init-from")
    if tuple(config.model.input_shape) != spec.input_shape and not layerspec.dense_only(layers):
        raise UserError(f"--init-from {source}: its network takes images "
                        f"{list(spec.input_shape)} but model.input_shape = "
                        f"{list(config.model.input_shape)}; use the same input shape, or train "
                        f"from scratch without --init-from")
    flat = np.concatenate([params[f"{k}{n}"].ravel()
                           for n in range(1, len(spec.weight_shapes) + 1)
                           for k in "Wb"])                                     # (P,)
    return spec.normalization, flat
