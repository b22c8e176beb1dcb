"""Early stopping and the best epoch: decided from the epoch rows, in epoch order.

Every decision is a function of the monitored value of each epoch
(``train.monitor``: the validation or the training loss, or the validation
score) and of its losses (a diverged epoch, the adaptive rate's end), which
dtrain computes bit for bit the same on any number of workers, so a run stops after
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

import numpy as np

from dtrain.core.config import Config, OptimConfig, TrainConfig, epochs_decide
from dtrain.maths.optim import ADAPTIVE, TrainState, adapted

NO_RATE = (1.0, math.inf, 0.0)      # the adaptive schedule's start: full rate, no best, no count


@dataclass
class Watch:
    """The monitored value so far (a loss, or a validation score negated: lower is better):
    its lowest value, that epoch (from 1) and its state (with ``keep_best``); the value
    that last counted as an improvement, the epochs since (early stopping's count), and why
    the run stopped (``patience``, ``diverged``, or ``rate``: the adaptive schedule's rate
    fell to 0, mirrored from the rows under scikit-learn's rule, ``optim`` and ``dtype``
    being the schedule and the precision the update keeps its numbers in)."""

    cfg: TrainConfig
    optim: OptimConfig | None = None
    dtype: str = "float64"
    best: float = math.inf
    best_epoch: int | None = None
    best_state: TrainState | None = None
    mark: float = math.inf              # the last value that counted as an improvement
    wait: int = 0
    stopped: int | None = None          # the epoch after which the run stops
    why: str | None = None              # ... and why
    rate: tuple[float, float, float] = NO_RATE     # the adaptive schedule's, as the update's

    @classmethod
    def of(cls, config: Config, start: TrainState | None = None) -> Watch:
        """The watch of a run of ``config``; ``start``: a state it goes on from (an
        estimator's warm start), whose adaptive numbers and last epoch the update reads
        first."""
        watch = cls(config.train, config.optim, config.model.dtype)
        if watch.mirrors and start is not None:
            watch.rate = watch._kept(tuple(float(v) for v in np.asarray(
                start.vector)[-ADAPTIVE:]))
            if start.epoch_samples:
                watch.rate = watch._kept(adapted(config.optim, config.optim.lr, watch.rate,
                                                 start.epoch_loss / start.epoch_samples))
        return watch

    @property
    def active(self) -> bool:
        """Whether epochs' states matter: the epoch rows decide where the run ends or what
        it keeps (:func:`~dtrain.core.config.epochs_decide`)."""
        return epochs_decide(self.cfg, self.optim or OptimConfig())

    @property
    def mirrors(self) -> bool:
        """Whether the run ends where the adaptive schedule's rate falls to 0."""
        return self.cfg.stopping == "scikit-learn" and self.optim is not None and \
            self.optim.schedule == "adaptive"

    @property
    def sign(self) -> int:
        """-1 where the monitored value is a score (higher is better), else 1."""
        return -1 if self.cfg.monitor == "val_score" else 1

    def value(self, row: dict[str, Any]) -> float | None:
        """The monitored value of an epoch ``row``, lower is better (a score negated)."""
        if self.cfg.monitor != "val_score":
            return row.get(self.cfg.monitor)
        score = row.get("val_accuracy")
        score = row.get("val_r2") if score is None else score
        return None if score is None else -score

    def see(self, row: dict[str, Any], state: TrainState | None = None) -> bool:
        """Take epoch ``row`` (and its end ``state``); True when the run should stop after it.

        The best epoch has the lowest value.  For patience, an epoch improves when its
        value is below the last improvement's by more than ``min_delta`` (``stopping =
        "scikit-learn"``: below the best before it by at least ``min_delta``); a NaN never
        improves; ``patience`` epochs in a row without one stop the run.  With ``diverged
        = "keep-best"`` an epoch whose training loss (or validation loss) is NaN, infinite
        or above ``max_loss`` stops it; under scikit-learn's rule, so does the adaptive
        schedule's rate falling to 0.
        """
        if not self.active:
            return False
        value, before = self.value(row), self.best
        if value is not None and value < self.best:
            self.best, self.best_epoch = value, row["epoch"]
            if self.cfg.keep_best:
                self.best_state = state
        if self.cfg.stopping == "scikit-learn":
            improved = value is not None and value <= before - self.cfg.min_delta
        else:
            improved = value is not None and value < self.mark - self.cfg.min_delta
        if improved:
            self.mark, self.wait = value, 0
        else:
            self.wait += 1
        if self.cfg.diverged != "error" and self._diverged(row):
            self._stop(row, "diverged")
        if self.cfg.patience and self.wait >= self.cfg.patience:
            self._stop(row, "patience")
        if self.mirrors and row.get("train_loss") is not None:
            if not self.rate[0]:                # the rate was 0 from the start (going on)
                self._stop(row, "rate")
            self.rate = self._kept(adapted(self.optim, self.optim.lr, self.rate,
                                           row["train_loss"]))
            if not self.rate[0]:
                self._stop(row, "rate")
        return self.stopped is not None

    def _stop(self, row: dict[str, Any], why: str) -> None:
        if self.stopped is None:
            self.stopped, self.why = row["epoch"], why

    def _diverged(self, row: dict[str, Any]) -> bool:
        train, val = row.get("train_loss"), row.get("val_loss")
        return any(v is not None and not (math.isfinite(v) and v <= self.cfg.max_loss)
                   for v in (train, val))

    def _kept(self, numbers: tuple[float, float, float]) -> tuple[float, float, float]:
        """``numbers`` as the update keeps them: in the state's dtype."""
        return tuple(float(v) for v in np.asarray(numbers, dtype=self.dtype))

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
                f"best_{self.cfg.monitor}": None if self.best_epoch is None
                else self.sign * self.best,
                "stopped_early": self.stopped, "params_from_epoch":
                    self.best_epoch if self.cfg.keep_best else None,
                **({"stopped_because": self.why} if self.why else {})}


def watched(ev: dict[str, Any], val: bool) -> dict[str, Any]:
    """What a :class:`Watch` reads of an epoch's row, from its evaluation ``ev`` (``val``:
    the run has a validation split): the epoch, both losses and the validation score
    (accuracy, or a regression's R^2), as the row has them."""
    return {"epoch": ev["epoch"], "train_loss": ev.get("train_loss"),
            "val_loss": ev["loss"] if val else None,
            "val_accuracy": ev.get("accuracy") if val else None,
            "val_r2": ev.get("r2") if val else None}


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
