"""Tuning a cluster for short, dependent tasks: control messages without batching delays,
an executor that runs tiny tasks in the worker's event loop, allocator settings that
keep freed memory for the next step, and a worker's event loop woken less often.

distributed batches control messages in ``BatchedSend`` with hard-coded
intervals (scheduler -> worker 5 ms, worker -> scheduler 2 ms, scheduler ->
client 2 ms, client -> scheduler 10 ms).  A chain of small dependent tasks - a
training step - pays up to one interval per hop.  There is no config key, so
dtrain sets the ``interval`` attribute of those streams, through
:mod:`dtrain.core.internals`, which changes nothing where the attribute is
missing.

A worker's event loop also wakes on its own: its sampling profiler every
10 ms while a task runs, its tick every 20 ms.  Each wake-up takes the GIL
from the task thread running a window, which then waits for the loop's
thread to be given a core again: on a machine whose cores are all busy
(P3 on 4 worker processes on 2 cores) a step took 3.5 ms with distributed's
periods and 2.8 ms with the profiler at 100 ms and the tick at 250 ms
(:data:`QUIET_MS`).  The profile is still there, at 10 samples a second; the
tick still says when the loop was blocked (after 3 s).

On a LocalCluster the nannies live in the driver's process, beside the scheduler, and
each wakes on its own too: its tick every 20 ms, its memory check every 100 ms, its
system monitor (``psutil``) every 500 ms, its tick cycle every second and its counters'
shift every 5 s.  At 16 worker processes, on distributed's periods, they are most of the
driver's CPU in steady state, growing with the workers (:data:`QUIET_NANNY_MS`).  A
nanny's system monitor samples the process it lives in, the driver, which the scheduler's
own monitor samples already: each nanny's comes once a minute (each lists the driver's
file descriptors, a few per worker).  A nanny's tick there times the driver's event loop, which the
scheduler's own tick times already: each nanny's comes once a minute, and so do the tick
cycle and the counters' shift, which only summarise those ticks (at 32 workers on
distributed's periods, 38 wake-ups a second: a fifth of an idle head's CPU).

The head pays for the cluster's heartbeats too: distributed has each of 11 to 49 workers
send one a second, and the scheduler reads, answers and files each (at 32 workers on a
LocalCluster, a third of an idle head's CPU).  A run's scheduler asks for at
most :data:`HEARTBEATS_PER_S` a second in all (32 workers: one each every 4 s; each at
least every :data:`MAX_HEARTBEAT_S`, and five times within the scheduler's ``worker-ttl``,
5 minutes unless set), and its own tick comes at :data:`QUIET_MS`'s period, as the
workers' do.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import Executor
from concurrent.futures import Future as ConcurrentFuture

import dask
from distributed import Client, NannyPlugin, SchedulerPlugin, WorkerPlugin

from dtrain.core import internals
from dtrain.core.allocator import ALLOCATOR_ENV, keep_freed_memory
from dtrain.core.broadcast import on_workers, register


INLINE = "dtrain-inline"     # the executor that runs a task in the worker's event loop
QUIET_MS = {"profile": 100.0, "tick": 250.0}    # a worker's periodic callbacks slowed to
                                                # these periods (distributed's: 10, 20 ms)
# a nanny's periodic callbacks slowed to these periods (distributed's: 20, 100, 500, 1,000
# and 5,000 ms)
QUIET_NANNY_MS = {"tick": 60000.0, "memory_monitor": 2000.0, "monitor": 60000.0,
                  "ticks": 60000.0, "shift_counters": 60000.0}
HEARTBEATS_PER_S = 8.0      # the workers' heartbeats the scheduler asks for, a second in all
MAX_HEARTBEAT_S = 10.0      # ... each worker's at least this often


class _Inline(Executor):
    """Runs each task at once, in the submitting thread (the worker's event loop): for tasks
    far shorter than a thread handoff, such as the reduce and update of a small model.
    The task sees its worker (``get_worker``) as in a pool thread."""

    def __init__(self, worker, current):
        self.worker, self.current = worker, current

    def submit(self, fn, /, *args, **kwargs) -> ConcurrentFuture:
        done: ConcurrentFuture = ConcurrentFuture()
        token = self.current.set(self.worker)
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            done.set_exception(exc)
        finally:
            self.current.reset(token)
        return done


def allocator_env() -> contextlib.AbstractContextManager:
    """Dask config under which nannies start workers with
    :data:`~dtrain.core.allocator.ALLOCATOR_ENV`.

    Returns
    -------
    A ``dask.config.set`` context: clusters created inside it (their nannies read
    ``distributed.nanny.pre-spawn-environ`` when made) start workers with dtrain's
    allocator settings; variables already in this process's environment win.
    """
    key = "distributed.nanny.pre-spawn-environ"
    return dask.config.set({key: {**dask.config.get(key, {}), **ALLOCATOR_ENV}})


class LowLatencyWorker(WorkerPlugin):
    """Worker -> scheduler messages without batching delay, the inline executor, allocator
    thresholds that keep freed memory, and the profiler and tick at :data:`QUIET_MS`
    (reapplied to joining and restarted workers)."""

    name = "dtrain-low-latency-worker"
    idempotent = True

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    def setup(self, worker) -> None:
        internals.set_batch_interval(internals.worker_stream(worker), self.seconds)
        current = internals.worker_context()          # what get_worker reads
        if current is not None:
            internals.add_executor(worker, INLINE, _Inline(worker, current))
        for name, ms in QUIET_MS.items():
            internals.slow_callback(worker, name, ms)
        keep_freed_memory()


class QuietNanny(NannyPlugin):
    """A nanny's periodic callbacks at :data:`QUIET_NANNY_MS`: a worker process is still
    watched, but a driver beside 32 nannies is not woken 2,000 times a second."""

    name = "dtrain-quiet-nanny"
    idempotent = True

    def setup(self, nanny) -> None:
        for name, ms in QUIET_NANNY_MS.items():
            internals.slow_callback(nanny, name, ms)


class LowLatencyScheduler(SchedulerPlugin):
    """Scheduler -> worker messages without batching delay, for workers present and to come;
    the scheduler's tick at :data:`QUIET_MS`, and at most :data:`HEARTBEATS_PER_S` worker
    heartbeats a second."""

    name = "dtrain-low-latency-scheduler"
    idempotent = True

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    async def start(self, scheduler) -> None:
        for stream in internals.scheduler_streams(scheduler, "workers").values():
            internals.set_batch_interval(stream, self.seconds)
        internals.slow_callback(scheduler, "tick", QUIET_MS["tick"])
        internals.fewer_heartbeats(scheduler, HEARTBEATS_PER_S, MAX_HEARTBEAT_S)

    def add_worker(self, scheduler, worker: str) -> None:
        internals.set_batch_interval(
            internals.scheduler_streams(scheduler, "workers").get(worker), self.seconds)


def _tune_client_stream(dask_scheduler, client: str, seconds: float) -> bool:
    return internals.set_batch_interval(
        internals.scheduler_streams(dask_scheduler, "clients").get(client), seconds)


def low_latency(client: Client, seconds: float = 0.0) -> bool:
    """Lower the batching interval of every control stream of ``client``'s cluster.

    Returns False (and changes nothing further) where this version of
    distributed does not have the streams dtrain knows.
    """
    if not internals.set_batch_interval(internals.client_stream(client), seconds):
        return False
    register(client, LowLatencyScheduler(seconds))
    register(client, LowLatencyWorker(seconds))
    return bool(client.run_on_scheduler(_tune_client_stream, client=client.id, seconds=seconds))


def _has_inline(dask_worker) -> bool:
    return internals.has_executor(dask_worker, INLINE)


def inline_executor(client: Client) -> bool:
    """Whether every worker has the inline executor (see :class:`LowLatencyWorker`), so
    tasks may be annotated with ``executor=INLINE``."""
    found = on_workers(client, _has_inline)
    return bool(found) and all(found.values())


def _periods(dask_worker) -> dict[str, float | None]:
    return {name: internals.callback_ms(dask_worker, name) for name in QUIET_MS}


def callback_periods(client: Client) -> dict[str, list[float | None]]:
    """The periods in ms of each worker's callbacks that :data:`QUIET_MS` names, by name,
    sorted over workers (for tests and diagnostics)."""
    found = client.run(_periods).values()
    return {name: sorted({p[name] for p in found}, key=lambda v: (v is None, v or 0.0))
            for name in QUIET_MS}


def stream_intervals(client: Client) -> dict[str, float | None]:
    """The batching intervals in force now (for tests and diagnostics)."""
    workers = client.run(lambda dask_worker: internals.batch_interval(
        internals.worker_stream(dask_worker)))
    schedulers = client.run_on_scheduler(lambda dask_scheduler: {
        f"to-{to}": sorted({internals.batch_interval(s) for s in
                            internals.scheduler_streams(dask_scheduler, to).values()})
        for to in ("workers", "clients")})
    return {"client": internals.batch_interval(internals.client_stream(client)),
            "workers": sorted(set(workers.values())), **schedulers}
