"""The Dask engine: a planned training run as task graphs on a cluster.

Data lives on the workers, built by loading tasks (or already there, a Dask
collection's partitions); one task graph per window of steps comes from the
plan's graph builder (:mod:`dtrain.taskgraph`); the driver waits only at window
edges, for the state it needs to start the next window; evaluations come back
on their own.  It runs the plan's :class:`~dtrain.training.plan.Schedule` from a
:class:`~dtrain.training.course.Start`, saves checkpoints through a
:class:`~dtrain.training.checkpoint.Checkpoints` and reports to a
:class:`~dtrain.observe.recorder.Recorder`, as the reference
(:mod:`dtrain.training.serial`) does in one process.

The engine holds its parts: the data on the cluster and its placement
(:class:`~dtrain.training.cluster_data.ClusterData`, which the full-batch engine holds
too), what it counts (:class:`~dtrain.training.counters.Counters`), and what makes each
window into tasks (:class:`~dtrain.training.launch.Launcher`).  This module is the loop
over the windows: when each goes, what it waits for, a window run again where its peers
failed, and the loop's exits (early stopping's, a stop signal's, the last window's).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any

from distributed import Client, Future

from dtrain.core import keys
from dtrain.core.broadcast import on_workers
from dtrain.core.errors import StateGone, UserError
from dtrain.deploy import p2p
from dtrain.deploy.workers import forgotten, gather
from dtrain.maths.optim import TrainState
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph import fuse, handoff, segments
from dtrain.taskgraph.placement import Placement
from dtrain.training import heldout
from dtrain.training.checkpoint import Checkpoint, Checkpoints
from dtrain.training.cluster_data import ClusterData, inline_kinds
from dtrain.training.counters import Counters
from dtrain.training.course import (Book, Outcome, Start, Stop, chosen, stop_before, stop_here,
                                    windows)
from dtrain.training.launch import Launched, Launcher, gc_paused
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch, needed_states

__all__ = ["DaskEngine", "gc_paused", "inline_kinds"]   # the last two: named from here too

RETRIES = 5                   # a window whose peers failed runs again at most this many times


@dataclasses.dataclass
class Progress:
    """Where the loop over windows stands: the state trained so far and where its last
    window ran, the checkpoint that window ended in, and the next window if it was launched
    while the last one ran."""

    book: Book
    checkpoints: Checkpoints
    state: TrainState
    placement: Placement
    done: Checkpoint | None = None          # the last window's end
    kept: str | None = None                 # the worker holding the last window's end
    ahead: Launched | None = None           # the next window, launched while this one ran
    last_end: float | None = None           # when the last window ended

    def save(self) -> None:
        """Checkpoint the last window's end, with early stopping's best state: its epochs
        are recorded, so it is safe to resume from."""
        if self.done is not None:
            self.checkpoints.save(dataclasses.replace(self.done,
                                                      best=self.book.watch.best_state))


class DaskEngine:
    """Data on the workers, one task graph per window of steps.

    At every window edge the driver (1) looks at the workers that are there
    now and re-pins: data whose worker is gone, or which belongs on a new
    worker, gets a fresh loading task there; (2) submits the window; (3) turns
    the previous window's evaluations into epoch rows and checkpoints its end
    state; (4) waits for this window's end state, its only wait.
    """

    def __init__(self, plan: Plan, client: Client):
        self.plan, self.client = plan, client
        self.run_id = plan.run
        self.cluster = ClusterData(plan, client)
        self.counters = Counters()
        self.launcher = Launcher(plan, client, self.cluster, self.counters)
        self.live: list[Future] = []                # the windows in flight

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        with self.cluster.in_use(self.launcher.close_mesh, lambda: self.live):
            return self._run(start, recorder, checkpoints, stop,
                             watch or Watch(self.plan.config.train))

    def _run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
             stop: Stop, watch: Watch) -> Outcome:
        p = self.plan
        t0 = time.perf_counter()
        self.launcher.fresh = start.fresh
        placement, held = self.cluster.load(start.step, recorder)
        stop_before(stop, p, start, checkpoints)
        book = Book(p, recorder, watch, start.step, list(recorder.metrics))
        at = Progress(book, checkpoints, start.state, placement)
        finished = self._windows(at, start, held.val, stop)
        if p.config.graph.reduce == "segments" and not self.counters.segmented_windows:
            recorder.say(f"graph.reduce = segments changed nothing: it reduces the sums of "
                         f"windows across {segments.MIN_WORKERS} to {segments.MAX_SEGMENTS} "
                         f"workers with replicated updates, each worker's segment at least "
                         f"{segments.MIN_SEGMENT_BYTES // 1024} KiB; this run's were summed "
                         f"by the tree")
        if finished and not self._stopped_early(book):
            at.save()
        seconds = time.perf_counter() - book.began
        last = book.last_state if watch.stopped else at.state
        final = chosen(watch, last)
        result = None
        if held.test is not None:
            on_root = at.kept == at.placement.root and final is at.state and at.done is not None
            result = heldout.evaluate_test(self.client, p, self.run_id, final, held.test,
                                           at.placement, at.done.step if on_root else None,
                                           self.launcher.attempt)
        self._forget_kept()
        trained = book.steps_done(at.done)
        return Outcome(book.rows, final, last, self.cluster.normalization, result,
                       seconds=seconds, setup_seconds=book.began - t0,
                       steps=trained - start.step,
                       samples=p.schedule.samples(start.step, trained),
                       **self.counters.summary(self.client, self.run_id,
                                               choice=self.cluster.choice,
                                               epoch_states=book.states),
                       **self.cluster.summary())

    def _windows(self, at: Progress, start: Start, val: Any, stop: Stop) -> bool:
        """Train the windows from ``start``, each checkpointed once the next is on its way
        (:meth:`_window`) and a stop signal acted on at its end; False where early stopping
        ended the run (nothing after its epoch is trained), True after the last window."""
        p, book = self.plan, at.book
        watch, recorder = book.watch, book.recorder

        def rate() -> float | None:                 # seconds per step so far
            steps = (at.done.step if at.done else start.step) - start.step
            return (time.perf_counter() - book.began) / steps if steps else None

        todo = windows(p, start.step, rate)
        window = next(todo, None)
        while window is not None:
            trim = None
            if at.ahead is None and not any(isinstance(f, Future) for _, f in book.pending):
                if self._stopped_early(book):
                    return False
                if watch.active:    # it has seen every epoch before this window: a fused
                    trim = functools.partial(needed_states, dataclasses.replace(  # window
                        watch, best_state=None), val=p.info.val)    # brings only those kept
            self.launcher.step_seconds = rate()
            if at.ahead is None and window.start != start.step:
                at.placement = self.cluster.place(_lost_note(recorder))
            nxt = next(todo, None)
            # the next window, launched while this one runs (not with early stopping: a
            # window's evaluations bring only the states its watch will keep, a watch as the
            # window before left it)
            then = None if nxt is None or stop.requested or watch.active else \
                functools.partial(self._ahead, nxt, at.state, val, book)
            got = self._window(window, at, val, trim, take=at.kept == at.placement.root,
                               then=then)
            if got is None:
                return False
            cur, values = got
            win = cur.win
            del got, cur                # its futures: a worker lost now would compute them again
            if win.meta:                            # a fused window: its evaluations with it
                values, ran = win.unpack(values)
                before = at.last_end
                at.last_end = fuse.ended(ran, time.perf_counter(), at.last_end)
                book.arrived.update(fuse.epoch_ends(win, ran, at.last_end, before))
                recorder.window(ran.spans)
                self.counters.ran(win, ran)
                book.pending = list(zip(win.evals, ran.values))
            else:
                at.last_end = time.perf_counter()
            at.state = win.join(values)
            at.kept = at.placement.root if handoff.start_node(win) is None and \
                len(win.ends) == 1 and keys.kind_of(win.ends[0]) == keys.KEPT else None
            at.done = Checkpoint(window.stop, window.stop // p.schedule.steps_per_epoch,
                                 at.state)
            del values
            if stop.requested and window.stop < len(p.schedule):
                self._cancel(at.ahead)              # no window is in flight
                at.ahead = None
                if self._stopped_early(book):
                    return False
                at.save()
                stop_here(stop, p, window.stop, at.checkpoints)
            window = nxt
        self._cancel(at.ahead)
        return True

    def _stopped_early(self, book: Book, cur: Launched | None = None,
                       nxt: Launched | None = None) -> bool:
        """The loop's early exit: the finished evaluations become epoch rows
        (:meth:`~dtrain.training.course.Book.drain`); where early stopping has stopped the
        run, the windows still in flight (``cur``, and ``nxt`` started from its end) are
        cancelled, nothing after its epoch trained, and True."""
        if not book.drain():
            return False
        self._cancel(cur, nxt)
        return True

    def _window(self, window: range, at: Progress, val: Any, trim: Any, take: bool,
                then: Callable[[Launched, Placement], Launched | None] | None = None
                ) -> tuple[Launched, list] | None:
        """Launch one window (or take ``at.ahead``, launched while the one before ran) and
        wait for its end; once it is on its way, the last window's checkpoint is saved,
        unless early stopping ended the run there (None).  Meanwhile ``then`` launches the
        next window, if it can, starting from this one's end where it is: the edge between
        two windows (the driver's wait, the next graph's way to the workers) is off the
        critical path.

        A window whose kept state was gone (:class:`StateGone`), or whose peers could not
        go on (:class:`~dtrain.deploy.p2p.Broken`: a worker left mid-window, or between
        windows, or its tasks were left waiting on nothing that runs:
        :class:`~dtrain.deploy.workers.Stalled`), runs again from its literal start state on
        the workers there now, under a new mesh, at most :data:`RETRIES` times (the next
        window, started from its end, with it); a window task's own error is raised.
        Returns the window launched and the values of its ends (and meta); ``at`` gets the
        placement it ran on and the next window if it is on its way."""
        p, book, recorder = self.plan, at.book, at.book.recorder
        steps = [p.schedule[t] for t in window]
        placement, ahead, at.ahead = at.placement, at.ahead, None
        drained, submitted, error = False, [], None
        for _ in range(RETRIES + 1):
            cur, nxt = ahead, None
            ahead = None
            try:
                if cur is None:
                    cur = self.launcher.launch(steps, window, at.state, val, placement, book,
                                               take=take, trim=trim)
                submitted = list(cur.win.dsk)
                nxt = then(cur, placement) if then is not None else None
                self.live = [*cur.futures, *(nxt.futures if nxt else ()),
                             *(f for _, f in book.pending if isinstance(f, Future))]
                if not drained:
                    drained = True
                    if self._stopped_early(book, cur, nxt):
                        return None
                    at.save()
                book.pending = list(zip(cur.win.evals, cur.evals))
                values = gather(self.client, cur.ends + cur.meta, p.config.cluster.timeout,
                                _lost_note(recorder), frozenset(placement.workers), cur.pieces,
                                stalls=True)
                at.placement, at.ahead = placement, nxt
                return cur, values
            except (StateGone, p2p.Broken) as exc:
                error = self._cause(exc, cur)
                self._cancel(cur, nxt)
                self.launcher.attempt += 1  # what Dask runs again of those gives up at once
                on_workers(self.client, handoff.give_up, self.run_id, self.launcher.attempt)
            if isinstance(error, p2p.Broken):
                note = f"steps {window.start}-{window.stop - 1}: {error}"
                if isinstance(error, p2p.PeerLost) and error.silent:   # listed, yet silent
                    self.cluster.silent.add(error.silent)
                    note += "; it is left out of the run"
                self.counters.reruns.append(note)
                recorder.say(f"window of {note}; running it again from its start on the "
                             f"workers there now")
            self.launcher.close_mesh()      # a failed window's mesh is over
            forgotten(self.client, submitted, p.config.cluster.timeout)   # the same keys again
            placement, take = self.cluster.place(_lost_note(recorder)), False
        raise UserError(f"the window of steps {window.start}-{window.stop - 1} failed "
                        f"{RETRIES + 1} times; the last: {error}{_lost_note(recorder)}")

    def _ahead(self, window: range, shape: TrainState, val: Any, book: Book,
               cur: Launched, placement: Placement) -> Launched | None:
        """The window after ``cur``, launched while ``cur`` runs: its tasks go to the workers
        at once, each runs once ``cur``'s task on its worker ended, and it starts from the
        state ``cur`` keeps there (:func:`~dtrain.taskgraph.handoff.take`, waiting for it)
        without a round trip through the scheduler (``shape``: a state of its size, whose
        literal the builder makes and the take replaces).  None (it is launched once ``cur``
        ended) where ``cur`` ends in no single kept state, or the workers changed (a new one
        is placed after ``cur``'s end)."""
        if not cur.kept:
            return None
        now = self.cluster.place(_lost_note(book.recorder))
        if now.workers != placement.workers or now.root != placement.root:
            return None
        steps = [self.plan.schedule[t] for t in window]
        return self.launcher.launch(steps, window, shape, val, now, book, take=True,
                                    follows=cur.first)

    def _cancel(self, cur: Launched | None, nxt: Launched | None = None) -> None:
        """Cancel a window, and the next one started from its end: that one first, on its
        own (the scheduler asserts that whoever cancels a key wants every task that depends
        on it; nobody wants the next window's tasks that read this one's end, only their
        ends)."""
        for one in (nxt, cur):
            if one is not None and one.futures:
                self.client.cancel(one.futures)

    def _cause(self, exc: BaseException, cur: Launched | None) -> BaseException:
        """Why the window in flight failed: where its tasks per worker stopped because one of
        them did (:class:`~dtrain.deploy.p2p.Broken`), that one's error.  An error of the
        window's own (not a lost peer, not a state gone) is raised as it is: running the
        window again would only fail again."""
        if not isinstance(exc, p2p.Broken):
            return exc
        deadline = time.monotonic() + self.plan.config.cluster.timeout
        for future in cur.pieces if cur else ():    # each ends at once after one failed
            try:
                error = future.exception(timeout=max(deadline - time.monotonic(), 0.001))
            except (TimeoutError, CancelledError):
                continue
            if isinstance(error, StateGone):
                exc = error
            elif error is not None and not isinstance(error, p2p.Broken):
                raise error
        return exc

    def _forget_kept(self) -> None:
        """The workers stop this run's windows (one launched ahead may run), drop the state
        they keep for it (it has ended) and close its mesh."""
        self.launcher.close_mesh()
        self.cluster.end_kept()


def _lost_note(recorder: Recorder) -> str:
    """What a run that lost every worker says of its checkpoint."""
    if recorder.saved is None:
        return "; no checkpoint was saved yet"
    return (f"{recorder.checkpoint_note()}: resume it with python -m dtrain --resume "
            f"{recorder.path} once workers are back")
