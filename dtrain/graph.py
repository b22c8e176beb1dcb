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

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.task_spec import DataNode, Task, TaskRef

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
class Placement:
    """Where tasks run: shard ``i``'s tasks on ``shards[i]``, the update on ``root``."""

    shards: tuple[str, ...]
    root: str

    @property
    def workers(self) -> list[str]:
        return sorted(set(self.shards) | {self.root})


def place(workers: Sequence[str], shards: int, strategy: str) -> Placement:
    """Assign shards to workers in contiguous blocks, so a reduce subtree stays on one worker.

    ``allreduce``: every worker holds shards, the update runs with shard 0.
    ``parameter-server``: the first worker is the head; it reduces and updates
    and holds no shard.
    """
    workers = list(workers)
    if strategy == "parameter-server":
        head, trainers = workers[0], workers[1:]
    else:
        head, trainers = None, workers
    owner = tuple(trainers[i * len(trainers) // shards] for i in range(shards))
    return Placement(owner, head or owner[0])


# --- tasks (run on workers) -----------------------------------------------------------------

def forward_backward(net: Network, shuffle_seed: int | None, epoch: int, lo: int, hi: int,
                     state: TrainState, shard) -> Any:
    """Summed gradient and loss of one shard's rows ``lo:hi`` this epoch: ``(P + 1,)``."""
    x, y = shard.batch(epoch, lo, hi, shuffle_seed)
    return net.loss_and_grad(state.vector[: net.size], x, y)


def reduce(*grads) -> Any:
    """Sum gradient buffers in the given (shard) order."""
    return sum_buffers(*grads)


def local_steps(opt: Optimizer, shuffle_seed: int | None, steps: tuple[Step, ...], index: int,
                state: TrainState, shard) -> Any:
    """Local SGD leaf: shard ``index`` runs ``steps`` alone from ``state``."""
    return local_sgd(opt, steps, state,
                     lambda s: shard.batch(s.epoch, *s.bounds[index], shuffle_seed))


def evaluate(net: Network, epoch: int, state: TrainState, part) -> dict[str, float]:
    """Loss and accuracy of the state's parameters on a held-out shard, plus train loss."""
    loss, correct, n = net.evaluate(state.vector[: net.size], part.x, part.y)
    out = {"epoch": epoch + 1, "loss": loss / max(n, 1), "accuracy": correct / max(n, 1)}
    if state.epoch_samples:
        out["train_loss"] = state.epoch_loss / state.epoch_samples
    return out


# --- builders ---------------------------------------------------------------------------------

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

    def output_bytes(self, key: str) -> int:
        """Size (as Dask's ``sizeof`` counts it) of the value a task of this graph returns."""
        item = np.dtype(self.net.dtype).itemsize
        state = self.net.size * (1 + self.opt.slots)
        if key.startswith(("update-", "state-")):
            return sizeof(TrainState(np.empty(state, self.net.dtype)))
        if key.startswith(("forward-backward-", "reduce-", "local-sgd-")):
            local = self.strategy == "local-sgd"          # local SGD reduces whole states
            return ((state + 2) if local else (self.net.size + 1)) * item
        return 0


@dataclass
class Window:
    """A graph of consecutive steps, with the placement of every key."""

    dsk: dict[str, Task | DataNode] = field(default_factory=dict)
    where: dict[str, list[str]] = field(default_factory=dict)
    end: str = ""                                   # key of the last state
    evals: dict[int, str] = field(default_factory=dict)   # epoch -> evaluate key

    def add(self, node: Task | DataNode, worker: str) -> str:
        self.dsk[node.key] = node
        self.where[node.key] = [worker]
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


def key(name: str, *parts: int | str, run: str) -> str:
    """``name-part-part-run``: the dashboard groups tasks by ``name``."""
    return "-".join([name, *map(str, parts), run])


Leaf = tuple[str, int, str]         # (key, first shard, worker)


def _tree(win: Window, index: int, leaves: list[Leaf], placement: Placement, recipe: Recipe,
          run: str) -> list[Leaf]:
    """Reduce ``leaves`` (in shard order) level by level; return the root level's inputs,
    for the update task to combine (fused) or one reduce task's output (unfused)."""
    k = fan_in(recipe.strategy, recipe.fan_in, len(leaves))
    level, depth = leaves, tree_depth(len(leaves), k)
    for d in range(1, depth + 1):
        if d == depth and recipe.fuse_update:
            break                                   # the update task is this level's root
        groups = [level[j:j + k] for j in range(0, len(level), k)]
        level = []
        for group in groups:
            if len(group) == 1:
                level.append(group[0])
                continue
            first, worker = group[0][1], placement.root if d == depth else group[0][2]
            name = key("reduce", index, d, first, run=run)
            win.add(Task(name, reduce, *(TaskRef(g[0]) for g in group)), worker)
            level.append((name, first, worker))
    return level


def add_step(win: Window, step: Step, state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key."""
    leaves = []
    for i, (shard, (lo, hi)) in enumerate(zip(shards, step.bounds)):
        name = key("forward-backward", step.index, i, run=run)
        win.add(Task(name, forward_backward, recipe.net, recipe.shuffle_seed, step.epoch, lo, hi,
                     TaskRef(state), shard), placement.shards[i])
        leaves.append((name, i, placement.shards[i]))
    root = _tree(win, step.index, leaves, placement, recipe, run)
    return win.add(Task(key("update", step.index, run=run), update, recipe.opt, step,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root)


def add_round(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
              placement: Placement, recipe: Recipe, run: str) -> str:
    """Add one local SGD round: each shard runs ``steps`` alone, then the tree averages."""
    last, leaves = steps[-1].index, []
    for i, shard in enumerate(shards):
        name = key("local-sgd", steps[0].index, i, run=run)
        win.add(Task(name, local_steps, recipe.opt, recipe.shuffle_seed, tuple(steps), i,
                     TaskRef(state), shard), placement.shards[i])
        leaves.append((name, i, placement.shards[i]))
    root = _tree(win, last, leaves, placement, recipe, run)
    return win.add(Task(key("update", last, run=run), average, recipe.opt, steps[0],
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root)


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
    on the validation shard ``val``.
    """
    win = Window()
    state = win.add(DataNode(key("state", steps[0].index, run=run), start), placement.root)
    for unit in units(steps, recipe):
        if recipe.strategy == "local-sgd":
            state = add_round(win, unit, state, shards, placement, recipe, run)
        else:
            state = add_step(win, unit[0], state, shards, placement, recipe, run)
        if unit[-1].last and val is not None:
            epoch = unit[-1].epoch
            win.evals[epoch] = win.add(
                Task(key("evaluate", epoch + 1, run=run), evaluate, recipe.net, epoch,
                     TaskRef(state), val), placement.root)
    win.end = state
    return win
