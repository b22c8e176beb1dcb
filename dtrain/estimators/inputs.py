"""What an estimator's ``fit`` and ``predict`` are given, made into what dtrain trains on.

:func:`training_data` checks ``X`` and ``y`` on the driver as far as that is
cheap (shapes, lengths, types, the classes of an in-memory ``y``) and
returns a :class:`TrainingData` whose ``collection(client)`` puts them on the
cluster as a :class:`~dtrain.training.collections.Collection`:

* NumPy and pandas inputs are cut into ``shards`` blocks of consecutive rows
  (as ``numpy.array_split`` cuts them; ``"auto"``: 4, or one per row of
  fewer), each block its own key of a Dask graph, so a lost worker's
  partitions can be computed again (the graph carries the data on purpose, so
  distributed's "Sending large graph" warning, whose advice to scatter the
  data would lose that, is not raised for it: :func:`_in_graph`); a
  scipy.sparse ``X`` travels sparse, each block made dense by its own task on
  the worker that holds it;
* a dask.array or dask.dataframe keeps its own partitions, each computed
  where the scheduler puts it (or where it already is): nothing is gathered
  to the driver or concatenated anywhere.

:func:`predict_input` makes ``predict``'s input the rows the model takes: a
checked NumPy array, or a lazy Dask array of the feature columns in the
order training saw them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from distributed import Client

from dtrain.core.errors import DataError
from dtrain.data.missing import array_cell, check_finite, first_bad, missing_labels, shown
from dtrain.training import collections
from dtrain.training.collections import Collection

LABEL = "__label__"     # the label column of a frame built from X and a separate y
FIX = ("fill or drop those rows, or put an imputer before the estimator in a Pipeline "
       "(e.g. sklearn.impute.SimpleImputer)")


@dataclass
class TrainingData:
    """``X`` and ``y`` checked, ready to go on a cluster.

    ``classes`` are known for in-memory labels (``numpy.unique(y)``), None for
    Dask ones (the partitions' statistics find them).  ``columns`` are the
    feature columns of a dataframe, as it names them; ``names`` their names
    where all are strings (scikit-learn's ``feature_names_in_``); ``label`` the
    label column's name when ``y`` named one.  ``targets`` is the number of a
    regression's targets, or of a multilabel ``y``'s labels (0/1 indicators,
    ``multilabel``; ``classes`` are then their indices); ``dtype`` what
    ``predict`` returns for a multilabel ``y``; ``x_dtype`` the features' floats, as
    scikit-learn keeps them (float32 if ``X`` is, else float64).
    """

    features: int
    make: Callable[[Client], Collection]
    dask: bool
    classes: np.ndarray | None = None
    columns: tuple[Any, ...] | None = None
    names: np.ndarray | None = None
    label: str = ""
    targets: int = 1
    multilabel: bool = False
    dtype: Any = None
    x_dtype: str = "float64"       # "float32" where every feature is float32 (dtype="auto")

    def collection(self, client: Client) -> Collection:
        return self.make(client)


def is_dask(obj: Any) -> bool:
    """Whether ``obj`` is a Dask collection (array, dataframe, series)."""
    return type(obj).__module__.startswith("dask") and hasattr(obj, "__dask_graph__")


def _is_frame(obj: Any) -> bool:
    return hasattr(obj, "columns") and hasattr(obj, "dtypes") and getattr(obj, "ndim", 2) == 2


def training_data(X: Any, y: Any, *, shards: int | str, classifier: bool,
                  sample_weight: Any = None, step_flops: float = 0.0) -> TrainingData:
    """``X`` and ``y`` (and ``sample_weight``, one per row, or None) as
    :class:`TrainingData`; a ``ValueError`` saying what is wrong with them, before any
    cluster is involved."""
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None: pass the labels, "
                         "or the name of X's label column")
    if is_dask(X) or is_dask(y):
        if not is_dask(X):
            raise ValueError("y is a Dask collection but X is not; pass X as a dask.array or "
                             "dask.dataframe with the same partitions as y")
        if sample_weight is not None and not is_dask(sample_weight):
            raise ValueError("sample_weight is in memory but X is a Dask collection; pass it "
                             "as a dask array or Series with X's partitions")
        return _dask_frame(X, y, sample_weight) if _is_frame(X) \
            else _dask_array(X, y, classifier, sample_weight)
    return _in_memory(X, y, shards, classifier, sample_weight, step_flops)


# --- NumPy and pandas -------------------------------------------------------------------------

def blocks(rows: int, shards: int) -> list[tuple[int, int]]:
    """Rows ``[a, b)`` of each of ``shards`` blocks of consecutive rows, as
    ``numpy.array_split`` cuts them (the first ``rows % shards`` one row longer)."""
    bounds = np.cumsum([0] + [len(b) for b in np.array_split(np.arange(rows), shards)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


SHARD_FLOPS = 2e7   # shards="auto": a shard per this much of a step's forward-backward
MAX_AUTO_SHARDS = 16


def shard_count(shards: int | str, rows: int, step_flops: float = 0.0) -> int:
    """The blocks NumPy and pandas inputs are cut into: ``shards``, or for ``"auto"`` one
    per :data:`SHARD_FLOPS` of a step's forward-backward (``step_flops``), from 1 to
    :data:`MAX_AUTO_SHARDS` and at most one per row: a shard's maths is then worth a core
    of its own, while a small step stays one pass over its minibatch instead of several
    passes over slivers of it, each paying NumPy's cost per call.  It depends on the data
    and the network alone, never on the machine, so a fit's bytes do not either."""
    if shards != "auto":
        return int(shards)
    return max(1, min(MAX_AUTO_SHARDS, rows, round(step_flops / SHARD_FLOPS)))


def _in_memory(X: Any, y: Any, shards: int | str, classifier: bool,
               sample_weight: Any = None, step_flops: float = 0.0) -> TrainingData:
    from sklearn.utils import check_array

    frame = _is_frame(X)
    label = ""
    if isinstance(y, str):
        if not frame or y not in X.columns:
            raise ValueError(f"y = {y!r} names no column of X; pass the labels, or the name "
                             f"of a column of a DataFrame X")
        label, y = y, X[y]
        X = X.drop(columns=[label])
    if frame:
        _shape_ok(X.shape)
        collections.check_numeric(X.dtypes.to_dict(), list(X.columns), "X")
        columns = tuple(X.columns)
        x_dtype = floats(X.dtypes)
        check_finite(X.to_numpy(dtype=np.float64, na_value=np.nan), "X", columns, FIX)
    else:
        X = check_array(X, dtype="numeric", ensure_all_finite=False, ensure_2d=True,
                        accept_sparse="csr")
        columns = None
        x_dtype = floats([X.dtype])
        _check_finite_rows(X)
    y = _labels(y, X.shape[0], classifier)
    multilabel = classifier and y.ndim == 2
    classes = (np.arange(y.shape[1]) if multilabel else np.unique(y)) if classifier else None
    weights = _weights(sample_weight, X.shape[0], y if classifier and not multilabel else None)
    shards = shard_count(shards, X.shape[0], step_flops)
    if X.shape[0] < shards:
        raise ValueError(f"X has {X.shape[0]} sample{'s' if X.shape[0] > 1 else ''} for "
                         f"shards = {shards}: each shard needs at least one training sample; "
                         f"pass shards <= {X.shape[0]}")
    cuts = blocks(X.shape[0], shards)
    if frame and (y.ndim == 2 or weights is not None):  # several label columns, or weights
        X = X.to_numpy(dtype=np.float64, na_value=np.nan)
        frame = False
    label_dtype = y.dtype if multilabel else None  # what predict gives back
    if multilabel or not classifier:
        y = np.asarray(y, dtype=np.float64)          # 0/1 indicators, or real targets
    make = _frame_maker(X, y, cuts) if frame else _array_maker(X, y, cuts, weights)
    return TrainingData(X.shape[1], make, False, classes, columns, feature_names(columns),
                        label, 1 if y.ndim == 1 else y.shape[1], multilabel, label_dtype,
                        x_dtype)


def floats(dtypes: Any) -> str:
    """The floats scikit-learn's MLPs train in for features of ``dtypes``: float32 if every
    one is float32, else float64."""
    return "float32" if all(np.dtype(d) == np.float32 for d in dtypes) else "float64"


def _check_finite_rows(X: Any) -> None:
    """:func:`~dtrain.data.missing.check_finite` of an array, or of a sparse matrix's stored
    values (its first bad one, in row order), without making it dense."""
    from scipy import sparse

    if not sparse.issparse(X):
        check_finite(X, "X", fix=FIX)
        return
    coo = X.tocoo()
    bad = ~np.isfinite(coo.data)
    if bad.any():
        at = np.lexsort((coo.col[bad], coo.row[bad]))[0]
        r, c, v = int(coo.row[bad][at]), int(coo.col[bad][at]), coo.data[bad][at]
        raise DataError(f"{array_cell('X', r, c, v)}: features must be finite numbers; {FIX}")


def _weights(sample_weight: Any, rows: int, labels: np.ndarray | None) -> np.ndarray | None:
    """``sample_weight`` as a float64 (rows,) copy: finite, not negative, not all zero, and
    (``labels``: a classifier's) leaving at least two classes of positive weight."""
    if sample_weight is None:
        return None
    from sklearn.utils.validation import _check_sample_weight

    w = _check_sample_weight(sample_weight, np.empty((rows, 0)), dtype=np.float64, copy=True)
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("sample_weight holds NaN, infinite or negative values; give each row a "
                         "finite weight >= 0")
    if not w.any():
        raise ValueError("sample_weight is zero for every row: sample weights must contain at "
                         "least one non-zero number")
    if labels is not None and len(kept := np.unique(labels[w > 0])) < 2:
        raise ValueError(f"sample_weight leaves 1 class of positive weight ({kept[0]!r}); a "
                         f"classifier needs at least 2 classes")
    return w


def _shape_ok(shape: tuple[int, ...]) -> None:
    """scikit-learn's messages for an empty X."""
    if shape[0] < 1:
        raise ValueError(f"Found array with 0 sample(s) (shape={shape}) while a minimum of 1 "
                         f"is required.")
    if shape[1] < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape={shape}) while a minimum of 1 "
                         f"is required.")


def _labels(y: Any, rows: int, classifier: bool) -> np.ndarray:
    """``y`` as ``rows`` labels: a 1-d array (a column vector is taken, with scikit-learn's
    warning), or (rows, labels) 0/1 indicators of a multilabel classifier, or (rows,
    targets) of a regression; classification targets must be classes, a regression's
    numbers."""
    from sklearn.utils.multiclass import check_classification_targets, type_of_target
    from sklearn.utils.validation import column_or_1d

    y = np.asarray(y)
    if y.ndim > 2 or y.ndim == 2 and y.shape[1] == 0:
        raise ValueError(f"y has shape {y.shape}; pass y of shape ({rows},) or ({rows}, "
                         f"{'labels' if classifier else 'targets'})")
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y, warn=True)
    if y.shape[0] != rows:
        raise ValueError(f"X has {rows} rows but y has {y.shape[0]}; pass one label per row")
    if classifier:
        gone = missing_labels(y)
        if gone.any():
            r = int(np.argmax(gone))
            raise ValueError(f"y[{r}] is {shown(y[r])}: every row needs a label; drop the "
                             f"rows without one")
        check_classification_targets(y)
        if y.ndim == 2 and type_of_target(y) != "multilabel-indicator":
            raise ValueError(f"y has shape {y.shape} but is not 0/1 label indicators; a "
                             f"classifier takes one label per row, or a 0/1 column per label "
                             f"(multilabel)")
        return y
    try:
        t = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"y holds {y.dtype} values that are not numbers; a regressor takes "
                         f"real-valued targets") from None
    if not np.isfinite(t).all():
        r = int(np.argmax(~np.isfinite(t).reshape(len(t), -1).all(axis=1)))
        v = next(v for v in np.ravel(t[r]) if not np.isfinite(v))
        raise ValueError(f"y[{r}] is {shown(v)}: the targets must be finite numbers "
                         f"(Input y contains NaN or infinity); drop or fix those rows")
    return t


def _array_maker(x: Any, y: np.ndarray, cuts: list[tuple[int, int]],
                 w: np.ndarray | None = None) -> Callable[[Client], Collection]:
    def make(client: Client) -> Collection:
        import dask
        import dask.array as da
        from scipy import sparse

        # one key per block (not one array sliced by every block's task): each worker
        # receives its own rows only; a sparse block is made dense by its own task, there
        if sparse.issparse(x):
            xs = da.concatenate([da.from_delayed(dask.delayed(_dense, pure=True)(x[a:b]),
                                                 (b - a, x.shape[1]), x.dtype)
                                 for a, b in cuts])
        else:
            xs = da.concatenate([da.from_array(x[a:b], chunks=x[a:b].shape) for a, b in cuts])
        ys = da.concatenate([da.from_array(y[a:b], chunks=y[a:b].shape) for a, b in cuts])
        ws = None if w is None else \
            da.concatenate([da.from_array(w[a:b], chunks=(b - a,)) for a, b in cuts])
        with _in_graph():
            return collections.from_arrays(client, xs, ys, ws)
    return make


def _in_graph() -> Any:
    """A context in which distributed does not warn of a large graph: an in-memory ``X``
    travels inside the graph that makes its partitions on purpose, so that the scheduler
    keeps each block's task and makes a lost worker's blocks again (scattered data would
    be lost with its worker)."""
    import dask
    return dask.config.set({"distributed.admin.large-graph-warning-threshold": "1 PiB"})


def _dense(block: Any) -> np.ndarray:
    """A block of a sparse ``X`` as the dense rows it stands for (on the worker)."""
    return block.toarray()


def _frame_maker(X: Any, y: np.ndarray, cuts: list[tuple[int, int]]
                 ) -> Callable[[Client], Collection]:
    def make(client: Client) -> Collection:
        import dask.dataframe as dd

        frame = X.assign(**{LABEL: y})                      # y by position, not by index
        parts = [frame.iloc[a:b] for a, b in cuts]
        ddf = dd.from_map(_rows, parts, meta=frame.iloc[:0], enforce_metadata=False)
        with _in_graph():
            return collections.from_frame(client, ddf, LABEL, where="X")
    return make


def _rows(part: Any) -> Any:
    """A partition of an in-memory frame: itself (it travels in the graph)."""
    return part


def feature_names(columns: tuple[Any, ...] | None) -> np.ndarray | None:
    """scikit-learn's ``feature_names_in_``: the column names, if every one is a string."""
    if columns is None or not all(isinstance(c, str) for c in columns):
        return None
    return np.asarray(columns, dtype=object)


# --- Dask collections -------------------------------------------------------------------------

def _dask_array(X: Any, y: Any, classifier: bool = True, w: Any = None) -> TrainingData:
    import dask.array as da

    if not isinstance(X, da.Array):
        raise ValueError(f"X is a {type(X).__name__}; pass a dask.array or dask.dataframe of "
                         f"rows by features")
    if X.ndim != 2:
        raise ValueError(f"Expected 2D array, got {X.ndim}D array instead: X must be (rows, "
                         f"features)")
    if X.shape[1] != X.shape[1] or X.shape[1] < 1:
        raise ValueError(f"X has {X.shape[1]} features; pass a dask.array whose feature count "
                         f"is known and at least 1")
    if not np.issubdtype(X.dtype, np.number) and X.dtype != bool:
        raise ValueError(f"X holds {X.dtype} values; the features must be numbers")
    if isinstance(y, str):
        raise ValueError(f"y = {y!r} names a column, but X is a dask.array; pass y as an "
                         f"array of labels")
    if is_dask(y) and _is_frame(y):
        raise ValueError("y is a dask.dataframe; pass one column (a dask Series or array)")
    if not is_dask(y):
        y = np.asarray(y)
    elif not isinstance(y, da.Array):
        y = y.to_dask_array()
    if y.ndim not in (1, 2):
        raise ValueError(f"y has shape {y.shape}; pass one label (or a row of targets or 0/1 "
                         f"label indicators) per row")
    if not is_dask(y):
        y = da.from_array(y, chunks=-1)        # cut as X is by from_arrays, which checks lengths
    if w is not None and not isinstance(w, da.Array):
        w = w.to_dask_array()

    def make(client: Client) -> Collection:
        return collections.from_arrays(client, X, y, w)
    multilabel = classifier and y.ndim == 2
    return TrainingData(int(X.shape[1]), make, True,
                        np.arange(y.shape[1]) if multilabel else None,
                        targets=1 if y.ndim == 1 else int(y.shape[1]), multilabel=multilabel,
                        dtype=y.dtype if multilabel else None, x_dtype=floats([X.dtype]))


def _dask_frame(X: Any, y: Any, w: Any = None) -> TrainingData:
    label = y if isinstance(y, str) else ""
    if label and label not in X.columns:
        raise ValueError(f"y = {y!r} names no column of X; its columns are "
                         f"{', '.join(map(str, X.columns))}")
    if not label and not (is_dask(y) and getattr(y, "ndim", 0) == 1 and hasattr(y, "index")):
        raise ValueError("X is a dask.dataframe: pass y as the name of its label column, or "
                         "as a dask Series with X's partitions")
    columns = tuple(c for c in X.columns if c != label)
    if not columns:
        raise ValueError(f"X has no feature columns (shape=({X.shape[0]}, 0)); a minimum of 1 "
                         f"is required")
    collections.check_numeric(X.dtypes.to_dict(), list(columns), "X")

    def make(client: Client) -> Collection:
        return collections.from_frame(client, X, y, where="X", weight=w)
    return TrainingData(len(columns), make, True, None, columns, feature_names(columns), label,
                        x_dtype=floats(X.dtypes[list(columns)]))


# --- predict ----------------------------------------------------------------------------------

def predict_input(est: Any, X: Any) -> Any:
    """``X`` as the rows a fitted ``est`` takes: a checked NumPy array, or a lazy Dask
    array (a dataframe's feature columns picked by name, in training's order) whose blocks
    are checked as they are computed."""
    from sklearn.utils.validation import validate_data

    columns = getattr(est, "_columns", None)
    if is_dask(X):
        return _lazy_rows(est, X, columns)
    if _is_frame(X) and columns is not None and list(X.columns) != list(columns) and \
            set(columns) <= set(X.columns):
        X = X[list(columns)]
    x = validate_data(est, X, reset=False, dtype="numeric", ensure_all_finite=False,
                      accept_sparse="csr")
    if hasattr(x, "toarray"):
        x = x.toarray()                                                 # sparse: dense rows
    check_finite(x, "X", columns if _is_frame(X) else None)
    return x


def _lazy_rows(est: Any, X: Any, columns: tuple[Any, ...] | None) -> Any:
    if _is_frame(X):
        if columns is not None:                # fitted on a frame: its columns, by name
            lacking = [c for c in columns if c not in set(X.columns)]
            if lacking:
                raise ValueError(f"X lacks the feature column(s) "
                                 f"{', '.join(map(repr, lacking))} that "
                                 f"{type(est).__name__} was fitted on; its columns are "
                                 f"{', '.join(map(repr, X.columns))}")
            X = X[list(columns)]
        elif len(X.columns) != est.n_features_in_:
            raise ValueError(f"X has columns {', '.join(map(str, X.columns))} but "
                             f"{type(est).__name__} was fitted on "
                             f"{est.n_features_in_} unnamed features")
        X = X.to_dask_array()                  # lazy; unknown block lengths stay unknown
    if X.ndim != 2 or X.shape[1] != est.n_features_in_:
        shape = X.shape[1] if X.ndim == 2 else f"a {X.ndim}D array of"
        raise ValueError(f"X has {shape} features, but {type(est).__name__} is expecting "
                         f"{est.n_features_in_} features as input.")
    return X.map_blocks(_finite, columns=columns, dtype=X.dtype)


def _finite(block: np.ndarray, columns: tuple[Any, ...] | None = None,
            block_info: Any = None) -> np.ndarray:
    """A block of rows to predict, checked: NaN or infinity is a ValueError naming the
    block, the row and the column."""
    bad = first_bad(block)
    if bad is not None:
        r, c = bad
        info = (block_info or {}).get(0) or {}
        index = (info.get("chunk-location") or (0,))[0]
        start = (info.get("array-location") or [(0, 0)])[0][0]
        row = f"row {int(start) + r}" if isinstance(start, (int, np.integer)) else \
            f"row {r} of the block"
        column = f"column {columns[c]!r}" if columns is not None else f"column {c}"
        raise DataError(f"X (partition {index}), {row}, {column}: {shown(block[r, c])}; "
                        f"features must be finite numbers: fill or drop those rows before "
                        f"predicting")
    return block
