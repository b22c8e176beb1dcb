"""A whole run configuration: :class:`Config`, made from mappings by :func:`from_dict`, and
the rules across its sections.

Each key's own rule is the schema's (:mod:`dtrain.core.config.schema`); here are the rules
that span keys, such as "dataset 'csv' needs data.path", each strategy's rules on the
rest of a config (:data:`STRATEGY_RULES`: "model-parallel runs on CPU workers"), and the
values derived from others (``data.target``, ``model.dtype`` "auto").  The strategies
themselves live a layer above (:mod:`dtrain.taskgraph.strategies`); their rules on a
config sit here, so a config is checked the same whatever has been imported.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from dtrain.core import layerspec
from dtrain.core.arrays import gpu_count
from dtrain.core.config.schema import (LABEL_LOSSES, SECTIONS, VALUE_DATASETS, VALUE_LOSSES,
                                       ClusterConfig, DataConfig, GraphConfig, ModelConfig,
                                       OptimConfig, TrackConfig, TrainConfig)
from dtrain.core.errors import ConfigError
from dtrain.core.fields import build


@dataclass(frozen=True)
class Config:
    """A complete, validated run configuration.

    Build one with :func:`load_config`; change it with :meth:`replace` or
    :func:`apply_overrides`, which validate again.
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    track: TrackConfig = field(default_factory=TrackConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (lists, not tuples), as written to ``config.toml``."""
        return {name: {k: list(v) if isinstance(v, tuple) else v
                       for k, v in dataclasses.asdict(getattr(self, name)).items()}
                for name in SECTIONS}

    def to_toml(self) -> str:
        """The resolved config as TOML text; loading it gives back an equal config."""
        return tomli_w.dumps(self.to_dict())

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys changed, e.g. ``cfg.replace(train={"epochs": 2})``."""
        merged = self.to_dict()
        for name, values in sections.items():
            merged.setdefault(name, {}).update(values)
        if "loss" in sections.get("model", {}) and "target" not in sections.get("data", {}):
            merged["data"]["target"] = "auto"       # derived from the loss: derive it again
        return from_dict(merged, source="replace()")


def from_dict(data: Mapping[str, Any], source: str = "<dict>") -> Config:
    """Build and validate a :class:`Config` from nested mappings.

    Parameters
    ----------
    data
        ``{"section": {"key": value}}``; missing keys take their defaults.
    source
        Where the values came from, for error messages.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a table of sections, got {type(data).__name__}")
    for name, values in data.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown section [{name}] in {source}; "
                              f"known sections: {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"'{name}' in {source} must be a table ([{name}])")
    cfg = Config(**{name: build(cls, name, data.get(name, {}), source)
                     for name, cls in SECTIONS.items()})
    _check_consistency(cfg, source)
    cfg = _images_as_the_net_takes_them(cfg)
    if cfg.data.target == "auto":
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, target=_auto_target(cfg)))
    if cfg.model.dtype == "auto":
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=_auto_dtype(cfg)))
    return cfg


def _images_as_the_net_takes_them(cfg: Config) -> Config:
    """Images resized to a convolutional net's ``model.input_shape`` where
    ``data.image_size`` is not given: its (height, width), and for an image folder its
    channels (1: grey, 3: colour)."""
    shape, d = cfg.model.input_shape, cfg.data
    if len(shape) != 3 or d.image_size or d.dataset not in ("mnist", "image-folder"):
        return cfg
    size = tuple(shape[1:])
    if d.dataset == "mnist":
        if size == (28, 28):
            return cfg                              # MNIST's own size: nothing to resize
        return dataclasses.replace(cfg, data=dataclasses.replace(d, image_size=size))
    return dataclasses.replace(cfg, data=dataclasses.replace(d, image_size=size,
                                                             grayscale=shape[0] == 1))


def _auto_target(cfg: Config) -> str:
    """Real-valued targets for a regression loss, classes for the others."""
    return "value" if cfg.model.loss in VALUE_LOSSES else "class"


def _auto_dtype(cfg: Config) -> str:
    """float32 on GPUs (where it is several times faster), float64 on CPUs."""
    if cfg.cluster.device == "gpu":
        return "float32"
    if cfg.cluster.device == "auto" and not cfg.cluster.scheduler_address \
            and not cfg.cluster.scheduler_file:
        return "float32" if gpu_count() else "float64"
    return "float64"


def _check_consistency(cfg: Config, source: str) -> None:
    """Rules that span more than one key."""
    try:
        layerspec.walk(cfg.model.layers, cfg.model.input_shape)
    except ValueError as exc:
        raise ConfigError(f"{exc} in {source}") from None
    needs_path = {"mnist": "a directory of IDX files", "image-folder": "a directory with one "
                  "folder per class", "csv": "a CSV file", "parquet": "Parquet files (a glob)"}
    if cfg.data.dataset in needs_path and not cfg.data.path:
        raise ConfigError(f"data.path is empty in {source}: dataset '{cfg.data.dataset}' "
                          f"needs {needs_path[cfg.data.dataset]} "
                          f"(e.g. --set data.path=/data/{cfg.data.dataset})")
    STRATEGY_RULES[cfg.graph.strategy](cfg, source)
    if cfg.optim.nesterov and cfg.optim.name != "momentum":
        raise ConfigError(f"optim.nesterov = true in {source} but optim.name = "
                          f"'{cfg.optim.name}': Nesterov's momentum needs optim.name = "
                          f"'momentum'; set optim.nesterov = false or use momentum")
    _check_solver(cfg, source)
    if cfg.train.diverged == "keep-best" and not cfg.train.keep_best:
        raise ConfigError(f"train.diverged = 'keep-best' in {source} ends a diverging run with "
                          f"the best epoch's parameters, which train.keep_best = false does not "
                          f"keep; set train.keep_best = true or train.diverged = 'error'")
    indicators = cfg.data.target == "value" and cfg.model.loss in LABEL_LOSSES   # multilabel
    if cfg.data.target != "auto" and cfg.data.target != _auto_target(cfg) and not indicators:
        raise ConfigError(f"data.target = '{cfg.data.target}' in {source} but model.loss = "
                          f"'{cfg.model.loss}' learns {_auto_target(cfg)} targets; set "
                          f"data.target = 'auto' (or '{_auto_target(cfg)}'), or a loss for "
                          f"{cfg.data.target} targets")
    if (indicators or _auto_target(cfg) == "value") and \
            cfg.data.dataset not in VALUE_DATASETS:
        raise ConfigError(f"model.loss = '{cfg.model.loss}' in {source} learns real-valued "
                          f"targets, but dataset '{cfg.data.dataset}' has classes; use one of "
                          f"{', '.join(map(repr, VALUE_DATASETS))}, or a classification loss")
    c = cfg.cluster
    if c.scheduler_address and c.scheduler_file:
        raise ConfigError(f"cluster.scheduler_address = {c.scheduler_address!r} and "
                          f"cluster.scheduler_file = {c.scheduler_file!r} in {source}: give "
                          f"one of them")
    for key, running in (("scheduler_file", c.scheduler_file),
                         ("scheduler_address", c.scheduler_address)):
        if running and c.kind != "local":
            raise ConfigError(f"cluster.kind = '{c.kind}' in {source} starts its own "
                              f"scheduler; drop cluster.{key} ({running}) or the kind")
        if running and c.tls == "on":
            raise ConfigError(f"cluster.tls = 'on' in {source} makes a per-run certificate for "
                              f"a cluster dtrain starts; a running scheduler ({running}) takes "
                              f"its TLS files from the Dask config (distributed.comm.tls.*)")
    if not layerspec.dense_only(cfg.model.layers) and cfg.model.init == "scikit-learn":
        raise ConfigError(f"model.init = 'scikit-learn' in {source} draws dense layers only; "
                          f"a net with {layerspec.show(next(v for v in cfg.model.layers if not isinstance(v, int)))} "
                          f"takes model.init = 'auto'")
    if cfg.data.dataset == "image-folder" and not cfg.data.image_size \
            and len(cfg.model.input_shape) != 3:
        raise ConfigError(f"data.image_size is empty in {source}: image-folder needs "
                          f"[height, width] to resize every image to (or, for a "
                          f"convolutional net, model.input_shape)")


def epochs_decide(train: TrainConfig, optim: OptimConfig) -> bool:
    """Whether the driver decides from the epoch rows where the run ends or what it keeps:
    early stopping, ``keep_best``, the adaptive rate's end under scikit-learn's rule, a
    diverged step that goes on to its epoch's end (the evaluations then bring their states)."""
    return train.patience > 0 or train.keep_best or train.diverged != "error" or \
        (train.stopping == "scikit-learn" and optim.schedule == "adaptive")


def _check_solver(cfg: Config, source: str) -> None:
    """Full-batch L-BFGS has iterations, not epochs of minibatches: no rate, no schedule and
    nothing to stop early from (scipy stops it: train.epochs, optim.max_fun, optim.gtol)."""
    if cfg.optim.name != "lbfgs":
        return
    if not layerspec.dense_only(cfg.model.layers):
        raise ConfigError(f"optim.name = 'lbfgs' in {source} trains dense layers only; a "
                          f"convolutional net trains with sgd, momentum or adam")
    t = cfg.train
    if t.patience or t.keep_best:
        raise ConfigError(f"optim.name = 'lbfgs' in {source} stops where scipy's L-BFGS-B "
                          f"stops (train.epochs iterations, optim.max_fun evaluations, "
                          f"optim.gtol), so train.patience = {t.patience} and "
                          f"train.keep_best = {str(t.keep_best).lower()} have nothing to do; "
                          f"set train.patience = 0 and train.keep_best = false")
    if cfg.optim.schedule != "constant":
        raise ConfigError(f"optim.schedule = '{cfg.optim.schedule}' in {source} schedules a "
                          f"learning rate, which optim.name = 'lbfgs' does not have (its line "
                          f"search sizes each step); set optim.schedule = 'constant'")


# --- each strategy's rules -------------------------------------------------------------

def _allreduce_only(cfg: Config, source: str) -> None:
    """What only allreduce runs: full-batch L-BFGS (its reduce tree evaluates the whole
    training set) and updates replicated on every worker."""
    name = cfg.graph.strategy
    if cfg.optim.name == "lbfgs":
        raise ConfigError(f"optim.name = 'lbfgs' in {source} computes each loss and "
                          f"gradient over the whole training set with allreduce's reduce "
                          f"tree, not graph.strategy = '{name}'; use graph.strategy = "
                          f"'allreduce'")
    if cfg.graph.update == "replicated":
        raise ConfigError(f"graph.update = 'replicated' in {source} needs graph.strategy = "
                          f"'allreduce' (every worker trains and updates), not "
                          f"'{name}'; use graph.update = 'root' or 'auto'")


_ADAPTIVE = ("optim.schedule = 'adaptive' in {1} decides the rate from each epoch's training "
             "loss inside the update, which graph.strategy = '{0}' splits; use another "
             "schedule or strategy")


def _local_sgd(cfg: Config, source: str) -> None:
    """Local SGD's rounds split the update that the adaptive rate decides in (a one-step
    round is the synchronous step, which runs as allreduce)."""
    _allreduce_only(cfg, source)
    if cfg.optim.schedule == "adaptive" and cfg.graph.sync_every > 1:
        raise ConfigError(_ADAPTIVE.format(cfg.graph.strategy, source))


def _model_parallel(cfg: Config, source: str) -> None:
    """Model parallelism splits dense hidden layers into ``graph.slices``, on CPU workers."""
    _allreduce_only(cfg, source)
    if cfg.optim.schedule == "adaptive":
        raise ConfigError(_ADAPTIVE.format(cfg.graph.strategy, source))
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


def _none(cfg: Config, source: str) -> None:
    """Allreduce runs every config the other rules let through."""


# graph.strategy -> its rules on the rest of a config (each raises ConfigError), a rule for
# every name of STRATEGIES (tests/test_config.py)
STRATEGY_RULES: dict[str, Callable[[Config, str], None]] = {
    "allreduce": _none,
    "parameter-server": _allreduce_only,
    "local-sgd": _local_sgd,
    "model-parallel": _model_parallel,
    "serial": _allreduce_only,
}
