"""A graph optimization: a window whose tasks all sit on one worker runs as one task.

The builders always build a window step by step (``forward-backward``,
``reduce``, ``update``, ``evaluate``: the keys, the pictures and the structure
tests see every step).  When every task of a window is pinned to one worker,
as on a laptop, one node or one GPU, nothing crosses between workers and each
step's scheduler round trip (3-5 ms) buys nothing.  This pass, run by the
engine after the builder, turns such a window into what Dask's own
``fuse_linear_task_spec`` makes of a linear chain: one task,
``window-<first step>-<last step>-w0-<run>``, that runs the window's tasks in
order in one call on that worker (the tasks as plain ``(function,
arguments)`` tuples, which pickle fast), with a tiny task under the end
state's own key that picks it out of the window's result, and
``window-<first>-<last>-meta-<run>``, the epochs' evaluations and the
timings, fetched with the end in one go.  The maths is the same functions on
the same inputs in the same order: the same bytes.  ``graph.fuse_steps =
false`` turns the pass off.

Inside, each task is timed by kind, and each output marked with when it was
done (seconds before the window's end), so the engine can still say how long
each epoch and each kind of work took; and each task (of a sample of steps, in
a long window) is kept as a span, ``(key, kind, start, end)``, for the
``/dtrain`` page's stream of spans and ``report.html``
(:mod:`dtrain.observe.spans` reads them).
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dask.task_spec import DataNode, GraphNode, Task, TaskRef
from distributed import WorkerPlugin

from dtrain.core import keys
from dtrain.core.errors import RunEnded
from dtrain.deploy import runtime
from dtrain.taskgraph.window import Window

META = "meta"       # the part that names a fused window's timings key
CRITICAL = "critical"   # a Ran's seconds on the window's critical path (its maths, one chain)
SPAN_NODES = 512    # at most about this many of a chain's tasks kept as spans (whole steps)
ALWAYS_KEPT = (keys.STATE, keys.KEPT, keys.EVALUATE)   # kept as spans in any sample


@dataclass(frozen=True)
class Chain:
    """The tasks of a fused window in an order that runs each after its inputs (the order
    the builder added them, but for a task added before its inputs), with what runs them
    needs.

    ``inputs``: keys from outside the window (shards, held-out data), in the order the fused
    task receives their values; ``outputs``: the keys the engine asked for; ``kinds``: each
    task's kind, for the timings; ``uses``: how many tasks read each key, so a value is
    dropped once its last reader ran (a window of 1,000 steps never holds 1,000 gradients).
    """

    nodes: tuple[tuple[str, Any, tuple[Any, ...]], ...]   # (key, function, arguments)
    kinds: tuple[str | None, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    uses: tuple[tuple[str, int], ...]
    steps: int = 0
    run: str = ""               # the run it belongs to (it stops when the run ended)


@dataclass(frozen=True)
class Packed:
    """A :class:`Chain` pickled once, where the window is built.  The scheduler unpickles a
    graph to read it and pickles each task again to send it to its worker: the chain of a
    window of 400 steps is thousands of tasks, built and taken apart each way (a third of a
    2-worker fit's driver CPU, where the scheduler runs beside the driver); bytes are only
    copied.  A worker process (:class:`OpenChains`) opens it as its task arrives, in its
    event loop while the window before runs, as distributed unpickles any task; anywhere
    else it stays bytes until :func:`run_chain` opens it."""

    data: bytes

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return _arrived, (self.data,)

    @classmethod
    def of(cls, chain: Chain) -> Packed:
        from distributed.protocol import pickle
        return cls(pickle.dumps(chain))

    def open(self) -> Chain:
        from distributed.protocol import pickle
        return pickle.loads(self.data)


def _arrived(data: bytes) -> Packed | Chain:
    """A :class:`Packed` chain unpickled: opened in a worker process, bytes elsewhere."""
    if _runs().opens_chains:
        from distributed.protocol import pickle
        return pickle.loads(data)
    return Packed(data)


class OpenChains(WorkerPlugin):
    """Marks a worker's process as one that opens a :class:`Packed` chain as its task
    arrives (on a scheduler of its own, chains stay bytes)."""

    name = "dtrain-open-chains"
    idempotent = True

    def setup(self, worker: Any) -> None:
        _runs().opens_chains = True


@dataclass(frozen=True)
class Ran:
    """What a fused window returns: the outputs' values in order, the seconds spent in each
    kind of task, how long before the window's end each output was done, and (a window
    that spans workers, :mod:`~dtrain.taskgraph.span`) what it sent to other workers."""

    values: tuple[Any, ...]
    seconds: dict[str, float]
    before_end: tuple[float, ...]
    steps: int
    sent: tuple[int, int] = (0, 0)      # messages and bytes sent to other workers ...
    via: tuple[str, ...] = ()           # ... and how: "unix", "tcp", "tls" (deploy.p2p)
    ended: float = 0.0                  # when it ended, by the worker's wall clock
    # per chain run (several once a spanning window's are merged): (worker, start, end,
    # seconds by kind, spans), its spans (key, kind, start, end) by the worker's wall clock
    spans: tuple[tuple[str, float, float, dict[str, float], tuple], ...] = ()


class _Runs:
    """The runs whose windows run in this process, and those that ended: a window launched
    ahead of a run's end (a stop, the last epoch) may already run, and stops at its next
    task once the driver says the run ended (:func:`end`)."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.ended: set[str] = set()
        self.changed = threading.Condition()
        self.opens_chains = False   # a Dask worker's process: chains opened as they arrive

    def enter(self, run: str) -> None:
        with self.changed:
            self.running[run] += 1

    def leave(self, run: str) -> None:
        with self.changed:
            self.running[run] -= 1
            if not self.running[run]:
                del self.running[run]
            self.changed.notify_all()

    def end(self, run: str, wait: float) -> bool:
        """Mark ``run`` ended; wait up to ``wait`` seconds for its windows here to stop."""
        deadline = time.monotonic() + wait
        with self.changed:
            if len(self.ended) >= 64:
                self.ended.clear()
            self.ended.add(run)
            while self.running[run] and time.monotonic() < deadline:
                self.changed.wait(max(deadline - time.monotonic(), 0.0))
            return not self.running[run]


def _runs() -> _Runs:
    """The runs of this process: its runtime's part."""
    return runtime.here().part("runs", _Runs)


CHECK_EVERY = 64            # tasks between a window's looks at whether its run ended


def running(run: str) -> int:
    """How many windows of ``run`` run in this process now."""
    runs = _runs()
    with runs.changed:
        return runs.running[run]


def end(run: str, wait: float = 2.0) -> bool:
    """The run ended: its windows in this process stop at their next look (they raise
    :class:`~dtrain.core.errors.RunEnded`); True once none runs (within ``wait`` s)."""
    return _runs().end(run, wait)


def leave_pool() -> None:
    """A window's task leaves its worker's thread pool as it starts (``distributed.secede``;
    nothing outside a Dask worker's pool thread).

    The window runs on in its own thread, and the pool's thread is free at once for what
    follows it on the worker: the tasks that pick this window's ends out run as soon as it
    ended (in the pool, on a worker of one thread, they ran only after the next window, so
    the driver launched the window after next only then: every second edge of a long run
    waited for a window's build), and the next window, launched while this one runs,
    starts at once and waits for it (:meth:`dtrain.deploy.p2p.Node.turn`,
    :func:`~dtrain.taskgraph.handoff.take`: each waits as long as the window before runs
    here).  A running window then holds no slot of the pool: on a cluster that several
    runs share, their windows on a worker compute side by side, not one after the other."""
    from distributed import secede
    from distributed.threadpoolexecutor import thread_state as pool
    from distributed.utils import thread_state as task
    if getattr(pool, "proceed", False) and getattr(task, "key", None) is not None:
        secede()                    # (only a task of a Dask worker's thread pool can)


def run_window(chain: Chain | Packed, *inputs: Any) -> Ran:
    """``window-<first>-<last>``: a fused window's task (:func:`leave_pool`, then
    :func:`run_chain`)."""
    leave_pool()
    return run_chain(chain, *inputs)


def run_chain(chain: Chain | Packed, *inputs: Any, spans: int = SPAN_NODES) -> Ran:
    """Run a fused window's tasks in order, in this thread; see :class:`Chain`.  About
    ``spans`` of its tasks, whole steps of them, are kept as spans (:func:`sampled`)."""
    if isinstance(chain, Packed):
        chain = chain.open()
    runs = _runs()
    if chain.run in runs.ended:
        raise RunEnded(f"run {chain.run} ended")
    runs.enter(chain.run)
    try:
        return _run_chain(chain, inputs, runs.ended, spans)
    finally:
        runs.leave(chain.run)
        _notes.parts = None


class _Notes(threading.local):
    """Parts of the running task timed inside it (a step's sum: the waits in ``recv``),
    by the thread that runs a chain; None outside one."""

    parts: list[tuple[str, str, float, float]] | None = None


_notes = _Notes()


def note(kind: str, start: float, end: float, inside: str = "") -> None:
    """Inside a chain's task of kind ``inside``: ``start`` to ``end``
    (``time.perf_counter``) of it was ``kind`` (``recv-wait`` inside ``allreduce``: waiting
    for a peer's message; ``reduce`` inside ``forward-backward``: a group's sum).  It
    becomes a span drawn over the task's, and its seconds are the chain's timings'
    ``<kind>/<inside>`` (still counted in the task's own kind too).  Nothing outside a
    chain."""
    parts = _notes.parts
    if parts is not None:
        parts.append((kind, inside, start, end))


def sampled(kinds: tuple[str | None, ...], budget: int) -> list[bool] | None:
    """Which of a chain's tasks (by their ``kinds``) to keep as spans: all (None) where
    there are at most ``budget``; else every k-th step whole (a step ends with its
    ``update``), and the window's state, kept state and evaluations."""
    if len(kinds) <= budget:
        return None
    every = -(-len(kinds) // max(budget, 1))
    mask, step = [], 0
    for kind in kinds:
        mask.append(not step % every or kind in ALWAYS_KEPT)
        step += kind == keys.UPDATE
    if not step:                                    # no steps to cut at: every k-th task
        mask = [not i % every for i in range(len(kinds))]
    return mask


def _here() -> str:
    try:
        from distributed import get_worker
        return get_worker().address
    except (ImportError, ValueError):
        return ""


def _run_chain(chain: Chain, inputs: tuple[Any, ...], ended: set[str],
               budget: int = SPAN_NODES) -> Ran:
    cache: dict[str, Any] = dict(zip(chain.inputs, inputs))
    left = dict(chain.uses)
    wanted = set(chain.outputs)
    seconds: Counter[str] = Counter()
    done: dict[str, float] = {}
    clock = time.perf_counter
    mask = sampled(chain.kinds, budget)
    kept: list[tuple[int, float, float]] = []       # (task, start, end) of the spans kept
    notes: list[tuple[str, str, float, float]] = []
    _notes.parts = notes                    # (run_chain takes it away, whatever happens)
    began = clock()
    for at, ((key, fn, args), kind) in enumerate(zip(chain.nodes, chain.kinds)):
        if not at % CHECK_EVERY and chain.run in ended:
            raise RunEnded(f"run {chain.run} ended")
        start = clock()
        values = [cache[a.key] if type(a) is TaskRef else a for a in args]
        cache[key] = fn(*values) if fn is not None else values[0]
        now = clock()
        seconds[kind or "other"] += now - start
        if mask is None or mask[at]:
            kept.append((at, start, now))
        if key in wanted:
            done[key] = now
        for a in args:
            if type(a) is TaskRef:
                dep = a.key
                left[dep] -= 1
                if not left[dep] and dep not in wanted:
                    del cache[dep]
    _notes.parts = None
    end = clock()
    seconds[CRITICAL] = sum(seconds[k] for k in (*keys.WORK, keys.REDUCE, keys.UPDATE))
    for kind, inside, a, b in notes:
        seconds[f"{kind}/{inside}" if inside else kind] += b - a
    wall = time.time()
    return Ran(tuple(cache[k] for k in chain.outputs), dict(seconds),
               tuple(end - done.get(k, end) for k in chain.outputs), chain.steps,
               ended=wall, spans=(_spans(chain, kept, notes, began, end, wall - end,
                                         dict(seconds)),))


def _spans(chain: Chain, kept: list[tuple[int, float, float]],
           notes: list[tuple[str, str, float, float]], began: float, end: float, shift: float,
           seconds: dict[str, float]) -> tuple[str, float, float, dict[str, float], tuple]:
    """A chain's run as :attr:`Ran.spans` holds it: the tasks kept, each followed by the
    notes timed inside it, by the wall clock (``shift`` added)."""
    out: list[tuple[str, str, float, float]] = []
    n = 0
    for at, a, b in kept:
        key, kind = chain.nodes[at][0], chain.kinds[at] or "other"
        out.append((key, kind, a + shift, b + shift))
        while n < len(notes) and notes[n][3] <= a:      # inside a task not kept
            n += 1
        while n < len(notes) and notes[n][2] < b:
            what, _, x, y = notes[n]
            out.append((key, what, x + shift, y + shift))
            n += 1
    return (_here(), began + shift, end + shift, seconds, tuple(out))


def in_order(dsk: dict[str, GraphNode]) -> list[str]:
    """The keys of ``dsk`` with every task after the tasks it reads, otherwise in the order
    they were added (a builder adds a reduce tree before the leaves it sums)."""
    out: list[str] = []
    seen: set[str] = set()
    for top in dsk:
        stack = [(top, False)]
        while stack:
            key, ready = stack.pop()
            if ready:
                out.append(key)
                continue
            if key in seen:
                continue
            seen.add(key)
            stack.append((key, True))
            stack.extend((dep, False) for dep in sorted(dsk[key].dependencies, reverse=True)
                         if dep in dsk and dep not in seen)
    return out


def plain(node: GraphNode) -> tuple[str, Any, tuple[Any, ...]]:
    """A task as ``(key, function, arguments)``, the arguments its records and ``TaskRef``s
    (a literal as ``(key, None, (value,))``): what the fused task runs, and what pickles
    fast, where a ``Task`` object takes some 30 us each way."""
    if isinstance(node, DataNode):
        return node.key, None, (node.value,)
    args = node.args if isinstance(node, Task) and not node.kwargs else None
    if args is None or any(map(_is_node, args)):
        raise TypeError(f"{node.key}: the fuse pass takes tasks of plain arguments")
    return node.key, node.func, tuple(args)


def _is_node(arg: Any) -> bool:
    return type(arg) is not TaskRef and isinstance(arg, GraphNode)


def chain_of(nodes: list[tuple[str, Any, tuple[Any, ...]]], kinds: list[str | None],
             outputs: tuple[str, ...], steps: int, run: str = "") -> Chain:
    """A :class:`Chain` of ``nodes`` in the order given: its inputs are the keys its tasks
    read that none of them makes, in the order first read."""
    made = {key for key, _, _ in nodes}
    uses: Counter[str] = Counter()
    external: dict[str, None] = {}
    for _, _, args in nodes:
        for a in args:
            if type(a) is TaskRef:
                uses[a.key] += 1
                if a.key not in made:
                    external[a.key] = None
    return Chain(tuple(nodes), tuple(kinds), tuple(external), tuple(outputs),
                 tuple(uses.items()), steps, run)


def one_worker(win: Window) -> str | None:
    """The worker every task of ``win`` is pinned to, or None if there are several."""
    workers = {where[0] for where in win.where.values()}
    return workers.pop() if len(workers) == 1 else None


def steps(win: Window, first: int, last: int, run: str,
          trim: Callable[[tuple], tuple] | None = None) -> Window:
    """``win`` with its tasks fused into one ``window-<first>-<last>`` task when they all sit
    on one worker (unchanged otherwise): the ends keep their keys, as tasks that pick their
    values out of the window's result, and ``window-<first>-<last>-meta`` holds the
    evaluations' values (in ``evals``' order) and the timings (:class:`Ran`), fetched with
    the ends in one go: the evaluations are not tasks of their own any more.

    Parameters
    ----------
    win
        A window as a builder made it, its tasks in the order they were added.
    first, last
        The window's first and last step (they name the fused task).
    run
        The run id that ends every key.
    trim
        Applied, on the worker, to the evaluations' values before the meta task returns
        them: what of them the driver needs (early stopping's states: only those it will
        keep, :func:`~dtrain.training.stopping.needed_states`).  Must pickle.
    """
    worker = one_worker(win)
    if worker is None or not win.dsk:
        return win
    outputs = (*win.ends, *win.evals.values())
    order = in_order(win.dsk)
    chain = chain_of([plain(win.dsk[k]) for k in order], list(map(keys.kind_of, order)),
                     outputs, last - first + 1, run)
    external = chain.inputs
    name = keys.make(keys.WINDOW, first, last, "w0", run=run)   # (as a spanning window's)
    out = Window(ends=list(win.ends), join=win.join, evals=dict(win.evals), fused=win.fused)
    out.add(Task(name, run_window, Packed.of(chain), *map(TaskRef, external)), worker,
            sum(win.nbytes.get(k, 0) for k in outputs))
    for i, key in enumerate(win.ends):
        out.add(Task(key, pick, TaskRef(name), i), worker, win.nbytes.get(key, 0))
    out.meta = out.add(Task(keys.make(keys.WINDOW, first, last, META, run=run), meta,
                            TaskRef(name), len(win.ends), trim), worker)
    out.steps_fused = chain
    return out


def pick(ran: Ran, i: int) -> Any:
    """Output ``i`` of a fused window."""
    return ran.values[i]


def meta(ran: Ran, ends: int = 0, trim: Callable[[tuple], tuple] | None = None) -> Ran:
    """A fused window's evaluations (``trim``-med) and timings, without its end state
    (what the driver fetches beside the end)."""
    values = ran.values[ends:]
    return dataclasses.replace(ran, values=values if trim is None else trim(values))


def is_fused(win: Window) -> bool:
    """Whether ``win`` came out of :func:`steps` as one task."""
    return win.meta is not None


def epoch_ends(win: Window, ran: Ran, ended: float, floor: float | None = None
               ) -> dict[int, float]:
    """When each epoch of a fused window ended, on the driver's clock: the window ended at
    ``ended``, and each evaluation was done ``ran.before_end`` earlier, but not before
    ``floor`` (when the window before it ended: an epoch never ends before the last)."""
    outputs = (*win.ends, *win.evals.values())
    before = dict(zip(outputs, ran.before_end))
    return {epoch: max(ended - before.get(key, 0.0), floor if floor is not None else -math.inf)
            for epoch, key in win.evals.items()}


def ended(ran: Ran, arrived: float, before: float | None) -> float:
    """When a fused window ended, on the driver's clock: by the worker's wall clock, where
    that is after the window ``before`` it ended and before its result ``arrived`` (the
    driver may look late, busy launching the next window; a worker on another machine may
    keep another time)."""
    at = ran.ended - (time.time() - time.perf_counter())
    return min(arrived, max(at, before if before is not None else at))
