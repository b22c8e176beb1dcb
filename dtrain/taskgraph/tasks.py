"""The functions a data-parallel graph's tasks run on the workers: pure, over NumPy or CuPy.

Each takes its :mod:`~dtrain.taskgraph.records` record first (the run's
constants, baked into the task) and the values of its dependencies after it;
a record's ``host`` says whether the result must leave GPU memory because
another worker reads it.
"""
from __future__ import annotations

import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dtrain.core import events, internals, keys
from dtrain.core.arrays import like, on_device, on_gpu, sum_in_order, to_host
from dtrain.data.shards import Shard, group_batch
from dtrain.maths.model import Network, noise
from dtrain.maths.optim import (Optimizer, Step, TrainState, average, local_sgd, settle,
                                update)
from dtrain.maths.scores import TargetSums
from dtrain.taskgraph import cores, fuse
from dtrain.taskgraph.records import (Average, Evaluate, ForwardBackward, Group, LocalSteps,
                                      Reduce, Update, Updates)
from dtrain.taskgraph.treesum import even_parts, nested_sum


def _one_shard(net: Network, shuffle_seed: int | None, epoch: int, rows: tuple[int, int],
               state: TrainState, shard: Shard) -> Any:
    """``[grad (P) | loss | correct]`` of one shard's rows this epoch, computed where the
    shard lives (host or GPU)."""
    x, y = shard.batch(epoch, *rows, shuffle_seed)
    w = None if shard.w is None else shard.weights(epoch, *rows, shuffle_seed)   # (B,)
    return net.loss_and_grad(like(state.vector[: net.size], x), x, y, w,     # (P + 2,)
                             noise=noise(epoch, [(shard.index, *rows)]))


# --- fused groups: a worker's shards in one task --------------------------------------------

class _Helpers:
    """The helper threads of fused tasks, started on first use, one pool per process."""

    def __init__(self) -> None:
        self.pool: ThreadPoolExecutor | None = None
        self.lock = threading.Lock()

    def __call__(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(thread_name_prefix="dtrain-shards")
            return self.pool


_helpers = _Helpers()


def _worker_threads() -> int:
    """Threads of the Dask worker running this task (1 outside a worker)."""
    from distributed import get_worker
    try:
        return internals.worker_threads(get_worker())
    except ValueError:
        return 1


def _tree_sum(tree: Any, bufs: Any, inside: str = keys.FORWARD_BACKWARD) -> Any:
    """``nested_sum(tree, bufs)``, timed as a ``reduce`` inside the task (of kind
    ``inside``) where a chain runs it (:func:`dtrain.taskgraph.fuse.note`)."""
    start = time.perf_counter()
    total = nested_sum(tree, bufs)
    fuse.note(keys.REDUCE, start, time.perf_counter(), inside)
    return total


def _summed(group: Group, one: Callable[[int], Any], inside: str = keys.FORWARD_BACKWARD
            ) -> Any:
    """``one(p)`` for each position ``p`` of the group, on up to ``group.threads`` of the
    worker's threads, summed as the group's reduce subtree would sum them: the same buffer,
    bit for bit, in one task instead of several (``inside``: the task's kind)."""
    def run(positions: range) -> list:
        return [one(p) for p in positions]

    n = len(group.shards)
    ways = min(group.threads, n, _worker_threads()) if group.threads > 1 else 1
    parts = even_parts(n, ways)
    helpers = [_helpers().submit(run, part) for part in parts[1:]]
    bufs = run(parts[0]) + [b for f in helpers for b in f.result()]
    return _tree_sum(group.tree, bufs, inside)


def _group_sum(task: ForwardBackward, state: TrainState, shards: tuple) -> Any:
    """Each shard of the task's group, summed in its subtree's order: on the worker's core
    processes (:mod:`~dtrain.taskgraph.cores`) or its threads (:func:`_summed`)."""
    group = task.group
    weighted = shards[0].w is not None        # sample weights: on this process's threads
    gpu = on_gpu(shards[0].x)
    if gpu and len(shards) > 1 and not weighted:
        return _one_pass(task, state, shards)
    if group.processes and not weighted:
        pool = cores.pool(_worker_threads() - 1)
        if pool is not None:
            try:
                return pool.group_sum(task.net, task.epoch, task.shuffle_seed, group.rows,
                                      group.tree, state.vector[: task.net.size], shards)
            except cores.Broken:
                pass                    # computed here; the pool starts afresh next time
    if group.threads == 1 and not gpu:
        return _one_thread(task, state, shards)
    return _summed(group, lambda p: _one_shard(task.net, task.shuffle_seed, task.epoch,
                                               group.rows[p], state, shards[p]))


def _one_thread(task: ForwardBackward, state: TrainState, shards: tuple) -> Any:
    """A host group in this thread (:func:`~dtrain.taskgraph.cores.shard_grads`: tiny shards
    of equal rows in one stacked pass), summed as its subtree sums them."""
    net = task.net
    bufs = np.empty((len(shards), net.buffer_size), state.vector.dtype)   # (S, P + 2)
    cores.shard_grads(net, state.vector[: net.size], shards, task.epoch, task.shuffle_seed,
                      task.group.rows, bufs)
    return _tree_sum(task.group.tree, bufs)


def _one_pass(task: ForwardBackward, state: TrainState, shards: tuple) -> Any:
    """A GPU's shards in one pass over their rows laid end to end: the sum of their
    gradients, as cuBLAS sums it (in its own order anyway: a GPU's bytes never matched a
    CPU's), at the cost of one shard instead of one per shard."""
    x, y = group_batch(shards, task.epoch, task.group.rows, task.shuffle_seed)
    keys = noise(task.epoch, [(s.index, *r) for s, r in zip(shards, task.group.rows)])
    return task.net.loss_and_grad(like(state.vector[: task.net.size], x), x, y, noise=keys)


# --- replicated updates: each computed once per worker --------------------------------------

class _RecentUpdates:
    """The updates this worker applied last, with the very input objects they were applied
    to.  A replicated update task and the forward-backward tasks that follow it on the same
    worker get the same objects from the worker's memory, so whichever runs first computes
    each update and the others reuse it (the function is pure, so this changes no bit).  A
    chain of updates is found link by link: each link's input state is the object the link
    before it returned."""

    def __init__(self) -> None:
        self.kept: deque[tuple[Optimizer, Step, TrainState, tuple, TrainState]] = deque()
        self.lock = threading.Lock()

    def update(self, opt: Optimizer, step: Step, state: TrainState, grads: tuple,
               keep: int) -> TrainState:
        """:func:`~dtrain.maths.optim.update`, computed once per worker for the same inputs;
        the newest ``keep`` results are remembered."""
        with self.lock:
            for o, st, s, gs, new in self.kept:
                if s is state and len(gs) == len(grads) and all(map(operator.is_, gs, grads)) \
                        and st == step and o == opt:
                    return new
        new = update(opt, step, False, state, *grads)
        with self.lock:
            self.kept.append((opt, step, state, grads, new))
            while len(self.kept) > keep:
                self.kept.popleft()
        return new


_recent = _RecentUpdates()


def _last(opt: Optimizer, steps: tuple[Step, ...], widths: tuple[int, ...], host: bool,
          state: TrainState, grads: tuple) -> tuple[TrainState, TrainState]:
    """The state before and after the last of ``steps``, walking the chain once; ``grads``
    holds each step's partial sums in turn, ``widths[j]`` for step ``j`` and the rest for the
    last.  ``host``: the last update is for another worker or the driver, computed afresh in
    host memory."""
    keep, at = len(steps) + 1, 0
    for step, width in zip(steps[:-1], widths):
        state = _recent.update(opt, step, state, grads[at:at + width], keep)
        at += width
    after = update(opt, steps[-1], True, state, *grads[at:]) if host \
        else _recent.update(opt, steps[-1], state, grads[at:], keep)
    return state, after


def _event(where: events.StepEvents | None, opt: Optimizer, step: Step, before: TrainState,
           after: TrainState) -> None:
    """``step``'s event, if one is due: the states' epoch sums read off the GPU first."""
    worker = events.due(where, step) if where is not None else None
    if worker is not None:
        events.send(worker, where, step, settle(opt, before), settle(opt, after))


def _apply(updates: Updates, state: TrainState, grads: tuple) -> TrainState:
    """This worker's state after ``updates``, sending the last one's event if asked."""
    before, new = _last(updates.opt, updates.steps, updates.widths, False, state, grads)
    _event(updates.events, updates.opt, updates.steps[-1], before, new)
    return new


# --- the task functions -----------------------------------------------------------------------

def forward_backward(task: ForwardBackward, state: TrainState, *inputs) -> Any:
    """See :class:`~dtrain.taskgraph.records.ForwardBackward`."""
    n = len(task.group.shards)
    if task.updates is not None:
        state = _apply(task.updates, state, inputs[n:])
    total = _group_sum(task, state, inputs[:n])
    return to_host(total) if task.host else total


def reduce(task: Reduce, *grads) -> Any:
    """Sum gradient buffers in the given (shard) order; to host memory if ``host``."""
    total = sum_in_order(*grads)
    return to_host(total) if task.host else total


def update_state(task: Update, state: TrainState, *grads) -> TrainState:
    """See :class:`~dtrain.taskgraph.records.Update`; the event is queued, not waited for."""
    before, new = _last(task.opt, task.steps, task.widths, task.host, state, grads)
    _event(task.events, task.opt, task.steps[-1], before, new)
    return new


def adopt_update(task: Update, state: TrainState, made: Any) -> TrainState:
    """``update-<step>-<first shard>`` of a described window whose update is made where the
    step's sum is (:func:`~dtrain.taskgraph.expand.step_sum_update`): the state with the new
    parameters ``made`` brought (:meth:`~dtrain.maths.optim.Optimizer.adopt`); the event is
    queued as :func:`update_state` queues it."""
    step = task.steps[-1]
    new = task.opt.adopt(state, made, step)
    _event(task.events, task.opt, step, state, new)
    return new


def local_steps(task: LocalSteps, *inputs) -> Any:
    """Local SGD leaf: each shard of the group runs ``steps`` alone from the state, where
    it lives; a group's buffers summed in its subtree's order (:func:`_summed`)."""
    state, shards = inputs[0], inputs[1:]

    def one(p: int) -> Any:
        shard, i = shards[p], task.group.shards[p]
        return local_sgd(task.opt, task.steps, TrainState(like(state.vector, shard.x)),
                         lambda s: (*shard.batch(s.epoch, *s.bounds[i], task.shuffle_seed),
                                    shard.weights(s.epoch, *s.bounds[i], task.shuffle_seed)),
                         lambda s: noise(s.epoch, [(shard.index, *s.bounds[i])]))

    out = _summed(task.group, one, keys.LOCAL_SGD)
    return to_host(out) if task.host else out


def average_states(task: Average, state: TrainState, *buffers) -> TrainState:
    """:func:`~dtrain.maths.optim.average` (a local SGD round's end), then its event."""
    new = average(task.opt, task.step, task.host, state, *buffers)
    if task.events is not None:
        events.step_event(task.events, task.step, state, new)
    return new


def evaluate(task: Evaluate, state: TrainState, part: Shard | None) -> dict[str, float]:
    """Loss and accuracy of the state's parameters on a held-out shard (None: there is no
    held-out data), plus the epoch's running train loss and accuracy (over its minibatches,
    each predicted before its update).  A regression has no accuracy (None); on the test
    split (``epoch`` -1) it gets ``r2``, ``rmse`` and ``mae`` (each the mean over targets,
    see :mod:`dtrain.maths.scores`)."""
    return _evaluation(task, state, evaluate_part(task, state, part) if part is not None
                       else None)


Sums = tuple[float, int, int, TargetSums | None]    # loss, correct, rows, regression's sums


def evaluate_part(task: Evaluate, state: TrainState, part: Shard) -> Sums:
    """``(summed loss, correct, rows, target sums)`` of one held-out part, where it lives
    (the target sums: a regression's, for its R^2)."""
    net = task.net
    params = like(state.vector[: net.size], part.x)
    loss, correct, n = net.evaluate(params, part.x, part.y)
    sums = TargetSums.of(to_host(net.predictions(params, part.x)), to_host(part.y)) \
        if net.regression else None
    return loss, correct, n, sums


def evaluate_parts(task: Evaluate, state: TrainState, *parts: Sums) -> dict[str, float]:
    """:func:`evaluate` over held-out data in parts: their sums added in part order."""
    loss, correct, n, sums = 0.0, 0, 0, None
    for part_loss, part_correct, part_n, part_sums in parts:
        loss, correct, n = loss + part_loss, correct + part_correct, n + part_n
        if part_sums is not None:
            sums = part_sums if sums is None else sums + part_sums
    return _evaluation(task, state, (loss, correct, n, sums))


def _evaluation(task: Evaluate, state: TrainState, found: Sums | None) -> dict[str, float]:
    net = task.net
    out = {"epoch": task.epoch + 1}
    if found is not None:
        loss, correct, n, sums = found
        out.update(loss=loss / max(n, 1), accuracy=None if net.regression else correct / max(n, 1))
        if sums is not None:
            out.update({k: v for k, v in sums.overall().items() if k != "mse"})
    if state.epoch_samples:
        out["train_loss"] = state.epoch_loss / state.epoch_samples
        out["train_accuracy"] = None if net.regression \
            else state.epoch_correct / state.epoch_samples
    if task.keep:
        out["state"] = state.with_vector(to_host(state.vector))
    return out


def calibrate(net: Network, rows: int, gpu: bool, repeats: int = 3) -> tuple[float, float]:
    """How long a forward-backward pass of ``net`` takes here (on the GPU if ``gpu`` and there
    is one), as ``(overhead seconds, samples per second)``: timed over ``rows`` and ``8 *
    rows`` random samples, ``seconds(n) = overhead + n / speed`` through both.  A GPU's
    overhead is its kernel launches, which a tiny net pays whatever its rows; how CPU and GPU
    workers are weighed against each other (:func:`~dtrain.taskgraph.placement.choices`)."""
    rng = np.random.default_rng(0)
    params = on_device(net.init(0), gpu)

    def timed(n: int) -> float:
        x = on_device(rng.standard_normal((n, net.features)).astype(net.dtype), gpu)
        y = on_device(rng.standard_normal((n, net.layers[-1])).astype(net.dtype)
                      if net.regression else rng.integers(0, net.layers[-1], n), gpu)
        float(net.loss_and_grad(params, x, y)[-1])     # warm up (kernels, BLAS threads)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            float(net.loss_and_grad(params, x, y)[-1])  # wait for the device
            best = min(best, time.perf_counter() - start)
        return best

    small, large = timed(rows), timed(8 * rows)
    if large < small * 1.05:                          # noise: no overhead to tell apart
        return 0.0, 8 * rows / max(large, 1e-9)
    speed = 7 * rows / (large - small)
    return max(small - rows / speed, 0.0), speed
