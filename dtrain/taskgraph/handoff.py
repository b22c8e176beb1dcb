"""A graph pass: the state between two windows stays on the worker where the first ended.

A window's graph starts from the state as a literal (``state-<step>``, a
``DataNode``), which the driver had fetched from the previous window: every
window the state crossed worker -> driver -> scheduler -> worker, and a big
model made each graph a big message (distributed warns "Sending large graph"
for a 784-2048-2048-10 net's 23 MB).  This pass, run by the engine after the
builder, makes the window's end ``kept-<step>``: a task beside the end state
that keeps it in that worker's memory as well as returning it; and, once the
previous window ended on the worker where this one starts, it replaces the
literal by ``state-<step>`` = :func:`take`, which hands the kept state over.
The driver still fetches each window's end, for the checkpoint and the
epoch's early stopping, but nothing goes back: the graph is a few kilobytes
whatever the model.  A fresh run's first window does not carry its initial
state either: ``state-0`` computes it from the seed where it is needed
(:class:`Fresh`).  The state a worker keeps is one per run, replaced each
window and dropped when the run ends.  A window launched while the one before
it still runs (the engine does so where no early stopping watches) takes the
state the same way, waiting for it to be kept (:class:`Handed`'s ``wait``):
between two windows nothing goes through the scheduler.

If the worker that kept the state left, or the scheduler ran ``take``
somewhere else, ``take`` raises :class:`StateGone` and the engine submits
the window again with the literal it fetched: the same state, the same bytes.
Each time it does, the run's windows are a new attempt (:class:`Handed`'s
``attempt``, :func:`give_up`): a window of an older attempt that Dask runs
again after a lost worker neither waits for a state nor keeps one.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.core.arrays import to_host
from dtrain.core.errors import RunEnded, StateGone
from dtrain.deploy import runtime
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, TrainState
from dtrain.taskgraph import fuse
from dtrain.taskgraph.window import Window

KEEP_RUNS = 4           # runs whose last state a worker keeps at once (one each)
KEEP_ATTEMPTS = 64      # runs whose current attempt a worker remembers (the newest)


@dataclass(frozen=True)
class Handed:
    """A kept state's name: its run and the step it stands before; ``wait``: how long
    :func:`take` waits for it to be kept (a window launched while the one before it runs
    may start first, on a worker of several threads); ``attempt``: the engine's attempt at
    the run's windows that made the task (see :func:`give_up`)."""

    run: str
    step: int
    wait: float = 0.0
    attempt: int = 0


class _Kept:
    """The states this process keeps: the newest of each run (at most ``KEEP_RUNS`` runs)."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[int, TrainState]] = {}
        self.ended: set[str] = set()        # runs dropped: nobody waits for their states
        self.attempts: dict[str, int] = {}  # runs' current attempts (older ones gave up)
        self.taking: Counter[str] = Counter()   # windows of each run waiting here for one
        self.changed = threading.Condition()

    def stale(self, handed: Handed) -> bool:
        """Whether ``handed`` comes from an attempt the run's engine has given up."""
        return handed.attempt < self.attempts.get(handed.run, 0)

    def put(self, handed: Handed, state: TrainState) -> None:
        with self.changed:
            if self.stale(handed):          # a window Dask ran again: the run went on without
                return
            self.states.pop(handed.run, None)
            while len(self.states) >= KEEP_RUNS:
                self.states.pop(next(iter(self.states)))
            self.states[handed.run] = (handed.step, state)
            self.changed.notify_all()

    def get(self, handed: Handed) -> TrainState:
        deadline = time.monotonic() + handed.wait
        run = handed.run
        with self.changed:
            self.taking[run] += 1
            try:
                while True:
                    step, state = self.states.get(run, (None, None))
                    left = deadline - time.monotonic()
                    if step == handed.step or run in self.ended or self.stale(handed):
                        break
                    # the window before, still running here, keeps it when it ends, however
                    # long it runs; but not a window that itself waits here for a state
                    # (two windows of a run each waiting for the other's would wait for ever)
                    if left <= 0 and handed.wait and fuse.running(run) > self.taking[run]:
                        deadline, left = time.monotonic() + handed.wait, handed.wait
                    if left <= 0:
                        break
                    self.changed.wait(left)
            finally:
                self.taking[run] -= 1
                if not self.taking[run]:
                    del self.taking[run]
        if step != handed.step and handed.run in self.ended:   # a window launched ahead
            raise RunEnded(f"run {handed.run} ended")         # of the run's end
        if step != handed.step:
            raise StateGone(f"this worker holds no state of run {handed.run} before step "
                            f"{handed.step}")
        return state

    def end(self, run: str) -> None:
        """No state of ``run`` will come: a take that waits for one stops waiting."""
        with self.changed:
            if len(self.ended) >= 64:
                self.ended.clear()
            self.ended.add(run)
            self.changed.notify_all()

    def give_up(self, run: str, attempt: int) -> None:
        with self.changed:
            attempt = max(attempt, self.attempts.pop(run, 0))
            while len(self.attempts) >= KEEP_ATTEMPTS:  # the oldest runs' go, not this one's
                self.attempts.pop(next(iter(self.attempts)))
            self.attempts[run] = attempt
            self.changed.notify_all()

    def drop(self, run: str) -> bool:
        with self.changed:
            return self.states.pop(run, None) is not None


    def close(self) -> None:
        """The worker closes: every state it kept goes."""
        with self.changed:
            self.states.clear()
            self.changed.notify_all()


def _kept() -> _Kept:
    """The states this process keeps: its runtime's part."""
    return runtime.here().part("kept", _Kept)


def keep(handed: Handed, state: TrainState) -> TrainState:
    """``kept-<step>``: keep ``state`` here for the next window, and return it in host memory
    for the driver."""
    _kept().put(handed, state)
    return state.with_vector(to_host(state.vector))


def take(handed: Handed) -> TrainState:
    """``state-<step>``: the state the last window kept here (raises :class:`StateGone`)."""
    return _kept().get(handed)


def end(run: str) -> bool:
    """The run ended: its windows here stop (:func:`dtrain.taskgraph.fuse.end`: one launched
    ahead of the end may run or wait for its state), and this process forgets its state;
    True if it had one."""
    _kept().end(run)
    fuse.end(run)
    return drop(run)


def give_up(run: str, attempt: int) -> None:
    """The run's engine runs a window again from its literal start (``attempt`` from now
    on): a take of an older attempt that waits here stops waiting (:class:`StateGone`), one
    that comes later does not wait, and a keep of one keeps nothing.  Those are windows Dask
    runs again after a lost worker, whose states were kept on that worker: without this they
    would hold the new worker's threads for their whole wait."""
    _kept().give_up(run, attempt)


def drop(run: str) -> bool:
    """Forget the state this process keeps for ``run`` (the run ended); True if it had one."""
    return _kept().drop(run)


@dataclass(frozen=True)
class Fresh:
    """A run's first state, made where it is needed: the network's seeded parameters and a
    fresh optimizer (what the plan's ``initial_state`` computes), so the first window's graph
    carries three small records instead of the parameters."""

    net: Network
    opt: Optimizer
    seed: int


def fresh(record: Fresh) -> TrainState:
    """``state-0``: the seeded initial state, computed here."""
    return record.opt.init_state(record.net.init(record.seed))


def start_node(win: Window) -> str | None:
    """The key of the literal state a window starts from, or None where it has none or
    several (model-parallel windows start from a state per slice)."""
    found = [k for k, node in win.dsk.items()
             if isinstance(node, DataNode) and keys.kind_of(k) == keys.STATE]
    return found[0] if len(found) == 1 and len(win.ends) == 1 else None


def rewrite(win: Window, run: str, start: int, stop: int, take_kept: bool,
            made: Fresh | None = None, wait: float = 0.0, attempt: int = 0) -> Window:
    """``win`` ending in ``kept-<stop>`` (see the module docstring) and, if ``take_kept``,
    starting from the state kept before step ``start`` instead of the literal (waiting up
    to ``wait`` seconds for it: a window launched while the one before it runs), or with
    ``made``, from the seeded initial state computed where it starts; both as ``attempt``
    (:func:`give_up`).  A window this pass does not fit (:func:`start_node` None) comes
    back unchanged.
    """
    first = start_node(win)
    if first is None:
        return win
    if take_kept:
        win.dsk[first] = Task(first, take, Handed(run, start, wait, attempt))
    elif made is not None:
        win.dsk[first] = Task(first, fresh, made)
    (end,) = win.ends
    where = win.where[end][0]
    win.ends = [win.add(Task(keys.make(keys.KEPT, stop, run=run), keep,
                             Handed(run, stop, attempt=attempt), TaskRef(end)), where,
                        win.nbytes.get(end, 0))]
    return win


def literal_size(win: Window) -> int:
    """Bytes of the literal state in ``win`` (0 once it is handed over)."""
    first = start_node(win)
    node: Any = win.dsk.get(first) if first else None
    return win.nbytes.get(first, 0) if isinstance(node, DataNode) else 0
