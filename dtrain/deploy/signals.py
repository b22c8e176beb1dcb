"""Signals: the driver alone decides how a run ends.

Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (what SLURM's ``--signal`` sends before the
walltime) mean what the moment of the command or the run says (:class:`StopSignals`):

* **at once** (:data:`AT_ONCE`), while nothing has been made (the command parsed, the data
  read and planned): the signal raises where the code is, ``KeyboardInterrupt`` for Ctrl-C,
  :class:`~dtrain.core.errors.Stopped` for the others;
* **at the next window edge** (:data:`AT_EDGE`), from the moment a run makes anything (its
  directory, a cluster) to its last step: the signal is recorded, and the run stops at its
  next window edge after saving a checkpoint (or before its first window, if it comes
  while the cluster starts or the data loads); a second Ctrl-C stops at once;
* **settled** (:data:`SETTLED`), once the outcome is known (the last step is done, or the
  run is stopping): the signal is recorded and nothing raises, so the run's files are
  finished and nothing that cleans up is cut short.

Worker processes leave those signals to the driver: a terminal's Ctrl-C reaches the
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

from dtrain.core.errors import Stopped

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)

AT_ONCE = "at once"             # nothing made yet: raise where the code is
AT_EDGE = "at the next edge"    # a run under way: record; it stops at its next window edge
SETTLED = "settled"             # the outcome is known: record, never raise
MODES = (AT_ONCE, AT_EDGE, SETTLED)     # in the order a command or a run goes through them

_active: StopSignals | None = None      # the one whose handlers are in place (main thread)


class StopSignals:
    """The stop signals' handlers while entered (in the main thread), in one of the modes
    of this module (``mode``, changed by :meth:`at_edges` and :meth:`settle`).

    The first signal's name is kept in :attr:`requested`, for the training loop to act on
    at its next window edge.  Entered while another is (the command line around a run), it
    shares that one's handlers and state: ``with`` gives the outer object, set to this
    one's mode if that is later in :data:`MODES` (a mode never goes back), and leaving it
    settles the outer one (the run's outcome is known).  The
    outermost one puts the handlers before back when it is left, or, with
    ``ignore_after`` (a process whose exit code is now known), ignores the signals from
    then on, so that none can cut the process's exit short.  Outside the main thread it
    records nothing: the code that owns the process owns its signals.

    Parameters
    ----------
    mode
        :data:`AT_ONCE`, :data:`AT_EDGE` or :data:`SETTLED`.
    ignore_after
        Ignore the signals after the outermost one is left, rather than put the handlers
        before back.
    """

    def __init__(self, mode: str = AT_EDGE, ignore_after: bool = False) -> None:
        self.requested: str | None = None
        self.event = threading.Event()
        self.mode = mode
        self.ignore_after = ignore_after
        self._previous: dict[int, Any] = {}
        self._outer: StopSignals | None = None
        self._entered = False

    def __enter__(self) -> StopSignals:
        global _active
        if threading.current_thread() is not threading.main_thread():
            return self
        if _active is not None:
            self._outer = _active
            _active.mode = max(_active.mode, self.mode, key=MODES.index)   # never back
            return _active
        _active, self._entered = self, True
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        except BaseException:           # a signal raised at once, before the last was in
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        global _active
        if self._outer is not None:
            self._outer.settle()
            self._outer = None
            return
        if not self._entered:
            return
        self.mode = SETTLED
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.ignore_after else previous)
        self._previous.clear()
        self._entered, _active = False, None

    def at_edges(self) -> None:
        """The run starts making things: from now on a signal is acted on at a window edge."""
        if self.mode == AT_ONCE:
            self.mode = AT_EDGE

    def settle(self) -> None:
        """The outcome is known: from now on a signal is recorded, and nothing raises."""
        self.mode = SETTLED

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.mode == AT_ONCE:
            self.mode = SETTLED                 # one exception, and no other in its way out
            self.requested = self.requested or name
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Stopped.before_training(name)
        if self.requested is not None and signum == signal.SIGINT and self.mode == AT_EDGE:
            self.mode = SETTLED
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
