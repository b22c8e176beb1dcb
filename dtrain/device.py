"""CPU or GPU: finding CUDA devices, moving arrays, and measuring each worker's speed.

dtrain's maths takes its array module from its inputs (NumPy or CuPy), so a
shard that lives in GPU memory is computed on the GPU by the same functions.
What this module decides is where arrays live: shards on a GPU worker are
CuPy arrays from their loading task on; a value goes back to host memory only
when it must cross to another worker (distributed would otherwise copy it
through the host anyway, and a CPU worker could not read it).
"""
from __future__ import annotations

import functools
import os
import time
from typing import Any

import numpy as np

from dtrain.errors import UserError

GPU = "GPU"           # the Dask worker resource a GPU worker advertises


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[Any, str]:
    """``(cupy module or None, why not)``, looked up once per process."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return None, f"CuPy cannot be imported ({type(exc).__name__}: {exc}); install it with " \
                     f"pip install 'dtrain[gpu]'"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return None, f"CuPy {cupy.__version__} found no usable CUDA device ({exc})"
    if count < 1:
        return None, f"CuPy {cupy.__version__} sees 0 CUDA devices " \
                     f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    return cupy, ""


def cupy() -> Any | None:
    """The CuPy module if this process can use a CUDA GPU, else None."""
    return _probe()[0]


def problem() -> str:
    """Why this process cannot compute on a GPU ("" if it can)."""
    return _probe()[1]


def gpu_count() -> int:
    """CUDA devices this process can see."""
    cp = cupy()
    return int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 0


def require_gpu(what: str) -> None:
    """Raise a one-line UserError saying what was looked for, if there is no GPU here."""
    if cupy() is None:
        raise UserError(f"{what} but there is no GPU here: {_probe()[1]}")


def is_gpu_worker(info: dict[str, Any]) -> bool:
    """Whether a worker (``scheduler_info()["workers"][addr]``) advertises a GPU."""
    return (info.get("resources") or {}).get(GPU, 0) >= 1


def on_device(x: Any, gpu: bool) -> Any:
    """``x`` in GPU memory if ``gpu`` and this worker has a usable GPU, else unchanged."""
    cp = cupy() if gpu else None
    return cp.asarray(x) if cp is not None else x


def like(x: Any, ref: Any) -> Any:
    """``x`` in the same memory (host or device) as ``ref``."""
    if type(ref).__module__.startswith("cupy"):
        return cupy().asarray(x)
    return to_host(x)


def to_host(x: Any) -> Any:
    """A NumPy array (a CuPy array is copied to the host)."""
    return x.get() if type(x).__module__.startswith("cupy") else x


def throughput(net, rows: int, gpu: bool, repeats: int = 3) -> float:
    """Samples per second of a forward-backward pass of ``net`` here, on ``rows`` random
    samples (on the GPU if ``gpu`` and there is one): the calibration task."""
    rng = np.random.default_rng(0)
    x = on_device(rng.standard_normal((rows, net.layers[0])).astype(net.dtype), gpu)
    y = on_device(rng.integers(0, net.layers[-1], rows), gpu)
    params = on_device(net.init(0), gpu)
    net.loss_and_grad(params, x, y)                    # warm up (kernels, BLAS threads)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buf = net.loss_and_grad(params, x, y)
        float(buf[-1])                                 # wait for the device
        best = min(best, time.perf_counter() - start)
    return rows / max(best, 1e-9)
