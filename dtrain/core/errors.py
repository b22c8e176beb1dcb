"""Exceptions that end a run with one clear line instead of a traceback, and their exit codes."""
from __future__ import annotations

EXIT_USER_ERROR = 2     # bad input: one line, no traceback
EXIT_DIVERGED = 3       # the loss became NaN or infinite
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback.

    The message says what is wrong, where, and how to fix it.
    """


class ConfigError(UserError):
    """An unknown key, a wrong type or an impossible value in a config."""


class DataError(UserError):
    """Missing, corrupt or inconsistent data files."""


class Diverged(Exception):
    """The training loss became NaN or infinite: the run stops at that step (exit code 3)."""

    def __init__(self, step: int, epoch: int, loss: float, note: str = ""):
        super().__init__(step, epoch, loss, note)
        self.step, self.epoch, self.loss, self.note = step, epoch, loss, note

    def __str__(self) -> str:
        return (f"training diverged at step {self.step} (epoch {self.epoch + 1}): the loss is "
                f"{self.loss}; lower optim.lr or raise model.l2{self.note}")


# what a worker's "Compute Failed" log names for these; the driver reports them once instead
REPORTED_BY_DRIVER = tuple(f"{cls.__name__}(" for cls in (Diverged, UserError, DataError,
                                                           ConfigError))


def exit_code(exc: BaseException) -> int:
    """The exit code of a run that ended with ``exc``: 2 for bad input, 3 for divergence."""
    return EXIT_DIVERGED if isinstance(exc, Diverged) else EXIT_USER_ERROR
