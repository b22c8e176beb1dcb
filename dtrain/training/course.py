"""The course of a run, shared by its engines: where it starts, its windows of steps, its
epoch rows, signals asking it to stop, early stopping's choice, and what it ends with.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from distributed import Future

from dtrain.core.errors import Stopped
from dtrain.core.modelfile import Normalization
from dtrain.maths.optim import TrainState
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph.placement import Fit
from dtrain.training.checkpoint import Checkpoint, Checkpoints
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch, watched


@dataclass(frozen=True)
class Start:
    """Where an engine begins: step 0, or a checkpoint's step."""

    state: TrainState
    step: int = 0
    epochs_done: int = 0
    fresh: bool = False     # the plan's seeded initial state (a worker can make it itself)


@dataclass
class Outcome:
    metrics: list[dict[str, Any]]
    state: TrainState                                           # what params.npz is made of
    last: TrainState                                            # the last step's (to go on)
    normalization: Normalization
    test: dict[str, float] | None
    workers: int
    seconds: float
    setup_seconds: float
    steps: int                                                  # steps run by this engine
    samples: int                                                # samples they trained
    compute: dict[str, float] = field(default_factory=dict)    # see observe.metrics.StepTimer
    worker_rss: dict[str, float] = field(default_factory=dict)
    comm: dict[str, int] = field(default_factory=dict)         # bytes between workers
    split: dict[str, dict[str, Any]] = field(default_factory=dict)   # work per worker
    moved: dict[str, Any] = field(default_factory=dict)        # partitions moved, and why
    graph: dict[str, Any] = field(default_factory=dict)   # tasks, transfers, fused shards
    solver: dict[str, Any] = field(default_factory=dict)  # lbfgs: iterations, scipy's status


def epoch_row(plan: Plan, ev: dict[str, float], seconds: float, first: int) -> dict[str, Any]:
    """An epoch's ``metrics.jsonl`` row; its throughput counts the samples of this epoch's
    steps from ``first`` on (a resumed run trained only those here)."""
    epoch, per = ev["epoch"], plan.schedule.steps_per_epoch
    samples = plan.schedule.samples(max(first, (epoch - 1) * per), epoch * per)
    seen = watched(ev, plan.info.val)           # what early stopping reads, as it reads it
    return {"epoch": epoch, "train_loss": seen["train_loss"],
            "train_accuracy": ev.get("train_accuracy"),
            "val_loss": seen["val_loss"],
            "val_accuracy": seen["val_accuracy"],
            **({"val_r2": seen["val_r2"]} if plan.net.regression and plan.info.val else {}),
            "seconds": seconds, "samples_per_second": samples / seconds if seconds else None,
            "lr": plan.schedule.rates[epoch - 1], "steps": per}


class Stop:
    """What asks a run to stop at its next step boundary: :attr:`requested` names the signal
    (see :class:`dtrain.deploy.signals.StopSignals`); None: carry on."""

    requested: str | None = None


def chosen(watch: Watch, last: TrainState) -> TrainState:
    """The state params.npz is made of: the best epoch's with ``keep_best`` (once there is
    one), else the last one trained (the epoch where early stopping stopped)."""
    return watch.best_state if watch.cfg.keep_best and watch.best_state is not None else last


def stop_here(stop: Stop, plan: Plan, step: int, checkpoints: Checkpoints) -> None:
    """After the checkpoint of ``step``: raise :class:`Stopped` if a stop was asked for and
    steps remain."""
    if stop.requested and step < len(plan.schedule):
        raise Stopped(stop.requested, step, len(plan.schedule),
                      step if checkpoints.run_dir is not None else None, checkpoints.run_dir)


def stop_before(stop: Stop, plan: Plan, start: Start, checkpoints: Checkpoints) -> None:
    """Before the first window (while the cluster started, or the data loaded): raise
    :class:`Stopped` if a stop was asked for; a resumed run's checkpoint is where it
    stands."""
    if stop.requested and start.step < len(plan.schedule):
        kept = start.step if start.step and checkpoints.run_dir is not None else None
        raise Stopped(stop.requested, start.step, len(plan.schedule), kept,
                      checkpoints.run_dir)


WINDOW_SECONDS = 1.0              # graph.window = 0: windows of about this long ...
WINDOW_STEPS = (100, 1000)        # ... and this many steps (the first window: the fewest)
UNTIMED = 4                       # a later window before any was timed: this many times the first


def window_steps(plan: Plan, seconds_per_step: float | None, first: bool = True) -> int:
    """Steps in the next window: ``graph.window``, or with 0 (auto) as many as take about
    ``WINDOW_SECONDS`` at the rate measured so far, within ``WINDOW_STEPS``.

    Each window edge is a pause of some 10-30 ms (the driver waits for the
    window's end state, then submits the next graph; hidden where the next window
    is launched while one runs, if the window is longer than the driver's turn):
    long windows of short steps hide it, short windows of long steps keep
    checkpoints frequent.  The first window is the shortest; a later one sized
    before any window was timed (launched while the first runs) :data:`UNTIMED`
    times as long.
    """
    fixed, (low, high) = plan.config.graph.window, WINDOW_STEPS
    if fixed:
        return fixed
    if not seconds_per_step:
        return low if first else UNTIMED * low
    return max(low, min(high, round(WINDOW_SECONDS / seconds_per_step)))


def windows(plan: Plan, start: int,
             seconds_per_step: Callable[[], float | None] = lambda: None) -> Iterator[range]:
    """Step ranges of the windows from ``start``: the driver syncs and checkpoints at each edge.

    A window ends after :func:`window_steps` steps (``seconds_per_step`` is asked at
    each edge), or later at the end of a local SGD round; with ``graph.window = 0``, a
    window that would leave fewer steps than it has itself (or than the first window's,
    ``WINDOW_STEPS[0]``) takes them too: no window of the run is shorter than the first,
    the last is at most about twice as long as it would be, and a short run pays no edge
    for a tail (160 steps: one window, not 100 and 60; 600: 100 and 500, not 100, 400 and
    100).
    """
    total = len(plan.schedule)
    first = start
    while first < total:
        n = window_steps(plan, seconds_per_step(), first == start)
        stop = min(first + n, total)
        if not plan.config.graph.window and total - stop < max(n, WINDOW_STEPS[0]):
            stop = total                # a tail shorter than a window: not one of its own
        while stop < total and not plan.recipe.unit_starts(plan.schedule[stop]):
            stop += 1
        yield range(first, stop)
        first = stop


def moved_summary(moved: list[tuple[int, str, str, int]], why: str = "") -> dict[str, Any]:
    """``summary.json``'s account of the partitions that moved between workers, and
    ``why`` (:attr:`~dtrain.taskgraph.placement.Moves.why`: what moved and why, or why
    nothing did); nothing for a run whose data was not on the cluster."""
    if not moved and not why:
        return {}
    return {"partitions": len(moved), "bytes": sum(b for *_, b in moved),
            "why": why or "balance: each worker a block of consecutive partitions of about "
                   "equal rows (a worker held partitions among another's, more than its "
                   "share of the rows, or left)",
            "moves": [{"partition": i, "from": a, "to": b, "bytes": n} for i, a, b, n in moved]}


def rebalance_fit(plan: Plan, first: int) -> Fit:
    """What the run from step ``first`` will do, as the decision to move partitions sees
    it (:func:`~dtrain.taskgraph.placement.rebalance`)."""
    rows = plan.collection.stats.sizes if plan.collection and plan.collection.stats else ()
    batch = min(plan.config.train.batch_size, sum(rows)) if rows else \
        plan.config.train.batch_size
    grad = plan.recipe.leaf_bytes or plan.net.size * 8
    return Fit(max(0, len(plan.schedule) - first), batch, plan.net.size, grad,
               plan.recipe.fan_in)


def moved_line(moved: list[tuple[int, str, str, int]], sizes: tuple[int, ...]) -> str:
    """The console line saying what moved, how much, and why."""
    froms = {a for _, a, _, _ in moved}
    return (f"moved {len(moved)} partition{'s' if len(moved) > 1 else ''} "
            f"({sum(b for *_, b in moved) / 1e6:,.1f} MB) off "
            f"{', '.join(sorted(froms))} to balance the workers, each a block of "
            f"consecutive partitions: "
            f"{sum(sizes[i] for i, *_ in moved):,} of {sum(sizes):,} training rows")


@dataclass
class Book:
    """The driver's book of a Dask run: evaluations in flight and when they arrived, the
    epoch rows recorded, and what early stopping decided."""

    plan: Plan
    recorder: Recorder
    watch: Watch
    first: int                                  # the step this engine started at
    rows: list[dict[str, Any]]
    pending: list[tuple[int, Any]] = field(default_factory=list)   # (epoch, future or value)
    arrived: dict[int, float] = field(default_factory=dict)     # epoch -> its evaluation's
    began: float = field(default_factory=time.perf_counter)
    last_state: TrainState | None = None        # the newest recorded epoch's (if kept)
    states: int = 0                             # epochs whose state came to the driver

    def drain(self) -> bool:
        """Turn finished evaluations into epoch rows, in epoch order; True once early
        stopping has stopped the run (no row after its epoch is recorded)."""
        pending, self.pending = self.pending, []
        futures = [f for _, f in pending if isinstance(f, Future)]   # a fused window's: values
        got = iter(futures[0].client.gather(futures) if futures else [])   # one wait, not one each
        results = [next(got) if isinstance(f, Future) else f for _, f in pending]
        drained = set()
        for (epoch, _), ev in zip(pending, results):
            if self.watch.stopped:
                break
            end = self.arrived.get(epoch) or time.perf_counter()
            row = epoch_row(self.plan, ev, end - self.arrived.get(epoch - 1, self.began),
                             self.first)
            self.rows.append(row)
            self.recorder.epoch(row)
            self.last_state = ev.get("state")
            self.states += self.last_state is not None
            self.watch.see(row, self.last_state)
            drained.add(row["epoch"])
        w = self.watch          # a fused window brings only these states (needed_states)
        if w.active and (w.stopped in drained and self.last_state is None or w.cfg.keep_best
                         and w.best_epoch in drained and w.best_state is None):
            raise RuntimeError(f"dtrain bug: the state of epoch {w.stopped or w.best_epoch} "
                               f"(early stopping's) did not come with its evaluation")
        return self.watch.stopped is not None

    def steps_done(self, done: Checkpoint | None) -> int:
        """Steps trained: to the end of the epoch early stopping stopped after, else to the
        last window's end."""
        if self.watch.stopped is not None:
            return self.watch.stopped * self.plan.schedule.steps_per_epoch
        return done.step if done is not None else self.first
