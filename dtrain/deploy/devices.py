"""GPU workers: the Dask resource they advertise, and the checks that one can compute."""
from __future__ import annotations

from typing import Any

from dtrain.core.arrays import cupy, gpu_problem
from dtrain.core.errors import UserError

GPU = "GPU"           # the Dask worker resource a GPU worker advertises


def require_gpu(what: str) -> None:
    """Raise a one-line UserError saying what was looked for, if there is no GPU here."""
    if cupy() is None:
        raise UserError(f"{what} but there is no GPU here: {gpu_problem()}")


def is_gpu_worker(info: dict[str, Any]) -> bool:
    """Whether a worker (``scheduler_info()["workers"][addr]``) advertises a GPU."""
    return (info.get("resources") or {}).get(GPU, 0) >= 1
