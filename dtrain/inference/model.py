"""A trained model applied to raw inputs: ``predict``, ``predict_proba``, ``score``.

:class:`Model` is what :func:`dtrain.load` returns.  It applies the saved
normalization, the network and its output layer (softmax, or sigmoid for an
``mse`` model) to raw features, in chunks, with NumPy.  Given a Dask array
it returns a lazy Dask array: one task per block of rows, the model itself
one key of the graph, so each worker receives it once.

A regression model (loss ``squared-error``) behaves as scikit-learn's
regressors: ``predict`` gives the values, ``score`` is R^2, and it has no
``predict_proba`` and no ``classes_`` (``hasattr`` says False).

A model with logistic outputs (loss ``binary-cross-entropy``) behaves as
scikit-learn's MLPClassifier with them: two classes share one output
(``predict_proba`` gives both columns, ``1 - p`` and ``p``; the second class is
predicted where ``p > 0.5``), and a multilabel model predicts a 0/1 indicator
per label (``(rows, labels)``), scored by the share of rows with every label
right.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dtrain.core import layerspec
from dtrain.core.errors import DataError, UserError
from dtrain.core.modelfile import ModelSpec
from dtrain.data.missing import first_bad, shown
from dtrain.inference.metrics import Report, ValueReport, report
from dtrain.inference.saved import read_run
from dtrain.maths.dense import sigmoid
from dtrain.maths.model import Network
from dtrain.maths.scores import r2

CHUNK = 8192    # rows per forward pass (bounds the memory of a predict on NumPy)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))          # (B, C)
    return e / e.sum(axis=1, keepdims=True)


class Model:
    """A trained network with its input normalization and class labels.

    Parameters
    ----------
    spec
        The network and its input pipeline (``model.json``).
    params
        ``{"W1": ..., "b1": ..., ...}`` as in ``params.npz``.

    Attributes
    ----------
    classes_ : numpy.ndarray
        The class labels as the data named them, in output order (classifiers only).
    targets_ : numpy.ndarray
        The names of a regression's targets, in output order (regressions only).
    regression : bool
        Whether the model predicts real values (loss ``squared-error``).
    n_features_in_ : int
        Features of a raw input row.
    feature_names_in_ : numpy.ndarray or None
        Their names, where the training data had them.
    """

    def __init__(self, spec: ModelSpec, params: dict[str, np.ndarray]):
        self.spec = spec
        self.net = Network(spec.layers, spec.activation, spec.loss, spec.dtype,
                           input_shape=spec.input_shape)
        flat = [params[f"{k}{n}"].ravel() for n in range(1, len(spec.weight_shapes) + 1)
                for k in "Wb"]
        self.params = np.concatenate(flat).astype(spec.dtype)             # (P,)
        self.regression = spec.regression
        if self.regression:
            self.targets_ = np.asarray(spec.targets, dtype=object)
        else:
            self.classes_ = np.asarray(spec.classes)
        self.n_features_in_ = spec.features
        self.feature_names_in_ = None if spec.feature_names is None \
            else np.asarray(spec.feature_names, dtype=object)

    @classmethod
    def read(cls, run_dir: str | Path) -> Model:
        return cls(*read_run(run_dir))

    def __repr__(self) -> str:
        names = f"targets={list(self.spec.targets)}" if self.regression \
            else f"classes={self.classes_.tolist()}"
        layers = list(self.spec.layers) if layerspec.dense_only(self.spec.layers) \
            else repr(layerspec.describe(self.spec.layers, self.spec.input_shape))
        return (f"dtrain.Model(layers={layers}, "
                f"activation="
                f"{self.spec.activation!r}, {names})")

    # --- the maths --------------------------------------------------------------------------

    def inputs(self, X: Any, where: str = "X", first_row: int = 0) -> np.ndarray:
        """Raw rows (B, D) as the network sees them: checked, normalized, as its dtype.

        A DataFrame's feature columns are picked by name where the model knows its
        features' names; a NaN or infinite value is a
        :class:`~dtrain.core.errors.DataError` naming its row (``first_row`` + its index:
        a block's place in the whole input) and column, in ``where``: no row is labelled
        from values that are not numbers.
        """
        X = self._by_name(X)
        x = np.asarray(X)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            shape = "x".join(map(str, x.shape))
            raise UserError(f"the input has shape {shape} but the model takes rows of "
                            f"{self.n_features_in_} features; pass an array of shape "
                            f"(rows, {self.n_features_in_})")
        if not np.issubdtype(x.dtype, np.number):
            raise UserError(f"the input holds {x.dtype} values; the model takes numbers")
        bad = first_bad(x)
        if bad is not None:
            r, c = bad
            names = self.spec.feature_names
            column = f"column {c} ({names[c]!r})" if names else f"column {c}"
            raise DataError(f"{where}: row {first_row + r}, {column}: {shown(x[r, c])}; "
                            f"features must be finite numbers: fill or drop those rows (a "
                            f"prediction from them would be meaningless)")
        return self.spec.normalization.apply(x, self.spec.dtype)

    def _by_name(self, X: Any) -> Any:
        """A DataFrame's feature columns, by the names the model was trained with (in
        training's order); any other input as it is."""
        names = self.spec.feature_names
        columns = getattr(X, "columns", None)
        if names is None or columns is None or not hasattr(X, "dtypes"):
            return X
        found = [str(c) for c in columns]
        if found == list(names):
            return X
        lacking = [n for n in names if n not in found]
        if lacking:
            raise DataError(f"the input lacks the feature column(s) "
                            f"{', '.join(map(repr, lacking[:5]))}"
                            f"{', ...' if len(lacking) > 5 else ''} that the model was trained "
                            f"on; its columns are {', '.join(map(repr, found))}")
        by_text = {str(c): c for c in columns}
        return X[[by_text[n] for n in names]]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Output-layer inputs (B, C) of normalized rows, in chunks: what training's argmax
        reads, so a prediction is the class training counted as predicted; a regression's
        predicted values (B, T) (through ``exp`` for a Poisson model), as training's R^2
        reads them."""
        if self.regression:
            return self.net.predictions(self.params, x, CHUNK)
        out = np.empty((x.shape[0], self.spec.layers[-1]), dtype=self.spec.dtype)
        with np.errstate(all="ignore"):
            for lo in range(0, x.shape[0], CHUNK):
                out[lo:lo + CHUNK] = self.net.forward(self.params, x[lo:lo + CHUNK])[-1]
        return out

    def _probabilities(self, z: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            if self.spec.output == "softmax":
                return _softmax(z)
            p = sigmoid(np, z)                                          # (B, C)
        return p if self.spec.output != "logistic" or self.spec.multilabel \
            else np.hstack([1 - p, p])                                  # (B, 2)

    def predicted(self, z: np.ndarray) -> np.ndarray:
        """The class index (B,) of each row of outputs ``z`` (B, C): the largest output, or
        for one logistic output of two classes the second where ``z > 0`` (probability
        above 0.5); a multilabel model's 0/1 indicators (B, L)."""
        if self.spec.output != "logistic":
            return z.argmax(axis=1)
        on = (z > 0).astype(np.int64)                                   # (B, L)
        return on if self.spec.multilabel else on[:, 0]

    def _proba(self, X: Any) -> np.ndarray:
        return self._probabilities(self.logits(self.inputs(X)))

    def _labels(self, X: Any) -> np.ndarray:
        found = self.predicted(self.logits(self.inputs(X)))
        return found if self.spec.multilabel else self.classes_[found]

    def _values(self, X: Any) -> np.ndarray:
        z = self.logits(self.inputs(X))                                   # (B, T)
        return z[:, 0] if z.shape[1] == 1 else z

    # --- scikit-learn's API ----------------------------------------------------------------

    @property
    def predict_proba(self) -> Any:
        """Class probabilities (rows, classes); the sigmoid outputs of an ``mse`` model.

        ``predict_proba(X)``, ``X``: a NumPy array, anything NumPy can convert, or a
        Dask array (then a lazy Dask array comes back, one task per block of rows).  A
        regression model has none: the attribute raises AttributeError, as scikit-learn's
        regressors lack it, so ``hasattr(model, "predict_proba")`` is False.
        """
        if self.regression:
            raise AttributeError(f"a regression model (loss {self.spec.loss!r}) has no "
                                 f"predict_proba: its outputs are values; use predict")
        return self._predict_proba

    def _predict_proba(self, X: Any) -> Any:
        if _is_dask(X):
            return self._lazy(X, _proba_block, len(self.classes_), self.spec.dtype)
        return self._proba(X)

    def predict(self, X: Any) -> Any:
        """The most likely class label of each row, as ``classes_`` names them; for a
        regression the predicted values: (rows,) for one target, else (rows, targets)."""
        if self.regression:
            targets = self.spec.layers[-1]
            if _is_dask(X):
                return self._lazy(X, _values_block, None if targets == 1 else targets,
                                  self.spec.dtype)
            return self._values(X)
        if _is_dask(X) and self.spec.multilabel:
            return self._lazy(X, _predict_block, len(self.classes_), np.int64)
        if _is_dask(X):
            return self._lazy(X, _predict_block, None, self.classes_.dtype)
        return self._labels(X)

    def score(self, X: Any, y: Any) -> float:
        """Accuracy: the share of rows whose predicted label is ``y``'s; for a regression
        R^2 (the mean over targets, as scikit-learn's ``r2_score``), against ``y`` as given."""
        if self.regression:
            return self._r2(X, y)
        if _is_dask(X) or _is_dask(y):
            import dask.array as da

            hits = self.predict(X) == y
            return float(da.mean(hits.all(axis=1) if self.spec.multilabel else hits).compute())
        hits = self.predict(X) == np.asarray(y)
        return float(np.mean(hits.all(axis=1) if self.spec.multilabel else hits))

    def _r2(self, X: Any, y: Any) -> float:
        predicted = self.predict(X)                      # (rows,) or (rows, T)
        if not _is_dask(y):
            y = np.asarray(y, dtype=np.float64)
        if y.ndim == 2 and y.shape[1] == 1 and predicted.ndim == 1:
            y = y[:, 0]
        if y.ndim != predicted.ndim or y.shape[1:] != predicted.shape[1:]:
            raise UserError(f"y has shape {y.shape} but the model predicts "
                            f"{predicted.shape[1:] or 'one value'} per row; pass y of shape "
                            f"(rows,{'' if predicted.ndim == 1 else f' {predicted.shape[1]}'})")
        sums = _r2_sums(predicted, y)
        if _is_dask(predicted) or _is_dask(y):
            import dask

            sums = dask.compute(*sums)
        return float(r2(*sums).mean())

    def evaluate(self, X: Any, y: Any) -> Report | ValueReport:
        """Accuracy, loss, per-class precision, recall and F1, and the confusion matrix of
        the model on raw rows ``X`` and labels ``y`` (as ``classes_`` names them); for a
        regression the loss, MSE, RMSE, MAE and R^2, per target and overall."""
        x = self.inputs(X)
        return report(self, x, self.values(y, x.shape[0]) if self.regression
                      else self.encode(y))

    def values(self, y: Any, rows: int | None = None) -> np.ndarray:
        """A regression's targets as (rows, targets) in the model's dtype, as training
        compared them; a wrong shape or a value that is not a finite number is a UserError."""
        targets = self.spec.layers[-1]
        try:
            t = np.asarray(y, dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError("the targets are not all numbers; a regression model takes "
                            "real-valued targets") from None
        if t.ndim == 1 and targets == 1:
            t = t[:, None]
        if t.ndim != 2 or t.shape[1] != targets or (rows is not None and t.shape[0] != rows):
            raise UserError(f"the targets have shape {'x'.join(map(str, t.shape))} but the "
                            f"model predicts {targets} target(s) for "
                            f"{rows if rows is not None else 'each'} row(s)")
        if not np.isfinite(t).all():
            raise UserError("the targets hold NaN or infinite values; drop or fix those rows")
        return np.ascontiguousarray(t, dtype=self.spec.dtype)            # (N, T)

    def encode(self, y: Any) -> np.ndarray:
        """Labels as output indices; a label the model never saw is a UserError."""
        if self.spec.multilabel:
            raise UserError("a multilabel model's evaluation takes 0/1 indicators per label; "
                            "score it in Python (dtrain.load(run).score(X, Y)) or with "
                            "scikit-learn's metrics on predict(X)")
        y = np.asarray(y)
        index = {_key(c): i for i, c in enumerate(self.classes_)}
        try:
            return np.fromiter((index[_key(v)] for v in y), dtype=np.int64, count=y.shape[0])
        except KeyError as exc:
            unseen = sorted({str(v) for v in y if _key(v) not in index})
            raise UserError(f"labels {', '.join(unseen[:5])} were never seen in training; the "
                            f"model knows {', '.join(map(str, self.classes_))}") from exc

    def loss(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int, int]:
        """``(summed loss, correct, rows)`` of normalized rows, computed as training
        evaluates (the same chunks, the same order: the same bits)."""
        return self.net.evaluate(self.params, x, y)

    # --- Dask arrays -----------------------------------------------------------------------

    def _lazy(self, X: Any, fn: Any, width: int | None, dtype: Any) -> Any:
        import dask

        X = _as_dask_array(self._by_name(X), self.n_features_in_)
        model = dask.delayed(self, pure=True, traverse=False)     # one key: shipped once
        if width is None:
            return X.map_blocks(fn, model, drop_axis=1, dtype=dtype, meta=np.empty(0, dtype))
        return X.map_blocks(fn, model, chunks=(X.chunks[0], (width,)), dtype=dtype,
                            meta=np.empty((0, width), dtype))


def _proba_block(block: np.ndarray, model: Model, block_info: Any = None) -> np.ndarray:
    return model._probabilities(model.logits(model.inputs(block, *_place(block_info))))


def _predict_block(block: np.ndarray, model: Model, block_info: Any = None) -> np.ndarray:
    found = model.predicted(model.logits(model.inputs(block, *_place(block_info))))
    return found if model.spec.multilabel else model.classes_[found]


def _values_block(block: np.ndarray, model: Model, block_info: Any = None) -> np.ndarray:
    z = model.logits(model.inputs(block, *_place(block_info)))          # (B, T)
    return z[:, 0] if z.shape[1] == 1 else z


def _place(block_info: Any) -> tuple[str, int]:
    """Where a block of a Dask input is, for its error messages: ``("block 3 of X", first
    row)`` (the first row where the chunk sizes are known, else 0: rows of the block)."""
    info = (block_info or {}).get(0) or {}
    index = (info.get("chunk-location") or (None,))[0]
    start = (info.get("array-location") or [(0, 0)])[0][0]
    known = isinstance(start, (int, np.integer)) and start == start
    if index is None:
        return "X", 0
    return (f"X (block {index}{'' if known else ', rows counted within it'})",
            int(start) if known else 0)


def _r2_sums(predicted: Any, y: Any) -> tuple[Any, Any]:
    """Summed squared errors and the targets' centred sums of squares, per target: NumPy,
    or lazy Dask arrays when either side is one."""
    diff = predicted - y
    return (diff * diff).sum(axis=0), ((y - y.mean(axis=0)) ** 2).sum(axis=0)


def _key(label: Any) -> Any:
    """Labels compared as the data names them: 3 and "3" are one label."""
    return str(label.item() if isinstance(label, np.generic) else label)


def _is_dask(x: Any) -> bool:
    return type(x).__module__.startswith("dask.") and hasattr(x, "__dask_graph__")


def _as_dask_array(X: Any, features: int) -> Any:
    """A Dask array of rows with all columns in one block (a dataframe's values, unknown
    row counts and all)."""
    import dask.array as da

    if not isinstance(X, da.Array):
        X = X.to_dask_array()
    if X.ndim != 2 or X.shape[1] != features:
        raise UserError(f"the input has shape {X.shape} but the model takes rows of "
                        f"{features} features")
    return X.rechunk({1: -1}) if len(X.chunks[1]) > 1 else X


def load(run_dir: str | Path) -> Model:
    """Load a finished run as a model.

    Parameters
    ----------
    run_dir
        A run directory (``model.json`` and ``params.npz``; a run written by
        dtrain 0.1 is read from its ``config.toml`` and data).

    Returns
    -------
    Model
        With ``predict``, ``predict_proba``, ``score``, ``evaluate`` and
        ``classes_``.

    Examples
    --------
    >>> model = dtrain.load("runs/20250101-120000-iris")        # doctest: +SKIP
    >>> model.predict([[5.1, 3.5, 1.4, 0.2]])                   # doctest: +SKIP
    array(['setosa'], dtype='<U10')
    """
    return Model.read(run_dir)


__all__ = ["Model", "load"]
