"""MPI deployment: ``mpirun -n N python -m dtrain --scheduler-rank R``.

Rank ``R`` is the *head*: it checks the run, runs the Dask scheduler and the
training driver.  The other ranks are the *worker ranks*.  With
``cluster.layout = "hybrid"`` (the default) the first worker rank of each node
(found with an MPI shared-memory split) is one Dask worker, named by its rank,
whose threads are the node's cores, and the node's other worker ranks start
none (GPU ranks are one worker each; more ranks serve where a strategy needs
more workers than there are nodes); with ``"flat"`` every worker rank is a
single-thread worker (:mod:`dtrain.deploy.layout`).  The ranks speak MPI only
around the cluster's life, in three broadcasts from the head and one report to
it:

1. **go or stop.**  The head parses the command line, loads the config and
   plans the run (data files, layer sizes, ranks needed, a resumable run
   directory) before anything starts, then sends either the config and the
   run's TLS certificate, or an exit code.  On a mistake only the head prints
   its one line.
2. **GPUs and nodes.**  Each worker rank takes its GPU (if the config asks for
   GPUs) and reports what it has, its node and its cores; with
   ``cluster.device = "gpu"`` and no worker rank that can compute on a GPU,
   the head stops the job here, before the cluster starts, naming what each
   rank lacks.
3. **address and roles.**  The scheduler's address and which worker ranks
   start a Dask worker with how many threads, or None if the scheduler could
   not start (an exit code if the GPU check stopped the job).
4. **exit code.**  Sent after the head has closed the workers and then the
   scheduler, so a successful run ends with a clean log on every rank.

Failures that leave no orderly way out end the job with ``MPI_Abort``: an
exception in the driver (its traceback printed once, by the head), a worker
rank that leaves the run early, or a shutdown that misses its deadline.
Waiting ranks sleep between polls instead of spinning in MPI calls.
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
from distributed import Client, Scheduler, Worker
from distributed.diagnostics.plugin import SchedulerPlugin

from dtrain.core import internals
from dtrain.core.config import ClusterConfig, Config
from dtrain.core.errors import EXIT_INTERRUPTED, Diverged, Stopped, UserError, exit_code
from dtrain.deploy import mpiwire, p2p
from dtrain.deploy.devices import GPU
from dtrain.deploy.layout import Role, assign, describe, one_blas_thread, pin_cpus, rank_place
from dtrain.deploy.logs import CLOSING_OP, CutByClose, quiet_logs
from dtrain.deploy.options import (NO_DASHBOARD, dashboard_link_config, http_address,
                                   security_for, started_by_dtrain)
from dtrain.deploy.signals import ignore_stop_signals
from dtrain.deploy.rankgpus import gpu_problem, gpu_report, local_worker_index, pin_gpu
from dtrain.deploy.tuning import keep_freed_memory
from dtrain.deploy.workers import wait_for_workers

POLL_S = 0.01            # how often a waiting rank looks for the head's next message
SHUTDOWN_S = 10.0        # how long an orderly shutdown may take before MPI_Abort
ABORT_GRACE_S = 0.2      # lets mpiexec pass on the last words before MPI_Abort kills the ranks



@dataclass(frozen=True)
class Job:
    """What the head runs: a checked ``config``, ``run(client)`` that trains (or resumes) on
    the cluster, the MPI ranks the run needs (``ranks``, the head included; ``ranks_why``
    says who they are), and the leaves (shards or slices) it computes, which bound a
    worker's useful threads (0: unknown)."""

    config: Config
    run: Callable[[Client], Any]
    ranks: int
    ranks_why: str
    leaves: int = 0


Prepare = Callable[[], Job]     # parses and checks everything on the head, before any start


def world_size() -> int:
    """Ranks in this MPI job."""
    return _comm().Get_size()


def _comm() -> Any:
    try:
        from mpi4py import MPI
    except ImportError:
        raise UserError("--scheduler-rank runs under MPI and needs mpi4py; install it with "
                        "pip install 'dtrain[mpi]' (or see docs/cluster.md, 'On a cluster')") from None
    return MPI.COMM_WORLD


def main(rank_text: str, prepare: Prepare) -> int:
    """Run this MPI rank's part of the job and return its exit code.

    Parameters
    ----------
    rank_text
        The ``--scheduler-rank`` value as typed: the rank of the head.
    prepare
        Called on the head only: parses the command line, loads and plans
        the run, and returns the :class:`Job`.  It raises
        :class:`~dtrain.core.errors.UserError` for bad input.

    Raises
    ------
    UserError
        On the head (or on rank 0 if the head rank itself is invalid) for a
        mistake in the input; the other ranks return the exit code silently.
    """
    comm = _comm()
    quiet_logs()
    rank, size = comm.Get_rank(), comm.Get_size()
    head = _head_rank(rank_text, size, quiet=rank != 0)
    if head is None:
        return 2
    mpiwire.install(comm)       # (collective: every rank, before anything can fail apart)
    is_head = rank == head
    is_worker = not is_head
    if is_worker:
        return _worker(comm, rank, head)
    sys.stdout.reconfigure(line_buffering=True)   # epoch lines reach the job's log as they come
    return _head(comm, size, prepare)


def _head_rank(text: str, size: int, quiet: bool) -> int | None:
    """The head's rank from ``--scheduler-rank``; every rank agrees, rank 0 reports a bad one."""
    try:
        head = int(text)
    except ValueError:
        head = -1
    if 0 <= head < size:
        return head
    if quiet:
        return None
    given = f"--scheduler-rank {text}" if text else "--scheduler-rank needs a value"
    raise UserError(f"{given}: the head's rank must be one of this job's ranks, 0 to "
                    f"{size - 1} (mpirun started {size})")


def check_ranks(job: Job, size: int) -> None:
    """Raise a UserError naming both numbers when ``size`` ranks are too few."""
    if size < job.ranks:
        raise UserError(f"graph.strategy = '{job.config.graph.strategy}' needs {job.ranks} MPI "
                        f"ranks ({job.ranks_why}), found {size}; start it with mpirun -n "
                        f"{job.ranks} or more")


# --- messages between ranks --------------------------------------------------------------

@dataclass(frozen=True)
class _Go:
    config: Config
    security: Any           # distributed.Security, or None for plain TCP


@dataclass(frozen=True)
class _Stop:
    code: int


@dataclass(frozen=True)
class _Start:
    address: str
    roles: dict[int, Role]  # worker rank -> its Role (threads 0: it starts no Dask worker)


def _arrive(comm: Any, late: str) -> None:
    """Return once every rank is here; waiting ranks sleep between polls.

    With ``late``, abort the job with that message if the others take over
    :data:`SHUTDOWN_S` seconds to arrive.
    """
    deadline = time.monotonic() + SHUTDOWN_S
    request = comm.Ibarrier()
    while not request.Test():
        if late and time.monotonic() > deadline:
            _abort(comm, f"{late} within {SHUTDOWN_S:g} s", 1)
        time.sleep(POLL_S)


def _bcast(comm: Any, obj: Any, root: int, late: str = "") -> Any:
    """``comm.bcast``, entered only once every rank is there (see :func:`_arrive`)."""
    _arrive(comm, late)
    return comm.bcast(obj, root=root)


def _gather(comm: Any, obj: Any, root: int) -> list[Any] | None:
    """``comm.gather``, entered only once every rank is there (see :func:`_arrive`)."""
    _arrive(comm, "")
    return comm.gather(obj, root=root)


def _abort(comm: Any, message: str | None, code: int) -> None:
    """Print ``message`` (if any), then end every rank of the job."""
    if message:
        print(f"dtrain: error: {message}; ending all MPI ranks", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)    # the launcher forwards output asynchronously
    comm.Abort(code)


def _exit_code(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):       # --help, or argparse leaving on its own
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return exit_code(exc) if isinstance(exc, (UserError, Diverged, Stopped)) else 1


# --- the head ----------------------------------------------------------------------------

def _head(comm: Any, size: int, prepare: Prepare) -> int:
    rank = comm.Get_rank()
    try:
        job = prepare()            # the data and the model sizes, before anything starts
        check_ranks(job, size)
        config = job.config
        security = security_for(config.cluster)
    except BaseException as exc:
        _bcast(comm, _Stop(_exit_code(exc)), rank)
        raise
    _bcast(comm, _Go(config, security), rank)
    local_worker_index(comm, is_worker=False)
    rank_place(comm, is_worker=False, gpu=False)
    reports = [r for r in _gather(comm, None, rank) if r is not None]
    gpus, places = [g for g, _ in reports], [p for _, p in reports]
    problem = gpu_problem(config, gpus, uses_workers=job.ranks > 1)
    if problem:
        _bcast(comm, _Stop(2), rank)            # in place of the address: nothing started
        raise UserError(problem)
    roles = assign(places, config.cluster, job.ranks - 1, job.leaves)
    scheduler = SchedulerThread(config.cluster, security, lambda msg: _abort(comm, msg, 1))
    try:
        address = scheduler.start()
    except BaseException:
        _bcast(comm, None, rank)
        raise
    _bcast(comm, _Start(address, roles), rank)
    print(f"scheduler: {address} on rank {rank}"
          f"{' (TLS, per-run certificate)' if security else ' (no TLS)'}, {size - 1} worker "
          f"rank(s)")
    if places:
        print(describe(roles, places, config.cluster.layout))
    serving = sum(1 for role in roles.values() if role.threads)
    error = _drive(comm, config, job.run, address, security, serving)
    code = exit_code(error) if error else 0
    if not scheduler.close_workers(SHUTDOWN_S):
        _abort(comm, f"the worker ranks did not close within {SHUTDOWN_S:g} s", 1)
    _bcast(comm, code, rank, late="not every worker rank ended")
    if not scheduler.close(SHUTDOWN_S):
        _abort(comm, f"the Dask scheduler did not close within {SHUTDOWN_S:g} s", code or 1)
    if error:
        raise error
    return code


def _drive(comm: Any, config: Config, job: Callable[[Client], Any], address: str,
           security: Any, workers: int) -> UserError | Diverged | Stopped | None:
    """Train as the driver; return the user error, divergence or signal that stopped it, or
    abort on any other exception."""
    try:
        with dask.config.set(dashboard_link_config(config.cluster.dashboard_address)), \
                Client(address, security=security, timeout=config.cluster.timeout) as client:
            if workers:    # none with one rank (the serial strategy)
                wait_for_workers(client, workers, config.cluster.timeout)
            result = job(started_by_dtrain(client))
        print(f"run directory: {result.out}")
    except (UserError, Diverged, Stopped) as exc:
        return exc
    except KeyboardInterrupt:      # Ctrl-C before the training could stop itself
        _abort(comm, "interrupted", EXIT_INTERRUPTED)
    except BaseException:
        traceback.print_exc()
        _abort(comm, None, 1)
    return None


class _LostRank(SchedulerPlugin):
    """Ends the job when a worker rank leaves before the head closes the cluster."""

    name = "dtrain-lost-rank"

    def __init__(self, on_lost: Callable[[str], None]):
        self.on_lost = on_lost
        self.closing = False
        self.names: dict[str, Any] = {}

    def add_worker(self, scheduler: Scheduler, worker: str) -> None:
        self.names[worker] = scheduler.workers[worker].name

    def remove_worker(self, scheduler: Scheduler, worker: str, *, stimulus_id: str,
                      **kwargs: Any) -> None:
        if not self.closing:
            self.on_lost(f"MPI rank {self.names.get(worker, '?')} (Dask worker {worker}) left "
                         f"the run; a lost rank cannot rejoin")


class SchedulerThread:
    """The Dask scheduler on its own event loop, in a thread of the head rank.

    Parameters
    ----------
    cfg
        ``interface``, ``dashboard_address`` and ``timeout`` are used.
    security
        A :class:`distributed.Security` for TLS, or None for plain TCP.
    on_lost
        Called with a message if a worker leaves before :meth:`close_workers`.
    """

    def __init__(self, cfg: ClusterConfig, security: Any, on_lost: Callable[[str], None]):
        self.cfg, self.security = cfg, security
        self.plugin = _LostRank(on_lost)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),),
                                        name="dtrain-scheduler", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduler: Scheduler | None = None
        self._error: BaseException | None = None

    def start(self) -> str:
        """Start the scheduler and return its address."""
        self._thread.start()
        if not self._ready.wait(self.cfg.timeout):
            raise UserError(f"the Dask scheduler did not start within {self.cfg.timeout:g} s "
                            f"(cluster.timeout)")
        if self._error is not None:
            raise self._error
        return self._scheduler.address

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            dash = self.cfg.dashboard_address
            # a busy dashboard port: distributed takes another and says so in four lines; the
            # dashboard line the head prints gives the port it got
            warnings.filterwarnings("ignore", message="Port .* is already in use",
                                    category=UserWarning)
            self._scheduler = await Scheduler(
                protocol="tls" if self.security else "tcp", security=self.security,
                interface=self.cfg.interface or None, port=0, dashboard=bool(dash),
                # without a dashboard the scheduler still serves /health and /metrics: on
                # a free port of 127.0.0.1 (not 8787, which another run may hold)
                dashboard_address=http_address(dash), plugins=[self.plugin])
        except BaseException as exc:
            self._error = exc
            return
        finally:
            self._ready.set()
        await self._scheduler.finished()

    def _call(self, coroutine: Any, timeout: float) -> bool:
        """Run ``coroutine`` on the scheduler's loop; False if it took over ``timeout`` s."""
        done = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            done.result(timeout)
        except TimeoutError:
            return False
        return True

    async def _close_workers(self) -> None:
        s = self._scheduler
        self.plugin.closing = True
        # every worker hears that the job is closing before any closes (see dtrain.deploy.logs.CutByClose)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(s.broadcast(msg={"op": CLOSING_OP}, on_error="ignore"),
                                   SHUTDOWN_S / 4)
        for worker in list(s.workers):
            s.close_worker(worker)
        while s.workers:
            await asyncio.sleep(POLL_S)

    def close_workers(self, timeout: float) -> bool:
        """Ask every worker to close and wait until all have left; False on time-out."""
        return self._call(self._close_workers(), timeout)

    def close(self, timeout: float) -> bool:
        """Close the scheduler (after the worker ranks have ended); False on time-out."""
        if not self._call(self._scheduler.close(), timeout):
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()


# --- worker ranks ------------------------------------------------------------------------

def _worker(comm: Any, rank: int, head: int) -> int:
    ignore_stop_signals()            # mpiexec forwards Ctrl-C, SIGTERM and SIGUSR1 to every
    go = _bcast(comm, None, head)    # rank: the head stops the run and closes the workers
    if isinstance(go, _Stop):
        return go.code
    index = local_worker_index(comm, is_worker=True)
    report = gpu_report(go.config.cluster.device, rank, pin_gpu(go.config.cluster.device, index))
    place = rank_place(comm, is_worker=True, gpu=report.gpu is not None)
    _gather(comm, (report, place), head)
    gpu = report.gpu
    start = _bcast(comm, None, head)
    if isinstance(start, _Stop):
        return start.code
    if start is None:
        return 1
    role = start.roles[rank]
    if not role.threads:             # its node's cores are another rank's threads: wait, as
        return _bcast(comm, None, head)      # long as the run takes, for the exit code
    pin_cpus(role.cpus)
    if role.shared:
        p2p.sharing_a_core()
    one_blas_thread()                # the same bits as any other layout's workers
    keep_freed_memory()              # before the worker starts its task threads
    try:
        asyncio.run(_serve_worker(start.address, go.config.cluster, go.security, rank,
                                  gpu is not None, role.threads))
    except (OSError, TimeoutError) as exc:        # e.g. the scheduler is unreachable
        _abort(comm, f"MPI rank {rank}: the Dask worker stopped: {type(exc).__name__}: {exc}", 1)
    except KeyboardInterrupt:                     # the head reports it
        _abort(comm, None, EXIT_INTERRUPTED)
    except BaseException:
        traceback.print_exc()
        _abort(comm, None, 1)
    return _bcast(comm, None, head, late=f"the head (rank {head}) did not end the run")


async def _serve_worker(address: str, cfg: ClusterConfig, security: Any, rank: int,
                        gpu: bool, threads: int) -> None:
    """One Dask worker of ``threads`` threads named by its rank; a rank given a GPU
    advertises it."""
    async with Worker(address, name=rank, nthreads=threads, security=security,
                      interface=cfg.interface or None, death_timeout=cfg.timeout,
                      dashboard_address=NO_DASHBOARD,     # its /health, /metrics: loopback
                      resources={GPU: 1} if gpu else None) as worker:
        noise = CutByClose(worker).install()
        internals.add_worker_handler(worker, CLOSING_OP, noise.mark_closing)
        try:
            await worker.finished()
        finally:
            noise.remove()
