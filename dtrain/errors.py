"""Exceptions that end a run with one clear line instead of a traceback."""
from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback.

    The message says what is wrong, where, and how to fix it.
    """


class Diverged(Exception):
    """The training loss became NaN or infinite: the run stops at that step (exit code 3)."""

    def __init__(self, step: int, epoch: int, loss: float, note: str = ""):
        super().__init__(step, epoch, loss, note)
        self.step, self.epoch, self.loss, self.note = step, epoch, loss, note

    def __str__(self) -> str:
        return (f"training diverged at step {self.step} (epoch {self.epoch + 1}): the loss is "
                f"{self.loss}; lower optim.lr or raise model.l2{self.note}")
