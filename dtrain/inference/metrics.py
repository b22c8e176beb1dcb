"""An evaluation's figures: accuracy, loss, per-class precision, recall and F1, confusion.

The loss and accuracy are computed by the network's own ``evaluate`` (the
chunks and order training uses), so re-evaluating a run's test split gives
``summary.json``'s ``test_loss`` and ``test_accuracy`` to the last bit.  A
regression's :class:`ValueReport` has the loss, MSE, RMSE, MAE and R^2 per
target and overall (the mean over targets), from
:class:`~dtrain.maths.scores.TargetSums`, as the training's test figures are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dtrain.maths.scores import TargetSums

FIGURES = ("mse", "rmse", "mae", "r2")


class Evaluable(Protocol):
    classes_: np.ndarray            # classifiers
    regression: bool
    spec: Any                       # a ModelSpec: a regression's target names

    def loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int, int]: ...

    def logits(self, x: np.ndarray) -> np.ndarray: ...

    def predicted(self, z: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Report:
    """What ``python -m dtrain evaluate`` prints and writes.

    ``confusion[i, j]`` counts rows of true class ``i`` predicted as ``j``;
    ``per_class`` maps each label to its precision, recall, F1 and support
    (a class never predicted has precision 0, one never present recall 0).
    """

    samples: int
    accuracy: float
    loss: float
    classes: tuple[Any, ...]
    confusion: np.ndarray
    per_class: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "accuracy": self.accuracy, "loss": self.loss,
                "classes": [c.item() if isinstance(c, np.generic) else c for c in self.classes],
                "per_class": self.per_class, "confusion": self.confusion.tolist(),
                "macro_f1": float(np.mean([v["f1"] for v in self.per_class.values()]))}

    def lines(self) -> list[str]:
        """The console view: the totals, a table per class, the confusion matrix."""
        names = [str(c) for c in self.classes]
        width = max(9, *map(len, names))
        out = [f"samples {self.samples}  accuracy {self.accuracy:.4f}  loss {self.loss:.4f}  "
               f"macro F1 {self.to_dict()['macro_f1']:.4f}", "",
               f"{'class':<{width}}  precision  recall      f1  support"]
        for name in names:
            v = self.per_class[name]
            out.append(f"{name:<{width}}  {v['precision']:9.4f}  {v['recall']:6.4f}  "
                       f"{v['f1']:6.4f}  {v['support']:7d}")
        cell = max(5, *(len(str(n)) for n in self.confusion.ravel()), *map(len, names))
        out += ["", "confusion (rows: true class, columns: predicted)",
                " " * width + "  " + " ".join(f"{n[:cell]:>{cell}}" for n in names)]
        for name, row in zip(names, self.confusion):
            out.append(f"{name:<{width}}  " + " ".join(f"{v:>{cell}d}" for v in row))
        return out


def confusion(y: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """``(classes, classes)`` counts of (true, predicted) index pairs."""
    return np.bincount(y * classes + predicted, minlength=classes * classes) \
        .reshape(classes, classes)


def per_class(matrix: np.ndarray, labels: tuple[Any, ...]) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support of each class from a confusion matrix."""
    tp = np.diag(matrix).astype(float)                               # (C,)
    predicted, present = matrix.sum(axis=0), matrix.sum(axis=1)      # (C,), (C,)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, present, out=np.zeros_like(tp), where=present > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros_like(tp), where=both > 0)
    return {str(c): {"precision": float(p), "recall": float(r), "f1": float(f),
                     "support": int(s)}
            for c, p, r, f, s in zip(labels, precision, recall, f1, present)}


@dataclass(frozen=True)
class ValueReport:
    """What ``python -m dtrain evaluate`` prints and writes for a regression: the mean loss
    and, per target and overall (their mean), MSE, RMSE, MAE and R^2."""

    samples: int
    loss: float
    targets: tuple[str, ...]
    sums: TargetSums

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "loss": self.loss, **self.sums.overall(),
                "targets": list(self.targets),
                "per_target": self.sums.per_target(self.targets)}

    def lines(self) -> list[str]:
        """The console view: the totals, then a table per target."""
        total = self.sums.overall()
        width = max(9, *map(len, self.targets))
        out = [f"samples {self.samples}  loss {self.loss:.6g}  "
               + "  ".join(f"{k} {total[k]:.6g}" for k in FIGURES), "",
               f"{'target':<{width}}  " + "  ".join(f"{k:>12}" for k in FIGURES)]
        for name, v in self.sums.per_target(self.targets).items():
            out.append(f"{name:<{width}}  " + "  ".join(f"{v[k]:12.6g}" for k in FIGURES))
        return out


def value_report(samples: int, loss: float, targets: tuple[str, ...],
                 sums: TargetSums) -> ValueReport:
    """A regression's :class:`ValueReport` from its summed loss and its target sums."""
    return ValueReport(samples, loss / max(samples, 1), tuple(map(str, targets)), sums)


def report(model: Evaluable, x: np.ndarray, y: np.ndarray) -> Report | ValueReport:
    """The :class:`Report` of ``model`` on normalized rows ``x`` and label indices ``y``;
    for a regression the :class:`ValueReport` on its targets ``y`` (N, T)."""
    if model.regression:
        loss, _, n = model.loss(x, y)
        return value_report(n, loss, model.spec.targets, TargetSums.of(model.logits(x), y))
    loss, correct, n = model.loss(x, y)
    predicted = model.predicted(model.logits(x))                        # (N,)
    matrix = confusion(y, predicted, len(model.classes_))
    return Report(n, correct / max(n, 1), loss / max(n, 1), tuple(model.classes_), matrix,
                  per_class(matrix, tuple(model.classes_)))
