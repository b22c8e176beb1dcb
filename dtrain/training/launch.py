"""One window of steps on its way to the cluster: built, rewritten, submitted.

The :class:`~dtrain.training.engines.DaskEngine` decides when a window goes and waits for
it; a :class:`Launcher` makes it into tasks on the workers: the plan's graph builder's graph
(:mod:`dtrain.taskgraph`) through the graph passes (:func:`dtrain.taskgraph.passes.optimize`:
its state handed over where it was kept, its steps fused into a task per worker), or, for
the allreduce strategies across workers, a description each worker builds its own chain
from (:mod:`~dtrain.taskgraph.describe`, with a context task per worker and mesh).  It
holds what windows across workers talk over (a :class:`~dtrain.deploy.p2p.Mesh` per set of
workers), how long their tasks wait for a peer, and which attempt of the run a window is
(a window whose peers failed is sent again as the next).  What it submits is counted in the
run's :class:`~dtrain.training.counters.Counters`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from dask.task_spec import TaskRef
from distributed import Client, Future

from dtrain.core import keys
from dtrain.core.errors import UserError
from dtrain.deploy import p2p
from dtrain.deploy.layout import machine_cores
from dtrain.maths.optim import TrainState
from dtrain.taskgraph import describe, fuse, handoff, passes
from dtrain.taskgraph.dataparallel import DataParallel, add_step
from dtrain.taskgraph.placement import Placement
from dtrain.taskgraph.window import Window
from dtrain.training import heldout
from dtrain.training.cluster_data import ClusterData
from dtrain.training.counters import Counters
from dtrain.training.course import Book
from dtrain.training.plan import Plan


PEER_WAIT_STEPS = 20          # a window task waits for a peer's message up to this many steps
PEER_WAIT_FIRST_S = 60.0      # ... or, before a step was timed, this long (or cluster.timeout)


@dataclasses.dataclass
class Launched:
    """A window on its way: its graph and the futures of its ends, its evaluations (a window
    run step by step), its meta (fused or cut: the evaluations and timings) and its tasks
    per worker (cut)."""

    win: Window
    first: int                  # its first step
    ends: list[Future]
    evals: list[Future]
    meta: list[Future]
    pieces: list[Future]

    @property
    def futures(self) -> list[Future]:
        return [*self.ends, *self.evals, *self.meta, *self.pieces]

    @property
    def kept(self) -> bool:
        """Whether the window ends in one state kept on its worker (``kept-<step>``), which
        the next window can take there (not model parallelism's, nor a window of steps)."""
        w = self.win
        return fuse.is_fused(w) and len(w.ends) == 1 and keys.kind_of(w.ends[0]) == keys.KEPT


class Launcher:
    """Builds, rewrites and submits a run's windows on ``cluster`` (see the module's
    docstring), counting what it sends in ``counters``."""

    def __init__(self, plan: Plan, client: Client, cluster: ClusterData, counters: Counters):
        self.plan, self.client, self.cluster, self.counters = plan, client, cluster, counters
        self.run_id = plan.run
        self.fresh = False                          # the run starts from the seeded state
        self.attempt = 0                            # windows run again so far (handoff)
        self.step_seconds: float | None = None      # seconds per step so far
        self.mesh: p2p.Mesh | None = None           # windows that span workers: their peers
        self.contexts: tuple[p2p.Mesh, describe.Layout, list[Future]] | None = None

    def launch(self, steps: list, window: range, state: TrainState, val: Any,
               placement: Placement, book: Book, take: bool, trim: Any = None,
               follows: int | None = None) -> Launched:
        """Build, rewrite and submit one window: the builder's graph, its state handed over
        on the worker that kept it (``take``; :mod:`~dtrain.taskgraph.handoff`), its steps
        fused into a task per worker (:mod:`~dtrain.taskgraph.fuse`,
        :mod:`~dtrain.taskgraph.span`; ``trim``: what of its evaluations comes back);
        ``follows``: the first step of the window still running before it (its tasks wait
        for that one's, and for the state it keeps)."""
        with gc_paused():
            return self._build_and_submit(steps, window, state, val, placement, book, take,
                                          trim, follows)

    def _build_and_submit(self, steps: list, window: range, state: TrainState, val: Any,
                          placement: Placement, book: Book, take: bool, trim: Any,
                          follows: int | None) -> Launched:
        p = self.plan
        builder = p.builder
        if p.config.graph.fuse_steps and p.config.graph.reduce == "tree" and \
                isinstance(builder, DataParallel) and describe.describable(
                    p.recipe, placement, builder.server, builder.unit is not add_step):
            win = self._described(steps, window, state, val, placement, take, trim, follows)
            return self._submitted(win, window, book)
        win = builder.window(steps, state, self.cluster.refs, heldout.refs(val), placement,
                             self.run_id)
        made = handoff.Fresh(p.net, p.opt, p.config.model.seed) \
            if self.fresh and window.start == 0 and p.init is None else None   # a fresh run's
        opts = passes.Options(
            self.run_id, window.start, window.stop, p.config.graph.fuse_steps,
            p.config.graph.reduce == "segments", np.dtype(p.net.dtype).itemsize, take, made,
            self.peer_wait() if follows is not None else 0.0, self.attempt, trim, follows,
            self.peer_wait(), self.mesh_of)
        done = passes.optimize(win, opts, self.cluster.located |
                               heldout.located(val, placement.root))
        self.counters.segmented_windows += done.segmented
        self.counters.predicted_transfers += done.messages
        self.counters.predicted_bytes += done.nbytes
        self.counters.literal_bytes += done.literal_bytes
        win = done.win
        return self._submitted(win, window, book)

    def _submitted(self, win: Window, window: range, book: Book) -> Launched:
        """Submit a window built and rewritten; its futures, as a :class:`Launched`."""
        self.counters.submitted(win)
        futures = self.cluster.submit(win)
        n, m, k = len(win.ends), 0 if fuse.is_fused(win) else len(win.evals), \
            win.meta is not None and not win.end_in_meta
        out = Launched(win, window.start, futures[:n], futures[n:n + m],
                       futures[n + m:n + m + k], futures[n + m + k:])
        for epoch, fut in zip(win.evals, out.evals):
            fut.add_done_callback(lambda f, e=epoch: book.arrived.setdefault(
                e, time.perf_counter()))
        return out

    def _described(self, steps: list, window: range, state: TrainState, val: Any,
                   placement: Placement, take: bool, trim: Any, follows: int | None
                   ) -> Window:
        """A window described to each worker, which builds its chain itself
        (:mod:`~dtrain.taskgraph.describe`): the state it starts from is the one each worker
        kept (``take``), made from the seed there (a fresh run's first window), or sent."""
        p, run, counters = self.plan, self.run_id, self.counters
        lay, contexts = self._contexts(placement, val)
        first, last = window.start, window.stop - 1
        start: Any = state
        if take:
            start = handoff.Handed(run, first, self.peer_wait() if follows is not None
                                   else 0.0, self.attempt)
        elif self.fresh and first == 0 and p.init is None:
            start = handoff.Fresh(p.net, p.opt, p.config.model.seed)
        else:
            counters.literal_bytes += p.recipe.state_bytes
        evals = {s.epoch: self.cluster.key(keys.EVALUATE, s.epoch + 1) for s in steps if s.last}
        messages, numbers = lay.traffic(p.net.buffer_size)
        counters.predicted_transfers += messages * len(steps)
        counters.predicted_bytes += numbers * np.dtype(p.net.dtype).itemsize * len(steps)
        counters.described_windows += 1
        return describe.window(first, last, run, lay, contexts, start,
                               handoff.Handed(run, window.stop, attempt=self.attempt),
                               self.peer_wait(), follows, trim, evals, p.recipe.state_bytes,
                               describe.fused_note(lay))

    def _contexts(self, placement: Placement, val: Any) -> tuple[describe.Layout, list[str]]:
        """The described windows' layout on ``placement`` and each worker's context task
        (made once per mesh, beside the worker's shards: :func:`describe.context_tasks`)."""
        workers = list(dict.fromkeys(placement.leaves))
        mesh = self.mesh_of(workers)
        if self.contexts is not None and self.contexts[0] is mesh:
            return self.contexts[1], [f.key for f in self.contexts[2]]
        p = self.plan
        lay = describe.layout(p.recipe, placement, self._one_machine(placement), mesh.workers,
                              machine_cores())
        made = describe.setups(p.recipe, p.schedule, placement, lay, mesh,
                               heldout.refs(val))
        futures = {f.key: f for f in self.cluster.data} | heldout.futures(val)
        tasks = describe.context_tasks(made, self.cluster.refs, lambda r: self.cluster.key(
            keys.CONTEXT, self.counters.meshes, r))
        got = []
        for w, task in tasks:
            args = [futures[a.key] if isinstance(a, TaskRef) else a for a in task.args]
            # (loosely, as every task of a window: a worker lost, the context is made again
            # elsewhere and the window there fails Misplaced, to be run again on a new mesh)
            got.append(self.client.submit(task.func, *args, key=task.key, workers=[w],
                                          allow_other_workers=True, pure=False))
        self.contexts, self.counters.step_sum = (mesh, lay, got), lay.schedule
        self.counters.update_where_summed = lay.where_made
        return lay, [f.key for f in got]

    def _one_machine(self, placement: Placement) -> bool:
        """Whether a window's workers share one machine, their messages on Unix sockets."""
        hosts = {w.rsplit(":", 1)[0] for w in placement.leaves}
        return len(hosts) == 1 and self.plan.config.cluster.p2p != "tcp"

    # --- the meshes of windows across workers -----------------------------------------------

    def mesh_of(self, participants: list[str]) -> p2p.Mesh:
        """The mesh of a window on ``participants``: the last one if they are its workers,
        else a new one (the old closed)."""
        if self.mesh is None or set(self.mesh.workers) != set(participants):
            self.close_mesh()
            cfg = self.plan.config.cluster
            self.mesh = p2p.open_mesh(self.client, participants, cfg.timeout,
                                      local=cfg.p2p in ("auto", "mesh"),
                                      mpi=cfg.p2p == "mpi")
            if cfg.p2p == "mpi" and not self.mesh.over_mpi:
                self.close_mesh()
                raise UserError("cluster.p2p = 'mpi' needs workers that are ranks of dtrain's "
                                "own MPI job (mpirun ... python -m dtrain --scheduler-rank 0, "
                                "mpi4py with MPI_THREAD_MULTIPLE); use 'auto' elsewhere")
            self.counters.meshes += 1
        return self.mesh

    def close_mesh(self) -> None:
        """Close the mesh of the last window across workers, and forget the context tasks
        made for it (their futures released: the tasks forgotten)."""
        self.contexts = None
        if self.mesh is not None:
            p2p.close_mesh(self.client, self.mesh, self.plan.config.cluster.timeout)
            self.mesh = None

    def peer_wait(self) -> float:
        """How long a window task waits for a peer's message: long enough for the slowest
        step seen so far many times over, never less than ``cluster.timeout``."""
        floor = self.plan.config.cluster.timeout
        if self.step_seconds is None:
            return max(floor, PEER_WAIT_FIRST_S)
        return max(floor, PEER_WAIT_STEPS * self.step_seconds)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a window is built and submitted: its
    thousands of new task objects trigger full collections of everything a driver holds
    (Dask, distributed, Bokeh), 0.1 s each on the window's critical path; the next
    collection runs later, while the window computes."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
