"""The functions a training graph's tasks run on the workers: pure, over NumPy or CuPy.

Each takes the run's constants first (baked into the task) and the values of
its dependencies last; a ``host`` flag says whether the result must leave GPU
memory because another worker reads it.
"""
from __future__ import annotations

import operator
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from distributed import get_worker

from dtrain import live
from dtrain.device import like, to_host
from dtrain.model import Network
from dtrain.optim import (Optimizer, Step, TrainState, average, local_sgd, sum_buffers,
                          update)


def forward_backward(net: Network, shuffle_seed: int | None, epoch: int, lo: int, hi: int,
                     host: bool, state: TrainState, shard) -> Any:
    """Summed gradient, loss and correct predictions of one shard's rows ``lo:hi`` this
    epoch: ``[grad (P) | loss | correct]``, ``(P + 2,)``, computed where the shard lives
    (host or GPU), returned to host memory if ``host``."""
    x, y = shard.batch(epoch, lo, hi, shuffle_seed)
    buf = net.loss_and_grad(like(state.vector[: net.size], x), x, y)
    return to_host(buf) if host else buf


@dataclass(frozen=True)
class Group:
    """Shards that one task computes and sums as their reduce subtree would.

    ``rows[p]`` are shard ``shards[p]``'s rows this step; ``tree`` nests the
    positions ``p`` as the tree groups them (``((0, 1), (2, 3))`` at fan-in 2);
    ``threads``: compute the shards on up to this many of the worker's threads.
    """

    shards: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    tree: tuple
    threads: int = 1


_pool: ThreadPoolExecutor | None = None       # a fused task's helper threads
_pool_lock = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(thread_name_prefix="dtrain-shards")
        return _pool


def _worker_threads() -> int:
    """Threads of the Dask worker running this task (1 outside a worker)."""
    try:
        return get_worker().state.nthreads
    except ValueError:
        return 1


def _nested_sum(tree: int | tuple, bufs: list) -> Any:
    """The reduce tree's sums over ``bufs``, level by level, children in order."""
    if isinstance(tree, int):
        return bufs[tree]
    return sum_buffers(*(_nested_sum(t, bufs) for t in tree))


def forward_backward_group(net: Network, shuffle_seed: int | None, epoch: int, group: Group,
                           host: bool, state: TrainState, *shards) -> Any:
    """:func:`forward_backward` of each shard of ``group``, summed as its reduce subtree
    would sum them: the same buffer, bit for bit, in one task instead of several."""
    def run(positions: range) -> list:
        return [forward_backward(net, shuffle_seed, epoch, *group.rows[p], False, state,
                                 shards[p]) for p in positions]

    n = len(shards)
    ways = min(group.threads, n, _worker_threads()) if group.threads > 1 else 1
    parts = [range(n * j // ways, n * (j + 1) // ways) for j in range(ways)]
    helpers = [_helpers().submit(run, part) for part in parts[1:]]
    bufs = run(parts[0]) + [b for f in helpers for b in f.result()]
    total = _nested_sum(group.tree, bufs)
    return to_host(total) if host else total


# The updates a worker applied last, with the very input objects they were applied to: a
# replicated update task and the forward-backward tasks that follow it on the same worker get
# the same objects from the worker's memory, so whichever runs first computes each update and
# the others reuse it (the function is pure, so this changes no bit).  A chain of updates is
# found link by link: each link's input state is the object the link before it returned.
_recent: deque[tuple[Optimizer, Step, TrainState, tuple, TrainState]] = deque()
_recent_lock = threading.Lock()


def _update_once(opt: Optimizer, step: Step, state: TrainState, grads: tuple,
                 keep: int) -> TrainState:
    """:func:`~dtrain.optim.update`, computed once per worker for the same inputs; the
    newest ``keep`` results are remembered."""
    with _recent_lock:
        for o, st, s, gs, new in _recent:
            if s is state and len(gs) == len(grads) and all(map(operator.is_, gs, grads)) \
                    and st == step and o == opt:
                return new
    new = update(opt, step, False, state, *grads)
    with _recent_lock:
        _recent.append((opt, step, state, grads, new))
        while len(_recent) > keep:
            _recent.popleft()
    return new


def _advance(opt: Optimizer, steps: tuple[Step, ...], state: TrainState,
             grads: tuple) -> TrainState:
    """``state`` after ``steps`` in order; ``grads`` holds each step's partial sums in turn,
    the same number per step."""
    per = len(grads) // max(len(steps), 1)
    for j, step in enumerate(steps):
        state = _update_once(opt, step, state, grads[j * per:(j + 1) * per], len(steps) + 1)
    return state


def _last(opt: Optimizer, steps: tuple[Step, ...], host: bool, state: TrainState,
          grads: tuple) -> tuple[TrainState, TrainState]:
    """The state before and after the last of ``steps``, walking the chain once; ``host``:
    the last update is for the driver, computed afresh in host memory."""
    per = len(grads) // len(steps)
    before = _advance(opt, steps[:-1], state, grads[:-per])
    after = update(opt, steps[-1], True, before, *grads[-per:]) if host \
        else _update_once(opt, steps[-1], before, grads[-per:], len(steps) + 1)
    return before, after


def update_copy(opt: Optimizer, steps: tuple[Step, ...], host: bool, state: TrainState,
                *grads) -> TrainState:
    """A replicated update: this worker's copy of the state after ``steps`` (the steps since
    ``state`` was kept; each update computed once per worker)."""
    return _last(opt, steps, host, state, grads)[1]


def _replica(opt: Optimizer, steps: tuple[Step, ...], report: live.StepEvents | None,
             state: TrainState, grads: tuple) -> TrainState:
    """This worker's state after ``steps``, sending the last one's event if ``report``."""
    before, new = _last(opt, steps, False, state, grads)
    if report is not None:
        live.step_event(report, steps[-1], before, new)
    return new


def update_forward_backward(opt: Optimizer, steps: tuple[Step, ...], shuffle_seed: int | None,
                            epoch: int, lo: int, hi: int, host: bool,
                            report: live.StepEvents | None, state: TrainState, shard,
                            *grads) -> Any:
    """Replicated updates' step: this worker's state after ``steps`` (shared with the
    other tasks that apply them here, as in :func:`update_copy`), then
    :func:`forward_backward` from it, in one task.  ``report``: where this task sends the
    ``step`` event of the last of ``steps`` (see :mod:`dtrain.live`)."""
    new = _replica(opt, steps, report, state, grads)
    return forward_backward(opt.net, shuffle_seed, epoch, lo, hi, host, new, shard)


def update_forward_backward_group(opt: Optimizer, steps: tuple[Step, ...],
                                  shuffle_seed: int | None, epoch: int, group: Group, host: bool,
                                  report: live.StepEvents | None, state: TrainState,
                                  *shards_and_grads) -> Any:
    """:func:`update_forward_backward` for a :class:`Group`: its shards come first in
    ``shards_and_grads``, then the steps' partial sums."""
    n = len(group.shards)
    new = _replica(opt, steps, report, state, shards_and_grads[n:])
    return forward_backward_group(opt.net, shuffle_seed, epoch, group, host, new,
                                  *shards_and_grads[:n])


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


def update_and_report(opt: Optimizer, steps: tuple[Step, ...], events: live.StepEvents,
                      host: bool, state: TrainState, *grads) -> TrainState:
    """:func:`update_copy`, then a ``step`` event for the last of ``steps`` to the
    scheduler (see :mod:`dtrain.live`); the event is queued, not waited for."""
    before, new = _last(opt, steps, host, state, grads)
    live.step_event(events, steps[-1], before, new)
    return new


def average_and_report(opt: Optimizer, step: Step, events: live.StepEvents, host: bool,
                       state: TrainState, *buffers) -> TrainState:
    """:func:`~dtrain.optim.average` (a local SGD round's end), then a ``step`` event."""
    new = average(opt, step, host, state, *buffers)
    live.step_event(events, step, state, new)
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
