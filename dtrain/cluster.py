"""Getting a Dask cluster: an embedded LocalCluster, batch jobs, or a running scheduler.

(The MPI deployment, where the ranks are the cluster, is :mod:`dtrain.mpi`.)
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Executor
from concurrent.futures import Future as ConcurrentFuture

import dask
import distributed.worker
from distributed import (Client, LocalCluster, Nanny, Scheduler, SchedulerPlugin, Security,
                         SpecCluster, WorkerPlugin)

from dtrain import device
from dtrain.config import ClusterConfig
from dtrain.errors import UserError


@contextlib.contextmanager
def connect(cfg: ClusterConfig) -> Iterator[Client]:
    """A client on ``cfg.scheduler_address``, or on a LocalCluster of worker processes.

    Closes what it started on exit.  An unreachable scheduler is a
    :class:`~dtrain.errors.UserError` after ``cfg.timeout`` seconds.
    """
    if cfg.scheduler_address:
        try:
            client = Client(cfg.scheduler_address, timeout=cfg.timeout)
        except (OSError, TimeoutError) as exc:
            raise UserError(f"cannot reach the Dask scheduler at {cfg.scheduler_address} within "
                            f"{cfg.timeout:g} s ({type(exc).__name__}); check the address or start "
                            f"one with `dask scheduler`") from None
        with contextlib.closing(client):
            wait_for_workers(client, 1, cfg.timeout)
            yield client
        return
    if cfg.kind != "local":
        from dtrain import batch
        with batch.connect(cfg, security_for(cfg, deployed=True)) as client:
            yield client
        return
    security = security_for(cfg, deployed=False)
    gpus = device.gpu_count() if cfg.device != "cpu" else 0
    if cfg.device == "gpu":
        device.require_gpu("cluster.device = 'gpu'")
    cluster = local_gpu_cluster(cfg, gpus, security) if gpus else local_cluster(cfg, security)
    with cluster, Client(cluster, security=security) as client:
        yield client


def security_for(cfg: ClusterConfig, deployed: bool) -> Security | None:
    """A per-run TLS :class:`~distributed.Security` (self-signed, in memory), or None.

    ``cluster.tls = 'auto'`` means on for clusters that other users of the
    machines could reach (``deployed``: MPI, SLURM, PBS) and off for the
    LocalCluster, which listens on 127.0.0.1 only.
    """
    if cfg.tls == "off" or (cfg.tls == "auto" and not deployed):
        return None
    try:
        return Security.temporary()
    except ImportError:
        raise UserError("cluster.tls needs the 'cryptography' package for its per-run "
                        "certificate; pip install 'dtrain[mpi]', or set cluster.tls = 'off'"
                        ) from None


def local_cluster(cfg: ClusterConfig, security: Security | None = None) -> LocalCluster:
    """``cfg.workers`` worker processes on this machine."""
    # without a dashboard the scheduler still serves /health and /metrics: on any free port
    http = {} if cfg.dashboard_address else {"scheduler_kwargs": {"dashboard_address": ":0"}}
    with allocator_env():
        return LocalCluster(n_workers=cfg.workers, threads_per_worker=cfg.threads_per_worker,
                            processes=True, dashboard_address=cfg.dashboard_address or None,
                            silence_logs=logging.ERROR, security=security, **http)


def local_gpu_cluster(cfg: ClusterConfig, gpus: int,
                      security: Security | None = None) -> SpecCluster:
    """One worker per visible GPU (each sees only its own device and advertises a ``GPU``
    resource), plus, with ``device = "auto"``, CPU workers up to ``cfg.workers``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    cpus = max(0, cfg.workers - gpus) if cfg.device == "auto" else 0
    protocol = {"security": security, "protocol": "tls://"} if security else {}
    workers = {i: {"cls": Nanny, "options": {
        "name": i, "nthreads": cfg.threads_per_worker, "silence_logs": logging.ERROR, **protocol,
        **({"resources": {device.GPU: 1}, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}}
           if i < gpus else {})}} for i in range(gpus + cpus)}
    scheduler = {"cls": Scheduler, "options": {
        "dashboard": bool(cfg.dashboard_address), **protocol,
        "dashboard_address": cfg.dashboard_address or ":0"}}
    with allocator_env():
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                           security=security)


def wait_for_workers(client: Client, n: int, timeout: float) -> None:
    """Block until ``n`` workers are connected, or raise a UserError saying how many came."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError:
        found = len(scheduler_workers(client))
        raise UserError(f"needs {n} Dask worker(s), found {found} after {timeout:g} s; start more "
                        f"workers or lower the count") from None


def _natural(name: object) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def worker_addresses(client: Client) -> list[str]:
    """Addresses of the connected workers, ordered by worker name (0, 1, 2, ... for
    LocalCluster and dask-mpi ranks)."""
    return list(workers(client))


def scheduler_workers(client: Client) -> dict[str, dict]:
    """``{address: info}`` of the connected workers, asked of the scheduler now.

    Not ``client.scheduler_info()["workers"]``: that returns the client's cached
    identity, which a periodic refresh (``distributed.client.scheduler-info-interval``)
    overwrites with one that lists no workers, so it can come back empty while
    workers are connected.
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def workers(client: Client) -> dict[str, dict]:
    """``{address: info}`` of the connected workers, ordered by worker name."""
    info = scheduler_workers(client)
    return {a: info[a] for a in sorted(info, key=lambda a: _natural(info[a].get("name", a)))}


class _ReportedByDriver(logging.Filter):
    """Drop a worker's "Compute Failed" log for dtrain's own errors: the driver reports
    those once, as one line; any other exception is still logged."""

    OURS = ("Diverged(", "UserError(", "DataError(", "ConfigError(")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("Compute Failed") and len(args) > 3
                    and str(args[3]).startswith(self.OURS))


class QuietUserErrors(WorkerPlugin):
    """Installs :class:`_ReportedByDriver` on every worker, restarted ones included."""

    name = "dtrain-quiet-user-errors"
    idempotent = True

    def setup(self, worker) -> None:
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _ReportedByDriver) for f in log.filters):
            log.addFilter(_ReportedByDriver())


# --- control-message latency ------------------------------------------------------------------
#
# distributed batches control messages in ``BatchedSend`` with hard-coded intervals (scheduler ->
# worker 5 ms, worker -> scheduler 2 ms, scheduler -> client 2 ms, client -> scheduler 10 ms).
# A chain of small dependent tasks - a training step - pays up to one interval per hop.  There is
# no config key, so dtrain sets the ``interval`` attribute of those streams.  That is internal
# API: every access is guarded, and where the attribute is missing nothing is changed.

def _set_interval(stream: object, seconds: float) -> bool:
    if stream is None or not isinstance(getattr(stream, "interval", None), (int, float)):
        return False
    stream.interval = seconds
    return True


INLINE = "dtrain-inline"     # the executor that runs a task in the worker's event loop


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


# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, to hand freed memory back to the
# OS.  Setting it also pins glibc's mmap threshold at 128 KiB, so every larger array is a fresh
# mmap that page-faults on first touch: the update of a 0.8 M-parameter state takes 4.9 ms
# instead of 1.8.  A training step allocates the same few buffers again and again, so dtrain's
# workers keep freed memory, as a GPU framework's caching allocator does: arrays up to 512 MiB
# come from the heap, trimmed past 1 GiB free, and threads started from then on (the task
# threads) share the main heap, since a thread's own arena is capped at 64 MiB and maps anything
# larger afresh whatever the threshold.  The ceiling covers a full batch's activations (60k x
# 1024 float32 over 2 workers: 123 MB each): a forward-backward of 30k MNIST rows in a thread
# took 1.20-1.28 s with 2,000 page faults, 1.10-1.15 s with none.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8     # glibc's mallopt parameters
MMAP_THRESHOLD, TRIM_THRESHOLD, ARENA_MAX = 512 << 20, 1 << 30, 1


# The same settings as environment variables, which glibc reads when a process starts: how
# the nannies of dtrain's local clusters start their workers (Dask's own MALLOC_TRIM_THRESHOLD_
# is among the variables this replaces).
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
                 "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
                 "MALLOC_ARENA_MAX": str(ARENA_MAX)}


def allocator_env() -> contextlib.AbstractContextManager:
    """Dask config under which nannies start workers with :data:`ALLOCATOR_ENV`.

    Returns
    -------
    A ``dask.config.set`` context: clusters created inside it (their nannies read
    ``distributed.nanny.pre-spawn-environ`` when made) start workers with dtrain's
    allocator settings; variables already in this process's environment win.
    """
    key = "distributed.nanny.pre-spawn-environ"
    return dask.config.set({key: {**dask.config.get(key, {}), **ALLOCATOR_ENV}})


def keep_freed_memory() -> bool:
    """Set this process's glibc allocator parameters as above; False without glibc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(_M_ARENA_MAX, ARENA_MAX))


class LowLatencyWorker(WorkerPlugin):
    """Worker -> scheduler messages without batching delay, the inline executor, and
    allocator thresholds that keep freed memory (reapplied to joining and restarted workers)."""

    name = "dtrain-low-latency-worker"
    idempotent = True

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    def setup(self, worker) -> None:
        _set_interval(getattr(worker, "batched_stream", None), self.seconds)
        executors = getattr(worker, "executors", None)
        current = getattr(distributed.worker, "_worker_cvar", None)   # what get_worker reads
        if isinstance(executors, dict) and isinstance(current, contextvars.ContextVar):
            executors.setdefault(INLINE, _Inline(worker, current))
        keep_freed_memory()


class LowLatencyScheduler(SchedulerPlugin):
    """Scheduler -> worker messages without batching delay, for workers present and to come."""

    name = "dtrain-low-latency-scheduler"
    idempotent = True

    def __init__(self, seconds: float = 0.0):
        self.seconds = seconds

    async def start(self, scheduler) -> None:
        for stream in getattr(scheduler, "stream_comms", {}).values():
            _set_interval(stream, self.seconds)

    def add_worker(self, scheduler, worker: str) -> None:
        _set_interval(getattr(scheduler, "stream_comms", {}).get(worker), self.seconds)


def _tune_client_stream(dask_scheduler, client: str, seconds: float) -> bool:
    return _set_interval(getattr(dask_scheduler, "client_comms", {}).get(client), seconds)


def low_latency(client: Client, seconds: float = 0.0) -> bool:
    """Lower the batching interval of every control stream of ``client``'s cluster.

    Returns False (and changes nothing further) where this version of
    distributed does not have the streams dtrain knows.
    """
    if not _set_interval(getattr(client, "scheduler_comm", None), seconds):
        return False
    client.register_plugin(LowLatencyScheduler(seconds))
    client.register_plugin(LowLatencyWorker(seconds))
    return bool(client.run_on_scheduler(_tune_client_stream, client=client.id, seconds=seconds))


def _has_inline(dask_worker) -> bool:
    return INLINE in getattr(dask_worker, "executors", {})


def inline_executor(client: Client) -> bool:
    """Whether every worker has the inline executor (see :class:`LowLatencyWorker`), so
    tasks may be annotated with ``executor=INLINE``."""
    found = client.run(_has_inline)
    return bool(found) and all(found.values())


def stream_intervals(client: Client) -> dict[str, float | None]:
    """The batching intervals in force now (for tests and diagnostics)."""
    workers = client.run(lambda dask_worker: getattr(
        getattr(dask_worker, "batched_stream", None), "interval", None))
    schedulers = client.run_on_scheduler(lambda dask_scheduler: {
        "to-workers": sorted({getattr(s, "interval", None)
                              for s in dask_scheduler.stream_comms.values()}),
        "to-clients": sorted({getattr(s, "interval", None)
                              for s in dask_scheduler.client_comms.values()})})
    return {"client": getattr(client.scheduler_comm, "interval", None),
            "workers": sorted(set(workers.values())), **schedulers}


def dashboard_link_config(address: str) -> dict[str, str]:
    """Dask config that makes ``Client.dashboard_link`` name the host the dashboard listens on.

    The link is built from the scheduler's host, which for a deployed
    cluster is the machine's network address, while the dashboard binds to
    ``127.0.0.1`` unless told otherwise (``cluster.dashboard_address``).
    """
    host = address.rpartition(":")[0]
    if not host or host in ("0.0.0.0", "[::]", "::"):
        return {}
    return {"distributed.dashboard.link": "{scheme}://" + host + ":{port}/status"}
