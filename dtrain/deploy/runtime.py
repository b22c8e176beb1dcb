"""A worker process's dtrain state, in one object held by a worker plugin.

The windows a worker runs leave state in its process between tasks: the runs whose
windows run here and those that ended (:mod:`dtrain.taskgraph.fuse`), the state a
window keeps for the next (:mod:`dtrain.taskgraph.handoff`), the meshes it takes part
in (:mod:`dtrain.deploy.p2p`), the connections of the window each thread runs
(:mod:`dtrain.taskgraph.span`).  All of it lives in this process's :class:`Runtime`,
each module in its own part (:meth:`Runtime.part`, made on first use), knowing nothing
of the others'.  On a Dask worker the :class:`RuntimePlugin` holds it
(``worker.plugins["dtrain-runtime"]``, as distributed's P2P shuffle keeps its state on
its worker plugin) and closes it when the worker closes: its meshes stop listening,
its kept states go.  Elsewhere (the driver, a test calling the functions directly)
the same object serves the process.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from distributed import WorkerPlugin

NAME = "dtrain-runtime"
T = TypeVar("T")


class Runtime:
    """This process's dtrain state, by part: ``part(name, make)`` is the part ``name``,
    made by ``make()`` the first time it is asked for."""

    def __init__(self) -> None:
        self._parts: dict[str, Any] = {}
        self._lock = threading.Lock()

    def part(self, name: str, make: Callable[[], T]) -> T:
        found = self._parts.get(name)
        if found is None:
            with self._lock:
                found = self._parts.get(name)
                if found is None:
                    found = self._parts[name] = make()
        return found

    def find(self, name: str) -> Any:
        """The part ``name`` if it was made, else None (nothing is made)."""
        return self._parts.get(name)

    def parts(self) -> list[str]:
        """The parts made so far (tests and diagnostics)."""
        with self._lock:
            return list(self._parts)

    def close(self) -> None:
        """Close every part that can be closed (``close()``), and forget them all."""
        with self._lock:
            parts, self._parts = list(self._parts.values()), {}
        for p in parts:
            close = getattr(p, "close", None)
            if callable(close):
                close()


_process = Runtime()


def here() -> Runtime:
    """This process's :class:`Runtime`."""
    return _process


class RuntimePlugin(WorkerPlugin):
    """Holds this worker process's :class:`Runtime` (``runtime``) from the worker's start,
    and closes it as the worker closes."""

    name = NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        self.runtime = here()

    def teardown(self, worker: Any) -> None:
        here().close()
