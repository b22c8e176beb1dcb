"""What a process and its children listen on: every listening TCP/UDP socket, read with psutil.

Shared by ``test_listening.py`` and the scripts it runs in fresh processes.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterable

import psutil

Listener = tuple[int, str, int]          # (pid, local address, port)


def family(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants (a cluster's worker processes)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def listening(procs: Iterable[psutil.Process]) -> set[Listener]:
    """Every listening TCP socket and every bound UDP socket of ``procs``."""
    found: set[Listener] = set()
    for proc in procs:
        try:
            conns = proc.net_connections(kind="inet")
        except psutil.Error:                  # it ended meanwhile
            continue
        for conn in conns:
            if conn.status == psutil.CONN_LISTEN or (conn.type == socket.SOCK_DGRAM and
                                                     conn.laddr and not conn.raddr):
                found.add((proc.pid, conn.laddr.ip, conn.laddr.port))
    return found


def loopback(ip: str) -> bool:
    """``ip`` is in 127.0.0.0/8 or is ::1 (or an IPv4-mapped loopback address)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def outside_loopback(found: Iterable[Listener]) -> list[Listener]:
    """The listeners of ``found`` that other machines could reach."""
    return sorted(item for item in found if not loopback(item[1]))


class Watch:
    """Everything the tree under ``pid`` listens on, polled every ``every`` seconds from a
    thread until :meth:`stop` (use as a context manager)."""

    def __init__(self, pid: int, every: float = 0.05) -> None:
        self.pid, self.every = pid, every
        self.seen: set[Listener] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen |= listening(family(self.pid))
            self._stop.wait(self.every)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> set[Listener]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.seen


def poll_until_exit(proc, every: float = 0.05) -> set[Listener]:   # noqa: ANN001 (a Popen)
    """What ``proc`` (a :class:`subprocess.Popen`) and its children listened on while it ran."""
    with Watch(proc.pid, every) as watch:
        while proc.poll() is None:
            time.sleep(every)
    return watch.seen
