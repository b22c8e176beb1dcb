"""Worker to worker: the messages of a window that spans workers, without the scheduler.

A window whose tasks sit on several workers runs as one long task per worker
(:mod:`dtrain.taskgraph.span`), and the values that cross between workers
(a step's partial sums to their tree parent, the reduced sums back down) go
straight from one task to another over sockets those tasks hold open.  Dask's
P2P shuffle is the model: the peers find each other through distributed
(a run id, the addresses), and then no step's bytes pass through the scheduler
or an event loop (a hop through a worker's event loop costs about 1 ms here,
a plain socket between task threads 0.04 ms: ARCHITECTURE.md).  This module
knows buffers, ranks and a run id, nothing of training.

* **A mesh** is one attempt of a run on a fixed set of workers: a run id and a
  secret made on the driver (:func:`open_mesh`), a listening socket on each
  participant (:func:`listen`, run there through ``client.run``), closed when
  the run ends or its workers change (:func:`close_mesh`).  Workers that
  change make a new mesh, under a new run id: an old mesh's messages cannot
  reach it.
* **What listens.**  Each participant listens on its Dask worker's own host
  (127.0.0.1 on an embedded cluster), on a port the kernel picks, and (for
  peers of the same machine: the TCP stack costs them more than the bytes) on a
  Unix socket in a folder only its user can open, for as long as the mesh lasts
  (:data:`IDLE_S` at most without a window).  Where the cluster uses TLS, so do
  the TCP sockets, with the worker's own certificate and CA
  (``distributed.Security``).  Every
  connection, TLS or not, must prove that it knows the mesh's secret
  before a byte of a message is read (:mod:`dtrain.deploy.wire`, which also
  says what a message is): a stranger on a shared login node is refused, and
  so is a peer of another mesh.
* **Connections go one way**: rank ``a`` writes to rank ``b`` only on a
  connection ``a`` opened to ``b``'s listener, and reads only from
  connections others opened to it; a send never waits.  Every participant runs
  its tasks in one global order of the window's graph, so no wait can close a
  circle.
* **Faults.**  A peer whose process dies has its sockets closed by the
  kernel, a host that vanished is found by TCP keepalive within seconds, and no
  read waits longer than the window's ``timeout``.  Each raises :class:`PeerLost`
  in the waiting task, which shuts every connection of the mesh down as it
  fails, so that its peers stop too.  A task that runs on a worker other than
  the participant it was made for raises :class:`Misplaced`.  The engine runs
  the window again on a new mesh.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dtrain.core import broadcast, internals
from dtrain.deploy import mpiwire, runtime
from dtrain.deploy.wire import (SPIN_S, Broken, In, Out, PeerLost, Quiet, Refused, check,
                                encode, prove, shut, transport, tune)

HANDSHAKE_S = 10.0        # a connection proves itself within this, or is dropped
IDLE_S = 900.0            # a mesh no window used this long closes itself


class Misplaced(Broken):
    """A window's task ran where its mesh has no participant (its worker left, and the
    scheduler moved the task), or the participant's listener is gone."""


@dataclass(frozen=True)
class Place:
    """Where a participant listens: TCP on its worker's host, and (``path``, for peers of
    the same ``machine``) a Unix socket in a folder only its user can open."""

    host: str
    port: int
    path: str = ""
    machine: str = ""
    mpi: int = -1           # its world rank, where its messages may go over MPI (mpiwire)


@dataclass(frozen=True)
class Mesh:
    """The participants of one attempt of a run, as every window task sees them.

    ``workers[r]`` is rank ``r``'s Dask worker address, ``places[r]`` where it
    listens.  The secret is not here (a task's arguments pass through the
    scheduler): each listener was given it by :func:`listen`.
    """

    run: str
    workers: tuple[str, ...]
    places: tuple[Place, ...]

    def rank(self, worker: str) -> int:
        """The rank of Dask worker ``worker``."""
        return self.workers.index(worker)

    @property
    def over_mpi(self) -> bool:
        """Whether its windows' messages go over MPI (every participant a rank with a wire)."""
        return all(p.mpi >= 0 for p in self.places)


def _machine() -> str:
    """What tells this machine (this kernel) from another: a Unix socket of a peer with the
    same can be reached."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class Node:
    """This process's part of a mesh: its listeners, and its connections to and from peers.

    Made by :func:`listen`; :meth:`link` gives each window the connections it needs.
    """

    def __init__(self, run: str, secret: bytes, rank: int, host: str,
                 server: ssl.SSLContext | None, client: ssl.SSLContext | None, local: bool,
                 wire: mpiwire.Wire | None = None):
        self.run, self.secret, self.rank, self.wire = run, secret, rank, wire
        self.peers: tuple[int, ...] = ()    # over MPI: the other participants' world ranks
        self.server, self.client = server, client
        self.ins: dict[int, In] = {}
        self.outs: dict[int, Out] = {}
        self.changed = threading.Condition()
        self.broken: str | None = None
        self.windows, self.used = 0, time.monotonic()   # windows running; last used
        self.ended: deque[int] = deque(maxlen=8)    # the last windows that ended here
        self.listeners = [socket.create_server((host, 0), backlog=64)]
        self.folder = ""
        path = ""
        if local and hasattr(socket, "AF_UNIX"):   # a folder only this user can open
            self.folder = tempfile.mkdtemp(prefix="dtrain-p2p-")
            path = os.path.join(self.folder, "s")
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                unix.bind(path)
                unix.listen(64)
                self.listeners.append(unix)
            except OSError:         # e.g. a TMPDIR too long for a socket's name: TCP only
                unix.close()
                shutil.rmtree(self.folder, ignore_errors=True)
                self.folder = path = ""
        tcp_host, port = self.listeners[0].getsockname()[:2]
        self.place = Place(tcp_host, port, path, _machine() if path else "",
                           wire.rank if wire is not None else -1)
        for listener in self.listeners:
            threading.Thread(target=self._accept, args=(listener,), daemon=True,
                             name="dtrain-p2p-listen").start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:                             # closed: the mesh is over
                return
            threading.Thread(target=self._admit, args=(sock,), daemon=True,
                             name="dtrain-p2p-admit").start()

    def _admit(self, raw: socket.socket) -> None:
        """Let a connection in once it proved itself (else drop it), within HANDSHAKE_S."""
        sock = raw
        try:
            raw.settimeout(HANDSHAKE_S)
            tune(raw)
            if self.server is not None and raw.family != socket.AF_UNIX:
                sock = self.server.wrap_socket(raw, server_side=True)
            peer = check(sock, self.run, self.secret)
        except (OSError, ssl.SSLError, Refused, ValueError):
            shut(sock)
            return
        with self.changed:
            if self.broken is not None or peer in self.ins:
                shut(sock)
                return
            self.ins[peer] = In(sock, peer, _nodes().spin)     # as this process reads
            self.changed.notify_all()

    def _connect(self, mesh: Mesh, peer: int) -> Out:
        """A connection to ``peer``: its Unix socket where it runs on this machine and has
        one, else TCP (with TLS where the cluster has it)."""
        there = mesh.places[peer]
        sock = None
        if there.path and there.machine == self.place.machine:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(HANDSHAKE_S)
                sock.connect(there.path)
            except OSError:                     # not the same file system after all
                shut(sock)
                sock = None
        try:
            if sock is None:
                sock = socket.create_connection((there.host, there.port), timeout=HANDSHAKE_S)
                if self.client is not None:
                    sock = self.client.wrap_socket(sock, server_hostname=None)
            tune(sock)
            prove(sock, self.run, self.rank, self.secret)
        except (OSError, ssl.SSLError, Refused) as exc:
            if sock is not None:
                shut(sock)
            raise PeerLost(f"cannot reach rank {peer} ({mesh.workers[peer]}) at "
                           f"{there.host}:{there.port}: {exc}") from None
        sock.settimeout(None)
        return Out(sock, peer, isinstance(sock, ssl.SSLSocket))

    def link(self, mesh: Mesh, to: Iterable[int], frm: Iterable[int], timeout: float
             ) -> Link | mpiwire.Link:
        """The connections of one window: to the ranks ``to`` it sends to (opened here once
        per mesh) and from the ranks ``frm`` it reads (waited for up to ``timeout`` seconds,
        which also bounds each read's wait); over MPI where every participant's messages
        may go there (:mod:`~dtrain.deploy.mpiwire`).  :meth:`done` says when the window is
        over."""
        self.check()
        with self.changed:
            self.windows += 1
            self.used = time.monotonic()
        if self.wire is not None and all(p.mpi >= 0 for p in mesh.places):
            self.peers = tuple(p.mpi for r, p in enumerate(mesh.places) if r != self.rank)
            return mpiwire.Link(self.wire, mesh.run, [p.mpi for p in mesh.places],
                                mesh.workers, timeout)
        try:
            for peer in sorted(set(to) - set(self.outs)):
                self.outs[peer] = self._connect(mesh, peer)
            deadline = time.monotonic() + timeout
            wanted = set(frm)
            with self.changed:
                while self.broken is None and not wanted <= set(self.ins):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        missing = sorted(wanted - set(self.ins))
                        raise PeerLost(f"rank(s) {missing} did not connect within "
                                       f"{timeout:g} s", silent=mesh.workers[missing[0]])
                    self.changed.wait(left)
            self.check()
        except BaseException:
            self.done()
            raise
        return Link(self, mesh, timeout)

    def check(self) -> None:
        if self.broken is not None:
            raise PeerLost(f"this mesh already failed: {self.broken}")

    def done(self, window: int = 0) -> None:
        """Window ``window`` (its first step), which :meth:`link` let in, is over here."""
        with self.changed:
            self.windows -= 1
            self.used = time.monotonic()
            self.ended.append(window)
            self.changed.notify_all()

    def turn(self, after: int, timeout: float) -> None:
        """Return once the window whose first step is ``after`` ended here (a window
        launched while that one runs, on a worker of several threads, may start first).
        Raises :class:`PeerLost` once ``timeout`` seconds passed with no window running
        here (a window that runs may take longer than any one read: each of its reads is
        bounded, and a peer lost ends it and this wait with it), or if the mesh failed."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while after not in self.ended and self.broken is None:
                left = deadline - time.monotonic()
                if left <= 0 and self.windows:          # the window before still runs here
                    deadline, left = time.monotonic() + timeout, timeout
                if left <= 0:
                    raise PeerLost(f"the window of step {after} did not end here within "
                                   f"{timeout:g} s")
                self.changed.wait(left)
        self.check()

    def idle(self, now: float) -> bool:
        """Whether no window has used it for :data:`IDLE_S` seconds."""
        with self.changed:
            return not self.windows and now - self.used > IDLE_S

    def abort(self, why: str) -> None:
        """Shut every connection down (its peers' reads end at once) and stop listening: the
        mesh is over for this participant."""
        with self.changed:
            first = self.broken is None
            if first:
                self.broken = why
            self.changed.notify_all()
        if first and self.wire is not None and self.peers and why != "closed":
            self.wire.abort(self.run, self.peers, why)  # over MPI no socket closes: say so
        for listener in self.listeners:
            shut(listener)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        for out in self.outs.values():
            out.close()
            shut(out.sock)
        for inn in self.ins.values():
            shut(inn.sock)

    def close(self) -> None:
        """The mesh ended (the run finished, or the workers changed)."""
        self.abort("closed")


class Link:
    """One window's messages on this participant: :meth:`send` and :meth:`recv` by rank."""

    def __init__(self, node: Node, mesh: Mesh, timeout: float):
        self.node, self.mesh, self.timeout = node, mesh, timeout
        self.messages = self.bytes = 0          # sent (the values' bytes, as Dask counts them)

    def finish(self) -> None:
        """The window's messages are all sent (a socket's sender threads finish on their
        own)."""

    def via(self) -> tuple[str, ...]:
        """How this participant's messages went: "unix", "tcp" and/or "tls"."""
        return tuple(sorted({transport(out.sock) for out in self.node.outs.values()}))

    def send(self, ranks: Sequence[int], tag: str, value: Any) -> None:
        """Send ``value`` as message ``tag`` to each of ``ranks``; returns at once."""
        frames, nbytes = encode(tag, value)
        for r in ranks:
            self.node.outs[r].send(frames)
        self.messages += len(ranks)
        self.bytes += len(ranks) * nbytes

    def recv(self, rank: int, tag: str) -> Any:
        """The value of message ``tag`` from rank ``rank``, once it has come."""
        inn = self.node.ins.get(rank)
        if inn is None:
            raise PeerLost(f"no connection from rank {rank}")
        try:
            return inn.take(tag, self.timeout)
        except Quiet as exc:
            worker = self.mesh.workers[rank]
            raise PeerLost(f"{exc} (worker {worker})", silent=worker) from None


# --- this process's meshes (its runtime's part), and the driver's side -----------------------

class Nodes:
    """This process's parts of meshes, by mesh id (its part of the worker's
    :class:`~dtrain.deploy.runtime.Runtime`), and the thread that closes idle ones."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.lock = threading.Lock()
        self.reaper: threading.Thread | None = None
        self.spin = SPIN_S                  # how long this process's reads poll first

    def close(self) -> None:
        """Close every mesh part here (the worker closes)."""
        with self.lock:
            found, self.nodes = list(self.nodes.values()), {}
        for n in found:
            n.close()


def _nodes() -> Nodes:
    return runtime.here().part("p2p", Nodes)


def sharing_a_core() -> None:
    """This worker process shares its core with other workers (ranks that outnumber their
    node's cores, pinned together: :func:`~dtrain.deploy.layout.assign`): its meshes' reads
    sleep at once.  Polling first (:data:`~dtrain.deploy.wire.SPIN_S`) is for a reader with
    a core of its own, whose peer's answer often comes before a sleeping core would wake;
    here it takes the core from the worker whose answer it waits for."""
    _nodes().spin = 0.0


def node(run: str, rank: int) -> Node:
    """This process's part of mesh ``run`` as rank ``rank`` (raises :class:`Misplaced`)."""
    found = _nodes().nodes.get(run)
    if found is None or found.rank != rank:
        raise Misplaced(f"this worker is not rank {rank} of mesh {run} (its worker left, or "
                        f"the mesh was closed)")
    return found


def listen(run: str, secret: bytes, rank: int, host: str, server: ssl.SSLContext | None,
           client: ssl.SSLContext | None, local: bool = True, mpi: bool = False) -> Place:
    """Open this process's listeners of mesh ``run`` as rank ``rank``: TCP on ``host``
    (``server``/``client``: its TLS contexts, None for plain TCP) and, with ``local``, a
    Unix socket for peers on this machine; with ``mpi``, its world rank where its MPI job
    installed a wire (:mod:`~dtrain.deploy.mpiwire`); returns where it listens."""
    made = Node(run, secret, rank, host, server, client, local,
                mpiwire.here() if mpi else None)
    here = _nodes()
    with here.lock:
        here.nodes[run] = made
        if here.reaper is None or not here.reaper.is_alive():
            here.reaper = threading.Thread(target=_reap, args=(here,), daemon=True,
                                           name="dtrain-p2p-reaper")
            here.reaper.start()
    return made.place


def _reap(here: Nodes) -> None:
    """Close meshes no window used for :data:`IDLE_S` (a driver that died cannot close
    them): nothing listens long after its run."""
    while True:
        time.sleep(min(IDLE_S / 10, 1.0))
        now = time.monotonic()
        with here.lock:
            idle = [run for run, n in here.nodes.items() if n.idle(now)]
        for run in idle:
            close(run)


def close(run: str) -> bool:
    """Close this process's part of mesh ``run``; True if it had one."""
    here = _nodes()
    with here.lock:
        found = here.nodes.pop(run, None)
    if found is not None:
        found.close()
    return found is not None


def open_nodes() -> list[str]:
    """The meshes this process takes part in (tests: nothing listens after a run)."""
    here = _nodes()
    with here.lock:
        return list(here.nodes)


def new_run() -> tuple[str, bytes]:
    """A fresh mesh id and secret."""
    return uuid.uuid4().hex, secrets.token_bytes(32)


def _listen_here(run: str, secret: bytes, ranks: dict[str, int], local: bool,
                 mpi: bool = False, dask_worker: Any = None) -> Place:
    """On a worker, through ``client.run``: its listener of mesh ``run`` on its own host,
    with its TLS where its address says it uses TLS."""
    from distributed.comm import get_address_host

    address = dask_worker.address
    server = client = None
    if address.startswith("tls://"):
        security = internals.worker_security(dask_worker)
        if security is None:
            raise Misplaced(f"worker {address} uses TLS but its certificate is not readable")
        server = security.get_listen_args("worker")["ssl_context"]
        client = security.get_connection_args("worker")["ssl_context"]
    return listen(run, secret, ranks[address], get_address_host(address), server, client, local,
                  mpi)


def _close_here(run: str) -> bool:
    return close(run)


def open_mesh(client: Any, workers: Sequence[str], timeout: float, local: bool = True,
              mpi: bool = False) -> Mesh:
    """A new mesh over ``workers`` (Dask worker addresses, in rank order): a fresh run id
    and secret, and listeners on each; ``local``: peers on one machine talk over Unix
    sockets (else TCP, as across machines); ``mpi``: over MPI where every worker is a rank
    of dtrain's MPI job (:attr:`Mesh.over_mpi`).  Raises :class:`PeerLost` if a worker
    cannot listen, or (``silent``) does not answer within ``timeout`` seconds."""
    run, secret = new_run()
    ranks = {w: r for r, w in enumerate(workers)}
    answers = broadcast.answers(client, _listen_here, run, secret, ranks, local, mpi,
                                workers=workers, timeout=timeout)
    mesh = Mesh(run, tuple(workers), tuple(a if isinstance(a, Place) else Place("", 0)
                                           for a in answers.values()))
    for worker, answer in answers.items():
        if not isinstance(answer, Place):
            close_mesh(client, mesh, timeout)
            if answer is broadcast.SILENT:
                raise PeerLost(f"worker {worker} did not answer within {timeout:g} s",
                               silent=worker)
            raise PeerLost(f"worker {worker} could not open its listener: {answer}")
    return mesh


def close_mesh(client: Any, mesh: Mesh, timeout: float) -> None:
    """Close every participant's part of ``mesh`` that is still there, waiting at most
    ``timeout`` seconds for any (a worker that left took its part with it)."""
    try:
        there = internals.scheduler_workers(client)
        broadcast.answers(client, _close_here, mesh.run,
                          workers=[w for w in mesh.workers if w in there], timeout=timeout)
    except Exception:           # a cluster going down: nothing is left to close
        pass
