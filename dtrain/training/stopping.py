"""Early stopping and the best epoch: decided from the epoch rows, in epoch order.

Every decision is a function of the monitored loss of each epoch
(``train.monitor``: the validation or the training loss), which dtrain
computes bit for bit the same on any number of workers, so a run stops after
the same epoch and keeps the same parameters whatever the cluster, and a
resumed run, replaying its recorded rows, decides as the run it continues
would have.  The engines make the evaluations of such a run return their
epoch's state (:class:`~dtrain.taskgraph.records.Evaluate`'s ``keep``); the
state of the best epoch travels in the checkpoint.  A window fused into one
task on its worker brings back only the states the driver will keep
(:func:`needed_states`): at most the best epoch's and the stop epoch's, not one
per epoch.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtrain.core.config import TrainConfig
from dtrain.maths.optim import TrainState


@dataclass
class Watch:
    """The monitored loss so far: its lowest value, that epoch (from 1) and its state (with
    ``keep_best``); the last loss that improved by more than ``min_delta`` and the epochs
    since (early stopping's count)."""

    cfg: TrainConfig
    best: float = math.inf
    best_epoch: int | None = None
    best_state: TrainState | None = None
    mark: float = math.inf              # the last loss that counted as an improvement
    wait: int = 0
    stopped: int | None = None          # the epoch after which patience ran out

    @property
    def active(self) -> bool:
        """Whether epochs' states matter: early stopping or ``keep_best`` is on."""
        return self.cfg.patience > 0 or self.cfg.keep_best

    def see(self, row: dict[str, Any], state: TrainState | None = None) -> bool:
        """Take epoch ``row`` (and its end ``state``); True when the run should stop after it.

        The best epoch has the lowest loss.  For patience, an epoch improves
        when its loss is below the last improvement's by more than
        ``min_delta`` (a NaN never improves); ``patience`` epochs in a row
        without one stop the run.
        """
        if not self.active:
            return False
        loss = row.get(self.cfg.monitor)
        if loss is not None and loss < self.best:
            self.best, self.best_epoch = loss, row["epoch"]
            if self.cfg.keep_best:
                self.best_state = state
        if loss is not None and loss < self.mark - self.cfg.min_delta:
            self.mark, self.wait = loss, 0
        else:
            self.wait += 1
        if self.cfg.patience and self.wait >= self.cfg.patience:
            self.stopped = row["epoch"]
        return self.stopped is not None

    def replay(self, rows: list[dict[str, Any]], best: TrainState | None) -> None:
        """Catch up with a resumed run's recorded ``rows``; ``best`` is the best epoch's state
        from its checkpoint."""
        for row in rows:
            self.see(row)
        self.best_state = best

    def summary(self) -> dict[str, Any]:
        """What ``summary.json`` says about it."""
        if not self.active:
            return {}
        return {"monitor": self.cfg.monitor, "best_epoch": self.best_epoch,
                f"best_{self.cfg.monitor}": None if self.best_epoch is None else self.best,
                "stopped_early": self.stopped, "params_from_epoch":
                    self.best_epoch if self.cfg.keep_best else None}


def watched(ev: dict[str, Any], val: bool) -> dict[str, Any]:
    """What a :class:`Watch` reads of an epoch's row, from its evaluation ``ev`` (``val``:
    the run has a validation split): the epoch and both losses, as the row has them."""
    return {"epoch": ev["epoch"], "train_loss": ev.get("train_loss"),
            "val_loss": ev["loss"] if val else None}


def needed_states(watch: Watch, evaluations: Sequence[dict[str, Any]], val: bool
                  ) -> tuple[dict[str, Any], ...]:
    """``evaluations`` (a window's, in epoch order, each with its ``state``) with the state
    left only where ``watch``, seeing them next, will keep it: the best epoch's (with
    ``keep_best``) and the epoch it stops after.  Every decision is a function of the
    losses, so this is what the driver's own ``watch`` does with them; run where the window
    ran, it spares the driver a state per epoch (``tests/test_stopping.py``)."""
    ahead = dataclasses.replace(watch, best_state=None)
    keep, best = set(), None
    for i, ev in enumerate(evaluations):
        was = ahead.best_epoch
        stops = ahead.see(watched(ev, val))
        if ahead.best_epoch != was:
            best = i
        if stops:
            keep.add(i)
            break
    if ahead.cfg.keep_best and best is not None:
        keep.add(best)
    return tuple(ev if i in keep or "state" not in ev else
                 {k: v for k, v in ev.items() if k != "state"}
                 for i, ev in enumerate(evaluations))
