"""A process's allocator statistics (glibc's ``mallinfo2``), for the tests that memory does
not grow."""
from __future__ import annotations

import ctypes


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def mallinfo2() -> MallInfo2 | None:
    """This process's allocator statistics (``uordblks``: heap bytes in use, ``hblkhd``:
    bytes mapped outside the heaps); None without glibc 2.33+."""
    from dtrain.core.allocator import libc

    fn = getattr(libc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = MallInfo2
    return fn()
