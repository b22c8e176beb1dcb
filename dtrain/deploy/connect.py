"""Getting a Dask cluster for a run: an embedded LocalCluster, batch jobs, or a running scheduler.

(The MPI deployment, where the ranks are the cluster, is :mod:`dtrain.deploy.mpi`.)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed import Client

from dtrain.core.arrays import gpu_count
from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy import jobqueue
from dtrain.deploy.devices import require_gpu
from dtrain.deploy.layout import local_shape
from dtrain.deploy.local import local_cluster, local_gpu_cluster
from dtrain.deploy.options import security_for
from dtrain.deploy.workers import wait_for_workers


@contextlib.contextmanager
def connect(cfg: ClusterConfig, min_workers: int = 1, leaves: int = 0) -> Iterator[Client]:
    """A client on ``cfg.scheduler_address``, or on a cluster dtrain starts (a LocalCluster, or
    batch jobs) shaped by ``cfg.layout`` for a run that needs ``min_workers`` workers and
    computes ``leaves`` shards or slices (0: unknown; see :mod:`dtrain.deploy.layout`).

    Closes what it started on exit.  An unreachable scheduler is a
    :class:`~dtrain.core.errors.UserError` after ``cfg.timeout`` seconds.
    """
    if cfg.scheduler_address:
        try:
            client = Client(cfg.scheduler_address, timeout=cfg.timeout)
        except (OSError, TimeoutError) as exc:
            raise UserError(f"cannot reach the Dask scheduler at {cfg.scheduler_address} within "
                            f"{cfg.timeout:g} s ({type(exc).__name__}); check the address or start "
                            f"one with `dask scheduler`") from None
        with contextlib.closing(client):
            wait_for_workers(client, 1, cfg.timeout)
            yield client
        return
    if cfg.kind != "local":
        with jobqueue.connect(cfg, security_for(cfg, deployed=True), min_workers,
                              leaves) as client:
            yield client
        return
    security = security_for(cfg, deployed=False)
    gpus = gpu_count() if cfg.device != "cpu" else 0
    if cfg.device == "gpu":
        require_gpu("cluster.device = 'gpu'")
    shape = local_shape(cfg, min_workers, leaves)
    cluster = local_gpu_cluster(cfg, gpus, security, shape) if gpus else \
        local_cluster(cfg, security, shape)
    with cluster, Client(cluster, security=security) as client:
        yield client
