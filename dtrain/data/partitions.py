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
from dtrain.data import missing as missing_values
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
    missing: str = "error"          # "drop": rows with a missing value are left out
    weight_scale: float = 1.0       # sample weights times this average 1 on training rows


@dataclass(frozen=True)
class PartSource:
    """Shard ``index``'s loading record: partition ``index`` (the Dask key ``key``, held by
    the engine), built by :func:`shard` as ``spec`` says."""

    spec: PartSpec
    index: int
    key: Any


@dataclass(frozen=True)
class Bad:
    """The first row of a partition that training cannot use: a missing or non-finite
    feature in ``column`` (``label``: a missing label, or a target that is not a finite
    number), at ``row`` of partition ``partition`` (counted from 0), whose value is
    ``value``; ``place`` says where that is for the user (a file and its line, a row of the
    whole collection), once the driver knows (:func:`located`)."""

    column: str
    partition: int
    row: int
    value: str
    label: bool = False
    place: str = ""


@dataclass(frozen=True)
class PartStats:
    """A partition's (or, merged, several partitions') sizes, labels and statistics.

    ``mean`` and ``m2`` (sum of squared deviations) are over the training rows, so are
    ``low`` and ``high``; ``labels`` the distinct labels of every row; ``bad`` the first
    row training cannot use (:class:`Bad`); ``dropped`` the rows left out for missing
    values (``data.missing = "drop"``)."""

    rows: int
    train: int
    val: int
    test: int
    labels: tuple[Any, ...]
    mean: np.ndarray                 # (D,)
    m2: np.ndarray                   # (D,)
    low: np.ndarray                  # (D,)
    high: np.ndarray                 # (D,)
    bad: Bad | None = None
    sizes: tuple[int, ...] = ()      # training rows of each partition, in order
    dropped: int = 0
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


def weights_of(part: Any, columns: Columns) -> np.ndarray | None:
    """A partition's sample weights (n,) as float64, or None if it has none."""
    if columns.label is None:
        return None if len(part) < 3 else np.asarray(part[2], dtype=np.float64)
    if columns.weight is None:
        return None
    return part[columns.weight].to_numpy(dtype=np.float64, na_value=np.nan)


def usable_rows(spec: PartSpec, part: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """A partition's features (n, D) and labels as :func:`rows_of` reads them, less the
    rows with a missing value where ``spec.missing`` is ``"drop"``, and how many went."""
    x, y, _, dropped = _usable(spec, part)
    return x, y, dropped


def _usable(spec: PartSpec, part: Any) -> tuple[np.ndarray, np.ndarray, Any, int]:
    """:func:`usable_rows` and the sample weights (n,) of the rows kept, or None."""
    x, y = rows_of(part, spec.columns)
    w = weights_of(part, spec.columns)
    if spec.missing != "drop":
        return x, y, w, 0
    bad = missing_values.dropped_rows(x, y if not spec.regression else None)
    if spec.regression:
        bad |= ~_finite_targets(y)
    if not bad.any():
        return x, y, w, 0
    return x[~bad], y[~bad], None if w is None else w[~bad], int(bad.sum())


def _finite_targets(y: np.ndarray) -> np.ndarray:
    """A mask of the rows whose targets are all finite numbers."""
    if y.dtype.kind not in "fiub":
        try:
            y = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            return np.array([_is_finite_number(v) for v in y.tolist()], dtype=bool)
    finite = np.isfinite(y.astype(np.float64))
    return finite if finite.ndim == 1 else finite.all(axis=tuple(range(1, finite.ndim)))


def _is_finite_number(v: Any) -> bool:
    try:
        return bool(np.isfinite(float(v)))
    except (TypeError, ValueError):
        return False


def part_stats(spec: PartSpec, index: int, part: Any) -> PartStats:
    """Task: partition ``index``'s :class:`PartStats`."""
    x, y, w, dropped = _usable(spec, part)
    train, val, test = split(len(y), spec, index)
    bad = _first_bad(spec, index, x, y, w)
    xt = x[train]                                                        # (n_train, D)
    d = x.shape[1]
    mass = None
    if w is not None:
        wt = np.where(np.isfinite(w[train]) & (w[train] > 0), w[train], 0.0)   # (n_train,)
        mass = float(wt.sum())
        xt, wt = xt[wt > 0], wt[wt > 0]          # a row of weight 0 counts as absent
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite: reported in ``bad``
        if w is None:
            mean = xt.mean(axis=0) if len(xt) else np.zeros(d)
            m2 = ((xt - mean) ** 2).sum(axis=0) if len(xt) else np.zeros(d)
        else:
            mean = wt @ xt / mass if len(xt) else np.zeros(d)                  # (D,)
            m2 = wt @ ((xt - mean) ** 2) if len(xt) else np.zeros(d)           # (D,)
    low = xt.min(axis=0) if len(xt) else np.full(d, np.inf)
    high = xt.max(axis=0) if len(xt) else np.full(d, -np.inf)
    labels = () if spec.regression else \
        tuple(np.unique(y[~missing_values.missing_labels(y)]).tolist())
    return PartStats(len(y), len(train), len(val), len(test), labels, mean, m2, low, high, bad,
                     (len(train),), dropped, mass)


def _first_bad(spec: PartSpec, index: int, x: np.ndarray, y: np.ndarray,
               w: np.ndarray | None = None) -> Bad | None:
    """The first row of the partition with a missing or non-finite feature, or a missing
    label (a regression: a target that is not a finite number), or a sample weight that is
    not a finite number >= 0, whichever comes first."""
    found = []
    if w is not None and not (np.isfinite(w) & (w >= 0)).all():
        r = int(np.argmax(~(np.isfinite(w) & (w >= 0))))
        found.append(Bad("sample_weight", index, r, missing_values.shown(w[r])))
    cell = missing_values.first_bad(x)
    if cell is not None:
        r, c = cell
        name = spec.columns.features[c] if spec.columns.features else str(c)
        found.append(Bad(str(name), index, r, missing_values.shown(x[r, c])))
    wrong = ~_finite_targets(y) if spec.regression else missing_values.missing_labels(y)
    if wrong.any():
        r = int(np.argmax(wrong))
        value = next(v for v in np.ravel(y[r]).tolist() if not _is_finite_number(v)) \
            if spec.regression else y[r]
        found.append(Bad(str(spec.columns.label or "y"), index, r,
                         missing_values.shown(value), label=True))
    return min(found, key=lambda b: b.row) if found else None


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
                          total.bad or p.bad, total.sizes + p.sizes, total.dropped + p.dropped,
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
    x, y, w, _ = _usable(spec, part)
    rows = split(len(y), spec, index)[which]
    xs = spec.norm.apply(x[rows], spec.dtype)                            # (n, D)
    ys = np.asarray(y[rows], dtype=spec.dtype).reshape(len(rows), -1) if spec.regression \
        else _encode(y[rows], spec.classes)                              # (n, T) or (n,)
    ws = None if w is None or which != 0 else on_device(                 # held out: unweighted
        np.asarray(w[rows] * spec.weight_scale, dtype=spec.dtype), spec.gpu)   # (n,)
    return Shard(index if which == 0 else -1, on_device(xs, spec.gpu), on_device(ys, spec.gpu),
                 ws)


def shard(spec: PartSpec, index: int, part: Any) -> Shard:
    """Task: partition ``index``'s training rows as shard ``index``."""
    return _rows(spec, index, part, 0)


def held_out(spec: PartSpec, which: str, index: int, part: Any) -> Shard:
    """Task: partition ``index``'s ``"val"`` or ``"test"`` rows."""
    return _rows(replace(spec, gpu=False), index, part, {"val": 1, "test": 2}[which])


FIX = "fill or drop those rows before training"


def check(stats: PartStats, shards_needed: int = 1, regression: bool = False,
          label: str | None = None, fix: str = FIX) -> None:
    """Raise :class:`DataError` for what training cannot use: a missing or non-finite
    feature, a missing label or target (one line naming the partition or file, the row and
    the column; ``fix`` says how to mend it), a classifier's labels that are real numbers
    (``label``: the label column's name), fewer training rows than shards, a single
    class."""
    if stats.bad is not None:
        b = stats.bad
        place = b.place or f"partition {b.partition}, row {b.row}"
        if not b.label:
            what = "sample weights must be finite numbers >= 0" \
                if b.column == "sample_weight" else "features must be finite numbers"
            raise DataError(f"{place}, column {b.column!r}: {b.value}; {what}: {fix}")
        what = f"the target (column {b.column!r}) is {b.value}, not a finite number" \
            if regression else f"the label (column {b.column!r}) is {b.value}"
        raise DataError(f"{place}: {what}; every row needs one: {fix}")
    if stats.train < shards_needed:
        raise DataError(f"{stats.train} training samples for {shards_needed} partitions; each "
                        f"partition needs at least one (repartition to fewer)")
    if not regression:
        real = next((v for v in stats.labels if isinstance(v, float) and not v.is_integer()),
                    None)
        if real is not None:
            which = f"the label column {label!r} holds" if label else "the labels hold"
            raise DataError(f"{which} real numbers such as {real}, not classes: name the "
                            f"label column (data.label, or y), or learn the values as a "
                            f"regression (model.loss = 'squared-error', MLPRegressor)")
    if not regression and len(stats.labels) < 2:
        raise DataError(f"the labels hold {len(stats.labels)} class "
                        f"({', '.join(map(str, stats.labels))}); a classifier needs at least 2")


def located(stats: PartStats, parts: list[PartStats], files: tuple[str, ...] = (),
            first_line: int | None = None) -> PartStats:
    """``stats`` whose :class:`Bad` says where it is for the user: in ``files[partition]``
    where each partition is one file (its line, counting from ``first_line`` for the first
    data row of a CSV file; or its row), else its row in the whole collection, counting the
    rows of the partitions before it (``parts``, each partition's statistics)."""
    b = stats.bad
    if b is None:
        return stats
    if files:
        where = f"line {b.row + first_line}" if first_line is not None else f"row {b.row}"
        place = f"{files[b.partition]}: {where} (partition {b.partition})"
    else:
        before = sum(p.rows + p.dropped for p in parts[:b.partition])
        place = f"row {before + b.row} (row {b.row} of partition {b.partition})" if before \
            else f"row {b.row} (partition {b.partition})"
    return replace(stats, bad=replace(b, place=place))
