"""Which Dask cluster an estimator trains on, and the embedded one it starts when it has none.

An estimator given ``client=`` uses it.  Without one, Dask inputs use the
process's default client (``distributed.default_client()``) if there is
one.  Everything else runs on the **embedded cluster**: one LocalCluster per
process (``[cluster]``'s defaults, as ``python -m dtrain`` starts: one worker
process with a thread per core, the hybrid layout; no dashboard; listening on 127.0.0.1 only,
on TLS with a certificate made for it: :mod:`dtrain.deploy.local`), started by the first
estimator that needs it and shared by all the estimators of the process after that, so that
scikit-learn's meta-estimators (``GridSearchCV``, ``cross_val_score``), which
fit many clones, pay its start once.  It closes when the process exits
(``atexit``), or with :func:`close_embedded`.  Its client is not made Dask's
default client, so the user's own Dask computations stay where they were.
The workers are processes started with ``spawn``: a script that fits an
estimator without a client needs ``if __name__ == "__main__":``.

A process that cannot start worker processes gets an **in-process cluster**
instead: one worker of threads (as many as the layout gives a worker
process) in this process, which has no port to protect.  That is a joblib worker
(``GridSearchCV(n_jobs=2)``, ``cross_val_score(n_jobs=-1)``: loky sets its own start method, which a
spawned child cannot find, "cannot find context for 'loky'") and any daemonic
process (multiprocessing's pools: "daemonic processes are not allowed to have
children").  Such a process is already one of several running side by side,
so threads are what it should add; and an in-process cluster starts in a
fraction of a second.  The maths, and so the bytes, are the same.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import threading

from distributed import Client, LocalCluster

from dtrain.core.config import ClusterConfig
from dtrain.core import broadcast
from dtrain.deploy import mainguard
from dtrain.deploy.layout import local_shape
from dtrain.deploy.local import local_cluster
from dtrain.deploy.logs import QuietRefusals, lost_gathers_quiet, quiet_refusals
from dtrain.deploy.options import security_for, started_by_dtrain

START_METHODS = ("spawn", "fork", "forkserver")    # what a child process can be started with

_lock = threading.Lock()
_embedded: list[tuple[LocalCluster, Client]] = []     # at most one: the process's


def embedded() -> Client:
    """The client of the process's embedded LocalCluster, started on first use."""
    with _lock:
        if _embedded and _embedded[0][1].status in ("running", "connecting", "newly-created"):
            return _embedded[0][1]
        _close()
        mainguard.stop_if_bootstrapping()   # a script without its __main__ guard: one line
        cfg = ClusterConfig(dashboard_address="")
        security = security_for(cfg)
        if not can_start_processes():
            cluster, security = in_process(cfg), None
        else:
            quiet_refusals()        # its scheduler and nannies run in this process
            with mainguard.watch():
                cluster = local_cluster(cfg, security)
        try:
            with lost_gathers_quiet():      # a worker lost as it starts: the fit says so
                client = Client(cluster, security=security, set_as_default=False)
                if security is not None:
                    broadcast.register(client, QuietRefusals())
        except BaseException:
            cluster.close()
            raise
        broadcast.keep(client)          # dtrain's own: its plugins stay between fits
        started_by_dtrain(client)
        _embedded.append((cluster, client))
        return client


def can_start_processes() -> bool:
    """Whether this process can start worker processes: not a daemon, and with a start
    method a child can use (a joblib/loky worker's is ``"loky"``)."""
    if multiprocessing.current_process().daemon:
        return False
    return multiprocessing.get_start_method(allow_none=True) in (None, *START_METHODS)


def in_process(cfg: ClusterConfig) -> LocalCluster:
    """A cluster of one worker of threads in this process (``cfg``'s layout's threads)."""
    return LocalCluster(n_workers=1, threads_per_worker=local_shape(cfg).threads,
                        processes=False, dashboard_address=None, silence_logs=logging.ERROR)


def close_embedded() -> None:
    """Close the embedded cluster, if one is running (a later fit starts a new one)."""
    with _lock:
        _close()


def _close() -> None:
    while _embedded:
        cluster, client = _embedded.pop()
        client.close()
        cluster.close()


atexit.register(close_embedded)


def client_for(given: Client | None, dask_input: bool) -> Client:
    """``given``; else, for Dask inputs, the default client if there is one; else the
    embedded cluster's."""
    if given is not None:
        return given
    if dask_input:
        from distributed import default_client

        try:
            return default_client()
        except ValueError:                    # no default client in this process
            pass
    return embedded()
