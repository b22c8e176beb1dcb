"""A Dask run's data on the cluster and where it sits, held by both of its engines.

:class:`ClusterData` is what the engine of windows of steps
(:class:`~dtrain.training.engines.DaskEngine`) and the full-batch one
(:class:`~dtrain.training.fullbatch.FullBatchEngine`) share: the workers there now as
placement sees them (GPU or not, how fast, how many threads; those that stopped answering
left out), the shards placed on them (:mod:`~dtrain.taskgraph.placement`; a Dask
collection's partitions where they sit, moved only where it pays), the loading tasks'
futures, the held-out splits loaded beside them, and, mid-run, the placement made again over
the workers there now with the shards that must move loaded again.  It submits a graph with
each task pinned where the placement put it (GPU work on GPU workers, short tasks in the
worker's event loop), says how the work was split and what moved, and, when the run ends,
drops the copies it moved; a run that fails leaves nothing of its own on the workers
(:meth:`ClusterData.in_use`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import dask
from dask.task_spec import TaskRef
from distributed import Client, Future

from dtrain.core import internals, keys
from dtrain.core.arrays import gpu_problem
from dtrain.core.broadcast import on_workers, once, register
from dtrain.core.errors import UserError
from dtrain.core.modelfile import Normalization
from dtrain.deploy import runtime, tuning
from dtrain.deploy.devices import GPU, is_gpu_worker
from dtrain.deploy.logs import QuietUserErrors, lost_gathers_quiet
from dtrain.deploy.signals import WorkersIgnoreInterrupts
from dtrain.deploy.workers import (StrandedTasks, free_memory, present, round_trip,
                                   workers)
from dtrain.observe import metrics
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph import fuse, handoff
from dtrain.taskgraph.dataparallel import TINY_FLOPS, fuse_choice, shard_rows
from dtrain.taskgraph.placement import Placement, Worker, choices
from dtrain.taskgraph.tasks import calibrate
from dtrain.taskgraph.window import Window
from dtrain.training import heldout
from dtrain.training.course import moved_line, moved_summary, rebalance_fit
from dtrain.training.plan import Plan


INLINE_MAX_BYTES = 1 << 20    # states up to this size are reduced and updated in the event loop
INLINE_MAX_FLOPS = TINY_FLOPS  # forward-backward tasks up to this are too
INLINE_ALONE_FLOPS = 2e8      # ... and up to this (~5-10 ms of NumPy) on one-thread workers


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


class ClusterData:
    """A run's shards and held-out splits on the cluster, where they sit, and how a graph
    over them is submitted (see the module's docstring).

    Made with the run's engine: dtrain's worker and scheduler plugins are registered on
    ``client`` then (once per cluster; a worker that joins later gets them too).
    """

    def __init__(self, plan: Plan, client: Client):
        self.plan, self.client = plan, client
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
        self.first_step = 0                         # the step the run starts at
        self.speed: dict[str, tuple[float, float]] = {}   # calibrated (overhead s, samples/s)
        self.choice: dict[str, Any] = {}            # CPU and GPU: the assignment chosen, why
        self.on_gpu: dict[str, bool] = {}           # which workers compute on a GPU
        self.cuda: dict[str, str] = {}              # GPU workers: why CuPy fails there ("": ok)
        self.silent: set[str] = set()               # workers that stopped answering: left out
        self.placement: Placement | None = None
        self.parts: list[Future] = []               # validation and test shards
        self.normalization = Normalization()        # the training split's, once loaded
        coll = plan.collection                      # partitions already on the cluster
        self.held: dict[Any, Future] = {f.key: f for f in coll.futures} if coll else {}
        self.moved: list[tuple[int, str, str, int]] = []   # balancing: (shard, from, to, bytes)
        self.moves_why = ""                         # ... and why (or why nothing moved)

    def key(self, name: str, *parts: int | str) -> str:
        """A task key of this run (:func:`dtrain.core.keys.make`)."""
        return keys.make(name, *parts, run=self.plan.run)

    # --- the workers and the placement -----------------------------------------------------

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
            future = c.submit(item.fn, *item.args, *held, key=self.key(*item.name, self.loads),
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

    def load(self, first_step: int, recorder: Recorder) -> tuple[Placement, heldout.Loaded]:
        """What every run on the cluster starts with, from step ``first_step``: the data
        placed and loaded (what moved, said), the held-out splits loaded beside it."""
        self.first_step = first_step
        placement = self.place()
        if self.moved:
            recorder.say(moved_line(self.moved, self.plan.collection.stats.sizes))
        held = heldout.load(self.client, self.plan, placement, self.data, self.key)
        self.parts, self.normalization = held.futures, held.normalization
        return placement, held

    # --- the data as graphs name it ----------------------------------------------------------

    @property
    def data(self) -> list[Future]:
        """The loading tasks' futures, in shard order."""
        return [f for _, f in self.items]

    @property
    def refs(self) -> list[TaskRef]:
        """The loading tasks' keys for the graphs.  Graphs name them rather than embed the
        futures: a scheduler in this process keeps recent messages (and so the graphs'
        objects) for a while, and an embedded future would keep its data alive with them."""
        return [TaskRef(f.key) for f in self.data]

    @property
    def located(self) -> dict[str, str]:
        """Where each loading task's data sits: ``{key: worker}``."""
        return {f.key: w for w, f in self.items}

    def submit(self, win: Window) -> list[Future]:
        """Submit ``win``: each task pinned to its worker (loosely: a worker lost, it runs
        elsewhere), the maths of shards on GPU workers with the GPU resource, short tasks in
        the worker's event loop; the futures of its ends, its evaluations (a window run step
        by step), its meta and its tasks per worker, in that order."""
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
        meta = [win.meta] if win.meta and not win.end_in_meta else []
        wanted = [*win.ends, *evals, *meta, *win.pieces]
        with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True,
                           resources=PerKey(dict.fromkeys(on_gpu, {GPU: 1}), {}),
                           executor=PerKey(quick, "default")):   # short tasks: no thread handoff
            return self.client.get(win.dsk, wanted, sync=False)

    # --- what the summary says of it --------------------------------------------------------

    def work_split(self) -> dict[str, dict[str, Any]]:
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

    def summary(self) -> dict[str, Any]:
        """The :class:`~dtrain.training.course.Outcome`'s fields this data fills: ``split``
        (:meth:`work_split`) and ``moved`` (the partitions moved, and why)."""
        return {"split": self.work_split(), "moved": moved_summary(self.moved, self.moves_why)}

    # --- the run's end ---------------------------------------------------------------------

    def end_kept(self) -> None:
        """The workers stop this run's windows (one launched ahead may run) and drop the
        states they keep for it (it has ended)."""
        try:
            on_workers(self.client, handoff.end, self.plan.run)
        except Exception:       # a cluster going down as the run fails: nothing to drop
            pass

    @contextlib.contextmanager
    def in_use(self, close: Callable[[], None] = lambda: None,
               in_flight: Callable[[], list[Future]] = list) -> Iterator[None]:
        """While a run trains on this data: a gather that loses a worker is said once
        (:func:`~dtrain.deploy.logs.lost_gathers_quiet`), what the driver held before is out
        of the collector's full walks (:func:`_gc_frozen`), and a run that fails leaves
        nothing behind on the workers: the engine's own ``close`` (its mesh), the states
        kept for it, and now, not when the traceback (which references them) is finally
        collected, its data, its held-out splits and the futures ``in_flight`` gives (the
        windows it had launched).  Either way the copies of partitions it moved are
        dropped as it ends."""
        try:
            with lost_gathers_quiet(), _gc_frozen():
                yield
        except BaseException:
            close()
            self.end_kept()
            for future in self.data + in_flight() + self.parts:
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
