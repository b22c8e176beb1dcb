"""An evaluation's figures: accuracy, loss, per-class precision, recall and F1, confusion.

The loss and accuracy are computed by the network's own ``evaluate`` (the
chunks and order training uses), so re-evaluating a run's test split gives
``summary.json``'s ``test_loss`` and ``test_accuracy`` to the last bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class Evaluable(Protocol):
    classes_: np.ndarray

    def loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int, int]: ...

    def logits(self, x: np.ndarray) -> np.ndarray: ...


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


def report(model: Evaluable, x: np.ndarray, y: np.ndarray) -> Report:
    """The :class:`Report` of ``model`` on normalized rows ``x`` and label indices ``y``."""
    loss, correct, n = model.loss(x, y)
    predicted = model.logits(x).argmax(axis=1)                          # (N,)
    matrix = confusion(y, predicted, len(model.classes_))
    return Report(n, correct / max(n, 1), loss / max(n, 1), tuple(model.classes_), matrix,
                  per_class(matrix, tuple(model.classes_)))
