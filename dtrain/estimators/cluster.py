"""Which Dask cluster an estimator trains on, and the embedded one it starts when it has none.

An estimator given ``client=`` uses it.  Without one, Dask inputs use the
process's default client (``distributed.default_client()``) if there is
one.  Everything else runs on the **embedded cluster**: one LocalCluster per
process (``[cluster]``'s defaults, as ``python -m dtrain`` starts: one worker
process with a thread per core, the hybrid layout; no dashboard; listening on 127.0.0.1 only:
:mod:`dtrain.deploy.local`), started by the first estimator that
needs it and shared by all the estimators of the process after that, so that
scikit-learn's meta-estimators (``GridSearchCV``, ``cross_val_score``), which
fit many clones, pay its start once.  It closes when the process exits
(``atexit``), or with :func:`close_embedded`.  Its client is not made Dask's
default client, so the user's own Dask computations stay where they were.
The workers are processes started with ``spawn``: a script that fits an
estimator without a client needs ``if __name__ == "__main__":``.
"""
from __future__ import annotations

import atexit
import threading

from distributed import Client, LocalCluster

from dtrain.core.config import ClusterConfig
from dtrain.deploy import mainguard
from dtrain.deploy.local import local_cluster
from dtrain.deploy.options import security_for

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
        security = security_for(cfg, deployed=False)
        with mainguard.watch():
            cluster = local_cluster(cfg, security)
        try:
            client = Client(cluster, security=security, set_as_default=False)
        except BaseException:
            cluster.close()
            raise
        _embedded.append((cluster, client))
        return client


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
