"""What an estimator's ``fit`` and ``predict`` are given, made into what dtrain trains on.

:func:`training_data` checks ``X`` and ``y`` on the driver as far as that is
cheap (shapes, lengths, types, the classes of an in-memory ``y``) and
returns a :class:`TrainingData` whose ``collection(client)`` puts them on the
cluster as a :class:`~dtrain.training.collections.Collection`:

* NumPy and pandas inputs are cut into ``shards`` blocks of consecutive rows
  (as ``numpy.array_split`` cuts them), each block its own key of a Dask
  graph, so a lost worker's partitions can be computed again;
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
from dtrain.data.missing import check_finite, first_bad, missing_labels, shown
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
    label column's name when ``y`` named one.
    """

    features: int
    make: Callable[[Client], Collection]
    dask: bool
    classes: np.ndarray | None = None
    columns: tuple[Any, ...] | None = None
    names: np.ndarray | None = None
    label: str = ""

    def collection(self, client: Client) -> Collection:
        return self.make(client)


def is_dask(obj: Any) -> bool:
    """Whether ``obj`` is a Dask collection (array, dataframe, series)."""
    return type(obj).__module__.startswith("dask") and hasattr(obj, "__dask_graph__")


def _is_frame(obj: Any) -> bool:
    return hasattr(obj, "columns") and hasattr(obj, "dtypes") and getattr(obj, "ndim", 2) == 2


def training_data(X: Any, y: Any, *, shards: int, classifier: bool) -> TrainingData:
    """``X`` and ``y`` as :class:`TrainingData`; a ``ValueError`` (or ``TypeError`` for
    sparse input) saying what is wrong with them, before any cluster is involved."""
    if y is None:
        raise ValueError("requires y to be passed, but the target y is None: pass the labels, "
                         "or the name of X's label column")
    if is_dask(X) or is_dask(y):
        if not is_dask(X):
            raise ValueError("y is a Dask collection but X is not; pass X as a dask.array or "
                             "dask.dataframe with the same partitions as y")
        return _dask_frame(X, y) if _is_frame(X) else _dask_array(X, y)
    return _in_memory(X, y, shards, classifier)


# --- NumPy and pandas -------------------------------------------------------------------------

def blocks(rows: int, shards: int) -> list[tuple[int, int]]:
    """Rows ``[a, b)`` of each of ``shards`` blocks of consecutive rows, as
    ``numpy.array_split`` cuts them (the first ``rows % shards`` one row longer)."""
    bounds = np.cumsum([0] + [len(b) for b in np.array_split(np.arange(rows), shards)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _in_memory(X: Any, y: Any, shards: int, classifier: bool) -> TrainingData:
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
        check_finite(X.to_numpy(dtype=np.float64, na_value=np.nan), "X", columns, FIX)
    else:
        X = check_array(X, dtype="numeric", ensure_all_finite=False, ensure_2d=True)
        columns = None
        check_finite(X, "X", fix=FIX)
    y = _labels(y, X.shape[0], classifier)
    classes = np.unique(y) if classifier else None
    if X.shape[0] < shards:
        raise ValueError(f"X has {X.shape[0]} sample{'s' if X.shape[0] > 1 else ''} for "
                         f"shards = {shards}: each shard needs at least one training sample; "
                         f"pass shards <= {X.shape[0]}")
    cuts = blocks(X.shape[0], shards)
    make = _frame_maker(X, y, cuts) if frame else _array_maker(X, y, cuts)
    return TrainingData(X.shape[1], make, False, classes, columns, feature_names(columns),
                        label)


def _shape_ok(shape: tuple[int, ...]) -> None:
    """scikit-learn's messages for an empty X."""
    if shape[0] < 1:
        raise ValueError(f"Found array with 0 sample(s) (shape={shape}) while a minimum of 1 "
                         f"is required.")
    if shape[1] < 1:
        raise ValueError(f"Found array with 0 feature(s) (shape={shape}) while a minimum of 1 "
                         f"is required.")


def _labels(y: Any, rows: int, classifier: bool) -> np.ndarray:
    """``y`` as a 1-d array of ``rows`` labels (a column vector is taken, with scikit-learn's
    warning); classification targets must be classes, not real values."""
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import column_or_1d

    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] != 1 or y.ndim > 2:
        raise ValueError(f"y has shape {y.shape}; dtrain learns one label per row: pass y of "
                         f"shape ({rows},)")
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
    else:
        t = np.asarray(y, dtype=np.float64)
        if not np.isfinite(t).all():
            r = int(np.argmax(~np.isfinite(t)))
            raise ValueError(f"y[{r}] is {shown(t[r])}: the targets must be finite numbers "
                             f"(Input y contains NaN or infinity); drop or fix those rows")
    return y


def _array_maker(x: np.ndarray, y: np.ndarray, cuts: list[tuple[int, int]]
                 ) -> Callable[[Client], Collection]:
    def make(client: Client) -> Collection:
        import dask.array as da

        # one key per block (not one array sliced by every block's task): each worker
        # receives its own rows only
        xs = da.concatenate([da.from_array(x[a:b], chunks=x[a:b].shape) for a, b in cuts])
        ys = da.concatenate([da.from_array(y[a:b], chunks=(b - a,)) for a, b in cuts])
        return collections.from_arrays(client, xs, ys)
    return make


def _frame_maker(X: Any, y: np.ndarray, cuts: list[tuple[int, int]]
                 ) -> Callable[[Client], Collection]:
    def make(client: Client) -> Collection:
        import dask.dataframe as dd

        frame = X.assign(**{LABEL: y})                      # y by position, not by index
        parts = [frame.iloc[a:b] for a, b in cuts]
        ddf = dd.from_map(_rows, parts, meta=frame.iloc[:0], enforce_metadata=False)
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

def _dask_array(X: Any, y: Any) -> TrainingData:
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
    if y.ndim != 1:
        raise ValueError(f"y has shape {y.shape}; dtrain learns one label per row")
    if not is_dask(y):
        y = da.from_array(y, chunks=-1)        # cut as X is by from_arrays, which checks lengths

    def make(client: Client) -> Collection:
        return collections.from_arrays(client, X, y)
    return TrainingData(int(X.shape[1]), make, True)


def _dask_frame(X: Any, y: Any) -> TrainingData:
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
        return collections.from_frame(client, X, y, where="X")
    return TrainingData(len(columns), make, True, None, columns, feature_names(columns), label)


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
    x = validate_data(est, X, reset=False, dtype="numeric", ensure_all_finite=False)
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
