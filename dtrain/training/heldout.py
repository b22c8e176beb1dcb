"""A Dask run's held-out data: the validation and test splits, loaded where they are used.

With shards built by loading tasks, the splits are two more loads on the worker where the
updates run (the placement's root), with the training split's normalization; with a Dask
collection's partitions, each partition's held-out rows are loaded beside it, in parts.
The graphs name them (:func:`refs`), and the run ends with the test split's evaluation
(:func:`evaluate_test`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dask
from dask.task_spec import DataNode, Task, TaskRef
from distributed import Client, Future, wait

from dtrain.core import keys
from dtrain.core.broadcast import on_workers
from dtrain.core.modelfile import Normalization
from dtrain.data import partitions
from dtrain.data.prepare import clear_cache, normalization
from dtrain.data.shards import load_part
from dtrain.deploy.workers import forgotten
from dtrain.maths.optim import TrainState
from dtrain.taskgraph import handoff
from dtrain.taskgraph.evaluation import HeldOut, add_evaluation
from dtrain.taskgraph.handoff import StateGone
from dtrain.taskgraph.placement import Placement
from dtrain.taskgraph.records import Evaluate
from dtrain.taskgraph.window import Window
from dtrain.training.plan import Plan

Key = Callable[..., str]        # a task key of this run: key(name, *parts)


@dataclass
class Loaded:
    """The held-out splits as the graphs take them (:data:`val`, :data:`test`: a future, a
    list of ``(future, worker)`` parts, or None for an empty split), every future loaded
    (``futures``, to release with the run) and the training split's normalization."""

    val: Any
    test: Any
    futures: list[Future] = field(default_factory=list)
    normalization: Normalization = field(default_factory=Normalization)


def load(client: Client, plan: Plan, placement: Placement, data: list[Future],
         key: Key) -> Loaded:
    """Validation and test shards, loaded where the updates run (partitioned data: in parts
    beside their partitions), waiting for the training ``data`` too, so that data errors
    surface now."""
    if plan.collection is not None:
        return _parts(client, plan, placement, data, key)
    cfg, root = plan.config, placement.root
    splits = [client.submit(load_part, cfg.data, part, cfg.model.dtype,
                            root in placement.gpus, plan.norm, key=key(f"load-{part}"),
                            workers=[root], allow_other_workers=True)
              if getattr(plan.info, part) else None for part in ("val", "test")]
    futures = [f for f in splits if f is not None]
    norm = client.submit(normalization, cfg.data, plan.norm, key=key(keys.NORMALIZATION),
                         workers=[root], allow_other_workers=True)
    _surface_errors(client, data + futures + [norm])
    on_workers(client, clear_cache)     # the data is built; drop the workers' copies of the files
    return Loaded(splits[0], splits[1], futures, norm.result())


def _parts(client: Client, plan: Plan, placement: Placement, data: list[Future],
           key: Key) -> Loaded:
    """Each partition's validation and test rows, loaded on its worker: ``[(future,
    worker), ...]`` per split (None: the split is empty)."""
    coll = plan.collection
    spec = plan.part_sources[0].spec
    out = []
    for which in ("val", "test"):
        loads = [(client.submit(partitions.held_out, spec, which, i, f,
                                key=key(f"load-{which}", i), workers=[w],
                                allow_other_workers=True), w)
                 for i, (f, w, part) in enumerate(zip(coll.futures, placement.leaves,
                                                      coll.parts))
                 if getattr(part, which)]
        out.append(loads or None)
    futures = [f for loads in out if loads for f, _ in loads]
    _surface_errors(client, data + futures)
    return Loaded(out[0], out[1], futures, plan.fitted)


def _surface_errors(client: Client, futures: list[Future]) -> None:
    """Wait for ``futures``; a worker's exception is raised here."""
    with client.as_current():        # distributed.wait asks the default client
        wait(futures)
    for f in futures:
        if f.status == "error":
            f.result()


def refs(parts: Any) -> HeldOut:
    """Held-out data as the graphs name it: a key, or ``(key, worker)`` per part."""
    if isinstance(parts, list):
        return tuple((TaskRef(f.key), w) for f, w in parts)
    return TaskRef(parts.key) if parts is not None else None


def futures(parts: Any) -> dict[Any, Future]:
    """Held-out data's futures by key."""
    if isinstance(parts, list):
        return {f.key: f for f, _ in parts}
    return {parts.key: parts} if parts is not None else {}


def located(parts: Any, root: str) -> dict[Any, str]:
    """Where held-out data sits: on the root, or each part beside its partition."""
    if isinstance(parts, list):
        return {f.key: w for f, w in parts}
    return {parts.key: root} if parts is not None else {}


def evaluate_test(client: Client, plan: Plan, run: str, state: TrainState, test: Any,
                  placement: Placement, kept: int | None = None,
                  attempt: int = 0) -> dict[str, float]:
    """The test split's evaluation of ``state`` (in parts where they are, if split);
    ``kept``: ``state`` is the one the root worker keeps from before that step (by the
    engine's ``attempt``), so the graph takes it there rather than carrying it (a worker
    gone since: sent after all)."""
    name = keys.make(keys.STATE, len(plan.schedule), run=run)
    for node in ([Task(name, handoff.take, handoff.Handed(run, kept, attempt=attempt))]
                 if kept is not None else []) + [DataNode(name, state)]:
        win = Window()
        start = win.add(node, placement.root)
        key = add_evaluation(win, Evaluate(plan.net, -1), start, refs(test), placement.root,
                             run)
        try:
            with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True):
                return client.get(win.dsk, key)
        except StateGone:       # the same keys next, with the state sent: once the failed
            forgotten(client, list(win.dsk),    # ones are gone (else their outcome comes
                      plan.config.cluster.timeout)                  # back for them)
    raise AssertionError("unreachable: the literal state always evaluates")
