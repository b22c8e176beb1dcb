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
head worker that holds no shard.  With replicated updates (the ``allreduce``
default) every worker runs its own ``update-<step>-<first shard>`` from the
root level's partial sums, and the next step's ``forward-backward`` tasks
apply the same update first instead of waiting for it.  With ``fuse_shards``
a reduce group whose shards all sit on one worker is one ``forward-backward``
task (named by its first shard) that sums them as the reduce would.  The tree
itself is :mod:`dtrain.reduction`.

Where the tasks run is :mod:`dtrain.placement`; what they compute is
:mod:`dtrain.tasks`.

A *window* chains many steps into one graph, starting from the state as a
literal (``state-<step>``): the scheduler can recompute anything inside the
window after a worker loss, and forgets it once the window is done.
"""
from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.task_spec import DataNode, Task, TaskRef
from dask.tokenize import normalize_token

from dtrain.data import load_shard
from dtrain.live import StepEvents
from dtrain.model import Network
from dtrain.optim import ROUND_TAIL, Optimizer, Step, TrainState, average, update
from dtrain.placement import Placement, Worker, place
from dtrain.reduction import Leaf, Spec, fan_in, flat, tree
from dtrain.tasks import (Group, average_and_report, evaluate, forward_backward,
                          forward_backward_group, local_steps, update_and_report, update_copy,
                          update_forward_backward, update_forward_backward_group)
from dtrain.tasktypes import key


TINY_FLOPS = 2e6    # a shard's forward-backward this small (~1 ms of NumPy) is not worth a thread


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
    state_every: int = 1           # replicated: steps between the tasks keeping each state
    fuse_shards: bool = True       # a worker's reduce subtree in one leaf task (see tree)
    step_event_gap: float = 0.0    # step events: at most one per this many seconds per worker

    def events(self, run: str) -> StepEvents:
        """Where the tasks of ``run`` send their step events."""
        return StepEvents(run, self.step_event_gap)

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


class TaskGraph(dict):
    """A plain dict of tasks, with a Dask token of its own: the graph is submitted once and
    its keys are already unique, while tokenizing it task by task (what ``Client.get`` does
    to name it) costs the driver about 0.3 ms per task on every window's critical path."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.token = uuid.uuid4().hex


@normalize_token.register(TaskGraph)
def _token(graph: TaskGraph) -> str:
    return graph.token


@dataclass
class Window:
    """A graph of consecutive steps, with the placement and output size of every key.

    ``ends`` are the keys whose values make up the state after the window;
    ``join`` turns those values into one :class:`~dtrain.optim.TrainState`.
    """

    dsk: TaskGraph = field(default_factory=TaskGraph)     # {key: Task | DataNode}
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


def _tree(win: Window, index: int, leaves: list[Leaf], placement: Placement, recipe: Recipe,
          run: str, readers: Sequence[str] = ()
          ) -> tuple[list[Leaf], dict[str, bool], dict[str, Spec]]:
    k = fan_in(recipe.strategy, recipe.fan_in, len(leaves))
    return tree(win, str(index), leaves, placement.root, k, recipe.fuse_update or bool(readers),
                recipe.leaf_bytes, run, readers,
                fusable=recipe.fuse_shards and recipe.strategy != "local-sgd")


def _group(spec: tuple, step: Step, worker: str, placement: Placement, recipe: Recipe) -> Group:
    """The :class:`~dtrain.tasks.Group` of a fused leaf: its shards' rows this step, their
    nesting, and how many threads may share the work (none for tiny shards or a GPU)."""
    shards = flat(spec)
    at = {i: p for p, i in enumerate(shards)}

    def positions(s: Spec) -> int | tuple:
        return at[s] if isinstance(s, int) else tuple(positions(c) for c in s)

    rows = tuple(step.bounds[i] for i in shards)
    worth = recipe.net.flops(max(hi - lo for lo, hi in rows)) > TINY_FLOPS
    threads = len(shards) if worth and worker not in placement.gpus else 1
    return Group(tuple(shards), rows, positions(spec), threads)


def _leaf_tasks(leaves: list[Leaf], spec: dict[str, Spec], step: Step,
                shards: Sequence[TaskRef], placement: Placement, recipe: Recipe
                ) -> Iterator[tuple[str, int, str, bool, tuple, tuple]]:
    """``(key, first shard, worker, fused, rows, shard refs)`` of each forward-backward
    task: ``rows`` is ``(lo, hi)`` for one shard, ``(Group,)`` for a ``fused`` group."""
    for name, i, worker in leaves:
        if name not in spec:
            continue
        if isinstance(spec[name], int):
            yield name, i, worker, False, step.bounds[i], (shards[i],)
        else:
            group = _group(spec[name], step, worker, placement, recipe)
            yield name, i, worker, True, (group,), tuple(shards[j] for j in group.shards)


def _state_leaves_root(placement: Placement) -> bool:
    """Whether a state made by the update must go to host memory: another worker needs it."""
    return any(w != placement.root for w in placement.leaves)


def add_step(win: Window, step: Step, state: str, shards: Sequence[TaskRef],
             placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one minibatch (forward-backward, reduce tree, update) and return the new state key.

    ``host``: the new state must be in host memory (it leaves the root worker)."""
    leaves = [(key("forward-backward", step.index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, crosses, spec = _tree(win, step.index, leaves, placement, recipe, run)
    for name, _, worker, fused, rows, refs in _leaf_tasks(leaves, spec, step, shards,
                                                         placement, recipe):
        fn = forward_backward_group if fused else forward_backward
        win.add(Task(name, fn, recipe.net, recipe.shuffle_seed, step.epoch, *rows,
                     crosses[name], TaskRef(state), *refs), worker, recipe.leaf_bytes)
    fn, extra = (update_and_report, ((step,), recipe.events(run))) if recipe.reports(step) \
        else (update, (step,))
    return win.add(Task(key("update", step.index, run=run), fn, recipe.opt, *extra, host,
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


def replicated_update(win: Window, carry: Carry, workers: Sequence[str], placement: Placement,
                      recipe: Recipe, run: str, host: bool) -> dict[str, str]:
    """``update-<step>-<first shard>`` on each of ``workers``: the chain's updates, applied
    to each worker's own copy of the state, named by the chain's last step.  The window's
    end (``host``) also sends that step's event.  Returns the new state key per worker."""
    steps, partials = carry.steps, carry.partials
    fn, extra = (update_and_report, (recipe.events(run),)) \
        if host and recipe.reports(steps[-1]) \
        else (update_copy, ())
    out = dict(carry.base)
    for w in workers:
        name = key("update", steps[-1].index, placement.leaves.index(w), run=run)
        out[w] = win.add(Task(name, fn, recipe.opt, steps, *extra, host,
                              TaskRef(carry.base[w]), *partials), w, recipe.state_bytes)
    return out


def add_replicated_step(win: Window, step: Step, carry: Carry, shards: Sequence[TaskRef],
                        placement: Placement, recipe: Recipe, run: str, last: bool) -> Carry:
    """Add one minibatch where every worker applies the update itself, as DDP and Horovod do.

    The gradients are tree-reduced as in :func:`add_step` up to the root
    level, whose few partial sums every worker reads.  Each ``forward-backward``
    applies the updates of the steps since its worker's state was last kept
    (the carry's chain) and then computes, so a step costs one scheduler
    round trip instead of two, and only gradients cross the network.  Every
    ``recipe.state_every`` steps, and after an epoch's last step (its
    evaluation reads the state), ``update-<step>-<first shard>`` keeps each
    worker's state; between them a worker computes each update once, for all
    the tasks that apply it (:mod:`dtrain.tasks`).  The root's first
    ``forward-backward`` sends the chain's last step event.  ``last``: no
    step follows in this window, so only the root reads the partials.
    """
    workers = list(dict.fromkeys(placement.leaves))
    leaves = [(key("forward-backward", step.index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    top, crosses, spec = _tree(win, step.index, leaves, placement, recipe, run,
                               readers=() if last else workers)
    nxt = carry
    if carry.chain and (len(carry.chain) >= recipe.state_every or carry.chain[-1][0].last):
        # keep the state (off the critical path: these tasks wait for what the next step's
        # forward-backward tasks wait for)
        nxt = Carry(replicated_update(win, carry, [placement.root] if last else workers,
                                      placement, recipe, run, False))
    report = recipe.events(run) if carry.chain and recipe.reports(carry.chain[-1][0]) else None
    steps, partials = carry.steps, carry.partials
    for name, i, worker, fused, rows, refs in _leaf_tasks(leaves, spec, step, shards,
                                                         placement, recipe):
        if not carry.chain:
            task = Task(name, forward_backward_group if fused else forward_backward,
                        recipe.net, recipe.shuffle_seed, step.epoch, *rows, crosses[name],
                        TaskRef(carry.base[worker]), *refs)
        else:
            task = Task(name, update_forward_backward_group if fused else
                        update_forward_backward, recipe.opt, steps, recipe.shuffle_seed,
                        step.epoch, *rows, crosses[name], report if i == 0 else None,
                        TaskRef(carry.base[worker]), *refs, *partials)
        win.add(task, worker, recipe.leaf_bytes)
    return Carry(nxt.base, (*nxt.chain, (step, tuple(TaskRef(g[0]) for g in top))))


def add_round(win: Window, steps: Sequence[Step], state: str, shards: Sequence[TaskRef],
              placement: Placement, recipe: Recipe, run: str, host: bool = True) -> str:
    """Add one local SGD round: each shard runs ``steps`` alone, then the tree averages."""
    last = steps[-1].index
    leaves = [(key("local-sgd", steps[0].index, i, run=run), i, placement.leaves[i])
              for i in range(len(shards))]
    root, crosses, _ = _tree(win, last, leaves, placement, recipe, run)
    for name, i, worker in leaves:
        win.add(Task(name, local_steps, recipe.opt, recipe.shuffle_seed, tuple(steps), i,
                     crosses[name], TaskRef(state), shards[i]), worker,
                recipe.leaf_bytes)
    # the round is reported as its last step (its epoch sums restart with its first)
    report = dataclasses.replace(steps[0], index=last)
    fn, extra = (average_and_report, (recipe.events(run),)) if recipe.reports(steps[-1]) \
        else (average, ())
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
