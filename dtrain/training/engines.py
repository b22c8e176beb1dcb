"""The engines that run a planned training: in one process, or as Dask task graphs.

* :class:`SerialEngine`: the reference; no Dask, each global minibatch in one piece.
* :class:`DaskEngine`: data on the workers, built by loading tasks; one task
  graph per window of steps, from the plan's graph builder
  (:mod:`dtrain.taskgraph`); the driver waits only at window edges, for the
  state it needs to start the next window; evaluations come back on their
  own.

Both run the same :class:`~dtrain.training.plan.Schedule` from a
:class:`Start`, save checkpoints through a
:class:`~dtrain.training.checkpoint.Checkpoints` and report to a
:class:`~dtrain.observe.recorder.Recorder`.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dask
from dask.task_spec import DataNode, TaskRef
from distributed import Client, Future, wait

from dtrain.core import keys
from dtrain.core.errors import Stopped, UserError
from dtrain.core.modelfile import Normalization
from dtrain.data.prepare import clear_cache, normalization
from dtrain.data.shards import load_part, load_shard, minibatch
from dtrain.deploy import tuning
from dtrain.deploy.devices import GPU, is_gpu_worker
from dtrain.deploy.logs import QuietUserErrors
from dtrain.deploy.signals import WorkersIgnoreInterrupts
from dtrain.deploy.workers import wait_for_workers, workers
from dtrain.core.arrays import gpu_problem
from dtrain.maths.optim import TrainState, update
from dtrain.observe import metrics
from dtrain.observe.recorder import Recorder
from dtrain.data import partitions
from dtrain.taskgraph.dataparallel import (TINY_FLOPS, HeldOut, add_evaluation, fuse_choice,
                                           shard_rows)
from dtrain.taskgraph.placement import Placement, Worker
from dtrain.taskgraph.records import Evaluate
from dtrain.taskgraph.tasks import calibrate, evaluate
from dtrain.taskgraph.window import Window
from dtrain.training.checkpoint import Checkpoint, Checkpoints
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch

INLINE_MAX_BYTES = 1 << 20    # states up to this size are reduced and updated in the event loop
INLINE_MAX_FLOPS = TINY_FLOPS  # forward-backward tasks up to this are too
INLINE_ALONE_FLOPS = 2e8      # ... and up to this (~5-10 ms of NumPy) on one-thread workers


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
    return (keys.UPDATE, keys.REDUCE, *((keys.FORWARD_BACKWARD,) if short else ()))


def fused(plan: Plan, placement: Placement) -> tuple[bool, str]:
    """Whether a worker's shards share one forward-backward task on ``placement``, and why
    (:func:`~dtrain.taskgraph.dataparallel.fuse_choice`, for a full step's shards)."""
    return fuse_choice(plan.recipe, placement,
                       shard_rows(plan.schedule[0]) * plan.recipe.sync_every)


@dataclass(frozen=True)
class Start:
    """Where an engine begins: step 0, or a checkpoint's step."""

    state: TrainState
    step: int = 0
    epochs_done: int = 0


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


def _epoch_row(plan: Plan, ev: dict[str, float], seconds: float, first: int) -> dict[str, Any]:
    """An epoch's ``metrics.jsonl`` row; its throughput counts the samples of this epoch's
    steps from ``first`` on (a resumed run trained only those here)."""
    epoch, per = ev["epoch"], plan.schedule.steps_per_epoch
    samples = plan.schedule.samples(max(first, (epoch - 1) * per), epoch * per)
    return {"epoch": epoch, "train_loss": ev.get("train_loss"),
            "train_accuracy": ev.get("train_accuracy"),
            "val_loss": ev["loss"] if plan.info.val else None,
            "val_accuracy": ev["accuracy"] if plan.info.val else None,
            "seconds": seconds, "samples_per_second": samples / seconds if seconds else None,
            "lr": plan.schedule.rates[epoch - 1], "steps": per}


class Stop:
    """What asks a run to stop at its next step boundary: :attr:`requested` names the signal
    (see :class:`dtrain.deploy.signals.StopSignals`); None: carry on."""

    requested: str | None = None


def _chosen(watch: Watch, last: TrainState) -> TrainState:
    """The state params.npz is made of: the best epoch's with ``keep_best`` (once there is
    one), else the last one trained (the epoch where early stopping stopped)."""
    return watch.best_state if watch.cfg.keep_best and watch.best_state is not None else last


def _stop_here(stop: Stop, plan: Plan, step: int, checkpoints: Checkpoints) -> None:
    """After the checkpoint of ``step``: raise :class:`Stopped` if a stop was asked for and
    steps remain."""
    if stop.requested and step < len(plan.schedule):
        raise Stopped(stop.requested, step, len(plan.schedule),
                      step if checkpoints.run_dir is not None else None, checkpoints.run_dir)


WINDOW_SECONDS = 1.0              # graph.window = 0: windows of about this long ...
WINDOW_STEPS = (100, 1000)        # ... and this many steps (the first window: the fewest)


def window_steps(plan: Plan, seconds_per_step: float | None) -> int:
    """Steps in the next window: ``graph.window``, or with 0 (auto) as many as take about
    ``WINDOW_SECONDS`` at the rate measured so far, within ``WINDOW_STEPS``.

    Each window edge is a pause of some 10-30 ms (the driver waits for the
    window's end state, then submits the next graph): long windows of short steps
    hide it, short windows of long steps keep checkpoints frequent.
    """
    fixed, (low, high) = plan.config.graph.window, WINDOW_STEPS
    if fixed or not seconds_per_step:
        return fixed or low
    return max(low, min(high, round(WINDOW_SECONDS / seconds_per_step)))


def windows(plan: Plan, start: int,
             seconds_per_step: Callable[[], float | None] = lambda: None) -> Iterator[range]:
    """Step ranges of the windows from ``start``: the driver syncs and checkpoints at each edge.

    A window ends after :func:`window_steps` steps (``seconds_per_step`` is asked at
    each edge), or later at the end of a local SGD round.
    """
    total = len(plan.schedule)
    first = start
    while first < total:
        stop = min(first + window_steps(plan, seconds_per_step()), total)
        while stop < total and not plan.recipe.unit_starts(plan.schedule[stop]):
            stop += 1
        yield range(first, stop)
        first = stop


class SerialEngine:
    """The reference: one process, NumPy, every global minibatch in one piece."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        p, cfg = self.plan, self.plan.config
        watch = watch or Watch(cfg.train)
        t0 = time.perf_counter()
        shards = [load_shard(src) for src in p.sources]
        val = load_part(cfg.data, "val", cfg.model.dtype, norm=p.norm)
        test = load_part(cfg.data, "test", cfg.model.dtype, norm=p.norm)
        norm = normalization(cfg.data, p.norm)
        state, rows = start.state, list(recorder.metrics)
        began = last = time.perf_counter()
        fb = upd = 0.0
        done = start.step
        for window in windows(p, start.step):
            for t in window:
                step = p.schedule[t]
                x, y = minibatch(shards, step.epoch, step.bounds, p.recipe.shuffle_seed)
                t1 = time.perf_counter()
                grad = p.net.loss_and_grad(p.opt.params(state), x, y)
                t2 = time.perf_counter()
                state = update(p.opt, step, True, state, grad)
                fb, upd, done = fb + t2 - t1, upd + time.perf_counter() - t2, t + 1
                if step.last:
                    now = time.perf_counter()
                    row = _epoch_row(p, evaluate(Evaluate(p.net, step.epoch), state, val),
                                     now - last, start.step)
                    last = now
                    rows.append(row)
                    recorder.epoch(row)
                    if watch.see(row, state):
                        break
            if watch.stopped:
                break
            checkpoints.save(Checkpoint(window.stop, window.stop // p.schedule.steps_per_epoch,
                                        state, watch.best_state))
            _stop_here(stop, p, window.stop, checkpoints)
        seconds = time.perf_counter() - began
        final = _chosen(watch, state)
        result = evaluate(Evaluate(p.net, -1), final, test) if p.info.test else None
        compute = {"forward_backward_seconds": fb, "reduce_seconds": 0.0, "update_seconds": upd,
                   "critical_seconds": fb + upd}
        return Outcome(rows, final, state, norm, result, 0, seconds, began - t0,
                       done - start.step, p.schedule.samples(start.step, done), compute)


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
        client.register_plugin(QuietUserErrors())
        client.register_plugin(WorkersIgnoreInterrupts())
        client.register_plugin(metrics.StepTimer())
        client.register_plugin(metrics.TransferCounter())
        self.low_latency = plan.config.cluster.low_latency and tuning.low_latency(client)
        self.inline = False                         # see place
        self.inline_kinds: tuple[str, ...] = ()     # see place
        self.items: list[tuple[str, Future]] = []   # (worker, loading-task future)
        self.loads = 0
        self.predicted_bytes = 0                    # what the graphs say crosses workers
        self.predicted_transfers = 0                # ... in how many values
        self.step_tasks = 0                         # the graphs' tasks of training steps
        self.fused: tuple[bool, str] | None = None  # the last window's fuse_choice
        self.speed: dict[str, float] = {}           # calibrated samples/s, by worker address
        self.cuda: dict[str, str] = {}              # GPU workers: why CuPy fails there ("": ok)
        self.placement: Placement | None = None
        self.live: list[Future] = []                # the windows in flight
        self.parts: list[Future] = []               # validation and test shards
        self.normalization = Normalization()        # the training split's, once loaded
        coll = plan.collection                      # partitions already on the cluster
        self.held: dict[Any, Future] = {f.key: f for f in coll.futures} if coll else {}
        self.moved: list[tuple[int, str, str, int]] = []   # balancing: (shard, from, to, bytes)

    def _key(self, name: str, *parts: int | str) -> str:
        return keys.make(name, *parts, run=self.run_id)

    def _workers(self) -> list[Worker]:
        """The workers there now, as placement sees them: GPU or not, how fast, how many threads."""
        cfg = self.plan.config
        info = workers(self.client)
        gpu = {a: cfg.cluster.device != "cpu" and is_gpu_worker(i) and self.plan.strategy.on_gpu
               for a, i in info.items()}
        if cfg.cluster.device == "gpu" and not any(gpu.values()):
            raise UserError(f"cluster.device = 'gpu' but none of the {len(info)} workers "
                            f"advertises a GPU resource; start GPU workers with "
                            f"`dask worker --resources {GPU}=1` or use device 'auto'")
        if cfg.cluster.device == "gpu":             # a GPU resource is a promise: check it
            claimed = [a for a in info if gpu[a] and a not in self.cuda]
            if claimed:
                self.cuda.update(self.client.run(gpu_problem, workers=claimed))
            broken = {a: why for a, why in self.cuda.items() if why and a in info}
            if broken:
                a, why = next(iter(broken.items()))
                raise UserError(f"cluster.device = 'gpu' but worker {info[a].get('name', a)} "
                                f"advertises a {GPU} resource and cannot compute on a "
                                f"GPU: {why}")
        if len(set(gpu.values())) > 1:             # CPU and GPU workers: size work by speed
            rows = max(16, min(1024, cfg.train.batch_size // max(1, len(info))))
            for a in info.keys() - self.speed.keys():
                self.speed[a] = self.client.run(calibrate, self.plan.net, rows, gpu[a],
                                                workers=[a])[a]
        return [Worker(a, gpu[a], self.speed.get(a, 1.0), i.get("nthreads", 1))
                for a, i in info.items()]

    def place(self) -> Placement:
        """Placement over the workers there now; (re)load data that must move."""
        cfg, c, builder = self.plan.config, self.client, self.plan.builder
        wait_for_workers(c, builder.min_workers, cfg.cluster.timeout)
        self.inline = self.low_latency and tuning.inline_executor(c)
        present = self._workers()
        if self.held:
            placement = self._place_partitions(present)
        else:
            placement = builder.place(present)
        self.placement = placement
        self.inline_kinds = inline_kinds(self.plan, placement,
                                         max((w.threads for w in present), default=1))
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
        """Partitions stay on the workers holding them, but for balancing; what moves (first
        placement: to balance; later: off workers that are gone) is logged in ``moved``."""
        coll = self.plan.collection
        holders = coll.holders(self.client)
        placement = self.plan.builder.place(present, holders, list(coll.stats.sizes))
        nbytes = coll.nbytes(self.client) if any(
            h != w for h, w in zip(holders, placement.leaves)) else []
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

    def load_held_out(self, placement: Placement) -> tuple[Any, Any]:
        """Validation and test shards, loaded where the updates run (partitioned data: in
        parts beside their partitions); surface data errors now."""
        if self.held:
            return self._held_out_parts(placement)
        p, cfg, c, root = self.plan, self.plan.config, self.client, placement.root
        parts = [c.submit(load_part, cfg.data, part, cfg.model.dtype, root in placement.gpus,
                          p.norm, key=self._key(f"load-{part}"), workers=[root],
                          allow_other_workers=True) if getattr(p.info, part) else None
                 for part in ("val", "test")]
        self.parts = [f for f in parts if f is not None]
        norm = c.submit(normalization, cfg.data, p.norm, key=self._key(keys.NORMALIZATION),
                        workers=[root], allow_other_workers=True)
        loading = self.data + self.parts + [norm]
        with c.as_current():        # distributed.wait asks the default client
            wait(loading)
        for f in loading:
            if f.status == "error":
                f.result()  # re-raises the worker's exception here
        self.normalization = norm.result()
        c.run(clear_cache)  # the data is built; drop the workers' copies of the files
        return parts[0], parts[1]

    def _test(self, state: TrainState, test: Any, placement: Placement) -> dict[str, float]:
        """The test split's evaluation of ``state`` (in parts where they are, if split)."""
        win = Window()
        start = win.add(DataNode(self._key(keys.STATE, len(self.plan.schedule)), state),
                        placement.root)
        key = add_evaluation(win, Evaluate(self.plan.net, -1), start, self.held_refs(test),
                             placement.root, self.run_id)
        with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True):
            return self.client.get(win.dsk, key)

    def _held_out_parts(self, placement: Placement) -> tuple[Any, Any]:
        """Each partition's validation and test rows, loaded on its worker: ``[(future,
        worker), ...]`` per split (None: the split is empty)."""
        coll, c = self.plan.collection, self.client
        spec = self.plan.part_sources[0].spec
        out = []
        for which in ("val", "test"):
            loads = [(c.submit(partitions.held_out, spec, which, i, f,
                               key=self._key(f"load-{which}", i), workers=[w],
                               allow_other_workers=True), w)
                     for i, (f, w, part) in enumerate(zip(coll.futures, placement.leaves,
                                                          coll.parts))
                     if getattr(part, which)]
            out.append(loads or None)
        self.parts = [f for loads in out if loads for f, _ in loads]
        with c.as_current():        # distributed.wait asks the default client
            wait(self.data + self.parts)
        for f in self.data + self.parts:
            if f.status == "error":
                f.result()
        self.normalization = self.plan.fitted
        return out[0], out[1]

    @staticmethod
    def held_refs(parts: Any) -> HeldOut:
        """Held-out data as the graphs name it: a key, or ``(key, worker)`` per part."""
        if isinstance(parts, list):
            return tuple((TaskRef(f.key), w) for f, w in parts)
        return TaskRef(parts.key) if parts is not None else None

    def _submit(self, win: Window) -> list[Future]:
        gpus = self.placement.gpus if self.placement else frozenset()
        need = {GPU: 1}

        def resources(key: str) -> dict:            # the maths of shards on GPU workers
            return need if win.where[key][0] in gpus and keys.is_leaf(key) else {}

        inline = keys.prefixes(self.inline_kinds) if self.inline else ()

        def executor(key: str) -> str:              # short tasks: no thread handoff
            return tuning.INLINE if key.startswith(inline) and not resources(key) \
                else "default"

        with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True,
                           resources=resources, executor=executor):
            return self.client.get(win.dsk, [*win.ends, *win.evals.values()], sync=False)

    def split(self) -> dict[str, dict[str, Any]]:
        """How the work was split over the workers (for the summary)."""
        pl, info = self.placement, workers(self.client)
        names = {a: str(i.get("name", a)) for a, i in info.items()}
        out = {}
        for a in [a for a in info if pl and a in pl.workers]:
            mine = [i for i, w in enumerate(pl.leaves) if w == a]
            out[names.get(a, a)] = {
                "device": "gpu" if a in pl.gpus else "cpu", "threads": info[a].get("nthreads"),
                "leaves": len(mine),
                "samples": sum(self.plan.ranges[i][1] - self.plan.ranges[i][0] for i in mine)
                if self.plan.strategy.leaf == "shard" else None,
                "samples_per_second": round(self.speed[a], 1) if a in self.speed else None}
        return out

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        try:
            return self._run(start, recorder, checkpoints, stop,
                             watch or Watch(self.plan.config.train))
        except BaseException:
            # a failed run leaves nothing behind on the workers: drop what it holds now, not
            # when the traceback (which references these futures) is finally collected
            for future in self.data + self.live + self.parts:
                future.release()
            self.items.clear()
            raise

    def _run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
             stop: Stop, watch: Watch) -> Outcome:
        p = self.plan
        t0 = time.perf_counter()
        placement = self.place()
        if self.moved:
            recorder.say(moved_line(self.moved, self.plan.collection.stats.sizes))
        val, test = self.load_held_out(placement)
        book = _Book(self.plan, recorder, watch, start.step, list(recorder.metrics))
        state, done = start.state, None

        def rate() -> float | None:                 # seconds per step so far
            steps = (done.step if done else start.step) - start.step
            return (time.perf_counter() - book.began) / steps if steps else None

        for window in windows(p, start.step, rate):
            if window.start != start.step:
                placement = self.place()
            win = p.builder.window([p.schedule[t] for t in window], state, self.refs,
                                   self.held_refs(val), placement, self.run_id)
            located = {f.key: w for w, f in self.items} | _located(val, placement.root)
            moves = win.transfers(located)
            self.predicted_bytes += sum(win.nbytes.get(k, 0) for k, _, _ in moves)
            self.predicted_transfers += len(moves)
            self.step_tasks += win.step_tasks()
            self.fused = win.fused or self.fused
            futures = self._submit(win)
            ends, evals = futures[:len(win.ends)], futures[len(win.ends):]
            self.live = futures + [f for _, f in book.pending]
            for epoch, fut in zip(win.evals, evals):
                fut.add_done_callback(lambda f, e=epoch: book.arrived.setdefault(
                    e, time.perf_counter()))
            if book.drain():                        # early stopping: nothing after its epoch
                self.client.cancel(futures)
                break
            if done is not None:            # its epochs are recorded: safe to resume from
                checkpoints.save(dataclasses.replace(done, best=watch.best_state))
            book.pending = list(zip(win.evals, evals))
            state = win.join(self.client.gather(ends))   # the one wait per window
            done = Checkpoint(window.stop, window.stop // p.schedule.steps_per_epoch, state)
            del ends
            if stop.requested and window.stop < len(p.schedule):   # no window is in flight
                if book.drain():
                    break
                checkpoints.save(dataclasses.replace(done, best=watch.best_state))
                _stop_here(stop, p, window.stop, checkpoints)
        else:
            if not book.drain() and done is not None:
                checkpoints.save(dataclasses.replace(done, best=watch.best_state))
        seconds = time.perf_counter() - book.began
        last = book.last_state if watch.stopped else state
        final = _chosen(watch, last)
        result = None
        if test is not None:
            result = self._test(final, test, placement)
        moved = metrics.transfers(self.client, self.run_id)
        trained = book.steps_done(done)
        threads = [i.get("nthreads", 1) for i in workers(self.client).values()]
        return Outcome(book.rows, final, last, self.normalization, result, len(threads),
                       seconds, book.began - t0, trained - start.step,
                       p.schedule.samples(start.step, trained),
                       metrics.task_times(self.client, self.run_id) or {},
                       metrics.worker_peak_rss_mb(self.client),
                       {"predicted": self.predicted_bytes, "measured": moved["bytes"],
                        "transfers": moved["transfers"],
                        "predicted_transfers": self.predicted_transfers}, self.split(),
                       moved_summary(self.moved),
                       {"tasks": self.step_tasks, "fused": self.fused, "threads": sum(threads)})


def moved_summary(moved: list[tuple[int, str, str, int]]) -> dict[str, Any]:
    """``summary.json``'s account of the partitions that moved between workers."""
    if not moved:
        return {}
    return {"partitions": len(moved), "bytes": sum(b for *_, b in moved),
            "why": "balance: a worker held more than its share of the rows (or left)",
            "moves": [{"partition": i, "from": a, "to": b, "bytes": n} for i, a, b, n in moved]}


def moved_line(moved: list[tuple[int, str, str, int]], sizes: tuple[int, ...]) -> str:
    """The console line saying what moved, how much, and why."""
    froms = {a for _, a, _, _ in moved}
    return (f"moved {len(moved)} partition{'s' if len(moved) > 1 else ''} "
            f"({sum(b for *_, b in moved) / 1e6:,.1f} MB) off "
            f"{', '.join(sorted(froms))} to balance the workers: "
            f"{sum(sizes[i] for i, *_ in moved):,} of {sum(sizes):,} training rows")


def _located(held: Any, root: str) -> dict[Any, str]:
    """Where held-out data sits: on the root, or each part beside its partition."""
    if isinstance(held, list):
        return {f.key: w for f, w in held}
    return {held.key: root} if held is not None else {}


@dataclass
class _Book:
    """The driver's book of a Dask run: evaluations in flight and when they arrived, the
    epoch rows recorded, and what early stopping decided."""

    plan: Plan
    recorder: Recorder
    watch: Watch
    first: int                                  # the step this engine started at
    rows: list[dict[str, Any]]
    pending: list[tuple[int, Future]] = field(default_factory=list)
    arrived: dict[int, float] = field(default_factory=dict)     # epoch -> its evaluation's
    began: float = field(default_factory=time.perf_counter)
    last_state: TrainState | None = None        # the newest recorded epoch's (if kept)

    def drain(self) -> bool:
        """Turn finished evaluations into epoch rows, in epoch order; True once early
        stopping has stopped the run (no row after its epoch is recorded)."""
        pending, self.pending = self.pending, []
        for epoch, fut in pending:
            if self.watch.stopped:
                break
            ev = fut.result()
            end = self.arrived.get(epoch) or time.perf_counter()
            row = _epoch_row(self.plan, ev, end - self.arrived.get(epoch - 1, self.began),
                             self.first)
            self.rows.append(row)
            self.recorder.epoch(row)
            self.last_state = ev.get("state")
            self.watch.see(row, self.last_state)
        return self.watch.stopped is not None

    def steps_done(self, done: Checkpoint | None) -> int:
        """Steps trained: to the end of the epoch early stopping stopped after, else to the
        last window's end."""
        if self.watch.stopped is not None:
            return self.watch.stopped * self.plan.schedule.steps_per_epoch
        return done.step if done is not None else self.first
