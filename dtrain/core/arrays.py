"""Arrays on the host or on a GPU: which module (NumPy or CuPy), moving them, CuPy found once.

dtrain's maths takes its array module from its inputs, so a shard that lives
in GPU memory is computed on the GPU by the same functions.  Shards on a GPU
worker are CuPy arrays from their loading task on; a value goes back to host
memory only when it must cross to another worker (distributed would copy it
through the host anyway, and a CPU worker could not read it).
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np


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


def gpu_problem() -> str:
    """Why this process cannot compute on a GPU ("" if it can)."""
    return _probe()[1]


def gpu_count() -> int:
    """CUDA devices this process can see."""
    cp = cupy()
    return int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 0


def on_gpu(x: Any) -> bool:
    """Whether ``x`` is a CuPy array (without importing CuPy)."""
    kind = type(x)
    return kind is not np.ndarray and kind.__module__.startswith("cupy")   # asked per op


def array_module(x: Any) -> Any:
    """NumPy or CuPy, whichever ``x`` belongs to."""
    return cupy() if on_gpu(x) else np


def to_host(x: Any) -> Any:
    """A NumPy array (a CuPy array is copied to the host)."""
    return x.get() if on_gpu(x) else x


def like(x: Any, ref: Any) -> Any:
    """``x`` in the same memory (host or device) as ``ref``."""
    return cupy().asarray(x) if on_gpu(ref) else to_host(x)


def on_device(x: Any, gpu: bool) -> Any:
    """``x`` in GPU memory if ``gpu`` and this process has a usable GPU, else unchanged."""
    cp = cupy() if gpu else None
    return cp.asarray(x) if cp is not None else x


def aligned(a: Any) -> Any:
    """``a``, copied if its data is not aligned to its item size.

    Arrays that Dask deserializes out of a merged network frame can start at
    any byte; NumPy and BLAS then take other code paths whose rounding
    differs, which would break bit-for-bit reproducibility.
    """
    flags = getattr(a, "flags", None)
    return a if getattr(flags, "aligned", True) else a.copy()


def align_on_unpickle(cls: type) -> type:
    """Class decorator: re-align the array fields named in ``cls._arrays`` of a frozen
    dataclass when it is unpickled."""
    def __setstate__(self, state):
        for name, value in state.items():
            object.__setattr__(self, name, aligned(value) if name in cls._arrays else value)
    cls.__setstate__ = __setstate__
    return cls


def sum_in_order(*arrays: Any) -> Any:
    """Elementwise sum, always left to right: the fixed order that makes results reproducible.

    Arrays in GPU memory are summed there; a host array joining them is copied over.
    A single array is returned as it is (callers never write into the result)."""
    if len(arrays) == 1:
        return arrays[0]
    ref = next((a for a in arrays if on_gpu(a)), arrays[0])
    with np.errstate(all="ignore"):   # overflow is caught as a non-finite loss
        total = like(arrays[0], ref) + like(arrays[1], ref)
        for a in arrays[2:]:
            total += like(a, ref)
    return total


class OnItsWay:
    """A small GPU array copied to the host without waiting for it: the copy is queued behind
    the work already queued (into page-locked memory, so it can be), and :meth:`value` waits
    only for that point of the stream, not for work queued after it.  A training step reads
    its loss this way, one step late, so the GPU never idles while the host catches up."""

    def __init__(self, a: Any):
        cp = cupy()
        import cupyx
        self.host = cupyx.empty_pinned(a.shape, a.dtype)
        cp.asnumpy(a, out=self.host, blocking=False)
        self.done = cp.cuda.Event()
        self.done.record()

    def value(self) -> np.ndarray:
        self.done.synchronize()
        return self.host
