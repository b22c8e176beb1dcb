"""How dtrain's computing processes allocate: glibc settings that keep freed memory.

A training step allocates the same few buffers again and again; handing them back to the
operating system between steps makes every step page-fault them in afresh.  The settings
are applied by environment (:data:`ALLOCATOR_ENV`: glibc reads it when a process starts;
how local clusters' nannies, batch jobs and core processes start theirs) or in a running
process (:func:`keep_freed_memory`, before it starts the threads that compute).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, to hand freed memory back to the
# OS.  Setting it also pins glibc's mmap threshold at 128 KiB, so every larger array is a fresh
# mmap that page-faults on first touch: the update of a 0.8 M-parameter state takes 4.9 ms
# instead of 1.8.  A training step allocates the same few buffers again and again, so dtrain's
# workers keep freed memory, as a GPU framework's caching allocator does: arrays up to 512 MiB
# come from the heap, trimmed past 1 GiB free, and threads started from then on (the task
# threads) share the main heap, since a thread's own arena is capped at 64 MiB and maps anything
# larger afresh whatever the threshold.  The ceiling covers a full batch's activations (60k x
# 1024 float32 over 2 workers: 123 MB each): a forward-backward of 30k MNIST rows in a thread
# took 1.20-1.28 s with 2,000 page faults, 1.10-1.15 s with none.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8     # glibc's mallopt parameters
MMAP_THRESHOLD, TRIM_THRESHOLD, ARENA_MAX = 512 << 20, 1 << 30, 1


# The same settings as environment variables, which glibc reads when a process starts: how
# the nannies of dtrain's local clusters start their workers (Dask's own MALLOC_TRIM_THRESHOLD_
# is among the variables this replaces), batch jobs, and a worker's core processes.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
                 "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
                 "MALLOC_ARENA_MAX": str(ARENA_MAX)}


@functools.lru_cache(maxsize=1)
def libc() -> Any | None:
    """The C library of this process (None where it cannot be loaded)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Set this process's glibc allocator parameters as above; False without glibc."""
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(_M_ARENA_MAX, ARENA_MAX))
