"""A window's messages over MPI, where the workers are the ranks of dtrain's own MPI job.

Under ``mpirun ... --scheduler-rank R`` every worker is an MPI rank (a Dask worker in the
rank's own process), and the job's MPI is built for its fabric (InfiniBand, Slingshot,
Omni-Path), where the mesh's TCP would go over IPoIB or Ethernet.  With ``cluster.p2p = "mpi"`` a
mesh's connections are MPI point-to-point instead of sockets: each rank
duplicates ``COMM_WORLD`` once as the job starts (:func:`install`, collective, before the
cluster), and a window's :class:`Link` sends each message with a nonblocking send on that
communicator (a send never waits, as the mesh's) and reads with a matched probe, polled
(the task thread yields the core between polls and never blocks in MPI, so a peer's
abort or a timeout still ends its wait).  A participant that fails tells every peer
(:meth:`Wire.abort`), so they stop at their next read, as the mesh's closed sockets do.

Not the default: on one 2-core machine (MPICH, ``MPI_THREAD_MULTIPLE``, 4 worker ranks) the
mesh's Unix sockets were faster on P3 and no slower on P2 (``benchmarks/NOTES.md``).
A lost rank ends the whole job (MPI's rule, and :mod:`dtrain.deploy.mpi`'s); ``--resume``
finishes it with the same bytes.  Messages over MPI go as MPI carries them, without the
mesh's TLS: they never leave the job's own ranks.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from dtrain.deploy.wire import PeerLost

DATA, ABORT = 7, 8          # the duplicated communicator's tags: a message, an abort
SPIN_S = 0.002              # poll this long before sleeping between polls
NAP_S = 50e-6               # ... then this long between polls


class Wire:
    """This rank's duplicate of ``COMM_WORLD`` for windows' messages (a part of its
    :class:`~dtrain.deploy.runtime.Runtime`), and its world rank."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.early: dict[tuple[str, int, str], Any] = {}   # (mesh, world rank, tag) -> value
        self.aborted: dict[str, str] = {}                   # mesh -> why a peer failed
        self.sent: list[Any] = []                           # abort messages on their way
        self.lock = threading.Lock()

    def abort(self, mesh: str, peers: Sequence[int], why: str) -> None:
        """Tell the world ranks ``peers`` that this participant's window of ``mesh`` failed."""
        with self.lock:
            self.sent = [q for q in self.sent if not q.Test()]
            self.sent += [self.comm.isend((mesh, why), dest=p, tag=ABORT) for p in peers]

    def close(self) -> None:
        self.early.clear()


def install(comm: Any) -> Wire | None:
    """On every rank of dtrain's MPI job, as it starts (collective): the communicator its
    windows' messages go over, in this process's runtime; None where MPI gives fewer than
    ``MPI_THREAD_MULTIPLE`` (a window task's thread cannot call MPI beside the rank's)."""
    from mpi4py import MPI

    from dtrain.deploy import runtime

    dup = comm.Dup()
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return None
    return runtime.here().part("mpi-wire", lambda: Wire(dup))


def here() -> Wire | None:
    """This process's :class:`Wire`, if its rank installed one."""
    from dtrain.deploy import runtime

    return runtime.here().find("mpi-wire")


class Link:
    """One window's messages over MPI: :meth:`send` and :meth:`recv` by mesh rank (as the
    mesh's :class:`~dtrain.deploy.p2p.Link`); ``ranks[r]`` is mesh rank ``r``'s world rank."""

    def __init__(self, wire: Wire, mesh: str, ranks: Sequence[int], workers: Sequence[str],
                 timeout: float):
        self.wire, self.mesh, self.ranks = wire, mesh, tuple(ranks)
        self.workers, self.timeout = workers, timeout
        self.messages = self.bytes = 0
        self.pending: list[Any] = []

    def via(self) -> tuple[str, ...]:
        return ("mpi",)

    def send(self, ranks: Sequence[int], tag: str, value: Any) -> None:
        """Send ``value`` as ``tag`` to each mesh rank of ``ranks``; returns at once."""
        body = pickle.dumps((self.mesh, tag, value), protocol=5)
        for r in ranks:
            self.pending.append(self.wire.comm.Isend(body, dest=self.ranks[r], tag=DATA))
        self.messages += len(ranks)
        self.bytes += len(ranks) * (value.nbytes if isinstance(value, np.ndarray) else len(body))
        if len(self.pending) > 64:
            self.pending = [q for q in self.pending if not q.Test()]

    def recv(self, rank: int, tag: str) -> Any:
        """The value of message ``tag`` from mesh rank ``rank``, once it came (raises
        :class:`PeerLost` if a peer aborted or nothing came within the timeout)."""
        wire, src = self.wire, self.ranks[rank]
        early = wire.early
        found = early.pop((self.mesh, src, tag), _NONE)
        if found is not _NONE:
            return found
        from mpi4py import MPI

        comm = wire.comm
        status = MPI.Status()
        start = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        while True:
            msg = comm.Improbe(source=src, tag=DATA, status=status)
            if msg is not None:
                buf = bytearray(status.Get_count(MPI.BYTE))
                msg.Recv(buf)
                mesh, got, value = pickle.loads(buf)
                if mesh == self.mesh and got == tag:
                    return value
                if mesh == self.mesh:       # a later message (the next window's, say)
                    early[mesh, src, got] = value
                continue                    # (an older mesh's: that attempt is over)
            if comm.Iprobe(source=MPI.ANY_SOURCE, tag=ABORT, status=status):
                mesh, why = comm.recv(source=status.Get_source(), tag=ABORT)
                wire.aborted[mesh] = why
            if self.mesh in wire.aborted:
                raise PeerLost(f"a peer's window failed: {wire.aborted[self.mesh]}")
            if time.monotonic() > deadline:
                raise PeerLost(f"no message {tag!r} from rank {rank} within {self.timeout:g} s "
                               f"(worker {self.workers[rank]})", silent=self.workers[rank])
            if time.perf_counter() - start < SPIN_S:
                os.sched_yield()
            else:
                time.sleep(NAP_S)

    def finish(self) -> None:
        """Wait for this window's sends to be taken (the buffers are the senders')."""
        from mpi4py import MPI

        MPI.Request.Waitall(self.pending)
        self.pending = []


_NONE = object()
