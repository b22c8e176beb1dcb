"""Signals: the driver alone decides how a run ends.

Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (what SLURM's ``--signal`` sends before
the walltime) ask the driver to stop at the next window edge, where it saves
a checkpoint (:class:`StopSignals`); a second Ctrl-C stops at once.  Worker
processes leave those signals to the driver: a terminal's Ctrl-C reaches the
whole process group, and a worker that died of it would print a traceback and
cost the run its shards (:class:`WorkersIgnoreInterrupts`,
:func:`ignore_stop_signals`).
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from distributed import WorkerPlugin

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """While entered (in the main thread), the first of :data:`STOP_SIGNALS` is recorded in
    :attr:`requested` (its name) for the training loop to act on at its next step
    boundary; a second SIGINT raises KeyboardInterrupt at once, after quieting the logs of
    the cluster's shutdown.  Outside the main thread it records nothing: the code that owns
    the process owns its signals."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            quiet_shutdown()
            raise KeyboardInterrupt
        if self.requested is None:
            self.requested = name
            self.event.set()


def quiet_shutdown() -> None:
    """Keep a cut-short run's shutdown off the console: distributed and asyncio log the
    connections and gathers it cuts, with tracebacks, although nothing is wrong (and
    distributed's ``sync``, cut before its call began, a NameError in its ``cancel``).
    ``tornado.application`` is named too: distributed's logging config gives it a level of
    its own."""
    for name in ("distributed", "asyncio", "tornado", "tornado.application"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def ignore_stop_signals() -> None:
    """In a worker process: leave Ctrl-C, SIGTERM and SIGUSR1 to the driver, which closes
    the workers when it stops (call from the main thread)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class WorkersIgnoreInterrupts(WorkerPlugin):
    """Workers of a LocalCluster, restarted ones included, ignore Ctrl-C: the terminal sends
    it to their process group too, and the driver closes them."""

    name = "dtrain-workers-ignore-interrupts"
    idempotent = True

    def setup(self, worker: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
