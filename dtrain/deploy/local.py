"""An embedded LocalCluster on this machine: CPU worker processes (as ``cluster.layout`` says),
or one worker per GPU.

It listens on 127.0.0.1 only: the scheduler, the nannies and the workers (and the workers'
own HTTP servers, which follow their address), unless ``cluster.interface`` names a network
interface; the scheduler's HTTP server (the dashboard, or without one ``/health`` and
``/metrics``) where :func:`~dtrain.deploy.options.http_address` says.
"""
from __future__ import annotations

import logging
import os

from distributed import LocalCluster, Nanny, Scheduler, Security, SpecCluster

from dtrain.core.arrays import gpu_count
from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy.devices import GPU
from dtrain.deploy.layout import Shape, local_shape
from dtrain.deploy.options import LOOPBACK, http_address
from dtrain.deploy.tuning import allocator_env


def binding(cfg: ClusterConfig) -> dict[str, str]:
    """Where the scheduler and the workers listen: ``cluster.interface``'s address if it
    names one, else loopback."""
    return {"interface": cfg.interface} if cfg.interface else {"host": LOOPBACK}


def local_cluster(cfg: ClusterConfig, security: Security | None = None,
                  shape: Shape | None = None) -> LocalCluster:
    """Worker processes on this machine: ``shape``, or what ``cfg`` says
    (:func:`~dtrain.deploy.layout.local_shape`)."""
    shape = shape or local_shape(cfg)
    dash = cfg.dashboard_address
    with allocator_env():
        return LocalCluster(n_workers=shape.workers, threads_per_worker=shape.threads,
                            processes=True, silence_logs=logging.ERROR, security=security,
                            **binding(cfg), dashboard_address=http_address(dash) if dash else None,
                            # without a dashboard the scheduler still serves /health and
                            # /metrics: on a free port of 127.0.0.1, not all interfaces
                            scheduler_kwargs={"dashboard_address": http_address(dash)})


def local_gpu_cluster(cfg: ClusterConfig, gpus: int, security: Security | None = None,
                      shape: Shape | None = None) -> SpecCluster:
    """One worker per visible GPU (each sees only its own device and advertises a ``GPU``
    resource; ``cluster.threads_per_worker`` threads, or 1), plus, with ``device = "auto"``,
    CPU workers of ``shape`` up to its worker count."""
    shape = shape or local_shape(cfg)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(gpus)]
    found = gpu_count()
    if gpus > len(ids) or (found and gpus > found):
        raise UserError(f"{gpus} GPU worker(s) asked for, but this machine shows "
                        f"{min(len(ids), found or len(ids))} GPU(s) (CUDA_VISIBLE_DEVICES="
                        f"{visible if visible is not None else 'unset'}): one worker per GPU; "
                        f"ask for at most that many")
    cpus = max(0, shape.workers - gpus) if cfg.device == "auto" else 0
    listen = {**binding(cfg), **({"security": security, "protocol": "tls://"} if security else {})}
    workers = {i: {"cls": Nanny, "options": {
        "name": i, "nthreads": (cfg.threads_per_worker or 1) if i < gpus else shape.threads,
        "silence_logs": logging.ERROR, **listen,
        **({"resources": {GPU: 1}, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}}
           if i < gpus else {})}} for i in range(gpus + cpus)}
    scheduler = {"cls": Scheduler, "options": {
        "dashboard": bool(cfg.dashboard_address), **listen,
        "dashboard_address": http_address(cfg.dashboard_address)}}
    with allocator_env():
        return SpecCluster(workers=workers, scheduler=scheduler, silence_logs=logging.ERROR,
                           security=security)
