"""A user's Python script for the fault sweep (``tests/test_fault_sweep.py``) to deal faults to.

``python sweep_child.py train|fit``: for each ``go OUT`` line on stdin, calls
``dtrain.train()`` (the sweep's iris run, into ``OUT``) or fits a ``dtrain.MLPClassifier`` on
iris (on the embedded cluster), printing ``MARK call`` before the call and ``MARK back``
after it (each epoch's line between them).  Then it waits for an ``on`` line (the sweep
deals no fault after that), resumes a stopped run as ``Stopped``'s lines say, closes the
embedded cluster, and prints one ``RESULT`` line of JSON: how the call ended, what was
resumed, a digest of what it trained, the signals that reached the script's own handlers
while dtrain's call ran, and what was left behind (processes, threads, sockets).  The calls
run one after the other in this one process, as a notebook's would: each must leave the
process as it found it.
"""
from __future__ import annotations

import hashlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

OUTSIDE: list[tuple[str, float]] = []


def _outside(signum: int, frame: object) -> None:
    """The script's own handler: a stop signal that comes outside dtrain's calls."""
    OUTSIDE.append((signal.Signals(signum).name, time.monotonic()))


for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(_sig, _outside)

import numpy as np      # noqa: E402  (after the handlers: the sweep deals nothing before a call)
import psutil           # noqa: E402
from sklearn.datasets import load_iris     # noqa: E402

import dtrain           # noqa: E402
from dtrain import MLPClassifier            # noqa: E402
from dtrain.estimators.cluster import close_embedded       # noqa: E402

SETTINGS = ["train.epochs=12", "graph.window=7", "cluster.dashboard_address="]
GLOBAL_THREADS = {"MainThread", "Dask-Offload_0"}   # distributed's offload executor: one a process


def _say(line: str) -> None:
    print(line, flush=True)


def _left() -> dict[str, list[str]]:
    """What this process holds beyond a fresh one's and distributed's own, after a grace:
    child processes (multiprocessing's resource tracker aside), threads, inet sockets."""
    me = psutil.Process()
    deadline = time.monotonic() + 10
    while True:
        children = [c for c in me.children(recursive=True)
                    if "resource_tracker" not in " ".join(c.cmdline())]
        threads = sorted(t.name for t in threading.enumerate() if t.name not in GLOBAL_THREADS)
        sockets = [f"{c.status} {c.laddr}" for c in me.net_connections(kind="inet")]
        if not (children or threads or sockets) or time.monotonic() > deadline:
            return {"processes": [" ".join(c.cmdline())[:80] for c in children],
                    "threads": threads, "sockets": sockets}
        time.sleep(0.1)


def once(mode: str, out: str, config: dtrain.Config, X: np.ndarray, y: np.ndarray) -> None:
    ended: dict[str, object] = {}
    trained = None
    OUTSIDE.clear()
    clf = MLPClassifier(hidden_layer_sizes=(16,), max_iter=12, random_state=0, batch_size=16,
                        verbose=True)
    _say("MARK call")
    called = time.monotonic()
    try:
        if mode == "train":
            dtrain.train(config, out=out, echo=_say)
            trained = hashlib.sha256(Path(out, "params.npz").read_bytes()).hexdigest()
        else:
            clf.fit(X, y)
            trained = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in
                                              clf.coefs_ + clf.intercepts_)).hexdigest()
        ended["how"] = "returned"
    except dtrain.Stopped as exc:
        ended.update(how="Stopped", code=exc.code, signal=exc.signal, lines=exc.lines(),
                     run_dir=str(exc.run_dir) if exc.run_dir is not None else None)
    except KeyboardInterrupt:
        ended["how"] = "KeyboardInterrupt"
    returned = time.monotonic()
    _say("MARK back")
    sys.stdin.readline()                    # "on": no fault comes after this
    resumed = None
    if ended["how"] == "Stopped" and len(ended["lines"]) == 2:     # where to resume from
        dtrain.resume(out, echo=None)
        resumed = hashlib.sha256(Path(out, "params.npz").read_bytes()).hexdigest()
    close_embedded()                        # (a fit's cluster is the process's: it stays)
    during = [name for name, at in OUTSIDE if called <= at <= returned]
    _say("RESULT " + json.dumps({"ended": ended, "trained": trained, "resumed": resumed,
                                 "during": during, "left": _left()}))


def main(mode: str) -> None:
    config = dtrain.load_config(None, SETTINGS)
    X, y = load_iris(return_X_y=True)
    _say("MARK ready")
    for line in sys.stdin:
        if line.startswith("go "):
            once(mode, line[3:].strip(), config, X, y)


if __name__ == "__main__":
    main(sys.argv[1])
