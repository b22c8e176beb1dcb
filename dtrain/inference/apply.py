"""A model applied to an input part by part: in this process, or as Dask tasks on a cluster.

:func:`each_part` runs one function per :class:`~dtrain.inference.inputs.Part`
and yields the results in order.  On a cluster the model is one task of its
own (sent to each worker once, and recomputed like any task if a worker is
lost), every part one task that reads its rows where it runs, and the driver
holds one part's result at a time.
"""
from __future__ import annotations

import csv
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from dtrain.core.errors import UserError
from dtrain.inference.inputs import Input, Part, read_part
from dtrain.inference.metrics import Report, ValueReport, confusion, per_class, value_report
from dtrain.inference.model import Model
from dtrain.maths.scores import TargetSums


def predict_part(model: Model, part: Part) -> tuple[np.ndarray, np.ndarray]:
    """A part's predicted labels (B,) and probabilities (B, C)."""
    if model.spec.multilabel:
        raise UserError("python -m dtrain predict writes one label per row; a multilabel "
                        "model predicts several: use dtrain.load(run).predict(X)")
    x, _ = read_part(part, labels=False)
    z = model.logits(model.inputs(x))                                  # (B, C)
    return model.classes_[model.predicted(z)], model._probabilities(z)


def values_part(model: Model, part: Part) -> np.ndarray:
    """A part's predicted values (B, T): a regression's."""
    x, _ = read_part(part, labels=False)
    return model.logits(model.inputs(x))                               # (B, T)


@dataclass(frozen=True)
class Tally:
    """What a labelled part adds to an evaluation: summed loss, correct, rows, confusion."""

    loss: float
    correct: int
    rows: int
    confusion: np.ndarray

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.loss + other.loss, self.correct + other.correct,
                     self.rows + other.rows, self.confusion + other.confusion)


@dataclass(frozen=True)
class ValueTally:
    """What a part with targets adds to a regression's evaluation: summed loss, rows, and
    the per-target sums (merged exactly enough for R^2, see :mod:`dtrain.maths.scores`)."""

    loss: float
    rows: int
    sums: TargetSums

    def __add__(self, other: ValueTally) -> ValueTally:
        return ValueTally(self.loss + other.loss, self.rows + other.rows, self.sums + other.sums)


def tally_part(model: Model, part: Part) -> Tally | ValueTally:
    """A labelled part's :class:`Tally` (labels the model never saw: a UserError); a
    regression's :class:`ValueTally` (targets that are not numbers: a UserError)."""
    x, labels = read_part(part)
    xn = model.inputs(x)
    if model.regression:
        return tally(model, xn, model.values(labels, xn.shape[0]))
    return tally(model, xn, model.encode(labels))


def tally(model: Model, x: np.ndarray, y: np.ndarray) -> Tally | ValueTally:
    """The tally of normalized rows ``x`` with label indices (a regression: targets) ``y``."""
    loss, correct, n = model.loss(x, y)
    if model.regression:
        return ValueTally(loss, n, TargetSums.of(model.logits(x), y))
    return Tally(loss, correct, n, confusion(y, model.predicted(model.logits(x)),
                                             len(model.classes_)))


def report_of(model: Model, total: Tally | ValueTally) -> Report | ValueReport:
    if isinstance(total, ValueTally):
        return value_report(total.rows, total.loss, model.spec.targets, total.sums)
    labels = tuple(model.classes_)
    return Report(total.rows, total.correct / max(total.rows, 1),
                  total.loss / max(total.rows, 1), labels, total.confusion,
                  per_class(total.confusion, labels))


def each_part(fn: Callable[[Model, Part], Any], model: Model, inp: Input,
              client: Any = None) -> Iterator[Any]:
    """``fn(model, part)`` for every part of ``inp``, in order; on ``client``'s cluster if
    given (one task per part, the model one task of its own)."""
    if client is None:
        for part in inp.parts:
            yield fn(model, part)
        return
    run = uuid.uuid4().hex[:8]
    kind = fn.__name__.replace("_part", "").replace("_", "-")
    shipped = client.submit(_same, model, key=f"model-{run}")
    futures = [client.submit(fn, shipped, part, key=f"{kind}-{i}-{run}")
               for i, part in enumerate(inp.parts)]
    try:
        for future in futures:
            yield future.result()
            future.release()
    finally:
        client.cancel([*futures, shipped])


def _same(model: Model) -> Model:
    return model


def write_values(out: TextIO, targets: tuple[str, ...], parts: Iterator[np.ndarray]) -> int:
    """CSV rows of a regression's predictions: one column per target, named after it
    (shortest exact text); returns the rows written."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(list(targets))
    rows = 0
    for values in parts:
        writer.writerows([*map(str, v)] for v in values)
        rows += len(values)
    return rows


def write_predictions(out: TextIO, classes: np.ndarray,
                      parts: Iterator[tuple[np.ndarray, np.ndarray]]) -> int:
    """CSV rows: the predicted label, then one probability per class (shortest exact
    text); returns the rows written."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["label", *(f"p_{c}" for c in classes.tolist())])
    rows = 0
    for labels, proba in parts:
        writer.writerows([label, *map(str, p)] for label, p in zip(labels.tolist(), proba))
        rows += len(labels)
    return rows
