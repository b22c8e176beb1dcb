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

Sample weights, where the data has them (a weight column, or a third array
block), travel with their rows: the statistics are weighted (a row of weight 0
counts as absent, one of weight 2 as two) and each training shard carries its
rows' weights, scaled so that they average 1 over the training rows (a step's
loss and gradient are then ``sum_i w_i l_i / B``); held-out rows are unweighted.
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
    weight: str | None = None       # a frame's sample-weight column (arrays: a third block)


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
    weight_scale: float = 1.0       # sample weights times this average 1 on training rows


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
    mass: float | None = None        # the training rows' summed sample weights (None: none)

    @property
    def weight(self) -> float | int:
        """What the training rows weigh: their summed sample weights, or their count."""
        return self.train if self.mass is None else self.mass


def rows_of(part: Any, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
    """A partition's features (n, D) as float64 and its labels (n,) as they are."""
    if columns.label is None:
        x, y = part[0], part[1]
        if len(x) != len(y):
            raise DataError(f"a partition holds {len(x)} rows of X but {len(y)} labels; X and "
                            f"y must be cut into the same blocks of rows")
        return np.asarray(x, dtype=np.float64), np.asarray(y)
    x = part[list(columns.features)].to_numpy(dtype=np.float64, na_value=np.nan)
    return x, part[columns.label].to_numpy()


def weights_of(part: Any, columns: Columns) -> np.ndarray | None:
    """A partition's sample weights (n,) as float64, or None if it has none."""
    if columns.label is None:
        return None if len(part) < 3 else np.asarray(part[2], dtype=np.float64)
    if columns.weight is None:
        return None
    return part[columns.weight].to_numpy(dtype=np.float64, na_value=np.nan)


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
    w = weights_of(part, spec.columns)
    mass = None
    if w is not None:
        if not (np.isfinite(w).all() and (w >= 0).all()):
            bad = bad or ("sample_weight", index)
        wt = np.where(np.isfinite(w[train]) & (w[train] > 0), w[train], 0.0)   # (n_train,)
        mass = float(wt.sum())
        xt = xt[wt > 0]                          # a row of weight 0 counts as absent
        wt = wt[wt > 0]
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite: reported in ``bad``
        if w is None:
            mean = xt.mean(axis=0) if len(xt) else np.zeros(d)
            m2 = ((xt - mean) ** 2).sum(axis=0) if len(xt) else np.zeros(d)
        else:
            mean = wt @ xt / mass if len(xt) else np.zeros(d)                  # (D,)
            m2 = wt @ ((xt - mean) ** 2) if len(xt) else np.zeros(d)           # (D,)
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
                     (len(train),), mass)


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
        n_a, n_b = total.weight, p.weight       # counts, or summed sample weights
        n = n_a + n_b
        if n_b == 0:
            mean, m2 = total.mean, total.m2
        elif n_a == 0:
            mean, m2 = p.mean, p.m2
        else:
            delta = p.mean - total.mean                                   # (D,)
            mean = total.mean + delta * (n_b / n)
            m2 = total.m2 + p.m2 + delta * delta * (n_a * n_b / n)
        total = PartStats(total.rows + p.rows, total.train + p.train, total.val + p.val,
                          total.test + p.test,
                          tuple(sorted(set(total.labels) | set(p.labels), key=_order)),
                          mean, m2, np.minimum(total.low, p.low), np.maximum(total.high, p.high),
                          total.bad or p.bad, total.sizes + p.sizes,
                          None if total.mass is None else n)
    return total


def _order(label: Any) -> tuple:
    """Labels sorted as ``np.unique`` sorts them: numbers by value, text as text."""
    return (0, label, "") if isinstance(label, (int, float)) else (1, 0, str(label))


def normalization(stats: PartStats, kind: str) -> Normalization:
    """The normalization of ``kind`` from merged statistics (population standard
    deviation, as ``np.std``); a constant feature gets scale 1."""
    if kind == "standardize":
        shift, scale = stats.mean, np.sqrt(stats.m2 / (max(stats.train, 1) if stats.mass is None
                                                       else stats.mass or 1.0))
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
    w = weights_of(part, spec.columns) if which == 0 else None          # held out: unweighted
    ws = None if w is None else on_device(np.asarray(w[rows] * spec.weight_scale,
                                                     dtype=spec.dtype), spec.gpu)   # (n,)
    return Shard(index if which == 0 else -1, on_device(xs, spec.gpu), on_device(ys, spec.gpu),
                 ws)


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
        what = "NaN or infinite values" + (" (or values that are not numbers)" if regression
                                           else "")
        raise DataError(f"column {column!r} of partition {index} holds {what}; fill or drop "
                        f"them before training")
    if stats.train < shards_needed:
        raise DataError(f"{stats.train} training samples for {shards_needed} partitions; each "
                        f"partition needs at least one (repartition to fewer)")
    if not regression and len(stats.labels) < 2:
        raise DataError(f"the labels hold {len(stats.labels)} class "
                        f"({', '.join(map(str, stats.labels))}); a classifier needs at least 2")
