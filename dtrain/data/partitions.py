"""Partitioned data: a Dask collection's partitions as shards, where they already sit.

The functions here run inside tasks on the worker that holds a partition (a
pandas DataFrame of a dask.dataframe, or a pair of NumPy blocks of dask
arrays); none of them ever sees more than one partition, and the driver never
sees a row.  A run on partitioned data goes:

1. :func:`part_stats` on every partition: its rows, its split into training,
   validation and test rows (seeded by ``(seed, partition)``, so it does not
   depend on the cluster), its labels and the training rows' statistics.
2. :func:`merge` in a tree of fixed fan-in, in partition order (Chan's
   parallel update of means and squared deviations): the same numbers, bit
   for bit, however the partitions are spread; :func:`normalization` turns
   them into the run's :class:`~dtrain.core.modelfile.Normalization`.
3. :func:`shard` builds partition ``i``'s training rows as shard ``i``,
   normalized and with labels as output indices; :func:`held_out` its
   validation or test rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dtrain.core.arrays import on_device
from dtrain.core.errors import DataError
from dtrain.core.modelfile import Normalization
from dtrain.data.shards import Shard


@dataclass(frozen=True)
class Columns:
    """Which columns of a DataFrame partition are features (in order) and which is the
    label (None: the partition is a pair ``(x block, y block)`` of arrays)."""

    features: tuple[Any, ...] | None = None      # column labels as the frame has them
    label: str | None = None


@dataclass(frozen=True)
class PartSpec:
    """What every partition's tasks share: the columns, the split fractions and seed, and,
    once the statistics are known, the class labels, normalization and dtype."""

    columns: Columns
    split: tuple[float, float, float] = (1.0, 0.0, 0.0)
    seed: int = 0
    classes: tuple[Any, ...] = ()
    norm: Normalization = field(default_factory=Normalization)
    dtype: str = "float64"
    gpu: bool = False
    regression: bool = False        # the label is one or more real-valued targets


@dataclass(frozen=True)
class PartSource:
    """Shard ``index``'s loading record: partition ``index`` (the Dask key ``key``, held by
    the engine), built by :func:`shard` as ``spec`` says."""

    spec: PartSpec
    index: int
    key: Any


@dataclass(frozen=True)
class PartStats:
    """A partition's (or, merged, several partitions') sizes, labels and statistics.

    ``mean`` and ``m2`` (sum of squared deviations) are over the training rows, so are
    ``low`` and ``high``; ``labels`` the distinct labels of every row; ``bad`` the first
    non-finite feature found, as ``(column, partition)``."""

    rows: int
    train: int
    val: int
    test: int
    labels: tuple[Any, ...]
    mean: np.ndarray                 # (D,)
    m2: np.ndarray                   # (D,)
    low: np.ndarray                  # (D,)
    high: np.ndarray                 # (D,)
    bad: tuple[str, int] | None = None
    sizes: tuple[int, ...] = ()      # training rows of each partition, in order


def rows_of(part: Any, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
    """A partition's features (n, D) as float64 and its labels (n,) as they are."""
    if columns.label is None:
        x, y = part
        if len(x) != len(y):
            raise DataError(f"a partition holds {len(x)} rows of X but {len(y)} labels; X and "
                            f"y must be cut into the same blocks of rows")
        return np.asarray(x, dtype=np.float64), np.asarray(y)
    x = part[list(columns.features)].to_numpy(dtype=np.float64, na_value=np.nan)
    return x, part[columns.label].to_numpy()


def split(n: int, spec: PartSpec, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row indices of partition ``index``'s training, validation and test rows, each in
    row order; the share of each is seeded by ``(seed, index)``."""
    _, f_val, f_test = spec.split
    val, test = round(n * f_val), round(n * f_test)
    if not val and not test:
        return np.arange(n), np.arange(0), np.arange(0)
    order = np.random.default_rng([spec.seed, 0x5B17, index]).permutation(n)
    return (np.sort(order[val + test:]), np.sort(order[:val]),
            np.sort(order[val:val + test]))


def part_stats(spec: PartSpec, index: int, part: Any) -> PartStats:
    """Task: partition ``index``'s :class:`PartStats`."""
    x, y = rows_of(part, spec.columns)
    train, val, test = split(len(y), spec, index)
    bad = None
    finite = np.isfinite(x)
    if not finite.all():
        column = int(np.argwhere(~finite)[0, 1])
        name = spec.columns.features[column] if spec.columns.features else str(column)
        bad = (name, index)
    xt = x[train]                                                        # (n_train, D)
    d = x.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite: reported in ``bad``
        mean = xt.mean(axis=0) if len(xt) else np.zeros(d)
        m2 = ((xt - mean) ** 2).sum(axis=0) if len(xt) else np.zeros(d)
    low = xt.min(axis=0) if len(xt) else np.full(d, np.inf)
    high = xt.max(axis=0) if len(xt) else np.full(d, -np.inf)
    if spec.regression:
        labels = ()
        if y.dtype.kind not in "fiub" or not np.isfinite(y.astype(np.float64)).all():
            bad = bad or (spec.columns.label or "y", index)
    else:
        labels = tuple(np.unique(y[~_missing(y)]).tolist())
        if _missing(y).any():
            bad = bad or (spec.columns.label or "y", index)
    return PartStats(len(y), len(train), len(val), len(test), labels, mean, m2, low, high, bad,
                     (len(train),))


def _missing(y: np.ndarray) -> np.ndarray:
    if y.dtype.kind == "f":
        return np.isnan(y)
    if y.dtype == object:
        return np.array([v is None or v != v for v in y], dtype=bool)
    return np.zeros(len(y), dtype=bool)


def merge(*parts: PartStats) -> PartStats:
    """Task: several partitions' statistics as one, combined in the given order."""
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite: reported in ``bad``
        return _merged(parts)


def _merged(parts: tuple[PartStats, ...]) -> PartStats:
    """The merge itself (see :func:`merge`)."""
    total = parts[0]
    for p in parts[1:]:
        n_a, n_b = total.train, p.train
        n = n_a + n_b
        if n_b == 0:
            mean, m2 = total.mean, total.m2
        elif n_a == 0:
            mean, m2 = p.mean, p.m2
        else:
            delta = p.mean - total.mean                                   # (D,)
            mean = total.mean + delta * (n_b / n)
            m2 = total.m2 + p.m2 + delta * delta * (n_a * n_b / n)
        total = PartStats(total.rows + p.rows, n, total.val + p.val, total.test + p.test,
                          tuple(sorted(set(total.labels) | set(p.labels), key=_order)),
                          mean, m2, np.minimum(total.low, p.low), np.maximum(total.high, p.high),
                          total.bad or p.bad, total.sizes + p.sizes)
    return total


def _order(label: Any) -> tuple:
    """Labels sorted as ``np.unique`` sorts them: numbers by value, text as text."""
    return (0, label, "") if isinstance(label, (int, float)) else (1, 0, str(label))


def normalization(stats: PartStats, kind: str) -> Normalization:
    """The normalization of ``kind`` from merged statistics (population standard
    deviation, as ``np.std``); a constant feature gets scale 1."""
    if kind == "standardize":
        shift, scale = stats.mean, np.sqrt(stats.m2 / max(stats.train, 1))
    elif kind == "minmax":
        shift, scale = stats.low, stats.high - stats.low
    else:
        return Normalization("none")
    return Normalization(kind, shift, np.where(scale > 0, scale, 1.0))


def _encode(y: np.ndarray, classes: tuple[Any, ...]) -> np.ndarray:
    index = {c: i for i, c in enumerate(classes)}
    return np.fromiter((index[v] for v in y.tolist()), dtype=np.int64, count=len(y))


def _rows(spec: PartSpec, index: int, part: Any, which: int) -> Shard:
    x, y = rows_of(part, spec.columns)
    rows = split(len(y), spec, index)[which]
    xs = spec.norm.apply(x[rows], spec.dtype)                            # (n, D)
    ys = np.asarray(y[rows], dtype=spec.dtype).reshape(len(rows), -1) if spec.regression \
        else _encode(y[rows], spec.classes)                              # (n, T) or (n,)
    return Shard(index if which == 0 else -1, on_device(xs, spec.gpu), on_device(ys, spec.gpu))


def shard(spec: PartSpec, index: int, part: Any) -> Shard:
    """Task: partition ``index``'s training rows as shard ``index``."""
    return _rows(spec, index, part, 0)


def held_out(spec: PartSpec, which: str, index: int, part: Any) -> Shard:
    """Task: partition ``index``'s ``"val"`` or ``"test"`` rows."""
    return _rows(replace(spec, gpu=False), index, part, {"val": 1, "test": 2}[which])


def check(stats: PartStats, shards_needed: int = 1, regression: bool = False) -> None:
    """Raise :class:`DataError` for what training cannot use: non-finite features (or
    targets), fewer training rows than shards, a single class."""
    if stats.bad is not None:
        column, index = stats.bad
        what = "NaN or infinite values" if not regression else "values that are not finite numbers"
        raise DataError(f"column {column!r} of partition {index} holds {what}; fill or drop "
                        f"them before training")
    if stats.train < shards_needed:
        raise DataError(f"{stats.train} training samples for {shards_needed} partitions; each "
                        f"partition needs at least one (repartition to fewer)")
    if not regression and len(stats.labels) < 2:
        raise DataError(f"the labels hold {len(stats.labels)} class "
                        f"({', '.join(map(str, stats.labels))}); a classifier needs at least 2")
