"""An embedded LocalCluster on this machine: CPU worker processes (as ``cluster.layout`` says),
or one worker per GPU."""
from __future__ import annotations

import logging
import os

from distributed import LocalCluster, Nanny, Scheduler, Security, SpecCluster

from dtrain.core.config import ClusterConfig
from dtrain.deploy.devices import GPU
from dtrain.deploy.layout import Shape, local_shape
from dtrain.deploy.tuning import allocator_env


def local_cluster(cfg: ClusterConfig, security: Security | None = None,
                  shape: Shape | None = None) -> LocalCluster:
    """Worker processes on this machine: ``shape``, or what ``cfg`` says
    (:func:`~dtrain.deploy.layout.local_shape`)."""
    shape = shape or local_shape(cfg)
    # without a dashboard the scheduler still serves /health and /metrics: on any free port
    http = {} if cfg.dashboard_address else {"scheduler_kwargs": {"dashboard_address": ":0"}}
    with allocator_env():
        return LocalCluster(n_workers=shape.workers, threads_per_worker=shape.threads,
                            processes=True, dashboard_address=cfg.dashboard_address or None,
                            silence_logs=logging.ERROR, security=security, **http)


def local_gpu_cluster(cfg: ClusterConfig, gpus: int, security: Security | None = None,
                      shape: Shape | None = None) -> SpecCluster:
    """One worker per visible GPU (each sees only its own device and advertises a ``GPU``
    resource; ``cluster.threads_per_worker`` threads, or 1), plus, with ``device = "auto"``,
    CPU workers of ``shape`` up to its worker count."""
    shape = shape or local_shape(cfg)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    cpus = max(0, shape.workers - gpus) if cfg.device == "auto" else 0
    protocol = {"security": security, "protocol": "tls://"} if security else {}
    workers = {i: {"cls": Nanny, "options": {
        "name": i, "nthreads": (cfg.threads_per_worker or 1) if i < gpus else shape.threads,
        "silence_logs": logging.ERROR, **protocol,
        **({"resources": {GPU: 1}, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}}
           if i < gpus else {})}} for i in range(gpus + cpus)}
    scheduler = {"cls": Scheduler, "options": {
        "dashboard": bool(cfg.dashboard_address), **protocol,
        "dashboard_address": cfg.dashboard_address or ":0"}}
    with allocator_env():
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                           security=security)
