"""How many Dask workers a deployment starts, and with how many threads: ``cluster.layout``.

* ``hybrid`` (the default): one worker process per machine (under MPI, per
  node; with ``--cluster slurm|pbs``, per batch job) with a Dask thread per
  core.  A node's shards share its memory and nothing crosses a process
  boundary inside it; a step costs the scheduler a task per node instead of a
  task per core.
* ``flat``: a single-thread worker process per core (under MPI, every worker
  rank is a worker; ranks that outnumber their node's cores are pinned, neighbours
  sharing a core).

``cluster.workers`` and ``cluster.threads_per_worker`` are 0 by default, which
means "as the layout says"; a value above 0 is used as given in either layout.
A worker never has more threads than shards to compute (``leaves``), and GPUs
keep one worker each.

Every worker's BLAS runs one thread (Dask's nannies start workers so, and MPI
worker ranks limit theirs with threadpoolctl): OpenBLAS's result bits depend on
its thread count (a 784-1024-10 forward-backward differs between 1 and 2
threads), and ``params.npz`` must not depend on the layout.
"""
from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dtrain.core.config import ClusterConfig


def machine_cores() -> int:
    """Cores this process may run on (its CPU affinity: a batch job's cpuset, a binding)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Shape:
    """Worker processes and the Dask threads of each."""

    workers: int
    threads: int


def _cap(threads: int, leaves: int, workers: int) -> int:
    """No more threads than a worker has leaves (shards or slices) to compute at once."""
    return min(threads, max(1, math.ceil(leaves / workers))) if leaves else threads


def local_shape(cfg: ClusterConfig, min_workers: int = 1, leaves: int = 0,
                cores: int | None = None) -> Shape:
    """The embedded LocalCluster's shape on a machine of ``cores`` cores (default: this one's).

    ``min_workers``: what the strategy needs (a parameter server 2); ``leaves``: shards
    (or model slices) the run computes, 0 if unknown.
    """
    cores = cores or machine_cores()
    need = max(1, min_workers)
    if cfg.layout == "hybrid":
        workers = cfg.workers or need
        threads = cfg.threads_per_worker or _cap(max(1, cores // workers), leaves, workers)
    else:
        workers = cfg.workers or max(need, min(cores, leaves or cores))
        threads = cfg.threads_per_worker or 1
    return Shape(workers, threads)


def job_shape(cfg: ClusterConfig, booked: int, min_workers: int = 1,
              leaves: int = 0) -> tuple[int, Shape]:
    """Batch jobs (``--cluster slurm|pbs``) of ``booked`` cores each: ``(jobs, shape of a
    job)``.  Hybrid: one worker per job with a thread per booked core; flat: one
    single-thread worker per booked core.  ``cluster.workers`` counts jobs."""
    booked = max(1, booked)
    if cfg.layout == "hybrid":
        per_job = 1
        threads = cfg.threads_per_worker or booked
    else:
        threads = cfg.threads_per_worker or 1
        per_job = max(1, booked // threads)
    jobs = cfg.workers or max(1, math.ceil(max(1, min_workers) / per_job))
    if not cfg.threads_per_worker:
        threads = _cap(threads, leaves, jobs * per_job)
    return jobs, Shape(per_job, threads)


# --- MPI: which worker ranks start a Dask worker ---------------------------------------------

@dataclass(frozen=True)
class RankPlace:
    """Where a worker rank runs: its node (named by the node's lowest worker rank), the cores
    it may use, and whether it took a GPU."""

    rank: int
    host: str
    node: int
    cpus: frozenset[int]
    gpu: bool = False


@dataclass(frozen=True)
class Role:
    """What a worker rank does: start a Dask worker of ``threads`` threads (0: none; its node's
    cores are another rank's threads), on ``cpus`` (empty: as it was started); ``shared``:
    its core is other worker ranks' too."""

    threads: int
    cpus: frozenset[int] = frozenset()
    shared: bool = False


def own_cpus() -> frozenset[int]:
    """The cores this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def rank_place(comm: Any, is_worker: bool, gpu: bool) -> RankPlace | None:
    """This rank's :class:`RankPlace` (None on the head).

    Collective: every rank of ``comm`` calls it.  The node is found with an MPI
    shared-memory split of the worker ranks.
    """
    from mpi4py import MPI
    rank = comm.Get_rank()
    workers = comm.Split(0 if is_worker else MPI.UNDEFINED, rank)
    if workers == MPI.COMM_NULL:
        return None
    try:
        node = workers.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            leader = node.bcast(rank, root=0)
        finally:
            node.Free()
    finally:
        workers.Free()
    return RankPlace(rank, socket.gethostname(), leader, own_cpus(), gpu)


def assign(places: Iterable[RankPlace], cfg: ClusterConfig, min_workers: int = 1,
           leaves: int = 0) -> dict[int, Role]:
    """Each worker rank's :class:`Role` (decided by the head).

    Flat: every rank is a worker of ``cluster.threads_per_worker`` (or 1) threads; where a
    node's one-thread CPU worker ranks outnumber its cores, each is pinned to one core
    (:func:`_crowded`).
    Hybrid: every rank with a GPU is a worker (one per GPU); of the others, the first
    rank of each node is a worker whose threads are the cores of the node's worker ranks
    (``cluster.threads_per_worker`` if set), and its CPU affinity widens to them; more
    ranks are workers, in rank order, while fewer than ``min_workers`` are.  A node's
    workers share its cores.
    """
    places = sorted(places, key=lambda p: p.rank)
    fixed = cfg.threads_per_worker
    if cfg.layout == "flat":
        cores = _crowded(places) if (fixed or 1) == 1 else {}
        return {p.rank: Role(fixed or 1, cores.get(p.rank, frozenset()), p.rank in cores)
                for p in places}
    roles = {p.rank: Role(fixed or 1) for p in places if p.gpu}
    nodes = _cpu_nodes(places)
    serving = {ranks[0].rank for ranks in nodes.values()}
    spare = [p.rank for ranks in nodes.values() for p in ranks[1:]]
    while len(serving) + len(roles) < min_workers and spare:
        serving.add(spare.pop(0))
    total = len(serving) + len(roles)
    for ranks in nodes.values():
        mine = [p for p in ranks if p.rank in serving]
        cores = _cores(ranks)
        for p in ranks:
            if p.rank not in serving:
                roles[p.rank] = Role(0)
                continue
            threads = fixed or _cap(max(1, len(cores) // len(mine)), leaves, total)
            roles[p.rank] = Role(threads, cores if len(mine) == 1 else frozenset())
    return roles


def _cpu_nodes(places: list[RankPlace]) -> dict[int, list[RankPlace]]:
    """The CPU (not GPU) worker ranks of each node, in rank order."""
    nodes: dict[int, list[RankPlace]] = {}
    for p in places:
        if not p.gpu:
            nodes.setdefault(p.node, []).append(p)
    return nodes


def _cores(ranks: list[RankPlace]) -> frozenset[int]:
    """The cores of a node's ranks (each rank's as it was started)."""
    return frozenset().union(*(p.cpus for p in ranks))


def _crowded(places: list[RankPlace]) -> dict[int, frozenset[int]]:
    """The core of each one-thread CPU worker rank on a node whose CPU worker ranks outnumber
    its cores: consecutive ranks in blocks, ``ranks // cores`` (or one more) to a core.

    Worker ranks are the workers' order, and a step's sum adds neighbours first (the tree
    over shards in blocks), so the ranks that share a core are those whose gradients meet
    first: they take turns on it, and the first message of the sum goes between two ranks
    of one core instead of waking a rank that the kernel keeps off both cores while two
    others compute (benchmarks/NOTES.md has the measurement).  Ranks with a core each (or
    more) are left as they were started (the MPI launcher's binding, if any)."""
    out: dict[int, frozenset[int]] = {}
    for ranks in _cpu_nodes(places).values():
        cores = sorted(_cores(ranks))
        for i, p in enumerate(ranks):
            core = crowded_core(i, len(ranks), cores)
            if core is not None:
                out[p.rank] = frozenset({core})
    return out


def crowded_core(i: int, workers: int, cores: list[int]) -> int | None:
    """The core of one-thread worker ``i`` of ``workers`` on a machine's ``cores`` where the
    workers outnumber them: consecutive workers in blocks (see :func:`_crowded`); None
    where each has a core."""
    if not 0 < len(cores) < workers or not 0 <= i < workers:
        return None
    return cores[i * len(cores) // workers]


def describe(roles: dict[int, Role], places: list[RankPlace], layout: str) -> str:
    """The head's one line about the layout: who is a worker, with how many threads, and
    which ranks start none."""
    workers = {r: role.threads for r, role in roles.items() if role.threads}
    idle = sorted(r for r, role in roles.items() if not role.threads)
    nodes = len({p.node for p in places})
    threads = sorted(set(workers.values()))
    per = f"{threads[0]} thread(s) each" if len(threads) == 1 else \
        "threads " + ", ".join(f"rank {r}: {t}" for r, t in sorted(workers.items()))
    line = (f"layout: {layout}, {len(workers)} Dask worker(s) on {nodes} node(s) "
            f"(rank(s) {_ranges(sorted(workers))}), {per}")
    shared = [role.cpus for role in roles.values() if role.shared]
    if shared:
        line += (f"; more worker ranks than cores: pinned {len(shared)} rank(s) to "
                 f"{len(set(shared))} core(s), neighbours together")
    if idle:
        line += (f"; rank(s) {_ranges(idle)} start no worker: their node's cores are the "
                 f"threads of its worker rank (cluster.layout = 'flat' makes every rank a "
                 f"worker)")
    return line


def _ranges(ranks: list[int]) -> str:
    """``1, 3-5, 8``."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def pin_cpus(cpus: frozenset[int]) -> None:
    """Let this process run on ``cpus`` (a node's cores left to it by idle ranks, or its
    core among ranks that outnumber the cores): every thread it has (an affinity is a
    thread's own; MPI and BLAS start theirs at import), and those it starts after."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):      # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


def one_blas_thread() -> bool:
    """Limit this process's BLAS to one thread (see the module docstring); False without
    threadpoolctl."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(limits=1)
    return True
