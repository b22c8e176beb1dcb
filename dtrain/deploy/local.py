"""An embedded LocalCluster on this machine: CPU worker processes (as ``cluster.layout`` says),
or one worker per GPU.

It listens on 127.0.0.1 only: the scheduler, the nannies and the workers (and the workers'
own HTTP servers, which follow their address), unless ``cluster.interface`` names a network
interface; the scheduler's HTTP server (the dashboard, or without one ``/health`` and
``/metrics``) where :func:`~dtrain.deploy.options.http_address` says.  Given a
``distributed.Security`` (:func:`~dtrain.deploy.options.security_for`: the run's own
certificate, as ``connect`` gives it), the scheduler, nannies and workers speak TLS only and
refuse any comm without that certificate; the worker processes get it from their nanny
through the pipe that starts them, never from a file.

Its worker processes never see a Ctrl-C (a terminal sends it to the whole process group;
the driver stops the run and closes them), from their first instant, restarted ones too
(:func:`_deaf_to_ctrl_c`); a worker process that dies while the cluster starts (a SIGKILL, a
node's OOM killer) costs a new start, not the run (:func:`_started`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker
from typing import TypeVar

from distributed import LocalCluster, Nanny, Scheduler, Security, SpecCluster, WorkerPlugin

from dtrain.core.arrays import gpu_count
from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy.devices import GPU
from dtrain.deploy.layout import Shape, crowded_core, local_shape, own_cpus, pin_cpus
from dtrain.deploy.options import LOOPBACK, http_address
from dtrain.deploy.tuning import allocator_env


START_TRIES = 3                 # starts of a cluster whose worker process died as it started

C = TypeVar("C", LocalCluster, SpecCluster)


@contextlib.contextmanager
def _deaf_to_ctrl_c() -> Iterator[None]:
    """While a cluster starts: SIGINT blocked in this thread, so that the threads the
    cluster starts (its event loop, which starts the worker processes, and starts them again
    when one dies) and the processes they start inherit it blocked, and never see a Ctrl-C.
    One that comes meanwhile waits, and reaches this process's handler once it is
    unblocked.  multiprocessing's resource tracker is started first (:func:`_quiet_tracker`):
    the thread that starts it unblocks SIGINT behind it (CPython's
    ``resource_tracker.ensure_running``), and would otherwise be the thread that starts the
    first worker process."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    _quiet_tracker()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


_tracker_started = False


def _quiet_tracker() -> None:
    """Start multiprocessing's resource tracker, once per process, its stderr the null
    device.  The nannies' queues and locks register their semaphores with it; a driver
    killed without closing them (SIGKILL, the OOM killer) leaves it to unlink them and to
    say so on the terminal, after the run has gone, in a warning of "leaked semaphore
    objects" and at times a traceback of its own: noise about a process nobody can act on
    any more.  (A tracker already running, started by the user's code, keeps its stderr.)"""
    global _tracker_started
    if _tracker_started:
        return
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)                # the tracker's stderr is this process's fd 2
        resource_tracker.ensure_running()
        _tracker_started = True
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _died_starting(exc: BaseException) -> bool:
    """Whether a cluster's start failed because a worker process died as it started
    (distributed: "Nanny failed to start worker process")."""
    while exc is not None:
        if isinstance(exc, RuntimeError) and "failed to start worker process" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _started(make: Callable[[], C]) -> C:
    """``make()``, the cluster, started again (at most :data:`START_TRIES` times in all) if
    a worker process died as it started; a cluster that does not start is one line."""
    for tries in range(1, START_TRIES + 1):
        try:
            with _deaf_to_ctrl_c(), allocator_env():
                return make()
        except RuntimeError as exc:     # the failed cluster closed itself
            if not _died_starting(exc):
                raise
            if tries == START_TRIES:
                raise UserError(f"the LocalCluster did not start: a worker process died as "
                                f"it started, {tries} times; see whether the machine has the "
                                f"memory for cluster.workers") from None
    raise AssertionError("unreachable")


def binding(cfg: ClusterConfig) -> dict[str, str]:
    """Where the scheduler and the workers listen: ``cluster.interface``'s address if it
    names one, else loopback."""
    return {"interface": cfg.interface} if cfg.interface else {"host": LOOPBACK}


def local_cluster(cfg: ClusterConfig, security: Security | None = None,
                  shape: Shape | None = None) -> LocalCluster:
    """Worker processes on this machine: ``shape``, or what ``cfg`` says
    (:func:`~dtrain.deploy.layout.local_shape`)."""
    shape = shape or local_shape(cfg)
    dash = cfg.dashboard_address
    return _started(lambda: LocalCluster(
        n_workers=shape.workers, threads_per_worker=shape.threads, processes=True,
        silence_logs=logging.ERROR, security=security, **binding(cfg),
        protocol="tls://" if security else "tcp://",
        dashboard_address=http_address(dash) if dash else None,
        # without a dashboard the scheduler still serves /health and /metrics: on a free
        # port of 127.0.0.1, not all interfaces
        scheduler_kwargs={"dashboard_address": http_address(dash)}))


class PinCrowded(WorkerPlugin):
    """On an embedded cluster of more one-thread CPU workers than the machine's cores: worker
    ``i`` (its name) runs on one core, consecutive workers together
    (:func:`~dtrain.deploy.layout.crowded_core`, as MPI worker ranks are pinned); restarted
    workers too.  ``cores`` are the driver's: a worker's own affinity is its core once
    pinned."""

    name = "dtrain-pin-crowded"
    idempotent = True

    def __init__(self, workers: int, cores: list[int]):
        self.workers, self.cores = workers, cores

    def setup(self, worker) -> None:
        i = worker.name
        core = crowded_core(i, self.workers, self.cores) if isinstance(i, int) else None
        if core is not None:
            pin_cpus(frozenset({core}))


def crowded(shape: Shape) -> PinCrowded | None:
    """The plugin that pins a LocalCluster's workers of ``shape``, where they outnumber this
    machine's cores and have one thread each (None otherwise)."""
    cores = sorted(own_cpus())
    if shape.threads != 1 or crowded_core(0, shape.workers, cores) is None:
        return None
    return PinCrowded(shape.workers, cores)


def local_gpu_cluster(cfg: ClusterConfig, gpus: int, security: Security | None = None,
                      shape: Shape | None = None) -> SpecCluster:
    """One worker per visible GPU (each sees only its own device and advertises a ``GPU``
    resource; ``cluster.threads_per_worker`` threads, or 1), plus, with ``device = "auto"``,
    CPU workers of ``shape`` up to its worker count."""
    shape = shape or local_shape(cfg)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    found = gpu_count()
    if gpus > len(ids) or (found and gpus > found):
        raise UserError(f"{gpus} GPU worker(s) asked for, but this machine shows "
                        f"{min(len(ids), found or len(ids))} GPU(s) (CUDA_VISIBLE_DEVICES="
                        f"{visible if visible is not None else 'unset'}): one worker per GPU; "
                        f"ask for at most that many")
    cpus = max(0, shape.workers - gpus) if cfg.device == "auto" else 0
    listen = {**binding(cfg), **({"security": security, "protocol": "tls://"} if security else {})}
    workers = {i: {"cls": Nanny, "options": {
        "name": i, "nthreads": (cfg.threads_per_worker or 1) if i < gpus else shape.threads,
        "silence_logs": logging.ERROR, **listen,
        **({"resources": {GPU: 1}, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}}
           if i < gpus else {})}} for i in range(gpus + cpus)}
    scheduler = {"cls": Scheduler, "options": {
        "dashboard": bool(cfg.dashboard_address), **listen,
        "dashboard_address": http_address(cfg.dashboard_address)}}
    return _started(lambda: SpecCluster(workers=workers, scheduler=scheduler,
                                        silence_logs=logging.ERROR, security=security))
