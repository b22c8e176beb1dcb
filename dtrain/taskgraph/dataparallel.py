"""Data-parallel task graphs: each minibatch a plain dict of deterministic keys.

One training step is::

    forward-backward-<step>-<shard>      one per shard, on the worker holding the shard
    reduce-<step>-<level>-<first shard>  tree levels, fan-in k, children in shard order
    update-<step>                        sum of the last level + optimizer step

(every key ends in ``-<run>`` so several runs can share a cluster; the
grammar is :mod:`dtrain.core.keys`).  With ``fuse_update`` the root of the
reduce tree *is* the update task, saving a hop.  The tree has ``depth =
ceil(log_k shards)`` levels, counting the fused root; a group of one child
passes through without a task.  A parameter server is the same graph with one
flat level (``k = shards``) whose root sits on a head worker that holds no
shard.  With replicated updates (the ``allreduce`` default) every worker runs
its own ``update-<step>-<first shard>`` from the root level's partial sums
(or, a window cut across 3 or more workers, from their sum, one ``reduce``
on the root), and the next step's ``forward-backward`` tasks apply the same
update first instead of waiting for it.  With ``fuse_shards`` a reduce group whose shards
all sit on one worker is one ``forward-backward`` task (named by its first
shard) that sums them as the reduce would (``auto``: where that is worth it,
:func:`fuse_choice`).  Local SGD replaces each step by a
round: ``local-sgd-<step>-<shard>`` leaves that run ``sync_every`` steps
alone, averaged by the tree (a worker's group of them fused the same way).

The tree itself is :mod:`~dtrain.taskgraph.reduction`, where tasks run
:mod:`~dtrain.taskgraph.placement`, what they compute
:mod:`~dtrain.taskgraph.tasks`, with the records of
:mod:`~dtrain.taskgraph.records`.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from operator import methodcaller
from typing import Any

from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.data.shards import ShardSource, load_shard
from dtrain.maths.optim import Step, TrainState
from dtrain.data import partitions
from dtrain.data.partitions import PartSource
from dtrain.taskgraph.placement import Placement, Worker, place, place_partitions
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.records import (Average, Evaluate, ForwardBackward, Group, LocalSteps,
                                      Update, Updates)
from dtrain.taskgraph.reduction import Leaf, Spec, add, shape
from dtrain.taskgraph.evaluation import HeldOut, add_evaluation
from dtrain.taskgraph.tasks import average_states, forward_backward, local_steps, update_state
from dtrain.taskgraph.treesum import flat
from dtrain.taskgraph.window import DataItem, Window

_LEAF_PREFIXES = tuple(f"{kind}-" for kind in keys.LEAVES)   # no other kind starts so
TINY_FLOPS = 2e6    # a shard's forward-backward this small (~1 ms of NumPy) is not worth a thread
# graph.fuse_shards = "auto" fuses a worker's shards where a shard's forward-backward is at most
# this many FLOP per task that fusing saves.  A task costs the scheduler and its worker about
# 1 ms of CPU (benchmarks/model.py: 0.6 ms of scheduler CPU, plus the worker's own), and one
# thread computes 50-180 GFLOP/s of float32 forward-backward, so below this line the saved
# tasks are worth more than ~5 % of a step's compute (benchmarks/README.md, "Shards in one
# task or one each", measures the line)
FUSE_FLOPS_PER_TASK = 1e9


def step_tree(win: Window, index: int, leaves: Leaves, placement: Placement,
              recipe: Recipe, run: str, readers: Sequence[str] = ()
              ) -> tuple[list[Leaf], dict[str, bool], dict[int, Spec]]:
    """Add step ``index``'s reduce tree of ``leaves`` to ``win`` (the tree's shape is worked
    out once per placement).

    A step's graph is :func:`step_leaves`, then this tree, then a task per leaf left
    (:func:`leaf_tasks`); the builders of a training step and of a full-batch evaluation
    (:mod:`~dtrain.taskgraph.fullbatch`) share the three.

    Parameters
    ----------
    win
        The window the reduce tasks are added to.
    index
        The step (or evaluation) the tree sums, as its keys name it.
    leaves
        The step's leaves, from :func:`step_leaves`.
    placement, recipe, run
        Where tasks run, the run's constants, the run id that ends every key.
    readers
        The workers that read the root level's sums (replicated updates); none: the root's
        update reads them.

    Returns
    -------
    top
        The root level's inputs, as ``(key, first shard, worker)``.
    crosses
        By key, whether each value the tree reads leaves its worker.
    spec
        The leaves left (a worker's fused shards make one), by first shard, each with the
        shards it sums.
    """
    # the root level's sums: combined by the root task (the update), or, read on several
    # workers, by each reader; read on 3 or more with root_sum, by a reduce task on the root
    root_task = recipe.fuse_update if not readers else \
        not (recipe.root_sum and len(set(readers)) > 2)
    got = shape(leaves.workers, placement.root, recipe.fan_in, root_task, tuple(readers),
                recipe.fuse_shards == "true")
    top, crosses = add(win, got, leaves.name, str(index), run, recipe.leaf_bytes)
    return top, crosses, got.spec


def fuse_choice(recipe: Recipe, placement: Placement, rows: int) -> tuple[bool, str]:
    """Whether a worker's shards share one ``forward-backward`` task (``graph.fuse_shards``),
    and why, for shards of about ``rows`` rows a step.

    ``auto`` fuses where a worker holds ``w > 1`` shards and a shard's forward-backward is at
    most ``FUSE_FLOPS_PER_TASK * (w - 1)`` FLOP: the ``w - 1`` tasks saved per worker and
    step then cost more than a few percent of its compute.  Elsewhere a task per shard
    costs nothing measurable, and the dashboard shows every shard.
    """
    width = max(Counter(placement.leaves).values(), default=1)
    if recipe.fuse_shards != "auto":
        return recipe.fuse_shards == "true", f"graph.fuse_shards = {recipe.fuse_shards}"
    if width < 2:
        return False, "auto: one shard per worker, nothing to fuse"
    if any(w in placement.gpus for w, n in Counter(placement.leaves).items() if n > 1):
        return True, "auto: a GPU computes its shards of a step in one pass"
    if recipe.fuse_steps and len(set(placement.leaves)) == 1 and placement.root in placement.leaves:
        return True, ("auto: one worker holds every shard, so each window runs as one task "
                      "(graph.fuse_steps) and its shards share a forward-backward, computed on "
                      "the worker's cores")
    flops = recipe.net.flops(rows)
    fused = flops <= FUSE_FLOPS_PER_TASK * (width - 1)
    what = (f"auto: up to {width} shards per worker of {flops / 1e6:.3g} MFLOP each ({rows} "
            f"rows a task)")
    return fused, what + (f": one task saves {width - 1} per worker and step, worth more "
                          f"than a few percent of the compute" if fused else
                          ": a task per shard costs a few percent of the compute at most")


@functools.lru_cache(maxsize=256)
def _nesting(spec: Spec) -> tuple[tuple[int, ...], int | tuple]:
    """A fused leaf's shards in order, and their nesting by position in that order."""
    shards = flat(spec)
    at = {i: p for p, i in enumerate(shards)}

    def positions(s: Spec) -> int | tuple:
        return at[s] if isinstance(s, int) else tuple(positions(c) for c in s)

    return tuple(shards), positions(spec)


def _group(spec: Spec, step: Step, worker: str, placement: Placement, recipe: Recipe) -> Group:
    """The :class:`~dtrain.taskgraph.records.Group` of a leaf: its shards' rows this step,
    their nesting, and how many threads may share the work (none for tiny shards or a GPU)."""
    if isinstance(spec, int):
        return Group.one(spec, step.bounds[spec])
    shards, nesting = _nesting(spec)
    rows = tuple(step.bounds[i] for i in shards)
    worth = recipe.net.flops(max(hi - lo for lo, hi in rows)) > TINY_FLOPS
    threads = len(shards) if worth and worker not in placement.gpus else 1
    return Group(shards, rows, nesting, threads,
                 processes=threads > 1 and recipe.cores != "threads")


def leaf_tasks(leaves: Leaves, spec: dict[int, Spec], step: Step,
               shards: Sequence[TaskRef], placement: Placement, recipe: Recipe
               ) -> Iterator[tuple[str, int, str, Group, tuple[TaskRef, ...]]]:
    """What each leaf task of a step computes: one per leaf left in the tree.

    Parameters
    ----------
    leaves
        The step's leaves, from :func:`step_leaves`.
    spec
        The leaves left and the shards each sums, from :func:`step_tree`.
    step
        The step, whose rows of each shard the leaves read.
    shards
        Every shard's loading task, in shard order.
    placement, recipe
        Where tasks run, and the run's constants.

    Yields
    ------
    tuple
        ``(key, first shard, worker, group, shard refs)``: the task's key, the first shard
        it sums, its worker, its :class:`~dtrain.taskgraph.records.Group` and the shards it
        reads; the caller makes the task (``forward-backward`` or ``local-sgd``).
    """
    for i, sp in spec.items():
        worker = leaves.workers[i]
        group = _group(sp, step, worker, placement, recipe)
        yield leaves.name(i), i, worker, group, tuple(shards[j] for j in group.shards)


@dataclass(frozen=True)
class Leaves:
    """A step's leaves: leaf ``i`` is ``<kind>-<index>-<i>-<run>`` on ``workers[i]``, named
    only where a task of that name is made (a worker's fused shards make one)."""

    kind: str
    index: int
    workers: tuple[str, ...]
    run: str

    def name(self, i: int) -> str:
        return keys.make(self.kind, self.index, i, run=self.run)


def step_leaves(kind: str, index: int, shards: Sequence[TaskRef], placement: Placement,
                run: str) -> Leaves:
    """Step ``index``'s leaves of ``kind`` (``forward-backward`` or ``local-sgd``): one per
    shard, on the worker that holds it."""
    workers = placement.leaves           # the same tuple each step: its tree's shape is cached
    return Leaves(kind, index, workers if len(workers) == len(shards) else
                  tuple(workers[:len(shards)]), run)


def _state_leaves_root(placement: Placement) -> bool:
    """Whether a state made by the update must go to host memory: another worker needs it."""
    return any(w != placement.root for w in placement.leaves)


def add_step(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key.

    ``steps`` is the one step (a unit of one); ``host``: the new state must be in host
    memory (it leaves the root worker)."""
    (step,) = steps
    leaves = step_leaves(keys.FORWARD_BACKWARD, step.index, shards, placement, run)
    root, crosses, spec = step_tree(win, step.index, leaves, placement, recipe, run)
    for name, _, worker, group, refs in leaf_tasks(leaves, spec, step, shards, placement,
                                                    recipe):
        task = ForwardBackward(recipe.net, recipe.shuffle_seed, step.epoch, group, crosses[name])
        win.add(Task(name, forward_backward, task, TaskRef(state), *refs), worker,
                recipe.leaf_bytes)
    task = Update(recipe.opt, (step.rowless(),), host, recipe.events_for(step, run))
    return win.add(Task(keys.make(keys.UPDATE, step.index, run=run), update_state, task,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root,
                   recipe.state_bytes)


Link = tuple[Step, tuple[TaskRef, ...]]     # a step, and its reduced partial sums


@dataclass(frozen=True)
class Carry:
    """What a replicated step hands to the next: on worker ``w`` the state before the step
    is ``base[w]`` after the updates of the ``chain``'s steps, in order."""

    base: dict[str, str]
    chain: tuple[Link, ...] = ()

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(step for step, _ in self.chain)

    @property
    def partials(self) -> list[TaskRef]:
        return [ref for _, refs in self.chain for ref in refs]

    @property
    def widths(self) -> tuple[int, ...]:
        """How many partial sums each step of the chain has."""
        return tuple(len(refs) for _, refs in self.chain)


@functools.lru_cache(maxsize=8)
def _first_shards(leaves: tuple[str, ...]) -> dict[str, int]:
    """Each worker's first shard."""
    return {w: i for i, w in reversed(list(enumerate(leaves)))}


def replicated_update(win: Window, carry: Carry, workers: Sequence[str], placement: Placement,
                      recipe: Recipe, run: str, host: bool) -> dict[str, str]:
    """``update-<step>-<first shard>`` on each of ``workers``: the chain's updates, applied
    to each worker's own copy of the state, named by the chain's last step.  The window's
    end (``host``) also sends that step's event.  Returns the new state key per worker."""
    steps, partials = carry.steps, carry.partials
    task = Update(recipe.opt, steps, host,
                  recipe.events_for(steps[-1], run) if host else None, carry.widths)
    out = dict(carry.base)
    for w in workers:
        name = keys.make(keys.UPDATE, steps[-1].index, _first_shards(placement.leaves)[w],
                         run=run)
        out[w] = win.add(Task(name, update_state, task, TaskRef(carry.base[w]), *partials), w,
                         recipe.state_bytes)
    return out


def add_replicated_step(win: Window, step: Step, carry: Carry, shards: Sequence[TaskRef],
                        placement: Placement, recipe: Recipe, run: str, last: bool) -> Carry:
    """Add one minibatch where every worker applies the update itself, as DDP and Horovod do.

    The gradients are tree-reduced as in :func:`add_step` up to the root
    level, whose few partial sums every worker reads.  Where 3 or more workers
    read them and the window runs as a task per worker (``recipe.root_sum``:
    ``graph.fuse_steps``, ``graph.reduce = "tree"``), the root's ``reduce``
    sums them and every worker reads that sum (the cut window makes it on both
    makers of a fan-in-2 level, which exchange their sums:
    :func:`dtrain.taskgraph.span.cut`): on 4 workers at fan-in 2, 6 buffers
    cross a step instead of 8 (each level-1 sum sent to 3 workers), and the
    level is added on one or two workers, not on every one; the same bits,
    summed in the same order.  Two workers exchange their sums and each adds
    them, and a graph run step by step would pay a scheduler round trip for
    the extra level.  Each ``forward-backward``
    applies the updates of the steps since its worker's state was last kept
    (the carry's chain) and then computes, so a step costs one scheduler
    round trip instead of two, and only gradients cross the network.  Every
    ``recipe.state_every`` steps, and after an epoch's last step (its
    evaluation reads the state), ``update-<step>-<first shard>`` keeps each
    worker's state; between them a worker computes each update once, for all
    the tasks that apply it (:mod:`dtrain.taskgraph.tasks`).  The root's first
    ``forward-backward`` sends the chain's last step event.  ``last``: no
    step follows in this window, so only the root reads the partials.
    """
    workers = list(dict.fromkeys(placement.leaves))
    leaves = step_leaves(keys.FORWARD_BACKWARD, step.index, shards, placement, run)
    top, crosses, spec = step_tree(win, step.index, leaves, placement, recipe, run,
                                   readers=() if last else workers)
    nxt = carry
    if carry.chain and (len(carry.chain) >= recipe.state_every or carry.chain[-1][0].last):
        # keep the state (off the critical path: these tasks wait for what the next step's
        # forward-backward tasks wait for)
        nxt = Carry(replicated_update(win, carry, [placement.root] if last else workers,
                                      placement, recipe, run, False))
    events = recipe.events_for(carry.chain[-1][0], run) if carry.chain else None
    updates = Updates(recipe.opt, carry.steps, carry.widths) if carry.chain else None
    partials = tuple(carry.partials) if updates else ()
    for name, i, worker, group, refs in leaf_tasks(leaves, spec, step, shards, placement,
                                                    recipe):
        task = ForwardBackward(recipe.net, recipe.shuffle_seed, step.epoch, group,
                               crosses[name], dataclasses.replace(updates, events=events)
                               if updates and i == 0 else updates)
        win.add(Task(name, forward_backward, task, TaskRef(carry.base[worker]), *refs,
                     *partials), worker, recipe.leaf_bytes)
    # the chain goes to every worker's tasks: its steps without the rows of every shard
    return Carry(nxt.base, (*nxt.chain, (step.rowless(), tuple(TaskRef(g[0]) for g in top))))


def add_round(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
              placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one local SGD round: each shard runs ``steps`` alone, then the tree averages."""
    last = steps[-1].index
    leaves = step_leaves(keys.LOCAL_SGD, steps[0].index, shards, placement, run)
    root, crosses, spec = step_tree(win, last, leaves, placement, recipe, run)
    for name, i, worker, group, refs in leaf_tasks(leaves, spec, steps[0], shards, placement,
                                                    recipe):
        task = LocalSteps(recipe.opt, recipe.shuffle_seed, tuple(steps), group, crosses[name])
        win.add(Task(name, local_steps, task, TaskRef(state), *refs), worker,
                recipe.leaf_bytes)
    # the round is reported as its last step (its epoch sums restart with its first)
    task = Average(recipe.opt, dataclasses.replace(steps[0], index=last), host,
                   recipe.events_for(steps[-1], run))
    return win.add(Task(keys.make(keys.UPDATE, last, run=run), average_states, task,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root,
                   recipe.state_bytes)


Unit = Callable[..., str]       # add_step or add_round: one unit of steps, its new state's key


def units(steps: Sequence[Step], recipe: Recipe) -> list[tuple[Step, ...]]:
    """Steps grouped as the graph runs them: one by one, or local SGD rounds of
    ``sync_every`` steps aligned to each epoch's start (a round never spans two epochs)."""
    out: list[list[Step]] = []
    for s in steps:
        if not out or recipe.unit_starts(s):
            out.append([])
        out[-1].append(s)
    return [tuple(u) for u in out]


def window_graph(steps: Sequence[Step], start: TrainState, shards: Sequence[TaskRef],
                 val: HeldOut, placement: Placement, recipe: Recipe, run: str,
                 unit: Unit = add_step) -> Window:
    """Chain ``steps`` into one graph that starts from the literal state ``start``, a
    ``unit`` (:func:`add_step` or :func:`add_round`) at a time.

    Each epoch that ends inside the window gets an ``evaluate-<epoch>`` task
    on the validation shard ``val`` (without a validation split it reports the
    epoch's train loss only: it still marks the epoch's end).
    """
    win = Window()      # a local SGD round computes sync_every steps' rows
    fuse, why = fuse_choice(recipe, placement, max(map(shard_rows, steps)) * recipe.sync_every)
    recipe = dataclasses.replace(recipe, fuse_shards="true" if fuse else "false")
    state = win.add(DataNode(keys.make(keys.STATE, steps[0].index, run=run), start),
                    placement.root, recipe.state_bytes)
    todo = units(steps, recipe)
    if recipe.replicated and len(placement.workers) > 1:  # one worker: the root's update is it
        _replicated_window(win, steps, state, shards, val, placement, recipe, run)
    else:
        for n, group in enumerate(todo):
            host = n == len(todo) - 1 or _state_leaves_root(placement)   # the driver takes it
            state = unit(win, group, state, shards, placement, recipe, run, host)
            if group[-1].last:
                _evaluate(win, group[-1].epoch, state, val, placement, recipe, run)
        win.ends = [state]
    leaves = sum(map(methodcaller("startswith", _LEAF_PREFIXES), win.dsk))   # kind_of, fast
    done = leaves < len(todo) * len(shards)             # some task sums several shards
    win.fused = (done, why if done or not fuse else
                 why + "; but no reduce group lies on one worker (fan-in, placement)")
    return win


def shard_rows(step: Step) -> int:
    """The most rows a shard computes in ``step``."""
    return max(hi - lo for lo, hi in step.bounds)


def _evaluate(win: Window, epoch: int, state: str, val: HeldOut, placement: Placement,
              recipe: Recipe, run: str) -> None:
    win.evals[epoch] = add_evaluation(win, Evaluate(recipe.net, epoch, recipe.keep_states),
                                      state, val, placement.root, run)


def _replicated_window(win: Window, steps: Sequence[Step], state: str,
                       shards: Sequence[TaskRef], val: HeldOut, placement: Placement,
                       recipe: Recipe, run: str) -> Window:
    """:func:`window_graph` with replicated updates: a step's state exists on the root once the
    next step's updates are added (or the window's final update)."""
    root = placement.root
    carry = Carry({w: state for w in placement.leaves})
    for n, step in enumerate(steps):
        last = n == len(steps) - 1
        carry = add_replicated_step(win, step, carry, shards, placement, recipe, run, last)
        if n and steps[n - 1].last:
            _evaluate(win, steps[n - 1].epoch, carry.base[root], val, placement, recipe, run)
    end = replicated_update(win, carry, [root], placement, recipe, run, True)[root]
    if steps[-1].last:
        _evaluate(win, steps[-1].epoch, end, val, placement, recipe, run)
    win.ends = [end]
    return win


class DataParallel:
    """The graph builder of the data-parallel strategies: one leaf per shard, each shard
    built by a loading task on its worker.

    Parameters
    ----------
    recipe
        The run's constants.
    sources
        Each shard's loading record, in shard order.
    server
        A head worker reduces and updates and holds no shard (a parameter server).
    unit
        :func:`add_step`, or :func:`add_round` for local SGD.
    """

    def __init__(self, recipe: Recipe, sources: Sequence[ShardSource], server: bool = False,
                 unit: Unit = add_step):
        self.recipe, self.sources, self.server, self.unit = recipe, list(sources), server, unit

    @property
    def min_workers(self) -> int:
        return 2 if self.server else 1

    def place(self, workers: Sequence[Worker | str],
              holders: Sequence[str | None] | None = None, rows: Sequence[int] = (),
              **moves: Any) -> Placement:
        """Shards in contiguous blocks over ``workers``; partitions already on the cluster
        (``holders``, with their training ``rows``) where they are, but where
        :func:`~dtrain.taskgraph.placement.rebalance` moves them (``moves``: its
        ``nbytes``, ``mode``, ``fit``, ``free``)."""
        if holders is not None:
            return place_partitions(workers, holders, rows, self.server, **moves)
        return place(workers, len(self.sources), self.server)

    def data(self, placement: Placement) -> list[DataItem]:
        def item(i: int, src: ShardSource | PartSource) -> DataItem:
            gpu = placement.leaves[i] in placement.gpus
            if isinstance(src, PartSource):
                return DataItem((keys.LOAD_SHARD, i), partitions.shard,
                                (dataclasses.replace(src.spec, gpu=gpu), i),
                                placement.leaves[i], (src.key,))
            return DataItem((keys.LOAD_SHARD, i), load_shard,
                            (dataclasses.replace(src, gpu=gpu),), placement.leaves[i])
        return [item(i, src) for i, src in enumerate(self.sources)]

    def window(self, steps: Sequence[Step], start: TrainState, refs: Sequence[TaskRef],
               val: HeldOut, placement: Placement, run: str) -> Window:
        return window_graph(steps, start, refs, val, placement, self.recipe, run, self.unit)
