"""Another process on the same machine, knowing nothing of a dtrain run, tries to run code in it.

``python tests/helpers/stranger.py PID WORKERS`` (with ``tests/`` on ``PYTHONPATH``): waits
until the process ``PID`` and at least ``WORKERS`` of its children listen, then, on every TCP
port that process tree listens on, calls ``distributed.Client`` twice, as a stranger would:
with no certificate (``tcp://``) and with a certificate of its own (``tls://``,
``Security.temporary()``: another run's).  Where a client connects it calls
``client.run(os.getpid)``.  Prints one JSON line:
``tried`` (``[pid, address, port]`` each), ``ran`` (what ran code: ``[port, how, pids]``),
``refused`` and ``hung`` (counts of attempts that failed, or did not finish within
``TRY_S``: an HTTP server never answers Dask's handshake), ``alive`` (every attempt that
finished did so while the tree still listened: they met a running cluster).

Used by ``tests/test_strangers.py``, and importable (:func:`attack`).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from distributed import Client, Security

from helpers.sockets import Listener, family, listening

TRY_S = 4.0         # a client's time to connect
WAIT_S = 120.0      # for the cluster to listen


def _listeners(pid: int) -> set[Listener]:
    return {item for item in listening(family(pid)) if item[0] and item[2]}


def wait_for(pid: int, workers: int, wait: float = WAIT_S) -> set[Listener]:
    """What the tree under ``pid`` listens on, once ``pid`` and ``workers`` children do."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        found = _listeners(pid)
        if pid in {p for p, _, _ in found} and len({p for p, _, _ in found} - {pid}) >= workers:
            time.sleep(0.5)                 # the last worker's listeners, all of them
            return _listeners(pid)
        time.sleep(0.1)
    raise SystemExit(f"stranger: {pid} did not listen with {workers} worker(s) in {wait:g} s")


def _try(address: str, how: str, security: Security | None, out: list) -> None:
    try:
        with Client(address, timeout=TRY_S, security=security) as client:
            ran = client.run(os.getpid)
        out.append(("ran", how, sorted(ran.values()), time.monotonic()))
    except Exception as exc:        # refused: what a stranger should see
        out.append(("refused", how, type(exc).__name__, time.monotonic()))


class _Gone(threading.Thread):
    """When the tree under ``pid`` stopped listening on all of ``listeners``."""

    def __init__(self, pid: int, listeners: set[Listener]) -> None:
        super().__init__(daemon=True)
        self.pid, self.listeners, self.at = pid, listeners, float("inf")

    def run(self) -> None:
        while _listeners(self.pid) & self.listeners:
            time.sleep(0.05)
        self.at = time.monotonic()


def attack(listeners: set[Listener], pid: int = 0) -> dict:
    """Every way in, side by side; what came of them (with ``pid``: whether they met the
    tree under it still listening)."""
    gone = _Gone(pid, listeners)
    if pid:
        gone.start()
    theirs = Security.temporary()               # another run's certificate
    results: dict[tuple[int, str], list] = {}
    threads = []
    for _, ip, port in sorted(listeners):
        host = f"[{ip}]" if ":" in ip else ip
        for how, scheme, security in (("no certificate", "tcp", None),
                                      ("another certificate", "tls", theirs)):
            out = results.setdefault((port, how), [])
            thread = threading.Thread(target=_try, args=(f"{scheme}://{host}:{port}", how,
                                                         security, out), daemon=True)
            thread.start()
            threads.append(thread)
    deadline = time.monotonic() + TRY_S + 6
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    ran = [[port, how, got[0][2]] for (port, how), got in results.items()
           if got and got[0][0] == "ran"]
    refused = sum(1 for got in results.values() if got and got[0][0] == "refused")
    hung = sum(1 for got in results.values() if not got)
    alive = all(got[0][3] < gone.at for got in results.values() if got)
    return {"tried": sorted(listeners), "ran": ran, "refused": refused, "hung": hung,
            "alive": alive}


def main() -> None:
    pid, workers = int(sys.argv[1]), int(sys.argv[2])
    found = wait_for(pid, workers)
    said = attack(found, pid)
    print(json.dumps(said), flush=True)


if __name__ == "__main__":
    main()
