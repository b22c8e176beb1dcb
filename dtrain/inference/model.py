"""A trained model applied to raw inputs: ``predict``, ``predict_proba``, ``score``.

:class:`Model` is what :func:`dtrain.load` returns.  It applies the saved
normalization, the network and its output layer (softmax, or sigmoid for an
``mse`` model) to raw features, in chunks, with NumPy.  Given a Dask array
it returns a lazy Dask array: one task per block of rows, the model itself
one key of the graph, so each worker receives it once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dtrain.core.errors import UserError
from dtrain.core.modelfile import ModelSpec
from dtrain.inference.metrics import Report, report
from dtrain.inference.saved import read_run
from dtrain.maths.model import Network, sigmoid

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
        The class labels as the data named them, in output order.
    n_features_in_ : int
        Features of a raw input row.
    feature_names_in_ : numpy.ndarray or None
        Their names, where the training data had them.
    """

    def __init__(self, spec: ModelSpec, params: dict[str, np.ndarray]):
        self.spec = spec
        self.net = Network(spec.layers, spec.activation, spec.loss, spec.dtype)
        flat = [params[f"{k}{n}"].ravel() for n in range(1, len(spec.layers)) for k in "Wb"]
        self.params = np.concatenate(flat).astype(spec.dtype)             # (P,)
        self.classes_ = np.asarray(spec.classes)
        self.n_features_in_ = spec.features
        self.feature_names_in_ = None if spec.feature_names is None \
            else np.asarray(spec.feature_names, dtype=object)

    @classmethod
    def read(cls, run_dir: str | Path) -> Model:
        return cls(*read_run(run_dir))

    def __repr__(self) -> str:
        return (f"dtrain.Model(layers={list(self.spec.layers)}, activation="
                f"{self.spec.activation!r}, classes={self.classes_.tolist()})")

    # --- the maths --------------------------------------------------------------------------

    def inputs(self, X: Any) -> np.ndarray:
        """Raw rows (B, D) as the network sees them: checked, normalized, as its dtype."""
        x = np.asarray(X)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            shape = "x".join(map(str, x.shape))
            raise UserError(f"the input has shape {shape} but the model takes rows of "
                            f"{self.n_features_in_} features; pass an array of shape "
                            f"(rows, {self.n_features_in_})")
        if not np.issubdtype(x.dtype, np.number):
            raise UserError(f"the input holds {x.dtype} values; the model takes numbers")
        return self.spec.normalization.apply(x, self.spec.dtype)

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Output-layer inputs (B, C) of normalized rows, in chunks: what training's argmax
        reads, so a prediction is the class training counted as predicted."""
        out = np.empty((x.shape[0], len(self.classes_)), dtype=self.spec.dtype)
        with np.errstate(all="ignore"):
            for lo in range(0, x.shape[0], CHUNK):
                out[lo:lo + CHUNK] = self.net.forward(self.params, x[lo:lo + CHUNK])[-1]
        return out

    def _probabilities(self, z: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return _softmax(z) if self.spec.output == "softmax" else sigmoid(np, z)

    def _proba(self, X: Any) -> np.ndarray:
        return self._probabilities(self.logits(self.inputs(X)))

    def _labels(self, X: Any) -> np.ndarray:
        return self.classes_[self.logits(self.inputs(X)).argmax(axis=1)]

    # --- scikit-learn's API ----------------------------------------------------------------

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities (rows, classes); the sigmoid outputs of an ``mse`` model.

        ``X``: a NumPy array, anything NumPy can convert, or a Dask array (then a
        lazy Dask array comes back, one task per block of rows).
        """
        if _is_dask(X):
            return self._lazy(X, _proba_block, len(self.classes_), self.spec.dtype)
        return self._proba(X)

    def predict(self, X: Any) -> Any:
        """The most likely class label of each row, as ``classes_`` names them."""
        if _is_dask(X):
            return self._lazy(X, _predict_block, None, self.classes_.dtype)
        return self._labels(X)

    def score(self, X: Any, y: Any) -> float:
        """Accuracy: the share of rows whose predicted label is ``y``'s."""
        if _is_dask(X) or _is_dask(y):
            import dask.array as da

            return float(da.mean(self.predict(X) == y).compute())
        return float(np.mean(self.predict(X) == np.asarray(y)))

    def evaluate(self, X: Any, y: Any) -> Report:
        """Accuracy, loss, per-class precision, recall and F1, and the confusion matrix of
        the model on raw rows ``X`` and labels ``y`` (as ``classes_`` names them)."""
        return report(self, self.inputs(X), self.encode(y))

    def encode(self, y: Any) -> np.ndarray:
        """Labels as output indices; a label the model never saw is a UserError."""
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

        X = _as_dask_array(X, self.n_features_in_)
        model = dask.delayed(self, pure=True, traverse=False)     # one key: shipped once
        if width is None:
            return X.map_blocks(fn, model, drop_axis=1, dtype=dtype, meta=np.empty(0, dtype))
        return X.map_blocks(fn, model, chunks=(X.chunks[0], (width,)), dtype=dtype,
                            meta=np.empty((0, width), dtype))


def _proba_block(block: np.ndarray, model: Model) -> np.ndarray:
    return model._proba(block)


def _predict_block(block: np.ndarray, model: Model) -> np.ndarray:
    return model._labels(block)


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
