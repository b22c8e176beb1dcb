"""Pictures of what a config would run: one step's task graph, and the gallery in ``graphs/``.

:func:`step_picture` builds the graph the trainer would submit for step 0
(with the loading tasks it refers to) for ``cluster.workers`` fake workers (2 if 0),
as a :class:`~dtrain.observe.drawing.Picture`; the gallery is every
strategy's own pictures (:attr:`dtrain.taskgraph.strategies.Strategy.pictures`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import graphviz
from dask.task_spec import TaskRef

from dtrain.core import keys, layerspec
from dtrain.core.config import Config, load_config
from dtrain.core.errors import UserError
from dtrain.observe.drawing import Picture, draw, render
from dtrain.taskgraph.dataparallel import units
from dtrain.taskgraph.strategies import STRATEGIES
from dtrain.training.plan import plan

GALLERY_BASE = ("data.shards=8", "cluster.workers=4")
PICTURE_WORKERS = 2              # fake workers where cluster.workers is 0 (as the layout says)
RUN = "picture"                  # the run id in the pictured keys (not shown)


def step_picture(config: Config) -> Picture:
    """One training step's task graph for ``config`` (a local SGD round: one round), placed on
    ``cluster.workers`` workers (:data:`PICTURE_WORKERS` if 0), one thread each."""
    cfg = config
    # replicated updates keep each state every graph.state_every steps; the picture keeps
    # step 0's, to show where it would be kept
    p = plan(dataclasses.replace(cfg, graph=dataclasses.replace(cfg.graph, state_every=1)))
    if p.builder is None:
        raise UserError(f"graph.strategy = '{p.strategy.name}' runs without a task graph; "
                        f"picture another strategy, e.g. 'allreduce' or 'parameter-server'")
    workers = [f"worker-{i}" for i in range(cfg.cluster.workers or PICTURE_WORKERS)]
    if len(workers) < p.builder.min_workers:
        raise UserError(f"graph.strategy = '{p.strategy.name}' needs {p.builder.min_workers} "
                        f"workers ({p.strategy.workers_word.removeprefix('the head + ')}); use "
                        f"--set cluster.workers={p.builder.min_workers} or more")
    where = p.builder.place(workers)
    items = p.builder.data(where)
    refs = [TaskRef(keys.make(*item.name, run=RUN)) for item in items]
    val = TaskRef(keys.make(keys.LOAD_VAL, run=RUN)) if p.info.val else None
    steps = list(units([p.schedule[t] for t in range(p.schedule.steps_per_epoch)],
                       p.recipe)[0])
    if p.recipe.replicated:
        # steps 0 and 1 of a longer window: every worker's update of step 0, and the step 1
        # forward-backward tasks that read the same partial sums (step 2 is built, not shown)
        steps = [p.schedule[t] for t in range(3)]
    win = p.builder.window(steps, p.initial_state(), refs, val, where, RUN)
    if p.recipe.replicated:
        for k in list(win.dsk):
            key = keys.parse(k)
            if key.kind in (keys.FORWARD_BACKWARD, keys.REDUCE, keys.UPDATE) and key.step == 2:
                del win.dsk[k], win.where[k]
    nodes = {ref.key: item.worker for ref, item in zip(refs, items)}
    deps = {k: sorted(win.dsk[k].dependencies) for k in win.dsk}
    if val is not None and any(val.key in d for d in deps.values()):
        nodes[val.key] = where.root
    nodes.update({k: w[0] for k, w in win.where.items()})
    detail = p.strategy.describe(cfg, p.recipe)
    if p.recipe.replicated:
        detail += ", replicated updates (steps 0 and 1)"
    title = (f"{p.strategy.name}{detail}: {len(p.ranges)} shards on {len(workers)} workers "
             f"(layers {_layers(cfg)})")
    return Picture(f"dtrain-{p.strategy.name}", title, workers, nodes, deps, where.leaves,
                   where.root, p.strategy.leaf, RUN)


def _layers(cfg: Config) -> str:
    """A dense net's sizes as a list (the gallery's titles), any other's in a line."""
    if layerspec.dense_only(cfg.model.layers):
        return str(list(cfg.model.layers))
    return layerspec.describe(cfg.model.layers, cfg.model.input_shape)


def step_graph(config: Config) -> graphviz.Digraph:
    """:func:`step_picture` as DOT."""
    return draw(step_picture(config))


def gallery() -> dict[str, graphviz.Digraph]:
    """The pictures kept in ``graphs/``, by file name (without suffix)."""
    return {name: step_graph(load_config(None, [*GALLERY_BASE, f"graph.strategy={s.name}",
                                                *sets]))
            for s in STRATEGIES.values() for name, sets in s.pictures.items()}


def write_gallery(directory: str | Path) -> list[Path]:
    """Write each :func:`gallery` picture as ``NAME.dot`` and ``NAME.svg``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [render(dot, directory / f"{name}.{fmt}")
            for name, dot in gallery().items() for fmt in ("dot", "svg")]
