"""A node's cores without the GIL: resident helper processes that compute a worker's shards.

The hybrid layout gives a node one Dask worker with a thread per core, so its
shards share memory and a step costs the scheduler one task.  But NumPy on
small matrices spends most of its time holding the GIL: on 16 cores, 16
shards of a 784-128-10 net take 3.7 ms a step on 16 threads against 0.11 ms
in 16 processes (``../shared/notes/in-node.md``).  So a worker that computes
several shards in one task hands them to **core processes**: one per extra
core, started once (the first time a task needs them) and kept for the
worker's life, each a plain ``python -m dtrain.taskgraph.cores`` child
(through :mod:`subprocess`: Dask's worker processes are daemonic, and
:mod:`multiprocessing` refuses daemonic processes children).

Memory is shared, never pickled per step.  Each shard is copied once into a
``memfd`` segment whose descriptor goes to the helpers over their socket
(``SCM_RIGHTS``); the parameters, one gradient slot per shard and the sum
live in three more segments.  A step then writes the parameters, sends each
helper a few bytes (which shards, which rows), computes its own share
meanwhile, and waits.  Each process's shards are consecutive positions of
the reduce tree, so each also sums the subtrees that lie wholly among them
(at fan-in 2, 4 shards on 2 processes: each adds its pair); what is left of
the fixed-order sum is split by ranges of the buffer over the helpers when it
is long.  Each shard's gradient is the same function of the same rows on one
BLAS thread, and each element of the sum adds the same numbers in the same
order: the bytes do not depend on which process did what
(``tests/test_hashes.py``, ``tests/test_cores.py``).

A helper that dies (killed, out of memory) costs nothing but time: its shards
are computed here, and the pool is started afresh at the next step.
"""
from __future__ import annotations

import atexit
import mmap
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

import numpy as np

from dtrain.core.allocator import ALLOCATOR_ENV
from dtrain.data.shards import Shard, stacked_batch
from dtrain.maths.model import Network, noise
from dtrain.taskgraph.treesum import (Tree, collapsed, even_parts, flat, nested_sum,
                                      sum_subtrees)

SUM_SPLIT_MIN = 1 << 17     # each process adds at least this many numbers of the buffers
SPIN_SECONDS = 0.002        # wait this long for a message polling, before blocking: waking a
                            # sleeping process (a halted virtual CPU) costs 0.1 ms or more
STEP, SUM, CONTROL = b"S", b"R", b"C"   # a message's kind, in its first byte (of 8)
OK = b"ok"
ALIGN = 64                  # byte alignment of each array in a segment (a cache line)
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")}


def supported() -> bool:
    """Whether this platform can share memory this way (Linux: ``memfd_create``)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "AF_UNIX")


def ready(conn: Connection) -> select.poll:
    """A poller of ``conn``'s incoming messages (made once: ``Connection.poll`` builds a
    selector at every call)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return poller


def wait(poller: select.poll, spin: float) -> None:
    """Return once the poller's connection has a message (or has closed): polling for
    ``spin`` seconds, yielding the core to anything else that wants it between polls
    (``sched_yield``: ``time.sleep(0)`` sleeps out the kernel's timer slack, 50 us, and
    made a step's round trip to a helper 80 us instead of 11), then blocking."""
    if poller.poll(0):
        return
    end = time.perf_counter() + spin
    while time.perf_counter() < end:
        if poller.poll(0):
            return
        os.sched_yield()
    poller.poll()


def _ints(kind: bytes, values: Sequence[int]) -> bytes:
    return kind.ljust(8, b" ") + np.asarray(values, np.int64).tobytes()


def _control(*msg: Any) -> bytes:
    return CONTROL.ljust(8, b" ") + pickle.dumps(msg)


# --- segments: anonymous shared memory, passed by descriptor -----------------------------

@dataclass(frozen=True)
class Layout:
    """Arrays at fixed offsets of one segment: ``(offset, shape, dtype)`` each."""

    arrays: tuple[tuple[int, tuple[int, ...], str], ...]

    @classmethod
    def of(cls, specs: Sequence[tuple[tuple[int, ...], str]]) -> Layout:
        out, at = [], 0
        for shape, dtype in specs:
            out.append((at, tuple(shape), dtype))
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            at += -(-max(n, 1) // ALIGN) * ALIGN
        return cls(tuple(out))

    @property
    def nbytes(self) -> int:
        off, shape, dtype = self.arrays[-1]
        return off + max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)

    def views(self, buf: mmap.mmap) -> list[np.ndarray]:
        return [np.ndarray(shape, dtype, buffer=buf, offset=off)
                for off, shape, dtype in self.arrays]


def _segment(layout: Layout) -> tuple[int, mmap.mmap]:
    """A new anonymous shared segment for ``layout``: ``(descriptor, mapping)``."""
    fd = os.memfd_create("dtrain-cores", os.MFD_CLOEXEC)
    os.ftruncate(fd, layout.nbytes)
    return fd, mmap.mmap(fd, layout.nbytes)


# --- the helper process ---------------------------------------------------------------------

class _Helper:
    """What a core process holds: the shards it was given, the shared buffers, the nets."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.conn = Connection(os.dup(sock.fileno()))
        self.ready = ready(self.conn)
        self.shards: dict[int, Any] = {}
        self.maps: dict[int, mmap.mmap] = {}
        self.params = self.grads = self.total = None
        self.nets: dict[int, Network] = {}
        self.trees: dict[int, int | tuple] = {}

    def _map(self, layout: Layout) -> tuple[mmap.mmap, list[np.ndarray]]:
        (fd,) = recvfds(self.sock, 1)
        try:
            buf = mmap.mmap(fd, layout.nbytes)
        finally:
            os.close(fd)
        return buf, layout.views(buf)

    def serve(self) -> None:
        while True:
            try:
                wait(self.ready, SPIN_SECONDS)
                msg = self.conn.recv_bytes()
            except (EOFError, OSError):
                return                      # the worker is gone: so are we
            try:
                if msg[:1] == STEP:         # a step's shards: ints only, no pickle
                    net, tree, epoch, seed, first, *work = \
                        np.frombuffer(msg, np.int64, offset=8).tolist()
                    net, work = self.nets[net], list(zip(*[iter(work)] * 3))
                    mine = range(first, first + len(work))
                    shard_grads(net, self.params[: net.size], [self.shards[w[0]] for w in work],
                                epoch, None if seed < 0 else seed, [w[1:] for w in work],
                                self.grads[mine.start: mine.stop])
                    sum_subtrees(self.trees[tree], mine, self.grads[:, : net.buffer_size])
                elif msg[:1] == SUM:
                    tree, lo, hi = np.frombuffer(msg, np.int64, offset=8).tolist()
                    _sum_range(self.trees[tree], self.grads, self.total, lo, hi)
                else:
                    op, *args = pickle.loads(msg[8:])
                    if op == "shard":
                        slot, index, layout = args
                        self.maps[slot], (x, y) = self._map(layout)
                        self.shards[slot] = Shard(index, x, y)
                    elif op == "drop":
                        self.shards.pop(args[0], None)
                        buf = self.maps.pop(args[0], None)
                        if buf is not None:
                            buf.close()
                    elif op == "buffers":
                        self.maps[-1], (self.params, self.grads, self.total) = \
                            self._map(args[0])
                    elif op == "net":
                        self.nets[args[0]] = args[1]
                    elif op == "tree":
                        self.trees[args[0]] = args[1]
                    continue                # no reply: the next step's reply orders them
                self.conn.send_bytes(OK)
            except Exception:
                self.conn.send_bytes(traceback.format_exc().encode())


def shard_grads(net: Network, params: np.ndarray, shards: Sequence[Any], epoch: int,
                seed: int | None, rows: Sequence[tuple[int, int]], out: np.ndarray) -> None:
    """Each host shard's ``[grad | loss | correct]`` over its ``rows`` of this epoch into its
    row of ``out`` (S, >= P + 2).  Shards of equal rows go in one pass over their rows
    stacked (S, B, I): NumPy's per-call cost paid once, not once per shard, and each row
    the bytes its shard alone gives (:meth:`~dtrain.maths.model.Network.loss_and_grad`)."""
    B = net.buffer_size
    if len(shards) > 1 and len({hi - lo for lo, hi in rows}) == 1:
        x, y = stacked_batch(shards, epoch, rows, seed)                   # (S, B, I)
        w = None if shards[0].w is None else \
            np.stack([s.weights(epoch, lo, hi, seed) for s, (lo, hi) in zip(shards, rows)])
        keys = tuple(noise(epoch, [(s.index, *r)]) for s, r in zip(shards, rows))
        net.loss_and_grad(params, x, y, w, out=out[: len(shards), :B], noise=keys)
        return
    for p, (shard, (lo, hi)) in enumerate(zip(shards, rows)):
        x, y = shard.batch(epoch, lo, hi, seed)
        net.loss_and_grad(params, x, y, shard.weights(epoch, lo, hi, seed), out=out[p, :B],
                          noise=noise(epoch, [(shard.index, lo, hi)]))


def _sum_range(tree: Tree, grads: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    """``out[lo:hi]`` = the tree's sum of the gradient slots' ``[lo:hi]`` (slot ``p`` of the
    group's position ``p``)."""
    out[lo:hi] = nested_sum(tree, grads[:, lo:hi])


def _main(fd: int) -> None:
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=1)      # one BLAS thread: the bytes of a shard's gradient
    sock = socket.socket(fileno=fd)
    _Helper(sock).serve()


# --- the pool, in the worker ---------------------------------------------------------------

class Broken(Exception):
    """A helper died or failed; the caller computes the group itself."""


@dataclass
class _Proc:
    popen: subprocess.Popen
    sock: socket.socket
    conn: Connection
    ready: select.poll


def _env() -> dict[str, str]:
    """A helper's environment: the worker's, with one BLAS thread and an allocator that keeps
    freed memory (:mod:`dtrain.core.allocator`; Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``,
    which pins the mmap threshold at 128 KiB, and glibc's defaults trim the heap past 128 KiB
    free: either way a step's batch and sum temporaries page-fault in afresh every step, and
    P3's 64-row shards took 1.3 times as long)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return {**env, **ONE_THREAD, **ALLOCATOR_ENV}


def _start(n: int) -> list[_Proc]:
    procs = []
    env = _env()
    for _ in range(n):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        popen = subprocess.Popen([sys.executable, "-m", "dtrain.taskgraph.cores",
                                  str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
                                 stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        conn = Connection(os.dup(mine.fileno()))
        procs.append(_Proc(popen, mine, conn, ready(conn)))
    return procs


class _Slot:
    """A shard's shared copy: its slot number and the layout the helpers map."""

    def __init__(self, slot: int, index: int, layout: Layout, fd: int):
        self.slot, self.index, self.layout, self.fd = slot, index, layout, fd


class Pool:
    """``n`` core processes and what they hold (one pool per worker process)."""

    def __init__(self, n: int):
        self.n = n
        self.lock = threading.Lock()
        self.procs: list[_Proc] = []
        self.slots: dict[int, _Slot] = {}            # id(shard) -> its shared copy
        self.refs: dict[int, weakref.ref] = {}
        self.dropped: list[int] = []                 # slots whose shard is gone
        self.next_slot = 0
        self.nets: dict[Network, int] = {}
        self.trees: dict[int | tuple, int] = {}
        self.buffers: tuple[Layout, mmap.mmap, list[np.ndarray]] | None = None
        self.buffer_fd: int | None = None

    # -- lifecycle --
    def _ensure(self) -> None:
        if self.procs:              # a dead one shows as a broken pipe, then the pool restarts
            return
        self._stop()
        self.procs = _start(self.n)
        self.nets.clear()
        self.trees.clear()
        for slot in self.slots.values():        # a fresh pool maps every shard again
            self._send_shard(slot)
        if self.buffers is not None:
            self._send_buffers()

    def _stop(self) -> None:
        for p in self.procs:
            try:
                p.conn.close()
                p.sock.close()
            except OSError:
                pass
            try:
                p.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.popen.kill()
        self.procs = []

    def close(self) -> None:
        with self.lock:
            self._stop()
            for slot in self.slots.values():
                os.close(slot.fd)
            self.slots.clear()
            if self.buffer_fd is not None:
                os.close(self.buffer_fd)
                self.buffer_fd, self.buffers = None, None

    # -- what the helpers hold --
    def _send(self, proc: _Proc, msg: tuple, fds: Sequence[int] = ()) -> None:
        proc.conn.send_bytes(_control(*msg))
        if fds:
            sendfds(proc.sock, list(fds))

    def _send_shard(self, slot: _Slot) -> None:
        for p in self.procs:
            self._send(p, ("shard", slot.slot, slot.index, slot.layout), [slot.fd])

    def _send_buffers(self) -> None:
        layout, _, _ = self.buffers
        for p in self.procs:
            self._send(p, ("buffers", layout), [self.buffer_fd])

    def _shard(self, shard: Any) -> int:
        """The slot of ``shard``'s shared copy, made (and sent to the helpers) on first use."""
        key = id(shard)
        ref = self.refs.get(key)
        if ref is not None and ref() is shard:
            return self.slots[key].slot
        if key in self.slots:                               # an old shard's id, reused
            self._forget(key)
        layout = Layout.of([(shard.x.shape, shard.x.dtype.str), (shard.y.shape, shard.y.dtype.str)])
        fd, buf = _segment(layout)
        x, y = layout.views(buf)
        x[...], y[...] = shard.x, shard.y
        buf.close()
        slot = _Slot(self.next_slot, shard.index, layout, fd)
        self.next_slot += 1
        self.slots[key] = slot
        self.refs[key] = weakref.ref(shard, lambda _, k=key: self.dropped.append(k))
        self._send_shard(slot)
        return slot.slot

    def _forget(self, key: int) -> None:
        slot = self.slots.pop(key, None)
        self.refs.pop(key, None)
        if slot is None:
            return
        os.close(slot.fd)
        for p in self.procs:
            self._send(p, ("drop", slot.slot))

    def _buffers(self, P: int, width: int, dtype: str) -> list[np.ndarray]:
        """The shared parameters ``(P,)``, gradient slots ``(width, P + 2)`` and sum, grown as
        needed."""
        if self.buffers is not None:
            layout, _, views = self.buffers
            params, grads, _ = views
            if params.dtype == np.dtype(dtype) and params.shape[0] >= P and \
                    grads.shape[0] >= width and grads.shape[1] >= P + 2:
                return views
            self.buffers[1].close()
            os.close(self.buffer_fd)
        row = -(-(P + 2) * np.dtype(dtype).itemsize // ALIGN) * ALIGN // np.dtype(dtype).itemsize
        layout = Layout.of([((P,), dtype), ((width, row), dtype), ((P + 2,), dtype)])
        self.buffer_fd, buf = _segment(layout)
        self.buffers = (layout, buf, layout.views(buf))
        self._send_buffers()
        return self.buffers[2]

    def _net(self, net: Network) -> int:
        if net not in self.nets:
            self.nets[net] = len(self.nets)
            for p in self.procs:
                self._send(p, ("net", self.nets[net], net))
        return self.nets[net]

    def _tree(self, tree: int | tuple) -> int:
        if tree not in self.trees:
            self.trees[tree] = len(self.trees)
            for p in self.procs:
                self._send(p, ("tree", self.trees[tree], tree))
        return self.trees[tree]

    # -- a step --
    def _ask(self, asks: list[tuple[_Proc, bytes]]) -> None:
        for proc, msg in asks:
            proc.conn.send_bytes(msg)

    def _answers(self, procs: Sequence[_Proc]) -> None:
        failed = None
        for proc in procs:
            try:
                wait(proc.ready, SPIN_SECONDS)
                reply = proc.conn.recv_bytes()
            except (EOFError, OSError) as exc:
                failed = failed or f"core process {proc.popen.pid} died ({exc!r})"
                continue
            if reply != OK:
                failed = failed or reply.decode(errors="replace")
        if failed:
            raise Broken(failed)

    def group_sum(self, net: Network, epoch: int, seed: int | None, rows: Sequence[tuple[int, int]],
                  tree: int | tuple, params: np.ndarray, shards: Sequence[Any]) -> np.ndarray:
        """The tree's in-order sum of each shard's ``[grad | loss | correct]`` over its
        ``rows`` this epoch, the shards spread over this process and the helpers."""
        with self.lock:
            while self.dropped:
                self._forget(self.dropped.pop())
            try:
                self._ensure()
                return self._group_sum(net, epoch, seed, rows, tree, params, shards)
            except (Broken, OSError) as exc:
                self._stop()            # started afresh next time
                if isinstance(exc, Broken):
                    raise
                raise Broken(f"a core process died ({exc!r})") from exc

    def _group_sum(self, net, epoch, seed, rows, tree, params, shards) -> np.ndarray:
        n, B = len(shards), net.buffer_size
        slots = [self._shard(s) for s in shards]
        shared, grads, total = self._buffers(net.size, n, str(params.dtype))
        shared[: net.size] = params
        ways = min(self.n + 1, n)
        parts = even_parts(n, ways)
        nid, tid = self._net(net), self._tree(tree)
        code = -1 if seed is None else seed
        asks = [(proc, _ints(STEP, [nid, tid, epoch, code, part.start,
                                    *(v for p in part for v in (slots[p], *rows[p]))]))
                for proc, part in zip(self.procs, parts[1:])]
        self._ask(asks)
        mine = parts[0]                 # params' values from shared: the same bytes
        shard_grads(net, shared[: net.size], shards[mine.start: mine.stop], epoch, seed,
                    rows[mine.start: mine.stop], grads[mine.start: mine.stop])
        sum_subtrees(tree, mine, grads[:n, :B])
        self._answers([proc for proc, _ in asks])
        rest = collapsed(tree, tuple(parts))
        ways = min(len(self.procs) + 1, max(1, (len(flat(rest)) - 1) * B // SUM_SPLIT_MIN))
        if ways == 1:                   # a new array (not the sum slot: no copy back)
            out = nested_sum(rest, grads[:n, :B])
            return out.copy() if isinstance(rest, int) else out
        tid = self._tree(rest)
        cuts = even_parts(B, ways)
        asks = [(proc, _ints(SUM, [tid, cut.start, cut.stop]))
                for cut, proc in zip(cuts[1:], self.procs[: ways - 1])]
        self._ask(asks)
        _sum_range(rest, grads[:n, :B], total, cuts[0].start, cuts[0].stop)
        self._answers([proc for proc, _ in asks])
        return total[:B].copy()


_pools: dict[int, Pool] = {}
_pools_lock = threading.Lock()


def pool(helpers: int) -> Pool | None:
    """This process's pool of ``helpers`` core processes (None where none can be had)."""
    if helpers < 1 or not supported():
        return None
    with _pools_lock:
        if os.getpid() not in _pools:
            _pools[os.getpid()] = Pool(helpers)
            atexit.register(_pools[os.getpid()].close)
        p = _pools[os.getpid()]
        if p.n != helpers:
            p.close()
            p.n = helpers
        return p


if __name__ == "__main__":
    _main(int(sys.argv[1]))
