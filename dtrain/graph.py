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
from dtrain.optim import (ROUND_TAIL, Optimizer, Step, TrainState, average, local_sgd,
                          sum_buffers, update)


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
    counts = blocks([w.weight for w in trainers], shards)
    owner = tuple(w.address for w, n in zip(trainers, counts) for _ in range(n))
    return Placement(owner, head.address if head else owner[0],
                     frozenset(w.address for w in workers if w.gpu))


def blocks(weights: Sequence[float], shards: int) -> list[int]:
    """Shards per worker, in worker order, so the slowest worker finishes first.

    Blocks proportional to the weights, unless shards are too few to split
    that finely; then the fewest-time blocks (a worker too slow to help gets
    none: a GPU five times faster than a CPU takes all 4 shards, rather than
    3 while the CPU takes 1 and makes everyone wait for it).
    """
    edges = np.cumsum(weights) / sum(weights)
    owner = [min(int(np.searchsorted(edges, (i + 0.5) / shards)), len(weights) - 1)
             for i in range(shards)]
    counts = [owner.count(j) for j in range(len(weights))]

    def slowest(c: list[int]) -> float:
        return max(n / w for n, w in zip(c, weights) if n)

    def fill(limit: float) -> list[int] | None:       # greedy blocks within a time limit
        out, left = [], shards
        for w in weights:
            out.append(min(left, int(limit * w + 1e-9)))
            left -= out[-1]
        return None if left else out

    times = sorted({n / w for w in weights for n in range(1, shards + 1)})
    lo, hi = 0, len(times) - 1
    while lo < hi:                                     # the least feasible time limit
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fill(times[mid]) else (mid + 1, hi)
    best = fill(times[lo])
    return best if best is not None and slowest(best) < slowest(counts) * (1 - 1e-9) \
        else counts


# --- tasks (run on workers) -----------------------------------------------------------------

def forward_backward(net: Network, shuffle_seed: int | None, epoch: int, lo: int, hi: int,
                     host: bool, state: TrainState, shard) -> Any:
    """Summed gradient, loss and correct predictions of one shard's rows ``lo:hi`` this
    epoch: ``[grad (P) | loss | correct]``, ``(P + 2,)``, computed where the shard lives
    (host or GPU), returned to host memory if ``host``."""
    x, y = shard.batch(epoch, lo, hi, shuffle_seed)
    buf = net.loss_and_grad(like(state.vector[: net.size], x), x, y)
    return to_host(buf) if host else buf


def update_forward_backward(opt: Optimizer, prev: Step, shuffle_seed: int | None, epoch: int,
                            lo: int, hi: int, host: bool, state: TrainState, shard,
                            *grads) -> Any:
    """A replicated update's first half: the update of step ``prev`` (exactly what that step's
    ``update`` tasks compute), then :func:`forward_backward` from the new state, in one task."""
    new = update(opt, prev, False, state, *grads)
    return forward_backward(opt.net, shuffle_seed, epoch, lo, hi, host, new, shard)


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
    held-out data), plus the epoch's running train loss and accuracy (over its minibatches,
    each predicted before its update)."""
    out = {"epoch": epoch + 1}
    if part is not None:
        loss, correct, n = net.evaluate(like(state.vector[: net.size], part.x), part.x, part.y)
        out.update(loss=loss / max(n, 1), accuracy=correct / max(n, 1))
    if state.epoch_samples:
        out["train_loss"] = state.epoch_loss / state.epoch_samples
        out["train_accuracy"] = state.epoch_correct / state.epoch_samples
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
    replicated: bool = False       # every worker applies each update (add_replicated_step)

    def reports(self, step: Step) -> bool:
        """Whether ``step``'s update sends a step event (always at an epoch's end)."""
        return self.step_events > 0 and (step.last or (step.index + 1) % self.step_events == 0)

    @property
    def state_bytes(self) -> int:
        """Size of a TrainState as Dask's ``sizeof`` counts it."""
        return sizeof(TrainState(np.empty(self.net.size * (1 + self.opt.slots), self.net.dtype)))

    @property
    def leaf_bytes(self) -> int:
        """Size of what a leaf sends up the tree: a gradient buffer (``P + 2``), or (local
        SGD) a whole weighted state with its loss, correct count and weight."""
        width = self.net.size * (1 + self.opt.slots) + ROUND_TAIL \
            if self.strategy == "local-sgd" else self.net.buffer_size
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
         nbytes: int, run: str, readers: Sequence[str] = ()) -> tuple[list[Leaf], dict[str, bool]]:
    """Reduce ``leaves`` (in leaf order) level by level with fan-in ``k``.

    Returns the root level's inputs, for the root task to combine (``fuse``)
    or one reduce task's output, and for every value the tree reads whether
    it must leave its worker (so a GPU producer knows to copy it to host).
    The root level is read on ``root`` and on every worker in ``readers``
    (replicated updates).  Keys are ``reduce-<tag>-<level>-<first leaf>``; a
    reduce runs where its first child runs, the last level on ``root``.
    """
    level, depth = leaves, tree_depth(len(leaves), k)
    readers_of: dict[str, set[str]] = {}
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
            for g in group:
                readers_of.setdefault(g[0], set()).add(worker)
            planned.append((name, group, worker))
            level.append((name, first, worker))
    for g in level:
        readers_of.setdefault(g[0], set()).update({root, *readers})
    produced = {name: worker for name, _, worker in leaves} | {n: w for n, _, w in planned}
    leaves_worker = {name: any(r != produced[name] for r in readers_of.get(name, ()))
                     for name in produced}
    for name, group, worker in planned:
        win.add(Task(name, reduce, leaves_worker[name], *(TaskRef(g[0]) for g in group)),
                worker, nbytes)
    return level, leaves_worker


def _tree(win: Window, index: int, leaves: list[Leaf], placement: Placement, recipe: Recipe,
          run: str, readers: Sequence[str] = ()) -> tuple[list[Leaf], dict[str, bool]]:
    k = fan_in(recipe.strategy, recipe.fan_in, len(leaves))
    return tree(win, str(index), leaves, placement.root, k, recipe.fuse_update or bool(readers),
                recipe.leaf_bytes, run, readers)


def _state_leaves_root(placement: Placement) -> bool:
    """Whether a state made by the update must go to host memory: another worker needs it."""
    return any(w != placement.root for w in placement.leaves)


def add_step(win: Window, step: Step, state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key.

    ``host``: the new state must be in host memory (it leaves the root worker)."""
    leaves = [(key("forward-backward", step.index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, leaves_worker = _tree(win, step.index, leaves, placement, recipe, run)
    for (name, i, worker), (lo, hi) in zip(leaves, step.bounds):
        win.add(Task(name, forward_backward, recipe.net, recipe.shuffle_seed, step.epoch, lo, hi,
                     leaves_worker[name], TaskRef(state), shards[i]), worker,
                recipe.leaf_bytes)
    fn, extra = (update_and_report, (run,)) if recipe.reports(step) else (update, ())
    return win.add(Task(key("update", step.index, run=run), fn, recipe.opt, step, *extra, host,
                        TaskRef(state), *(TaskRef(g[0]) for g in root)), placement.root,
                   recipe.state_bytes)


@dataclass(frozen=True)
class Carry:
    """What a replicated step hands to the next: on worker ``w`` the state before the step
    is ``update(opt, pending step, base[w], *pending partials)``, or ``base[w]`` itself
    when nothing is pending (a window's first step)."""

    base: dict[str, str]
    pending: tuple[Step, list[str]] | None = None


def replicated_update(win: Window, carry: Carry, workers: Sequence[str], placement: Placement,
                      recipe: Recipe, run: str, host: bool) -> dict[str, str]:
    """``update-<step>-<first shard>`` on each of ``workers``: the pending update, applied
    to each worker's own copy of the state.  Returns the new state key per worker."""
    step, partials = carry.pending
    out = dict(carry.base)
    for w in workers:
        fn, extra = (update_and_report, (run,)) if w == placement.root and recipe.reports(step) \
            else (update, ())
        name = key("update", step.index, placement.leaves.index(w), run=run)
        out[w] = win.add(Task(name, fn, recipe.opt, step, *extra, host, TaskRef(carry.base[w]),
                              *(TaskRef(p) for p in partials)), w, recipe.state_bytes)
    return out


def add_replicated_step(win: Window, step: Step, carry: Carry, shards: Sequence[TaskRef],
                        placement: Placement, recipe: Recipe, run: str, last: bool) -> Carry:
    """Add one minibatch where every worker applies the update itself, as DDP and Horovod do.

    The gradients are tree-reduced as in :func:`add_step` up to the root
    level, whose few partial sums every worker reads.  Each worker's
    ``update-<step>-<first shard>`` applies the step to its own copy of the
    state, and each ``forward-backward`` of the next step applies the same
    update first (the same function on the same bytes, so the same result)
    instead of waiting for it: a step costs one scheduler round trip instead
    of two, and only gradients cross the network.  ``last``: no step follows
    in this window, so only the root reads the partials.
    """
    workers = list(dict.fromkeys(placement.leaves))
    leaves = [(key("forward-backward", step.index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    top, leaves_worker = _tree(win, step.index, leaves, placement, recipe, run,
                               readers=() if last else workers)
    base = carry.base
    if carry.pending is not None:       # the previous step's updates, off the critical path
        base = replicated_update(win, carry, [placement.root] if last else workers, placement,
                                 recipe, run, False)
    for (name, i, worker), (lo, hi) in zip(leaves, step.bounds):
        if carry.pending is None:
            task = Task(name, forward_backward, recipe.net, recipe.shuffle_seed, step.epoch,
                        lo, hi, leaves_worker[name], TaskRef(carry.base[worker]), shards[i])
        else:
            prev, partials = carry.pending
            task = Task(name, update_forward_backward, recipe.opt, prev, recipe.shuffle_seed,
                        step.epoch, lo, hi, leaves_worker[name], TaskRef(carry.base[worker]),
                        shards[i], *(TaskRef(p) for p in partials))
        win.add(task, worker, recipe.leaf_bytes)
    return Carry(base, (step, [g[0] for g in top]))


def add_round(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
              placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one local SGD round: each shard runs ``steps`` alone, then the tree averages."""
    last = steps[-1].index
    leaves = [(key("local-sgd", steps[0].index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, leaves_worker = _tree(win, last, leaves, placement, recipe, run)
    for name, i, worker in leaves:
        win.add(Task(name, local_steps, recipe.opt, recipe.shuffle_seed, tuple(steps), i,
                     leaves_worker[name], TaskRef(state), shards[i]), worker,
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
    if recipe.replicated:
        return _replicated_window(win, steps, state, shards, val, placement, recipe, run)
    todo = units(steps, recipe)
    for n, unit in enumerate(todo):
        host = n == len(todo) - 1 or _state_leaves_root(placement)   # the driver takes the last
        if recipe.strategy == "local-sgd":
            state = add_round(win, unit, state, shards, placement, recipe, run, host)
        else:
            state = add_step(win, unit[0], state, shards, placement, recipe, run, host)
        if unit[-1].last:
            _evaluate(win, unit[-1].epoch, state, val, placement, recipe, run)
    win.ends = [state]
    return win


def _evaluate(win: Window, epoch: int, state: str, val: TaskRef | None, placement: Placement,
              recipe: Recipe, run: str) -> None:
    win.evals[epoch] = win.add(Task(key("evaluate", epoch + 1, run=run), evaluate, recipe.net,
                                    epoch, TaskRef(state), val), placement.root)


def _replicated_window(win: Window, steps: Sequence[Step], state: str,
                       shards: Sequence[TaskRef], val: TaskRef | None, placement: Placement,
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
