"""Exceptions that end a run with one clear line instead of a traceback, and their exit codes."""
from __future__ import annotations

EXIT_USER_ERROR = 2     # bad input: one line, no traceback
EXIT_DIVERGED = 3       # the loss became NaN or infinite, or exceeded train.max_loss
EXIT_STOPPED = 75       # stopped by SIGTERM or SIGUSR1 (after saving a checkpoint: resume it)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback.

    The message says what is wrong, where, and how to fix it.
    """


class ConfigError(UserError):
    """An unknown key, a wrong type or an impossible value in a config."""


class DataError(UserError, ValueError):
    """Missing, corrupt or inconsistent data (files, or arrays and dataframes given in Python):
    also a ``ValueError``, as scikit-learn's users expect of bad input."""


class UnprotectedCluster(UserWarning):
    """A Dask cluster that dtrain did not start takes connections without TLS, on an address
    that other users can reach: they can run code on its workers."""


class Diverged(Exception):
    """The training loss became NaN or infinite, or its mean per sample exceeded
    ``train.max_loss`` (``limit``): the run stops at that step (exit code 3)."""

    def __init__(self, step: int, epoch: int, loss: float, note: str = "",
                 limit: float | None = None):
        super().__init__(step, epoch, loss, note, limit)
        self.step, self.epoch, self.loss, self.note, self.limit = step, epoch, loss, note, limit

    def __str__(self) -> str:
        what = f"the loss is {self.loss}" if self.limit is None else \
            f"the mean loss per sample is {self.loss:.4g}, above train.max_loss = {self.limit:g}"
        return (f"training diverged at step {self.step} (epoch {self.epoch + 1}): {what}; "
                f"lower optim.lr or raise model.l2{self.note}")


class Stopped(BaseException):
    """A signal stopped the run at a step boundary, after a checkpoint was saved (or, on a
    second Ctrl-C, at once, with the last checkpoint kept; or before training began).

    A :class:`BaseException`, as ``KeyboardInterrupt`` and ``SystemExit`` are: a stop asked
    for by a signal is not an error, and ``except Exception:`` around ``fit`` or ``train()``
    must not swallow it and run on.

    ``signal`` is the signal's name (``"SIGINT"``, ``"SIGTERM"``, ``"SIGUSR1"``); ``step``
    the steps done of ``steps`` (None: stopped at once, mid-step; with ``steps`` 0: before
    any training, :meth:`before_training`); ``checkpoint`` the step of the checkpoint a
    resume starts from (None if the run had saved none); ``run_dir`` where it is (None: no
    files).
    """

    def __init__(self, signal: str, step: int | None, steps: int, checkpoint: int | None = None,
                 run_dir: object = None):
        super().__init__(signal, step, steps, checkpoint, run_dir)
        self.signal, self.step, self.steps = signal, step, steps
        self.checkpoint, self.run_dir = checkpoint, run_dir

    @classmethod
    def before_training(cls, signal: str) -> Stopped:
        """A stop that came before any training (while starting, reading, planning), or in a
        command that does not train."""
        return cls(signal, None, 0)

    @property
    def code(self) -> int:
        """130 for Ctrl-C, 75 (``EXIT_STOPPED``) for SIGTERM and SIGUSR1 (a scheduler's
        warning that the job must end: the run is meant to be resumed)."""
        return EXIT_INTERRUPTED if self.signal == "SIGINT" else EXIT_STOPPED

    def lines(self, resume: str = "python -m dtrain --resume") -> list[str]:
        """At most two lines: where it stopped and what was kept; how to go on."""
        if self.step is None and not self.steps:       # a Ctrl-C's, as KeyboardInterrupt's
            return ["interrupted" if self.signal == "SIGINT" else f"stopped by {self.signal}"]
        where = f"stopped by {self.signal} after step {self.step} of {self.steps}" \
            if self.step is not None else f"interrupted at once (a second {self.signal})"
        if self.run_dir is None:
            return [f"{where}; the run wrote no files, so it cannot be resumed"]
        if self.checkpoint is None:
            what = f"no checkpoint yet in {self.run_dir}"
        else:
            kept = "saved" if self.step is not None else "kept"
            what = f"checkpoint of step {self.checkpoint} {kept} in {self.run_dir}"
        return [f"{where}; {what}", f"resume with: {resume} {self.run_dir}"]


class RunEnded(Exception):
    """A window task stopped because its run ended (a window launched ahead of a stop)."""


class StateGone(Exception):
    """The worker running ``state-<step>`` does not hold the state the last window kept
    (:mod:`dtrain.taskgraph.handoff`): the engine runs the window again from the state it
    fetched.  Here, not beside the handoff, so that the worker's log filter
    (:mod:`dtrain.deploy.logs`, a layer below the task graphs) can name the class."""


# what a worker's "Compute Failed" log names for these; the driver reports them once instead
# (a run that ended says nothing of a window it no longer wanted)
REPORTED_BY_DRIVER = tuple(f"{cls.__name__}(" for cls in (Diverged, UserError, DataError,
                                                           ConfigError, RunEnded))


def exit_code(exc: BaseException) -> int:
    """The exit code of a run that ended with ``exc``: 2 for bad input, 3 for divergence,
    130 or 75 for a stop by a signal."""
    if isinstance(exc, Stopped):
        return exc.code
    return EXIT_DIVERGED if isinstance(exc, Diverged) else EXIT_USER_ERROR
