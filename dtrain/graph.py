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

from dask.task_spec import DataNode, Task, TaskRef

from dtrain import live
from dtrain.model import Network
from dtrain.optim import Optimizer, Step, TrainState, sum_buffers, update


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


def update_and_report(opt: Optimizer, step: Step, run: str, state: TrainState,
                      *grads) -> TrainState:
    """:func:`~dtrain.optim.update`, then a ``step`` event to the scheduler (see
    :mod:`dtrain.live`); the event is queued, not waited for."""
    new = update(opt, step, state, *grads)
    live.step_event(run, step, state, new)
    return new


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
    step_events: int = 0           # send a step event every this many steps (0: never)

    def reports(self, step: Step) -> bool:
        """Whether ``step``'s update sends a step event (always at an epoch's end)."""
        return self.step_events > 0 and (step.last or (step.index + 1) % self.step_events == 0)


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


def key(name: str, *parts: int | str, run: str) -> str:
    """``name-part-part-run``: the dashboard groups tasks by ``name``."""
    return "-".join([name, *map(str, parts), run])


def add_step(win: Window, step: Step, state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key."""
    k = fan_in(recipe.strategy, recipe.fan_in, len(shards))
    level: list[tuple[str, int, str]] = []        # (key, first shard, worker) in shard order
    for i, (shard, (lo, hi)) in enumerate(zip(shards, step.bounds)):
        name = key("forward-backward", step.index, i, run=run)
        win.add(Task(name, forward_backward, recipe.net, recipe.shuffle_seed, step.epoch, lo, hi,
                     TaskRef(state), shard), placement.shards[i])
        level.append((name, i, placement.shards[i]))
    depth = tree_depth(len(level), k)
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
            name = key("reduce", step.index, d, first, run=run)
            win.add(Task(name, reduce, *(TaskRef(g[0]) for g in group)), worker)
            level.append((name, first, worker))
    name = key("update", step.index, run=run)
    fn, extra = (update_and_report, (run,)) if recipe.reports(step) else (update, ())
    return win.add(Task(name, fn, recipe.opt, step, *extra, TaskRef(state),
                        *(TaskRef(g[0]) for g in level)), placement.root)


def window_graph(steps: Sequence[Step], start: TrainState, shards: Sequence[TaskRef],
                 val: TaskRef | None, placement: Placement, recipe: Recipe, run: str) -> Window:
    """Chain ``steps`` into one graph that starts from the literal state ``start``.

    Each epoch that ends inside the window gets an ``evaluate-<epoch>`` task
    on the validation shard ``val``.
    """
    win = Window()
    state = win.add(DataNode(key("state", steps[0].index, run=run), start), placement.root)
    for step in steps:
        state = add_step(win, step, state, shards, placement, recipe, run)
        if step.last and val is not None:
            win.evals[step.epoch] = win.add(
                Task(key("evaluate", step.epoch + 1, run=run), evaluate, recipe.net, step.epoch,
                     TaskRef(state), val), placement.root)
    win.end = state
    return win
