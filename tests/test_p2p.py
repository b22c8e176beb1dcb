"""The worker-to-worker transport (dtrain.deploy.p2p) on real sockets: messages arrive as
sent, strangers are refused, TLS where asked, nothing listens once a mesh closes, and a
peer that goes away ends a wait promptly."""
from __future__ import annotations

import os
import socket
import ssl
import stat
import struct
import threading
import time

import numpy as np
import pytest

from dtrain.deploy import p2p, wire
from dtrain.maths.optim import TrainState


def _pair(local: bool = True, tls: bool = False):
    """Two participants of one mesh in this process (ranks 0 and 1)."""
    run, secret = p2p.new_run()
    server = client = None
    if tls:
        from distributed import Security
        security = Security.temporary()
        server = security.get_listen_args("worker")["ssl_context"]
        client = security.get_connection_args("worker")["ssl_context"]
    nodes = [p2p.Node(run, secret, r, "127.0.0.1", server, client, local) for r in (0, 1)]
    mesh = p2p.Mesh(run, ("w0", "w1"), tuple(n.place for n in nodes))
    return mesh, nodes


def _links(mesh, nodes, timeout=5.0):
    """Each participant's link (both send to and read from the other), made side by side."""
    out = [None, None]

    def make(r):
        out[r] = nodes[r].link(mesh, [1 - r], [1 - r], timeout)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


VALUES = {
    "float32 gradient": np.arange(1000, dtype=np.float32),
    "bigger than the staging buffer": np.random.default_rng(0).standard_normal(300_000),
    "2-d int": np.arange(12, dtype=np.int64).reshape(3, 4),
    "0-d": np.float64(3.5) * np.ones(()),
    "empty": np.empty(0, np.float32),
    "a state (pickled, its vector out of band)": TrainState(np.linspace(0, 1, 70_000), 1.5, 3, 2),
    "plain python": {"loss": 0.25, "rows": [1, 2, 3]},
    "non-contiguous array": np.arange(20.0).reshape(4, 5)[:, 1],
}


@pytest.mark.parametrize("local", [True, False], ids=["unix", "tcp"])
def test_messages_arrive_as_sent_whatever_the_order_they_are_read_in(local):
    mesh, nodes = _pair(local)
    try:
        a, b = _links(mesh, nodes)
        assert (nodes[0].outs[1].sock.family == socket.AF_UNIX) is local
        for tag, value in VALUES.items():
            a.send([1], tag, value)
        for tag in reversed(VALUES):             # read last first: the rest wait their turn
            got, sent = b.recv(0, tag), VALUES[tag]
            if isinstance(sent, np.ndarray):
                assert got.dtype == sent.dtype and got.shape == sent.shape
                assert got.tobytes() == sent.tobytes()
            elif isinstance(sent, TrainState):
                assert got.vector.tobytes() == sent.vector.tobytes()
                assert (got.epoch_loss, got.epoch_samples) == (1.5, 3)
            else:
                assert got == sent
        assert a.messages == len(VALUES)
        assert a.bytes >= VALUES["bigger than the staging buffer"].nbytes
    finally:
        for n in nodes:
            n.close()


@pytest.mark.parametrize("shares", [False, True], ids=["own core", "shared core"])
def test_a_read_polls_before_it_sleeps_unless_its_process_shares_a_core(shares, monkeypatch):
    """A reader with a core of its own polls (yielding the core) before a read that may sleep;
    in a process that shares its core with other workers (``p2p.sharing_a_core``, worker
    ranks pinned together) it sleeps at once: polling would take the core from the worker
    whose answer it waits for."""
    yields = []
    monkeypatch.setattr(wire.os, "sched_yield", lambda: yields.append(1))
    here = p2p._nodes()
    monkeypatch.setattr(here, "spin", here.spin)       # this process's setting, put back
    if shares:
        p2p.sharing_a_core()
    run, secret = p2p.new_run()
    p2p.listen(run, secret, 1, "127.0.0.1", None, None, True)      # as a window's worker
    nodes = [p2p.Node(run, secret, 0, "127.0.0.1", None, None, True), p2p.node(run, 1)]
    mesh = p2p.Mesh(run, ("w0", "w1"), tuple(n.place for n in nodes))
    try:
        a, b = _links(mesh, nodes)
        later = threading.Timer(0.05, a.send, ([1], "late", np.arange(3.0)))
        later.start()
        assert b.recv(0, "late").tolist() == [0.0, 1.0, 2.0]
        later.join()
        assert nodes[1].ins[0].spin == (0.0 if shares else wire.SPIN_S)
        assert bool(yields) is not shares
    finally:
        nodes[0].close()
        p2p.close(run)


def test_both_sides_send_big_buffers_at_once_without_waiting_for_each_other():
    """A send never blocks its task: 8 MB each way at the same time, more than any socket
    buffer takes, still completes (what does not fit goes on in the sender thread)."""
    mesh, nodes = _pair(local=False)
    try:
        links = _links(mesh, nodes)
        big = [np.full(1 << 20, r, np.float64) for r in (0, 1)]
        got = [None, None]

        def swap(r):
            links[r].send([1 - r], "g", big[r])
            got[r] = links[r].recv(1 - r, "g")

        threads = [threading.Thread(target=swap, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got[0].tobytes() == big[1].tobytes() and got[1].tobytes() == big[0].tobytes()
    finally:
        for n in nodes:
            n.close()


def _stranger(host: str, port: int, run: str, secret: bytes) -> bytes:
    """Connect as a peer that does not know the secret (``secret`` is a guess); returns
    what the listener answered before it closed the connection."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(wire.HELLO + run.encode() + struct.pack("!I", 1) + os.urandom(wire.NONCE))
        answer = b""
        try:
            answer = sock.recv(wire.NONCE + 32)
            sock.sendall(os.urandom(32))       # its "proof"
            rest = sock.recv(1)
        except OSError:
            rest = b""
        return answer + rest


def test_a_stranger_that_does_not_know_the_secret_is_refused():
    mesh, nodes = _pair(local=False)
    try:
        host, port = mesh.places[0].host, mesh.places[0].port
        answer = _stranger(host, port, mesh.run, b"guess")
        assert len(answer) == wire.NONCE + 32        # a challenge, then nothing: no b"\x01"
        # nor does a peer of another mesh get in, or anything that is not a peer at all
        assert _stranger(host, port, "0" * 32, b"guess") == b""
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
            assert sock.recv(100) == b""
        time.sleep(0.2)
        assert nodes[0].ins == {}                   # no stranger became a peer
        # and the real peer still gets in afterwards
        a, b = _links(mesh, nodes)
        a.send([1], "x", np.ones(3))
        assert b.recv(0, "x").tolist() == [1.0, 1.0, 1.0]
    finally:
        for n in nodes:
            n.close()


def test_a_listener_refuses_a_peer_that_cannot_prove_the_secret():
    """The other way round: a participant with the wrong secret cannot connect to a real
    listener, and says why."""
    mesh, nodes = _pair(local=False)
    try:
        impostor = p2p.Node(mesh.run, b"not the secret", 1, "127.0.0.1", None, None, False)
        with pytest.raises(p2p.PeerLost, match="does not know the mesh's secret"):
            impostor.link(mesh, [0], [], 2.0)
        impostor.close()
    finally:
        for n in nodes:
            n.close()


def test_tls_where_the_cluster_has_it_and_a_plain_stranger_is_refused():
    mesh, nodes = _pair(local=False, tls=True)
    try:
        a, b = _links(mesh, nodes)
        assert isinstance(nodes[0].outs[1].sock, ssl.SSLSocket)
        assert isinstance(nodes[1].ins[0].sock, ssl.SSLSocket)
        value = np.random.default_rng(1).standard_normal(200_000).astype(np.float32)
        a.send([1], "g", value)
        assert b.recv(0, "g").tobytes() == value.tobytes()
        # a plain-TCP stranger gets no challenge: the TLS handshake fails first
        assert _stranger(mesh.places[0].host, mesh.places[0].port, mesh.run, b"?") == b""
    finally:
        for n in nodes:
            n.close()


def test_listeners_sit_on_the_workers_host_only_while_the_mesh_lasts():
    mesh, nodes = _pair(local=True)
    place = mesh.places[0]
    assert place.host == "127.0.0.1"
    assert nodes[0].listeners[0].getsockname()[0] == "127.0.0.1"
    folder = os.path.dirname(place.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700     # only this user can connect
    for n in nodes:
        n.close()
    assert not os.path.exists(folder)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((place.host, place.port), timeout=2)


def test_a_peer_that_goes_away_ends_the_wait_at_once():
    mesh, nodes = _pair()
    try:
        a, b = _links(mesh, nodes)
        threading.Timer(0.3, nodes[0].abort, ("its window failed",)).start()
        start = time.monotonic()
        with pytest.raises(p2p.PeerLost, match="closed its connection"):
            b.recv(0, "never sent")
        assert time.monotonic() - start < 5
        with pytest.raises(p2p.PeerLost, match="already failed"):
            nodes[0].link(mesh, [1], [1], 1.0)
    finally:
        for n in nodes:
            n.close()


def test_a_peer_that_says_nothing_ends_the_wait_after_the_timeout():
    mesh, nodes = _pair()
    try:
        a, b = _links(mesh, nodes, timeout=0.5)
        start = time.monotonic()
        with pytest.raises(p2p.PeerLost, match="no message from rank 0 within 0.5 s"):
            b.recv(0, "never sent")
        assert 0.4 < time.monotonic() - start < 5
    finally:
        for n in nodes:
            n.close()


def test_a_peer_that_never_connects_ends_the_wait_after_the_timeout():
    mesh, nodes = _pair()
    try:
        with pytest.raises(p2p.PeerLost, match=r"rank\(s\) \[1\] did not connect within 0.3 s"):
            nodes[0].link(mesh, [], [1], 0.3)
    finally:
        for n in nodes:
            n.close()


def test_the_next_window_waits_for_the_one_before_however_long_it_runs():
    """A window launched while the one before runs (a worker of several threads) waits for
    it past the peer timeout while it runs here, and no longer once none runs."""
    mesh, nodes = _pair()
    try:
        a, _ = _links(mesh, nodes)                          # window 0 runs on rank 0 ...
        threading.Timer(0.8, nodes[0].done, args=(0,)).start()      # ... for 0.8 s
        start = time.monotonic()
        nodes[0].turn(0, 0.2)                               # four timeouts: it waited
        assert 0.7 < time.monotonic() - start < 5
        start = time.monotonic()
        with pytest.raises(p2p.PeerLost, match="the window of step 7 did not end here "
                                               "within 0.2 s"):
            nodes[0].turn(7, 0.2)                           # none runs: the timeout holds
        assert time.monotonic() - start < 2
    finally:
        for n in nodes:
            n.close()


def test_a_window_task_on_a_worker_of_no_mesh_is_misplaced():
    with pytest.raises(p2p.Misplaced):
        p2p.node("0" * 32, 0)


def test_a_mesh_no_window_used_for_long_closes_itself(monkeypatch):
    """A driver that died cannot close its mesh: each participant closes its part once no
    window has used it for IDLE_S (here 0.1 s), and not while a window runs."""
    monkeypatch.setattr(p2p, "IDLE_S", 0.1)
    run, secret = p2p.new_run()
    place = p2p.listen(run, secret, 0, "127.0.0.1", None, None, False)
    mesh = p2p.Mesh(run, ("w0",), (place,))
    link = p2p.node(run, 0).link(mesh, [], [], 1.0)        # a window runs
    time.sleep(0.5)
    assert run in p2p.open_nodes()
    p2p.node(run, 0).done()
    deadline = time.monotonic() + 5
    while run in p2p.open_nodes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run not in p2p.open_nodes() and link.messages == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((place.host, place.port), timeout=2)
