"""Ranks on GPU nodes: each worker rank takes its own GPU, and says what it has.

The k-th worker rank of a node (counted by ``MPI_COMM_TYPE_SHARED``) takes the
k-th GPU of the node's ``CUDA_VISIBLE_DEVICES`` (or of all its GPUs), round
robin, before CuPy is imported; the head takes none.  With
``cluster.device = "gpu"`` the head refuses a job in which no worker rank can
compute on a GPU, before the cluster starts.
"""
from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from typing import Any

from dtrain.core import arrays
from dtrain.core.config import Config


@dataclass(frozen=True)
class GpuReport:
    """What a worker rank has to compute on: its GPU, or why it has none."""

    rank: int
    host: str
    gpu: str | None         # the CUDA device id it took, if it can compute on it
    why: str = ""           # why not, when the config asks for a GPU and gpu is None


def local_rank(comm: Any = None) -> int:
    """This process's index among the ranks of ``comm`` on the same node (shared memory)."""
    from mpi4py import MPI
    comm = comm if comm is not None else MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def local_worker_index(comm: Any, is_worker: bool) -> int | None:
    """Index of this worker rank among the worker ranks on its node (None on the head).

    Collective: every rank of ``comm`` calls it.
    """
    from mpi4py import MPI
    workers = comm.Split(0 if is_worker else MPI.UNDEFINED, comm.Get_rank())
    if workers == MPI.COMM_NULL:
        return None
    try:
        return local_rank(workers)
    finally:
        workers.Free()


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else the node's GPUs."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    with contextlib.suppress(OSError):
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    return []


def gpu_for(index: int, gpus: list[str]) -> str | None:
    """The GPU for the ``index``-th worker rank of a node: round-robin over ``gpus``."""
    return gpus[index % len(gpus)] if gpus else None


def pin_gpu(device: str, index: int | None) -> str | None:
    """Give this worker rank its own GPU by setting ``CUDA_VISIBLE_DEVICES``.

    Only when ``device`` asks for GPUs (anything but ``"cpu"``), and before
    CuPy is imported.  Returns the GPU id chosen, or None.
    """
    if device == "cpu" or index is None:
        return None
    gpu = gpu_for(index, visible_gpus())
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    return gpu


def gpu_report(device_kind: str, rank: int, gpu: str | None) -> GpuReport:
    """This worker rank's report for the head, after :func:`pin_gpu` gave it ``gpu``.

    With ``cluster.device = "gpu"`` a pinned GPU counts only if CuPy can use it
    (CuPy is imported here, after ``CUDA_VISIBLE_DEVICES`` is set); otherwise the
    report says what is missing.  Other devices are reported as pinned.
    """
    host = socket.gethostname()
    if device_kind != "gpu":
        return GpuReport(rank, host, gpu)
    if gpu is None:
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = ("no GPU visible (no CUDA_VISIBLE_DEVICES, no /proc/driver/nvidia/gpus)"
               if listed is None else f"no GPU visible (CUDA_VISIBLE_DEVICES={listed!r})")
        return GpuReport(rank, host, None, why)
    if arrays.cupy() is None:
        return GpuReport(rank, host, None, f"GPU {gpu} visible but {arrays.gpu_problem()}")
    return GpuReport(rank, host, gpu)


def gpu_problem(config: Config, reports: list[GpuReport],
                uses_workers: bool = True) -> str | None:
    """The head's one line when ``cluster.device = "gpu"`` and no worker rank has a usable GPU.

    ``reports`` are the worker ranks' :func:`gpu_report` answers.  A run that
    computes on the head and ``uses_workers`` not at all (the serial strategy) is
    not checked.
    """
    if config.cluster.device != "gpu" or not uses_workers or \
            any(r.gpu is not None for r in reports):
        return None
    groups: dict[tuple[str, str], list[int]] = {}
    for r in sorted(reports, key=lambda r: r.rank):
        groups.setdefault((r.host, r.why), []).append(r.rank)
    details = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} "
                        f"{', '.join(map(str, ranks))} on {host}: {why}"
                        for (host, why), ranks in groups.items())
    return (f"cluster.device = 'gpu' but none of the {len(reports)} worker rank(s) has a GPU "
            f"it can use ({details}); start the worker ranks on GPU nodes, one per GPU, or "
            f"use cluster.device = 'auto'")
