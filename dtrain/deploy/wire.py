"""One connection between two participants of a mesh: the handshake and the bytes of a message.

:mod:`dtrain.deploy.p2p` makes the mesh (who listens where, for how long); this module is
what crosses one of its connections, and knows sockets, nothing of ranks' meaning or of
training:

* **The handshake.**  A connection opens with :data:`HELLO`, the mesh's run id and the
  opener's rank, and proves both ways that each side knows the mesh's secret
  (HMAC-SHA256 challenges, :func:`prove` and :func:`check`: the secret never crosses the
  wire), before a byte of a message is read; a stranger is :class:`Refused`.
* **A message** is a tag and a value: a NumPy array as its dtype, shape and raw bytes; any
  other value pickled (protocol 5, its buffers out of band) (:func:`encode`).
* **Connections go one way**: :class:`Out` only writes, and never makes its task wait: what
  the socket does not take at once goes to a sender thread of that connection, in order.
  :class:`In` only reads, polling for :data:`SPIN_S` before a read that may sleep (unless
  told not to: a process that shares its core), and sets
  aside messages that arrive before the one its task waits for.
* **Faults**: a connection closed or failed, or a read that waited out its timeout, is
  :class:`PeerLost` (:class:`Quiet` for the timeout); both are :class:`Broken`, after which
  the window runs again on a new mesh.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from dask.sizeof import sizeof

HELLO = b"dtrain-p2p/1"   # what a connection opens with
NONCE = 16                # bytes of each side's challenge
KEEPALIVE = (5, 2, 3)     # TCP keepalive: idle s, between probes s, probes (a host gone: ~11 s)
UNIX_BUFFER = 4 << 20     # a Unix socket's buffers
TLS_PIECE = 1 << 20       # a TLS write from a task never waits: this much at a time
STAGING = 1 << 16         # a connection's read buffer: most messages arrive in one read
_FIXED = struct.Struct("!BHHI")   # a message's kind, tag bytes, then (array) dimensions and
_LENGTH = struct.Struct("!Q")     # dtype bytes, or (pickle) buffers and pickle bytes
ARRAY, PICKLE = 1, 2
SPIN_S = 5e-4             # a read polls this long before it sleeps (a sleeping core is slow
                          # to wake here: the peer's answer often comes within it)


class Broken(Exception):
    """A window's participants cannot go on together: the window runs again on a new mesh."""


class PeerLost(Broken):
    """A peer's connection closed, failed, or brought nothing within the window's timeout;
    ``silent``: the Dask worker that said nothing that long (it may be stopped or cut off
    while its scheduler still lists it), "" otherwise."""

    def __init__(self, message: str, silent: str = ""):
        super().__init__(message, silent)
        self.silent = silent

    def __str__(self) -> str:
        return self.args[0]


class Quiet(PeerLost):
    """A read that waited out its timeout (:class:`Link` says which worker)."""



class Refused(Exception):
    """A connection that did not prove it knows the mesh's secret."""


# --- the handshake -----------------------------------------------------------------------

def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).digest()


def _exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise Refused("the connection closed during the handshake")
        out += got
    return bytes(out)


def prove(sock: socket.socket, run: str, rank: int, secret: bytes) -> None:
    """The connecting side (rank ``rank``): say who it is, check the listener's proof, give
    its own."""
    mine = secrets.token_bytes(NONCE)
    me = struct.pack("!I", rank)
    sock.sendall(HELLO + run.encode() + me + mine)
    theirs = _exactly(sock, NONCE)
    if not hmac.compare_digest(_exactly(sock, 32), _mac(secret, b"listener", run.encode(),
                                                        me, mine, theirs)):
        raise Refused("the listener does not know the mesh's secret")
    sock.sendall(_mac(secret, b"sender", run.encode(), me, theirs, mine))
    if _exactly(sock, 1) != b"\x01":
        raise Refused("the listener refused the connection")


def check(sock: socket.socket, run: str, secret: bytes) -> int:
    """The listening side: the connecting rank, once it has proved it knows the secret."""
    if _exactly(sock, len(HELLO)) != HELLO:
        raise Refused("not a dtrain peer")
    head = _exactly(sock, len(run) + 4 + NONCE)
    if head[:len(run)] != run.encode():
        raise Refused("a peer of another mesh")
    me = head[len(run):-NONCE]
    theirs, mine = head[-NONCE:], secrets.token_bytes(NONCE)
    sock.sendall(mine + _mac(secret, b"listener", run.encode(), me, theirs, mine))
    if not hmac.compare_digest(_exactly(sock, 32), _mac(secret, b"sender", run.encode(), me,
                                                        mine, theirs)):
        raise Refused("the peer does not know the mesh's secret")
    sock.sendall(b"\x01")
    return struct.unpack("!I", me)[0]


def tune(sock: socket.socket) -> None:
    if sock.family == socket.AF_UNIX:       # a gradient buffer in one write (the default
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):     # takes 200 kB; capped by
            sock.setsockopt(socket.SOL_SOCKET, option, UNIX_BUFFER)   # the system's maximum)
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, option):             # Linux; macOS names them otherwise
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


# --- messages ----------------------------------------------------------------------------

def encode(tag: str, value: Any) -> tuple[list[memoryview], int]:
    """A message as frames to write in order: a fixed header, the tag, then either a NumPy
    array's shape, dtype and memory as it is (a gradient buffer: no copy, no pickle), or a
    pickle (protocol 5) with each out-of-band buffer's length, then those buffers.  And the
    value's size as Dask's ``sizeof`` counts it (the bytes Dask's own transfer would
    record)."""
    name = tag.encode()
    if type(value) is np.ndarray and value.flags.c_contiguous and not value.dtype.hasobject:
        dtype = value.dtype.str.encode()
        head = _FIXED.pack(ARRAY, len(name), value.ndim, len(dtype)) + name + \
            b"".join(_LENGTH.pack(n) for n in value.shape) + dtype
        return [memoryview(head), memoryview(value).cast("B")], value.nbytes
    buffers: list[pickle.PickleBuffer] = []
    body = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = _FIXED.pack(PICKLE, len(name), len(raws), len(body)) + name + \
        b"".join(_LENGTH.pack(r.nbytes) for r in raws)
    return [memoryview(head), memoryview(body), *raws], sizeof(value)


class In:
    """A connection a peer opened to this participant: read only, by the task thread."""

    def __init__(self, sock: socket.socket, peer: int, spin: float = SPIN_S):
        self.sock, self.peer, self.spin = sock, peer, spin
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.waiting: dict[str, Any] = {}           # messages that came before their turn
        self.buf = bytearray(STAGING)
        self.view = memoryview(self.buf)
        self.start = self.end = 0

    def take(self, tag: str, timeout: float) -> Any:
        """The value of message ``tag`` from this peer."""
        if tag in self.waiting:
            return self.waiting.pop(tag)
        self.sock.settimeout(timeout)
        while True:
            got, value = self._message()
            if got == tag:
                return value
            self.waiting[got] = value

    def _read(self, into: memoryview) -> int:
        """Read what has arrived, at least a byte, into ``into``; how many bytes."""
        self._spin()
        try:
            n = self.sock.recv_into(into)
        except TimeoutError:
            raise Quiet(f"no message from rank {self.peer} within "
                         f"{self.sock.gettimeout():g} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise PeerLost(f"the connection from rank {self.peer} failed: {exc}") from None
        if not n:
            raise PeerLost(f"rank {self.peer} closed its connection (it left, or its window "
                           f"failed)")
        return n

    def _spin(self) -> None:
        """Poll for up to ``spin`` seconds (:data:`SPIN_S` unless told) for bytes to arrive,
        yielding the core to anything else that wants it between polls (``sched_yield``),
        before a read that may sleep."""
        if not self.spin or (self.tls and self.sock.pending()) or self.poller.poll(0):
            return
        end = time.perf_counter() + self.spin
        while time.perf_counter() < end:
            os.sched_yield()
            if self.poller.poll(0):
                return

    def _bytes(self, n: int) -> memoryview:
        """The next ``n`` bytes (``n`` at most the staging buffer's size)."""
        if self.start == self.end:
            self.start = self.end = 0
        if self.start + n > len(self.buf):          # make room: the unread tail to the front
            left = self.end - self.start
            self.buf[:left] = self.buf[self.start:self.end]
            self.start, self.end = 0, left
        while self.end - self.start < n:
            self.end += self._read(self.view[self.end:])
        out = self.view[self.start:self.start + n]
        self.start += n
        return out

    def _into(self, out: memoryview) -> None:
        """Fill ``out``: first from the staging buffer, the rest straight from the socket."""
        have = min(self.end - self.start, out.nbytes)
        out[:have] = self.view[self.start:self.start + have]
        self.start += have
        while have < out.nbytes:
            have += self._read(out[have:])

    def _message(self) -> tuple[str, Any]:
        kind, tag_n, count, body_n = _FIXED.unpack(self._bytes(_FIXED.size))
        tag = bytes(self._bytes(tag_n)).decode()
        sizes = [_LENGTH.unpack(self._bytes(_LENGTH.size))[0] for _ in range(count)]
        if kind == ARRAY:
            value = np.empty(sizes, np.dtype(bytes(self._bytes(body_n)).decode()))
            self._into(memoryview(value).cast("B"))
            return tag, value
        body = bytes(self._bytes(body_n)) if body_n <= STAGING else self._big(body_n)
        bufs = []
        for size in sizes:
            buf = bytearray(size)
            self._into(memoryview(buf))
            bufs.append(buf)
        return tag, pickle.loads(body, buffers=bufs)

    def _big(self, n: int) -> bytes:
        buf = bytearray(n)
        self._into(memoryview(buf))
        return bytes(buf)


class Out:
    """A connection this participant opened to a peer: written only, by the task thread when
    the socket takes a message at once, else by the connection's sender thread, in order."""

    def __init__(self, sock: socket.socket, peer: int, tls: bool):
        self.sock, self.peer, self.tls = sock, peer, tls
        self.lock = threading.Condition(threading.Lock())
        self.queue: deque[list[memoryview]] = deque()
        self.busy = False                   # the sender thread is writing a message
        self.error: str | None = None
        self.closed = False
        self.thread: threading.Thread | None = None

    def send(self, frames: list[memoryview]) -> None:
        with self.lock:
            if self.error:
                raise PeerLost(self.error)
            if not self.queue and not self.busy:
                frames = self._now(frames)
                if not frames:
                    return
            self.queue.append(frames)
            if self.thread is None:
                self.thread = threading.Thread(target=self._drain, daemon=True,
                                               name=f"dtrain-p2p-send-{self.peer}")
                self.thread.start()
            self.lock.notify()

    def _now(self, frames: list[memoryview]) -> list[memoryview]:
        """Write what the socket takes without waiting; returns what is left."""
        if self.tls:
            return self._now_tls(frames)
        try:
            sent = self.sock.sendmsg(frames, [], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return frames
        except OSError as exc:
            self.error = f"sending to rank {self.peer} failed: {exc}"
            raise PeerLost(self.error) from None
        left = []
        for f in frames:
            if sent >= f.nbytes:
                sent -= f.nbytes
                continue
            left.append(f[sent:])
            sent = 0
        return left

    def _now_tls(self, frames: list[memoryview]) -> list[memoryview]:
        """:meth:`_now` on TLS: whole records' worth at a time, until the socket would wait.
        The piece it stopped in is the first thing left: OpenSSL wants the write it could
        not finish repeated with the same bytes, which the sender thread then does."""
        self.sock.setblocking(False)
        try:
            for i, frame in enumerate(frames):
                at = 0
                while at < frame.nbytes:
                    piece = frame[at:at + TLS_PIECE]
                    try:
                        at += self.sock.send(piece)
                    except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                        rest = [frame[at:at + piece.nbytes], frame[at + piece.nbytes:],
                                *frames[i + 1:]]
                        return [f for f in rest if f.nbytes]
            return []
        except (OSError, ssl.SSLError) as exc:
            self.error = f"sending to rank {self.peer} failed: {exc}"
            raise PeerLost(self.error) from None
        finally:
            self.sock.setblocking(True)

    def _drain(self) -> None:
        while True:
            with self.lock:
                while not self.queue and not self.closed:
                    self.lock.wait()
                if not self.queue:
                    return
                frames = self.queue.popleft()
                self.busy = True
            try:
                for f in frames:
                    self.sock.sendall(f)
            except (OSError, ssl.SSLError) as exc:
                with self.lock:
                    self.error = f"sending to rank {self.peer} failed: {exc}"
                    self.queue.clear()
                    self.busy = False
                return
            with self.lock:
                self.busy = False

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.lock.notify()


def transport(sock: socket.socket) -> str:
    """"unix", "tls" or "tcp": what a connection goes over."""
    if sock.family == socket.AF_UNIX:
        return "unix"
    return "tls" if isinstance(sock, ssl.SSLSocket) else "tcp"


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
