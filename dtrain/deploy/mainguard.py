"""A script that calls ``dtrain.train()`` with no ``if __name__ == "__main__":`` guard.

A LocalCluster's worker processes are started with multiprocessing's "spawn": each child
imports the parent's main script again (as ``__mp_main__``) before it runs anything, so a
script that trains at its top level trains again in every worker process while that is
still starting, and multiprocessing refuses with a wall of tracebacks.  The child side
(:func:`stop_if_bootstrapping`, called first by ``train()`` and ``resume()``) ends such a
child at once and quietly, leaving a mark; the parent side (:func:`watch`, around starting
the cluster) turns a failed start into one line on stderr and exit code 2 when a child
left it: a :class:`SystemExit`, as the script cannot go on and a traceback would only hide
the line.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dtrain.core.errors import EXIT_USER_ERROR

MARK = "DTRAIN_UNGUARDED_MAIN"      # names the file a spawned child writes to when it stops
CHILD_EXIT = 3                      # its exit code (the parent reports; nobody reads it)


def bootstrapping() -> bool:
    """Whether this process is a spawned child still importing its parent's main module."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def stop_if_bootstrapping() -> None:
    """End this process quietly if it is a spawned child re-running its parent's script: it
    touches the parent's mark file (see :func:`watch`) and exits, printing nothing."""
    if not bootstrapping():
        return
    mark = os.environ.get(MARK)
    if mark:
        with contextlib.suppress(OSError), open(mark, "a") as f:
            f.write("stopped\n")
    raise SystemExit(CHILD_EXIT)


def _script() -> str:
    """The main script's name, as the message gives it."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return Path(path).name if path else "your script"


def unguarded_message() -> str:
    """What the parent says when its spawned children stopped."""
    return (f"dtrain: error: the worker processes re-ran {_script()} as they started "
            f"(multiprocessing 'spawn' imports the main script again) and started dtrain "
            f"there; put the code that calls dtrain.train() or an estimator's fit() under "
            f'if __name__ == "__main__":')


@contextlib.contextmanager
def watch() -> Iterator[None]:
    """Around starting worker processes: if one of them stopped in
    :func:`stop_if_bootstrapping`, whatever the start raised becomes one line on stderr and
    ``SystemExit(2)``."""
    fd, name = tempfile.mkstemp(prefix="dtrain-guard-")     # empty until a child writes
    os.close(fd)
    old = os.environ.get(MARK)
    os.environ[MARK] = name
    try:
        try:
            yield
        except Exception:
            if os.path.getsize(name):
                print(unguarded_message(), file=sys.stderr)
                raise SystemExit(EXIT_USER_ERROR) from None
            raise
    finally:
        if old is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = old
        with contextlib.suppress(OSError):
            os.unlink(name)
