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
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from typing import Any

import dask
import numpy as np
from dask.task_spec import TaskRef
from distributed import Client, Future

from dtrain.core import internals, keys
from dtrain.core.arrays import gpu_problem
from dtrain.core.broadcast import on_workers, once, register
from dtrain.core.errors import UserError
from dtrain.core.modelfile import Normalization
from dtrain.deploy import p2p, runtime, tuning
from dtrain.deploy.devices import GPU, is_gpu_worker
from dtrain.deploy.layout import machine_cores
from dtrain.deploy.logs import QuietUserErrors, lost_gathers_quiet
from dtrain.deploy.signals import WorkersIgnoreInterrupts
from dtrain.deploy.workers import (StrandedTasks, forgotten, free_memory, gather, present,
                                   round_trip, workers)
from dtrain.maths.optim import TrainState
from dtrain.observe import metrics
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph import describe, fuse, handoff, passes, segments
from dtrain.taskgraph.handoff import StateGone
from dtrain.taskgraph.dataparallel import (TINY_FLOPS, DataParallel, add_step, fuse_choice,
                                           shard_rows)
from dtrain.taskgraph.placement import Placement, Worker, choices
from dtrain.taskgraph.tasks import calibrate
from dtrain.taskgraph.window import Window
from dtrain.training.checkpoint import Checkpoint, Checkpoints
from dtrain.training import heldout
from dtrain.training.course import (Book, Outcome, Start, Stop, chosen, moved_line,
                                    moved_summary, rebalance_fit, stop_before, stop_here,
                                    windows)
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch, needed_states


INLINE_MAX_BYTES = 1 << 20    # states up to this size are reduced and updated in the event loop
INLINE_MAX_FLOPS = TINY_FLOPS  # forward-backward tasks up to this are too
INLINE_ALONE_FLOPS = 2e8      # ... and up to this (~5-10 ms of NumPy) on one-thread workers
PEER_WAIT_STEPS = 20          # a window task waits for a peer's message up to this many steps
PEER_WAIT_FIRST_S = 60.0      # ... or, before a step was timed, this long (or cluster.timeout)
RETRIES = 5                   # a window whose peers failed runs again at most this many times


@dataclasses.dataclass(frozen=True)
class PerKey:
    """A task annotation as a table, ``values[key]`` (else ``default``).  Dask sends a
    callable annotation to the scheduler, which calls it with each key: a table pickles as
    data, where a closure over the window would pull the whole graph in a second time,
    through cloudpickle, on the client's event loop (a window of 1,000 fused steps: some
    0.2 s before the scheduler even saw it)."""

    values: dict[str, Any]
    default: Any = None

    def __call__(self, key: str) -> Any:
        return self.values.get(key, self.default)


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


def inline_kinds(plan: Plan, placement: Placement | None = None,
                 threads: int | None = None) -> tuple[str, ...]:
    """Kinds of the tasks short enough to run in the worker's event loop rather than
    pay a thread handoff: the reduces and updates of a state up to ``INLINE_MAX_BYTES``, and
    then forward-backward tasks of up to ``INLINE_MAX_FLOPS``, counting every shard a task
    computes where a worker's shards share one task (``placement``; data-parallel leaves only:
    local SGD rounds and model-parallel slices have keys of their own).  Where every worker
    has one thread (``threads``, the most any worker has), its tasks run one at a time
    whatever the executor, so forward-backward tasks of up to ``INLINE_ALONE_FLOPS`` run
    inline too: the handoff and the two threads' turns at the GIL cost more than a few
    milliseconds of blocked event loop (measured in benchmarks/README.md, "Latest
    results")."""
    if plan.recipe.state_bytes > INLINE_MAX_BYTES:
        return ()
    shared = max(Counter(placement.leaves).values()) \
        if placement and placement.leaves and fused(plan, placement)[0] else 1
    rows = plan.config.train.batch_size / max(len(plan.ranges), 1) * shared   # per task, step
    limit = INLINE_ALONE_FLOPS if threads == 1 else INLINE_MAX_FLOPS
    short = plan.net.flops(rows) <= limit
    return (keys.UPDATE, keys.REDUCE, keys.KEPT, keys.STATE,
            *((keys.FORWARD_BACKWARD,) if short else ()))


def fused(plan: Plan, placement: Placement) -> tuple[bool, str]:
    """Whether a worker's shards share one forward-backward task on ``placement``, and why
    (:func:`~dtrain.taskgraph.dataparallel.fuse_choice`, for a full step's shards)."""
    return fuse_choice(plan.recipe, placement,
                       shard_rows(plan.schedule[0]) * plan.recipe.sync_every)


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
        # a worker lost meanwhile: its successor gets them too; a kept cluster: once
        for plugin in (runtime.RuntimePlugin(), QuietUserErrors(), WorkersIgnoreInterrupts(),
                       metrics.StepTimer(),
                       metrics.TransferCounter(), StrandedTasks(), fuse.OpenChains(),
                       tuning.QuietNanny()):
            once(client, plugin.name, functools.partial(register, client, plugin))
        self.low_latency = plan.config.cluster.low_latency and \
            once(client, "low-latency", functools.partial(tuning.low_latency, client))
        self.inline = False                         # see place
        self.inline_on: frozenset[str] = frozenset()    # ... for these workers
        self.inline_kinds: tuple[str, ...] = ()     # see place
        self.items: list[tuple[str, Future]] = []   # (worker, loading-task future)
        self.loads = 0
        self.predicted_bytes = 0                    # what the graphs say crosses workers
        self.predicted_transfers = 0                # ... in how many values
        self.step_tasks = 0                         # the graphs' tasks of training steps
        self.fused: tuple[bool, str] | None = None  # the last window's fuse_choice
        self.fused_windows = 0                      # windows run as one task (fuse.steps)
        self.fused_seconds: Counter[str] = Counter()   # ... their task seconds by kind
        self.fused_steps = 0                        # ... and their steps
        self.literal_bytes = 0                      # states sent in graphs (not handed over)
        self.fresh = False                          # the run starts from the seeded state
        self.speed: dict[str, tuple[float, float]] = {}   # calibrated (overhead s, samples/s)
        self.choice: dict[str, Any] = {}            # CPU and GPU: the assignment chosen, why
        self.on_gpu: dict[str, bool] = {}           # which workers compute on a GPU
        self.cuda: dict[str, str] = {}              # GPU workers: why CuPy fails there ("": ok)
        self.placement: Placement | None = None
        self.live: list[Future] = []                # the windows in flight
        self.parts: list[Future] = []               # validation and test shards
        self.normalization = Normalization()        # the training split's, once loaded
        coll = plan.collection                      # partitions already on the cluster
        self.held: dict[Any, Future] = {f.key: f for f in coll.futures} if coll else {}
        self.moved: list[tuple[int, str, str, int]] = []   # balancing: (shard, from, to, bytes)
        self.moves_why = ""                         # ... and why (or why nothing moved)
        self.first_step = 0                         # the step this engine starts at
        self.mesh: p2p.Mesh | None = None           # windows that span workers: their peers
        self.meshes = 0                             # ... how many were opened
        self.spanned_windows = 0                    # windows run as a task per worker
        self.segmented_windows = 0                  # ... their sums reduced in segments
        self.described_windows = 0                  # ... described, each worker building its own
        self.contexts: tuple[p2p.Mesh, describe.Layout, list[Future]] | None = None
        self.step_sum: str | None = None            # ... the schedule of their steps' sums
        self.sent = [0, 0]                          # ... their messages and bytes
        self.via: set[str] = set()                  # ... and how they went (deploy.p2p)
        self.reruns: list[str] = []                 # windows run again, and why
        self.silent: set[str] = set()               # workers that stopped answering: left out
        self.step_seconds: float | None = None      # seconds per step so far
        self.attempt = 0                            # windows run again so far (handoff)

    def _key(self, name: str, *parts: int | str) -> str:
        return keys.make(name, *parts, run=self.run_id)

    def _workers(self, after: str | None = None) -> list[Worker]:
        """The workers there now, as placement sees them: GPU or not, how fast, how many
        threads; too few (none: every worker left) is waited for, up to ``cluster.timeout``
        (:func:`~dtrain.deploy.workers.present`; ``after``: as for :meth:`place`)."""
        cfg = self.plan.config
        info = present(self.client, self.plan.builder.min_workers, cfg.cluster.timeout, after,
                       self.silent)
        gpu = {a: cfg.cluster.device != "cpu" and is_gpu_worker(i) and self.plan.strategy.on_gpu
               for a, i in info.items()}
        if cfg.cluster.device == "gpu" and not any(gpu.values()):
            raise UserError(f"cluster.device = 'gpu' but none of the {len(info)} workers "
                            f"advertises a GPU resource; start GPU workers with "
                            f"`dask worker --resources {GPU}=1` or use device 'auto'")
        if cfg.cluster.device == "gpu":             # a GPU resource is a promise: check it
            claimed = [a for a in info if gpu[a] and a not in self.cuda]
            if claimed:
                self.cuda.update(on_workers(self.client, gpu_problem, workers=claimed))
            broken = {a: why for a, why in self.cuda.items() if why and a in info}
            if broken:
                a, why = next(iter(broken.items()))
                raise UserError(f"cluster.device = 'gpu' but worker {info[a].get('name', a)} "
                                f"advertises a {GPU} resource and cannot compute on a "
                                f"GPU: {why}")
        if len(set(gpu.values())) > 1:             # CPU and GPU workers: size work by speed
            rows = max(16, min(1024, cfg.train.batch_size // max(1, len(self.plan.ranges))))
            for a in info.keys() - self.speed.keys():
                self.speed.update(on_workers(self.client, calibrate, self.plan.net, rows,
                                             gpu[a], workers=[a]))
        self.on_gpu = {a: gpu[a] for a in info}
        out = []
        for a, i in info.items():
            overhead, speed = self.speed.get(a, (0.0, 1.0))
            threads = i.get("nthreads", 1)          # a CPU worker's shards on all its cores
            out.append(Worker(a, gpu[a], speed * (1 if gpu[a] else threads), threads,
                              overhead if gpu[a] else 0.0))
        return out

    def _choose(self, present: list[Worker]) -> list[Worker]:
        """CPU and GPU workers: the workers of the assignment predicted fastest
        (:func:`~dtrain.taskgraph.placement.choices`), said in ``summary.json``."""
        if len({w.gpu for w in present}) < 2 or self.plan.builder.min_workers > 1:
            return present
        rows = self.plan.config.train.batch_size / len(self.plan.ranges)
        sync = 2 * round_trip(self.client)          # a step's two hops between workers
        ranked = choices(present, len(self.plan.ranges), rows, sync)
        best = ranked[0]
        self.choice = {
            "chose": best.name, "sync_ms": round(sync * 1e3, 3),
            "predicted_step_ms": {c.name: round(c.seconds * 1e3, 3) for c in ranked},
            "why": f"{best.name}: the fastest predicted step ({best.seconds * 1e3:.3g} ms), "
                   f"from each worker's measured forward-backward and, where more than one "
                   f"worker holds shards, {sync * 1e3:.3g} ms of scheduler round trips"}
        return list(best.workers)

    def place(self, after: str | None = None) -> Placement:
        """Placement over the workers there now; (re)load data that must move (``after``,
        mid-run: what a run that cannot go on says of its checkpoint)."""
        c, builder = self.client, self.plan.builder
        there = self._workers(after)
        names = frozenset(w.address for w in there)
        if names != self.inline_on:                 # asked once per set of workers
            self.inline = self.low_latency and tuning.inline_executor(c)
            self.inline_on = names
        if self.held:
            placement = self._place_partitions(there)
        else:
            there = self._choose(there)
            placement = builder.place(there)
        self.placement = placement
        self.inline_kinds = inline_kinds(self.plan, placement,
                                         max((w.threads for w in there), default=1))
        wanted = builder.data(placement)
        for j, item in enumerate(wanted):
            if j < len(self.items) and self.items[j][0] == item.worker:
                continue
            held = [self.held[k] for k in item.inputs]      # partitions on the cluster
            future = c.submit(item.fn, *item.args, *held, key=self._key(*item.name, self.loads),
                              workers=[item.worker], allow_other_workers=True)
            self.items[j:j + 1] = [(item.worker, future)]
        del self.items[len(wanted):]
        self.loads += 1
        return placement

    def _place_partitions(self, present: list[Worker]) -> Placement:
        """Partitions stay on the workers holding them, but where moving them into blocks
        pays (:func:`~dtrain.taskgraph.placement.rebalance`, ``data.rebalance``); what
        moves (first placement: into blocks; later: off workers that are gone) is logged
        in ``moved``, and why in ``moves_why``."""
        coll = self.plan.collection
        holders, nbytes = coll.holders(self.client), coll.nbytes(self.client)
        placement = self.plan.builder.place(
            present, holders, list(coll.stats.sizes), nbytes=nbytes,
            mode=self.plan.config.data.rebalance, free=free_memory(self.client),
            fit=rebalance_fit(self.plan, self.first_step))
        self.moves_why = self.moves_why or (placement.moves.why if placement.moves else "")
        self.moved += [(i, h, w, nbytes[i]) for i, (h, w) in
                       enumerate(zip(holders, placement.leaves)) if h != w and h is not None
                       and not (i < len(self.items) and self.items[i][0] == w)]
        return placement

    @property
    def data(self) -> list[Future]:
        return [f for _, f in self.items]

    @property
    def refs(self) -> list[TaskRef]:
        """The loading tasks' keys for the graphs.  Graphs name them rather than embed the
        futures: a scheduler in this process keeps recent messages (and so the graphs'
        objects) for a while, and an embedded future would keep its data alive with them."""
        return [TaskRef(f.key) for f in self.data]

    def _submit(self, win: Window) -> list[Future]:
        gpus = self.placement.gpus if self.placement else frozenset()
        if fuse.is_fused(win):                      # a task per worker; the rest pick
            bodies = win.pieces or (next(iter(win.dsk)),)
            on_gpu = {b for b in bodies if win.where[b][0] in gpus}
            inline: tuple[str, ...] = tuple(k for k in win.dsk if k not in bodies) \
                if self.inline else ()
        else:                                       # the maths of shards on GPU workers
            bodies = ()
            on_gpu = {k for k in win.dsk if win.where[k][0] in gpus and keys.is_leaf(k)}
            inline = keys.prefixes(self.inline_kinds) if self.inline else ()
        quick = {k: tuning.INLINE for k in win.dsk if k.startswith(inline) and k not in on_gpu}
        evals = () if fuse.is_fused(win) else win.evals.values()    # fused: in the meta
        wanted = [*win.ends, *evals, *([win.meta] if win.meta else []), *win.pieces]
        with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True,
                           resources=PerKey(dict.fromkeys(on_gpu, {GPU: 1}), {}),
                           executor=PerKey(quick, "default")):   # short tasks: no thread handoff
            return self.client.get(win.dsk, wanted, sync=False)

    def split(self) -> dict[str, dict[str, Any]]:
        """How the work was split over the workers (for the summary)."""
        pl, info = self.placement, workers(self.client)
        names = {a: str(i.get("name", a)) for a, i in info.items()}
        out = {}
        shown = [a for a in info if pl and (a in pl.workers or self.choice)]   # a choice: all
        for a in shown:
            mine = [i for i, w in enumerate(pl.leaves) if w == a]
            out[names.get(a, a)] = {
                "device": "gpu" if a in pl.gpus or self.on_gpu.get(a) else "cpu",
                "threads": info[a].get("nthreads"),
                "leaves": len(mine),
                "samples": sum(self.plan.ranges[i][1] - self.plan.ranges[i][0] for i in mine)
                if self.plan.strategy.leaf == "shard" else None,
                "samples_per_second": round(self.speed[a][1], 1) if a in self.speed else None}
        return out

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        try:
            with lost_gathers_quiet(), _gc_frozen():
                return self._run(start, recorder, checkpoints, stop,
                                 watch or Watch(self.plan.config.train))
        except BaseException:
            self._forget_kept()
            # a failed run leaves nothing behind on the workers: drop what it holds now, not
            # when the traceback (which references these futures) is finally collected
            for future in self.data + self.live + self.parts:
                future.release()
            self.items.clear()
            raise
        finally:
            self._drop_moved()

    def _drop_moved(self) -> None:
        """A partition moved for the run is not held twice once it ends: the copy where it
        went is dropped where its worker of origin (or another) still holds it."""
        coll = self.plan.collection
        if not self.moved or coll is None:
            return
        try:
            self.client.run_on_scheduler(internals.drop_copies,
                                         [(coll.keys[i], to) for i, _, to, _ in self.moved])
        except Exception:       # a cluster going down as the run ends: nothing to drop
            pass

    def _run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
             stop: Stop, watch: Watch) -> Outcome:
        p = self.plan
        t0 = time.perf_counter()
        placement, held = self._begin(start, recorder, stop, checkpoints)
        val, test = held.val, held.test
        book = Book(self.plan, recorder, watch, start.step, list(recorder.metrics))
        state, done = start.state, None

        def rate() -> float | None:                 # seconds per step so far
            steps = (done.step if done else start.step) - start.step
            return (time.perf_counter() - book.began) / steps if steps else None

        def save_done() -> None:            # the last window's epochs are recorded: safe to
            if done is not None:            # resume from
                checkpoints.save(dataclasses.replace(done, best=watch.best_state))

        kept: str | None = None                     # the worker holding the last window's end
        # the next window, launched while this one ran (not with early stopping: a window's
        # evaluations bring only the states its watch will keep, a watch as the window
        # before left it)
        ahead: Launched | None = None
        last_end: float | None = None               # when the last window ended
        todo = windows(p, start.step, rate)
        window, finished = next(todo, None), True
        while window is not None:
            trim = None
            if ahead is None and not any(isinstance(f, Future) for _, f in book.pending):
                if book.drain():                    # early stopping: nothing after its epoch
                    finished = False
                    break
                if watch.active:    # it has seen every epoch before this window: a fused
                    trim = functools.partial(needed_states, dataclasses.replace(  # window
                        watch, best_state=None), val=p.info.val)    # brings only those kept
            self.step_seconds = rate()
            if ahead is None and window.start != start.step:
                placement = self.place(_lost_note(recorder))
            steps = [p.schedule[t] for t in window]
            nxt = next(todo, None)
            got = self._window(steps, window, state, val, placement, book, trim, recorder,
                               take=kept == placement.root, launched=save_done, ahead=ahead,
                               then=None if nxt is None or stop.requested or watch.active
                               else functools.partial(self._ahead, nxt, state, val, book,
                                                      recorder))
            if got is None:                         # early stopping: nothing after its epoch
                finished = False
                break
            cur, placement, values, ahead = got
            win = cur.win
            del got, cur                # its futures: a worker lost now would compute them again
            if win.meta:                            # a fused window: its evaluations with it
                ran = values.pop()
                before, last_end = last_end, fuse.ended(ran, time.perf_counter(), last_end)
                self._count_fused(win, ran, book, last_end, before)
                book.pending = list(zip(win.evals, ran.values))
            else:
                last_end = time.perf_counter()
            state = win.join(values)
            kept = placement.root if handoff.start_node(win) is None and len(win.ends) == 1 \
                and keys.kind_of(win.ends[0]) == keys.KEPT else None
            done = Checkpoint(window.stop, window.stop // p.schedule.steps_per_epoch, state)
            del values
            if stop.requested and window.stop < len(p.schedule):
                self._cancel(ahead)                 # no window is in flight
                ahead = None
                if book.drain():
                    finished = False
                    break
                checkpoints.save(dataclasses.replace(done, best=watch.best_state))
                stop_here(stop, p, window.stop, checkpoints)
            window = nxt
        self._cancel(ahead)
        if p.config.graph.reduce == "segments" and not self.segmented_windows:
            recorder.say(f"graph.reduce = segments changed nothing: it reduces the sums of "
                         f"windows across {segments.MIN_WORKERS} to {segments.MAX_SEGMENTS} "
                         f"workers with replicated updates, each worker's segment at least "
                         f"{segments.MIN_SEGMENT_BYTES // 1024} KiB; this run's were summed "
                         f"by the tree")
        if finished and not book.drain() and done is not None:
            checkpoints.save(dataclasses.replace(done, best=watch.best_state))
        seconds = time.perf_counter() - book.began
        last = book.last_state if watch.stopped else state
        final = chosen(watch, last)
        result = None
        if test is not None:
            on_root = kept == placement.root and final is state and done is not None
            result = heldout.evaluate_test(self.client, p, self.run_id, final, test, placement,
                                           done.step if on_root else None, self.attempt)
        self._forget_kept()
        moved = metrics.transfers(self.client, self.run_id)
        compute = _add_fused(metrics.task_times(self.client, self.run_id) or {},
                             self.fused_seconds, self.fused_steps)
        trained = book.steps_done(done)
        threads = [i.get("nthreads", 1) for i in workers(self.client).values()]
        return Outcome(book.rows, final, last, self.normalization, result, len(threads),
                       seconds, book.began - t0, trained - start.step,
                       p.schedule.samples(start.step, trained),
                       compute, metrics.worker_peak_rss_mb(self.client),
                       {"predicted": self.predicted_bytes,       # Dask's and the mesh's
                        "measured": moved["bytes"] + self.sent[1],
                        "transfers": moved["transfers"] + self.sent[0],
                        "predicted_transfers": self.predicted_transfers}, self.split(),
                       moved_summary(self.moved, self.moves_why),
                       {"tasks": self.step_tasks, "fused": self.fused, "threads": sum(threads),
                        "fused_windows": self.fused_windows,
                        "spanned_windows": self.spanned_windows,
                        "segmented_windows": self.segmented_windows, "meshes": self.meshes,
                        "described_windows": self.described_windows,
                        "step_sum": self.step_sum,
                        "via": sorted(self.via),
                        "reruns": self.reruns,
                        "state_bytes_in_graphs": self.literal_bytes, "choice": self.choice,
                        "epoch_states_fetched": book.states})

    def _begin(self, start: Start, recorder: Recorder, stop: Stop,
               checkpoints: Checkpoints) -> tuple[Placement, heldout.Loaded]:
        """What every run on the cluster starts with: the data placed and loaded (what
        moved, said), the held-out splits loaded beside it; a stop asked for meanwhile
        stops it there (:func:`~dtrain.training.course.stop_before`)."""
        self.fresh, self.first_step = start.fresh, start.step
        placement = self.place()
        if self.moved:
            recorder.say(moved_line(self.moved, self.plan.collection.stats.sizes))
        held = heldout.load(self.client, self.plan, placement, self.data, self._key)
        self.parts, self.normalization = held.futures, held.normalization
        stop_before(stop, self.plan, start, checkpoints)
        return placement, held

    def _forget_kept(self) -> None:
        """The workers stop this run's windows (one launched ahead may run), drop the state
        they keep for it (it has ended) and close its mesh."""
        self._close_mesh()
        try:
            on_workers(self.client, handoff.end, self.run_id)
        except Exception:       # a cluster going down as the run fails: nothing to drop
            pass

    def _close_mesh(self) -> None:
        self.contexts = None                # (their futures released: the tasks forgotten)
        if self.mesh is not None:
            p2p.close_mesh(self.client, self.mesh, self.plan.config.cluster.timeout)
            self.mesh = None

    def _mesh(self, participants: list[str]) -> p2p.Mesh:
        """The mesh of a window on ``participants``: the last one if they are its workers,
        else a new one (the old closed)."""
        if self.mesh is None or set(self.mesh.workers) != set(participants):
            self._close_mesh()
            cfg = self.plan.config.cluster
            self.mesh = p2p.open_mesh(self.client, participants, cfg.timeout,
                                      local=cfg.p2p in ("auto", "mesh"),
                                      mpi=cfg.p2p == "mpi")
            if cfg.p2p == "mpi" and not self.mesh.over_mpi:
                self._close_mesh()
                raise UserError("cluster.p2p = 'mpi' needs workers that are ranks of dtrain's "
                                "own MPI job (mpirun ... python -m dtrain --scheduler-rank 0, "
                                "mpi4py with MPI_THREAD_MULTIPLE); use 'auto' elsewhere")
            self.meshes += 1
        return self.mesh

    def _peer_wait(self) -> float:
        """How long a window task waits for a peer's message: long enough for the slowest
        step seen so far many times over, never less than ``cluster.timeout``."""
        floor = self.plan.config.cluster.timeout
        if self.step_seconds is None:
            return max(floor, PEER_WAIT_FIRST_S)
        return max(floor, PEER_WAIT_STEPS * self.step_seconds)

    def _window(self, steps: list, window: range, state: TrainState, val: Any,
                placement: Placement, book: Book, trim: Any, recorder: Recorder, take: bool,
                launched: Callable[[], None], ahead: Launched | None = None,
                then: Callable[[Launched, Placement], Launched | None] | None = None
                ) -> tuple[Launched, Placement, list, Launched | None] | None:
        """Launch one window (or take ``ahead``, launched while the one before ran) and wait
        for its end; ``launched`` (the last window's checkpoint) runs once it is on its way,
        unless early stopping ended the run there (None).  Meanwhile ``then`` launches the
        next window, if it can, starting from this one's end where it is: the edge between
        two windows (the driver's wait, the next graph's way to the workers) is off the
        critical path.

        A window whose kept state was gone (:class:`StateGone`), or whose peers could not
        go on (:class:`~dtrain.deploy.p2p.Broken`: a worker left mid-window, or between
        windows), runs again from its literal start state on the workers there now, under a
        new mesh, at most :data:`RETRIES` times (the next window, started from its end, with
        it); a window task's own error is raised.  Returns the window launched, its
        placement, the values of its ends (and meta), and the next window if it is on its
        way."""
        p = self.plan
        drained, submitted, error = False, [], None
        for _ in range(RETRIES + 1):
            cur, nxt = ahead, None
            ahead = None
            try:
                if cur is None:
                    cur = self._launch(steps, window, state, val, placement, book, take=take,
                                       trim=trim)
                submitted = list(cur.win.dsk)
                nxt = then(cur, placement) if then is not None else None
                self.live = [*cur.futures, *(nxt.futures if nxt else ()),
                             *(f for _, f in book.pending if isinstance(f, Future))]
                if not drained:
                    drained = True
                    if book.drain():            # early stopping: nothing after its epoch
                        self._cancel(cur, nxt)
                        return None
                    launched()
                book.pending = list(zip(cur.win.evals, cur.evals))
                values = gather(self.client, cur.ends + cur.meta, p.config.cluster.timeout,
                                _lost_note(recorder), frozenset(placement.workers), cur.pieces)
                return cur, placement, values, nxt
            except (StateGone, p2p.Broken) as exc:
                error = self._cause(exc, cur)
                self._cancel(cur, nxt)
                self.attempt += 1           # what Dask runs again of those gives up at once
                on_workers(self.client, handoff.give_up, self.run_id, self.attempt)
            if isinstance(error, p2p.Broken):
                note = f"steps {window.start}-{window.stop - 1}: {error}"
                if isinstance(error, p2p.PeerLost) and error.silent:   # listed, yet silent
                    self.silent.add(error.silent)
                    note += "; it is left out of the run"
                self.reruns.append(note)
                recorder.say(f"window of {note}; running it again from its start on the "
                             f"workers there now")
            self._close_mesh()              # a failed window's mesh is over
            forgotten(self.client, submitted, p.config.cluster.timeout)   # the same keys again
            placement, take = self.place(_lost_note(recorder)), False
        raise UserError(f"the window of steps {window.start}-{window.stop - 1} failed "
                        f"{RETRIES + 1} times; the last: {error}{_lost_note(recorder)}")

    def _ahead(self, window: range, shape: TrainState, val: Any, book: Book,
               recorder: Recorder, cur: Launched, placement: Placement) -> Launched | None:
        """The window after ``cur``, launched while ``cur`` runs: its tasks go to the workers
        at once, each runs once ``cur``'s task on its worker ended, and it starts from the
        state ``cur`` keeps there (:func:`~dtrain.taskgraph.handoff.take`, waiting for it)
        without a round trip through the scheduler (``shape``: a state of its size, whose
        literal the builder makes and the take replaces).  None (it is launched once ``cur``
        ended) where ``cur`` ends in no single kept state, or the workers changed (a new one
        is placed after ``cur``'s end)."""
        if not cur.kept:
            return None
        now = self.place(_lost_note(recorder))
        if now.workers != placement.workers or now.root != placement.root:
            return None
        steps = [self.plan.schedule[t] for t in window]
        return self._launch(steps, window, shape, val, now, book, take=True,
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

    def _launch(self, steps: list, window: range, state: TrainState, val: Any,
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
        if p.config.graph.fuse_steps and p.config.graph.reduce == "tree" and \
                isinstance(p.builder, DataParallel) and describe.describable(
                    p.recipe, placement, p.builder.server, p.builder.unit is not add_step):
            win = self._described(steps, window, state, val, placement, take, trim, follows)
            return self._submitted(win, window, book)
        win = p.builder.window(steps, state, self.refs, heldout.refs(val), placement,
                               self.run_id)
        made = handoff.Fresh(p.net, p.opt, p.config.model.seed) \
            if self.fresh and window.start == 0 and p.init is None else None   # a fresh run's
        opts = passes.Options(
            self.run_id, window.start, window.stop, p.config.graph.fuse_steps,
            p.config.graph.reduce == "segments", np.dtype(p.net.dtype).itemsize, take, made,
            self._peer_wait() if follows is not None else 0.0, self.attempt, trim, follows,
            self._peer_wait(), self._mesh)
        done = passes.optimize(win, opts, {f.key: w for w, f in self.items} |
                               heldout.located(val, placement.root))
        self.segmented_windows += done.segmented
        self.predicted_transfers += done.messages
        self.predicted_bytes += done.nbytes
        self.literal_bytes += done.literal_bytes
        win = done.win
        return self._submitted(win, window, book)

    def _submitted(self, win: Window, window: range, book: Book) -> Launched:
        """Submit a window built and rewritten; its futures, as a :class:`Launched`."""
        self.step_tasks += win.step_tasks()
        self.fused = win.fused or self.fused
        futures = self._submit(win)
        n, m, k = len(win.ends), 0 if fuse.is_fused(win) else len(win.evals), \
            win.meta is not None
        out = Launched(win, window.start, futures[:n], futures[n:n + m],
                       futures[n + m:n + m + k], futures[n + m + k:])
        if win.pieces:
            self.spanned_windows += 1
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
        p, run = self.plan, self.run_id
        lay, contexts = self._contexts(placement, val)
        first, last = window.start, window.stop - 1
        start: Any = state
        if take:
            start = handoff.Handed(run, first, self._peer_wait() if follows is not None
                                   else 0.0, self.attempt)
        elif self.fresh and first == 0 and p.init is None:
            start = handoff.Fresh(p.net, p.opt, p.config.model.seed)
        else:
            self.literal_bytes += p.recipe.state_bytes
        evals = {s.epoch: self._key(keys.EVALUATE, s.epoch + 1) for s in steps if s.last}
        messages, numbers = lay.traffic(p.net.buffer_size)
        self.predicted_transfers += messages * len(steps)
        self.predicted_bytes += numbers * np.dtype(p.net.dtype).itemsize * len(steps)
        self.described_windows += 1
        return describe.window(first, last, run, lay, contexts, start,
                               handoff.Handed(run, window.stop, attempt=self.attempt),
                               self._peer_wait(), follows, trim, evals, p.recipe.state_bytes,
                               describe.fused_note(lay))

    def _contexts(self, placement: Placement, val: Any) -> tuple[describe.Layout, list[str]]:
        """The described windows' layout on ``placement`` and each worker's context task
        (made once per mesh, beside the worker's shards: :func:`describe.context_tasks`)."""
        workers = list(dict.fromkeys(placement.leaves))
        mesh = self._mesh(workers)
        if self.contexts is not None and self.contexts[0] is mesh:
            return self.contexts[1], [f.key for f in self.contexts[2]]
        p = self.plan
        hosts = {w.rsplit(":", 1)[0] for w in mesh.workers}
        lay = describe.layout(p.recipe, placement, len(hosts) == 1 and
                              p.config.cluster.p2p != "tcp", mesh.workers, machine_cores())
        made = describe.setups(p.recipe, p.schedule, placement, lay, mesh,
                               heldout.refs(val))
        futures = {f.key: f for _, f in self.items} | heldout.futures(val)
        tasks = describe.context_tasks(made, self.refs,
                                       lambda r: self._key(keys.CONTEXT, self.meshes, r))
        got = []
        for w, task in tasks:
            args = [futures[a.key] if isinstance(a, TaskRef) else a for a in task.args]
            # (loosely, as every task of a window: a worker lost, the context is made again
            # elsewhere and the window there fails Misplaced, to be run again on a new mesh)
            got.append(self.client.submit(task.func, *args, key=task.key, workers=[w],
                                          allow_other_workers=True, pure=False))
        self.contexts, self.step_sum = (mesh, lay, got), lay.schedule
        return lay, [f.key for f in got]

    def _count_fused(self, win: Window, ran: fuse.Ran, book: Book, ended: float,
                     before: float | None = None) -> None:
        """A fused window's timings: its task seconds by kind, and when its epochs ended
        (their evaluations all arrive with the window's end, which was at ``ended``; the
        window before ended at ``before``)."""
        book.arrived.update(fuse.epoch_ends(win, ran, ended, before))
        book.recorder.window(ran.spans)
        self.fused_seconds.update(ran.seconds)
        self.fused_steps += ran.steps
        self.fused_windows += not win.pieces
        self.sent[0] += ran.sent[0]
        self.sent[1] += ran.sent[1]
        self.via.update(ran.via)


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


@contextlib.contextmanager
def _gc_frozen() -> Iterator[None]:
    """What the process held before the run is left out of Python's full collections while
    it trains (``gc.freeze``), and given back to them after (``gc.unfreeze``).  A driver
    holds 400,000 objects or more (Dask, distributed, a scheduler in this process, Bokeh):
    each full collection walked them all, 0.17 s with the GIL held, four times in five
    seconds of a 2-worker fit, stalling the scheduler and the next window's launch and taking
    a core from the workers.  Nothing is lost: a cycle among those objects that became
    garbage meanwhile is collected once the run ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _add_fused(compute: dict[str, float], seconds: Counter[str], steps: int
               ) -> dict[str, float]:
    """The StepTimer's totals (tasks the scheduler saw) plus the windows run as a task per
    worker (their tasks one after another in each, the longest on the critical path)."""
    if not steps:
        return compute
    work = sum(seconds[k] for k in keys.WORK)
    out = {"forward_backward_seconds": work, "reduce_seconds": seconds[keys.REDUCE],
           "update_seconds": seconds[keys.UPDATE], "updates": steps,
           "critical_seconds": seconds[fuse.CRITICAL]}
    return compute | {k: compute.get(k, 0) + v for k, v in out.items()}


def _lost_note(recorder: Recorder) -> str:
    """What a run that lost every worker says of its checkpoint."""
    if recorder.saved is None:
        return "; no checkpoint was saved yet"
    return (f"{recorder.checkpoint_note()}: resume it with python -m dtrain --resume "
            f"{recorder.path} once workers are back")
