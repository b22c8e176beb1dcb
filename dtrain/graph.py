"""Task graphs: each minibatch a plain dict of deterministic keys.

One training step is::

    forward-backward-<step>-<shard>      one per shard, on the worker holding the shard
    reduce-<step>-<level>-<first shard>  tree levels, fan-in k, children in shard order
    update-<step>                        sum of the last level + optimizer step

(every key ends in ``-<run>`` so several runs can share a cluster).  With
``fuse_update`` the root of the reduce tree *is* the update task, saving a
hop.  The tree has ``depth = ceil(log_k shards)`` levels, counting the fused
root; a group of one child passes through without a task.  ``parameter-server``
is the same graph with one flat level (``k = shards``) whose root sits on a
head worker that holds no shard.

A *window* chains many steps into one graph, starting from the state as a
literal (``state-<step>``): the scheduler can recompute anything inside the
window after a worker loss, and forgets it once the window is done.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.task_spec import DataNode, Task, TaskRef

from dtrain import live
from dtrain.data import load_shard
from dtrain.device import like, to_host
from dtrain.model import Network
from dtrain.optim import (Optimizer, Step, TrainState, average, local_sgd, sum_buffers,
                          update)


def fan_in(strategy: str, requested: int, shards: int) -> int:
    """The effective fan-in, normalised once: ``shards`` (one flat level) for a parameter
    server, else ``requested`` capped at ``shards``."""
    if strategy == "parameter-server":
        return max(shards, 2)
    return max(2, min(requested, shards))


def tree_depth(shards: int, k: int) -> int:
    """Reduce levels for ``shards`` leaves at fan-in ``k``: ``ceil(log_k shards)``."""
    depth, width = 0, shards
    while width > 1:
        width, depth = -(-width // k), depth + 1
    return depth


# --- placement ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Worker:
    """A worker as placement sees it: its address, whether it computes on a GPU, and its
    relative speed (measured when CPU and GPU workers mix; else 1)."""

    address: str
    gpu: bool = False
    weight: float = 1.0


@dataclass(frozen=True)
class Placement:
    """Where tasks run: leaf ``i``'s tasks (shard ``i``, or slice ``i`` of a model-parallel
    net) on ``leaves[i]``, the update on ``root``; ``gpus`` are the GPU workers."""

    leaves: tuple[str, ...]
    root: str
    gpus: frozenset[str] = frozenset()

    @property
    def workers(self) -> list[str]:
        return sorted(set(self.leaves) | {self.root})


def place(workers: Sequence[Worker | str], shards: int, strategy: str) -> Placement:
    """Assign shards to workers in contiguous blocks, so a reduce subtree stays on one worker.

    Blocks are sized by the workers' weights (equal unless calibrated): a GPU
    worker ten times faster than a CPU worker gets ten times the shards.
    ``allreduce``: every worker holds shards, the update runs with shard 0.
    ``parameter-server``: the first worker is the head; it reduces and updates
    and holds no shard.
    """
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    head, trainers = (workers[0], workers[1:]) if strategy == "parameter-server" \
        else (None, workers)
    edges = np.cumsum([w.weight for w in trainers]) / sum(w.weight for w in trainers)
    owner = tuple(trainers[min(int(np.searchsorted(edges, (i + 0.5) / shards)),
                               len(trainers) - 1)].address for i in range(shards))
    return Placement(owner, head.address if head else owner[0],
                     frozenset(w.address for w in workers if w.gpu))


# --- tasks (run on workers) -----------------------------------------------------------------

def forward_backward(net: Network, shuffle_seed: int | None, epoch: int, lo: int, hi: int,
                     host: bool, state: TrainState, shard) -> Any:
    """Summed gradient and loss of one shard's rows ``lo:hi`` this epoch: ``(P + 1,)``,
    computed where the shard lives (host or GPU), returned to host memory if ``host``."""
    x, y = shard.batch(epoch, lo, hi, shuffle_seed)
    buf = net.loss_and_grad(like(state.vector[: net.size], x), x, y)
    return to_host(buf) if host else buf


def reduce(host: bool, *grads) -> Any:
    """Sum gradient buffers in the given (shard) order; to host memory if ``host``."""
    total = sum_buffers(*grads)
    return to_host(total) if host else total


def local_steps(opt: Optimizer, shuffle_seed: int | None, steps: tuple[Step, ...], index: int,
                host: bool, state: TrainState, shard) -> Any:
    """Local SGD leaf: shard ``index`` runs ``steps`` alone from ``state``, where it lives."""
    local = TrainState(like(state.vector, shard.x))
    out = local_sgd(opt, steps, local,
                    lambda s: shard.batch(s.epoch, *s.bounds[index], shuffle_seed))
    return to_host(out) if host else out


def update_and_report(opt: Optimizer, step: Step, run: str, host: bool, state: TrainState,
                      *grads) -> TrainState:
    """:func:`~dtrain.optim.update`, then a ``step`` event to the scheduler (see
    :mod:`dtrain.live`); the event is queued, not waited for."""
    new = update(opt, step, host, state, *grads)
    live.step_event(run, step, state, new)
    return new


def average_and_report(opt: Optimizer, step: Step, run: str, host: bool, state: TrainState,
                       *buffers) -> TrainState:
    """:func:`~dtrain.optim.average` (a local SGD round's end), then a ``step`` event."""
    new = average(opt, step, host, state, *buffers)
    live.step_event(run, step, state, new)
    return new


def evaluate(net: Network, epoch: int, state: TrainState, part) -> dict[str, float]:
    """Loss and accuracy of the state's parameters on a held-out shard (None: there is no
    held-out data), plus the epoch's train loss."""
    out = {"epoch": epoch + 1}
    if part is not None:
        loss, correct, n = net.evaluate(like(state.vector[: net.size], part.x), part.x, part.y)
        out.update(loss=loss / max(n, 1), accuracy=correct / max(n, 1))
    if state.epoch_samples:
        out["train_loss"] = state.epoch_loss / state.epoch_samples
    return out


# --- builders ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataItem:
    """A loading task: ``fn(*args)`` pinned (loosely) to ``worker``; its key starts with
    ``name``.  Where the worker changes, the driver submits a fresh one there."""

    name: tuple[str | int, ...]
    fn: Callable[..., Any]
    args: tuple
    worker: str

@dataclass(frozen=True)
class Recipe:
    """The run's constants the tasks need; small, baked into each task."""

    net: Network
    opt: Optimizer
    shuffle_seed: int | None
    strategy: str = "allreduce"
    fan_in: int = 2
    fuse_update: bool = True
    sync_every: int = 1
    step_events: int = 0           # send a step event every this many steps (0: never)

    def reports(self, step: Step) -> bool:
        """Whether ``step``'s update sends a step event (always at an epoch's end)."""
        return self.step_events > 0 and (step.last or (step.index + 1) % self.step_events == 0)

    @property
    def state_bytes(self) -> int:
        """Size of a TrainState as Dask's ``sizeof`` counts it."""
        return sizeof(TrainState(np.empty(self.net.size * (1 + self.opt.slots), self.net.dtype)))

    @property
    def leaf_bytes(self) -> int:
        """Size of what a leaf sends up the tree: a gradient, or (local SGD) a whole state."""
        width = self.net.size * (1 + self.opt.slots) + 2 if self.strategy == "local-sgd" \
            else self.net.size + 1
        return width * np.dtype(self.net.dtype).itemsize


@dataclass
class Window:
    """A graph of consecutive steps, with the placement and output size of every key.

    ``ends`` are the keys whose values make up the state after the window;
    ``join`` turns those values into one :class:`~dtrain.optim.TrainState`.
    """

    dsk: dict[str, Task | DataNode] = field(default_factory=dict)
    where: dict[str, list[str]] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)    # as Dask's sizeof counts them
    ends: list[str] = field(default_factory=list)
    join: Callable[[list[Any]], TrainState] = lambda values: values[0]
    evals: dict[int, str] = field(default_factory=dict)     # epoch -> evaluate key

    def add(self, node: Task | DataNode, worker: str, nbytes: int = 0) -> str:
        self.dsk[node.key] = node
        self.where[node.key] = [worker]
        self.nbytes[node.key] = nbytes
        return node.key

    def transfers(self, located: dict[str, str]) -> list[tuple[str, str, str]]:
        """``(key, from, to)`` for every value that must cross between workers to run this
        graph, once per receiving worker; ``located`` places keys from outside the graph."""
        moves = set()
        for name, node in self.dsk.items():
            to = self.where[name][0]
            for dep in node.dependencies:
                src = self.where[dep][0] if dep in self.where else located.get(dep, to)
                if src != to:
                    moves.add((dep, src, to))
        return sorted(moves)

    def transfer_bytes(self, located: dict[str, str]) -> int:
        """Bytes that must cross between workers to run this graph."""
        return sum(self.nbytes.get(k, 0) for k, _, _ in self.transfers(located))


def is_leaf(key: str) -> bool:
    """Whether a key is a leaf of the data-parallel graph: the model's maths on a shard."""
    return key.startswith(("forward-backward-", "local-sgd-"))


def key(name: str, *parts: int | str, run: str) -> str:
    """``name-part-part-run``: the dashboard groups tasks by ``name``."""
    return "-".join([name, *map(str, parts), run])


Leaf = tuple[str, int, str]         # (key, first shard, worker)


def tree(win: Window, tag: str, leaves: list[Leaf], root: str, k: int, fuse: bool,
         nbytes: int, run: str) -> tuple[list[Leaf], dict[str, str]]:
    """Reduce ``leaves`` (in leaf order) level by level with fan-in ``k``.

    Returns the root level's inputs, for the root task to combine (``fuse``)
    or one reduce task's output, and the worker that consumes each input, so
    producers know whether their value must leave the GPU.  Keys are
    ``reduce-<tag>-<level>-<first leaf>``; a reduce runs where its first
    child runs, the last level on ``root``.
    """
    level, depth = leaves, tree_depth(len(leaves), k)
    consumer: dict[str, str] = {}
    planned: list[tuple[str, list[Leaf], str]] = []
    for d in range(1, depth + 1):
        if d == depth and fuse:
            break                                   # the root task is this level's root
        groups = [level[j:j + k] for j in range(0, len(level), k)]
        level = []
        for group in groups:
            if len(group) == 1:
                level.append(group[0])
                continue
            first, worker = group[0][1], root if d == depth else group[0][2]
            name = key("reduce", tag, d, first, run=run)
            consumer.update((g[0], worker) for g in group)
            planned.append((name, group, worker))
            level.append((name, first, worker))
    consumer.update((g[0], root) for g in level)
    for name, group, worker in planned:
        win.add(Task(name, reduce, consumer[name] != worker, *(TaskRef(g[0]) for g in group)),
                worker, nbytes)
    return level, consumer


def _tree(win: Window, index: int, leaves: list[Leaf], placement: Placement, recipe: Recipe,
          run: str) -> tuple[list[Leaf], dict[str, str]]:
    k = fan_in(recipe.strategy, recipe.fan_in, len(leaves))
    return tree(win, str(index), leaves, placement.root, k, recipe.fuse_update,
                recipe.leaf_bytes, run)


def _state_leaves_root(placement: Placement) -> bool:
    """Whether a state made by the update must go to host memory: another worker needs it."""
    return any(w != placement.root for w in placement.leaves)


def add_step(win: Window, step: Step, state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key.

    ``host``: the new state must be in host memory (it leaves the root worker)."""
    leaves = [(key("forward-backward", step.index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, consumer = _tree(win, step.index, leaves, placement, recipe, run)
    for (name, i, worker), (lo, hi) in zip(leaves, step.bounds):
        win.add(Task(name, forward_backward, recipe.net, recipe.shuffle_seed, step.epoch, lo, hi,
                     consumer[name] != worker, TaskRef(state), shards[i]), worker,
                recipe.leaf_bytes)
    fn, extra = (update_and_report, (run,)) if recipe.reports(step) else (update, ())
    return win.add(Task(key("update", step.index, run=run), fn, recipe.opt, step, *extra, host,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root,
                   recipe.state_bytes)


def add_round(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
              placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one local SGD round: each shard runs ``steps`` alone, then the tree averages."""
    last = steps[-1].index
    leaves = [(key("local-sgd", steps[0].index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, consumer = _tree(win, last, leaves, placement, recipe, run)
    for name, i, worker in leaves:
        win.add(Task(name, local_steps, recipe.opt, recipe.shuffle_seed, tuple(steps), i,
                     consumer[name] != worker, TaskRef(state), shards[i]), worker,
                recipe.leaf_bytes)
    # the round is reported as its last step (its epoch sums restart with its first)
    report = dataclasses.replace(steps[0], index=last)
    fn, extra = (average_and_report, (run,)) if recipe.reports(steps[-1]) else (average, ())
    return win.add(Task(key("update", last, run=run), fn, recipe.opt, report, *extra, host,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root,
                   recipe.state_bytes)


def units(steps: Sequence[Step], recipe: Recipe) -> list[tuple[Step, ...]]:
    """Steps grouped as the graph runs them: one by one, or local SGD rounds of
    ``sync_every`` steps aligned to each epoch's start (a round never spans two epochs)."""
    out: list[list[Step]] = []
    for s in steps:
        if not out or unit_starts(s, recipe):
            out.append([])
        out[-1].append(s)
    return [tuple(u) for u in out]


def unit_starts(step: Step, recipe: Recipe) -> bool:
    """Whether ``step`` begins a unit (a local SGD round) rather than continuing one."""
    return recipe.strategy != "local-sgd" or step.position % recipe.sync_every == 0


def window_graph(steps: Sequence[Step], start: TrainState, shards: Sequence[TaskRef],
                 val: TaskRef | None, placement: Placement, recipe: Recipe, run: str) -> Window:
    """Chain ``steps`` into one graph that starts from the literal state ``start``.

    Each epoch that ends inside the window gets an ``evaluate-<epoch>`` task
    on the validation shard ``val`` (without a validation split it reports the
    epoch's train loss only: it still marks the epoch's end).
    """
    win = Window()
    state = win.add(DataNode(key("state", steps[0].index, run=run), start), placement.root,
                    recipe.state_bytes)
    todo = units(steps, recipe)
    for n, unit in enumerate(todo):
        host = n == len(todo) - 1 or _state_leaves_root(placement)   # the driver takes the last
        if recipe.strategy == "local-sgd":
            state = add_round(win, unit, state, shards, placement, recipe, run, host)
        else:
            state = add_step(win, unit[0], state, shards, placement, recipe, run, host)
        if unit[-1].last:
            epoch = unit[-1].epoch
            win.evals[epoch] = win.add(
                Task(key("evaluate", epoch + 1, run=run), evaluate, recipe.net, epoch,
                     TaskRef(state), val), placement.root)
    win.ends = [state]
    return win


class DataParallel:
    """``allreduce``, ``parameter-server`` and ``local-sgd``: one leaf per shard, each shard
    built by a loading task on its worker."""

    def __init__(self, recipe: Recipe, data_cfg, ranges: Sequence[tuple[int, int]],
                 n_train: int, dtype: str):
        self.recipe, self.ranges = recipe, list(ranges)
        self.load = (data_cfg, n_train, dtype)

    @property
    def min_workers(self) -> int:
        return 2 if self.recipe.strategy == "parameter-server" else 1

    def place(self, workers: Sequence[Worker | str]) -> Placement:
        return place(workers, len(self.ranges), self.recipe.strategy)

    def data(self, placement: Placement) -> list[DataItem]:
        cfg, n_train, dtype = self.load
        return [DataItem(("load-shard", i), load_shard,
                         (cfg, i, a, b, n_train, dtype, placement.leaves[i] in placement.gpus),
                         placement.leaves[i]) for i, (a, b) in enumerate(self.ranges)]

    def window(self, steps: Sequence[Step], start: TrainState, refs: Sequence[TaskRef],
               val: TaskRef | None, placement: Placement, run: str) -> Window:
        return window_graph(steps, start, refs, val, placement, self.recipe, run)
