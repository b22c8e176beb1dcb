"""Logs: what dtrain keeps out of the console, and why, in one place.

Each filter drops one kind of message that would otherwise be printed with a
traceback although nothing is wrong, or although dtrain reports it better
itself; anything else still shows.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from distributed import Worker, WorkerPlugin
from distributed.core import Status

from dtrain.core.errors import REPORTED_BY_DRIVER, StateGone
from dtrain.deploy.p2p import Misplaced, PeerLost

# and a window whose peers failed, or whose state was not kept where it ran: the driver
# says it once, and runs the window again
_QUIET = REPORTED_BY_DRIVER + tuple(f"{cls.__name__}(" for cls in (PeerLost, Misplaced,
                                                                    StateGone))


class _ReportedByDriver(logging.Filter):
    """Drop a worker's "Compute Failed" log for dtrain's own errors: the driver reports
    those once, as one line; any other exception is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (str(record.msg).startswith("Compute Failed") and len(args) > 3
                    and str(args[3]).startswith(_QUIET))


class QuietUserErrors(WorkerPlugin):
    """Installs :class:`_ReportedByDriver` on every worker, restarted ones included."""

    name = "dtrain-quiet-user-errors"
    idempotent = True

    def setup(self, worker) -> None:
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, _ReportedByDriver) for f in log.filters):
            log.addFilter(_ReportedByDriver())


_CLOSED = ("CommClosedError", "StreamClosedError", "OSError", "ConnectionRefusedError",
           "ConnectionResetError")


# tornado's answer to a TLS connection to a worker that is dying: distributed expects an
# OSError there (a worker gone) and logs anything else with its traceback
_CUT_TLS = "IOStream is not idle; cannot convert to SSL"


class _LostWithAWorker(logging.Filter):
    """Drop a scheduler's error for values it could not gather because the worker holding
    them was lost (the client computes them again, and the run says once, as one line, that
    it runs the window again), and for a call on every worker that found one gone (dtrain's
    calls leave it out: :mod:`dtrain.core.broadcast`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith("broadcast to "):
            return not any(f" failed: {name}" in msg for name in _CLOSED)
        if msg.startswith("Unexpected error while collecting tasks"):
            exc = record.exc_info[1] if record.exc_info else None
            return not (type(exc).__name__ in _CLOSED or _CUT_TLS in str(exc))
        return not msg.startswith("Couldn't gather keys")


_GATHERING = ("distributed.scheduler", "distributed.utils_comm")   # (who gathers, and how)


@contextlib.contextmanager
def lost_gathers_quiet() -> Iterator[None]:
    """While a run goes on: a scheduler in this process (a LocalCluster's) says nothing of
    the values a lost worker took with it, or of a worker gone when dtrain called every
    worker (:class:`_LostWithAWorker`)."""
    logs, quiet = [logging.getLogger(name) for name in _GATHERING], _LostWithAWorker()
    for log in logs:
        log.addFilter(quiet)
    try:
        yield
    finally:
        for log in logs:
            log.removeFilter(quiet)


CLOSING_OP = "dtrain_closing"     # the head's word to every worker rank before it closes them


class CutByClose(logging.Filter):
    """Drops distributed's errors about a connection that the job's own close cut, and
    logs a transfer whose asker went away at DEBUG.

    Closing, a worker shuts its connections while a heartbeat may be in flight, and
    distributed logs the closed comm as an error with a traceback.  The head tells every
    worker that the job is closing (:data:`CLOSING_OP`, answered) before it closes any;
    the same failures mid-run still show.

    A transfer this worker was sending ("failed during get data", an ``OSError``) fails
    only when whoever asked for it went away: a peer that closed first (the head closes
    the ranks all at once), a peer lost mid-run (the driver says so once, as one line,
    and runs the window again), or the driver itself, with a LocalCluster's scheduler
    inside it (killed, the run is over, and this worker exits with its parent).  Never
    the only word of what happened, so never an error with a traceback on the console;
    DEBUG logs still have it.
    """

    CUT = ("Failed to communicate with scheduler during heartbeat",
           "Async instruction for")     # a task still running (a window launched ahead)
    TRANSFER = "failed during get data"
    LOGGERS = ("distributed.worker", "distributed.worker.state_machine")

    def install(self) -> CutByClose:
        """Put this filter on every logger it watches; returns it."""
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def remove(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)

    def __init__(self, worker: Worker):
        self.worker, self.closing = worker, False

    def mark_closing(self) -> None:
        """The handler of :data:`CLOSING_OP`."""
        self.closing = True

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.TRANSFER):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        closing = self.closing or self.worker.status in (Status.closing, Status.closed,
                                                         Status.closing_gracefully)
        return not (closing and str(record.msg).startswith(self.CUT))


class QuietClose(WorkerPlugin):
    """Installs :class:`CutByClose` on every worker of a cluster dtrain started and will close
    (restarted workers included); :func:`mark_closing`, run on them just before the close,
    arms it."""

    name = "dtrain-quiet-close"
    idempotent = True

    def setup(self, worker) -> None:
        log = logging.getLogger("distributed.worker")
        if not any(isinstance(f, CutByClose) for f in log.filters):
            CutByClose(worker).install()


def mark_closing() -> None:
    """On a worker (``client.run``): its :class:`CutByClose` filters start dropping."""
    for f in logging.getLogger("distributed.worker").filters:
        if isinstance(f, CutByClose):
            f.mark_closing()


class RefusedOnce(logging.Filter):
    """A connection refused at a TLS listener's handshake (no certificate, or another run's)
    logged once at DEBUG, not as a warning per try.

    distributed warns for each one ("Listener on ...: TLS handshake failed ..."), and so
    does tornado ("SSL Error on ..."); a stranger's client tries again and again, which
    would be a storm of warnings on the user's console about something that was refused as
    it should be.  Each listener and reason is logged once, at DEBUG, where its logger
    shows DEBUG; anything else passes unchanged.
    """

    SAID = {"distributed.comm.tcp": "Listener on %r: TLS handshake failed",
            "tornado.general": "SSL Error on "}

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        said = self.SAID.get(record.name)
        if said is None or not str(record.msg).startswith(said):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        error = args[-1] if args else None
        where = str(args[0]) if record.name == "distributed.comm.tcp" and args else ""
        key = (where, str(getattr(error, "reason", None) or type(error).__name__))
        with self.lock:
            if key in self.seen:
                return False
            self.seen.add(key)
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_refused_once = RefusedOnce()


def quiet_refusals() -> None:
    """In this process: refused TLS handshakes logged once each, at DEBUG
    (:class:`RefusedOnce`); idempotent."""
    for name in RefusedOnce.SAID:
        log = logging.getLogger(name)
        if _refused_once not in log.filters:
            log.addFilter(_refused_once)


class QuietRefusals(WorkerPlugin):
    """Installs :class:`RefusedOnce` in every worker process of a cluster dtrain started
    (restarted ones included)."""

    name = "dtrain-quiet-refusals"
    idempotent = True

    def setup(self, worker) -> None:
        quiet_refusals()


def quiet_logs() -> None:
    """Keep distributed's start-up chatter (INFO) off the job's log, and refused TLS
    handshakes to one DEBUG line each (:func:`quiet_refusals`); warnings still show."""
    logging.getLogger("distributed").setLevel(logging.WARNING)
    quiet_refusals()
