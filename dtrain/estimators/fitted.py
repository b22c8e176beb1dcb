"""What a finished run makes of an estimator, and where the next fit of it starts.

:func:`record` sets the fitted attributes scikit-learn names (``coefs_``,
``loss_curve_``, ``n_iter_``, ...) from a run's result; :func:`starting_point` and
:func:`fit_state` let ``partial_fit`` and a ``warm_start`` fit go on from the last
state, with the first fit's normalization.
"""
from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from dtrain.core import files
from dtrain.estimators.inputs import TrainingData
from dtrain.inference.model import Model
from dtrain.maths.optim import TrainState, state_size
from dtrain.training.trainer import RunResult


@contextlib.contextmanager
def starting_point(est: Any, going_on: bool) -> Iterator[tuple[str, TrainState | None]]:
    """Where a fit of ``est`` starts: afresh, or (going on) from the last state, with the
    fitted normalization through ``model.init_from``: the previous run directory when the
    last fit wrote ``out`` and this one does too, else a temporary one."""
    if not going_on:
        yield "", None
        return
    last = getattr(est, "run_dir_", None)
    if est.out is not None and last is not None and Path(est.out).resolve() == \
            Path(last).resolve() and (Path(last) / files.PARAMS).exists():
        yield str(Path(last).resolve()), est._state
        return
    with tempfile.TemporaryDirectory(prefix="dtrain-going-on-") as tmp:
        spec, params = est.model_.spec, est._params
        (Path(tmp) / files.MODEL).write_text(spec.to_json(), encoding="utf-8")
        np.savez(Path(tmp) / files.PARAMS, **params)
        yield tmp, est._state


def record(est: Any, result: RunResult, data: TrainingData, found: np.ndarray,
            going_on: bool, incremental: bool) -> None:
    """``est``'s fitted attributes from a finished run, as scikit-learn names and counts
    them."""
    rows = result.metrics
    if est._classifier:
        est.classes_ = found
        est._multilabel, est._label_dtype = data.multilabel, data.dtype
    est.n_features_in_ = data.features
    if data.names is not None:
        est.feature_names_in_ = data.names
    elif hasattr(est, "feature_names_in_"):
        del est.feature_names_in_
    est._columns = data.columns
    model = Model(result.model, result.params)
    if est._classifier and not data.multilabel:
        model.classes_ = est.classes_         # predictions of the labels' own dtype
    est.model_, est._params, est._state = model, result.params, result.state
    losses = [float(r["train_loss"]) for r in rows]
    est.loss_curve_ = (est.loss_curve_ if going_on else []) + losses
    est.loss_ = est.loss_curve_[-1]
    est.n_iter_ = len(rows)                   # this fit's epochs (partial_fit: 1)
    est.t_ = (est.t_ if going_on else 0) + result.summary["train_samples"] * len(rows)
    stopping = est.early_stopping and not incremental
    est.best_loss_ = None if stopping else min(est.loss_curve_)
    scores = [r[est._val_score] for r in rows if r.get(est._val_score) is not None]
    est.validation_scores_ = scores if stopping and scores else None
    est.best_validation_score_ = max(scores) if stopping and scores else None
    layers = result.model.layers
    est.coefs_ = [result.params[f"W{n}"].T for n in range(1, len(layers))]
    est.intercepts_ = [result.params[f"b{n}"] for n in range(1, len(layers))]
    est.n_layers_ = len(layers)
    est.n_outputs_ = layers[-1]
    est.out_activation_ = result.model.output
    est.summary_ = result.summary
    est.run_dir_ = result.out
    if not incremental and len(rows) == est.max_iter and \
            not result.summary.get("stopped_early"):
        warnings.warn(f"Stochastic Optimizer: Maximum iterations ({est.max_iter}) reached "
                      f"and the optimization hasn't converged yet.", ConvergenceWarning,
                      stacklevel=5)


def fit_state(state: TrainState, cfg: Any) -> TrainState:
    """The last state (of the same network) in this fit's optimizer and dtype: its slots
    kept if the optimizer is of the same kind, zeroed if not; its epoch sums kept (the
    adaptive schedule judges the last epoch from them)."""
    layers = cfg.model.layers
    size = sum(o * (i + 1) for i, o in zip(layers[:-1], layers[1:]))
    vector = np.asarray(state.vector)                                    # (state size,)
    wanted = state_size(cfg.optim, size)
    if vector.size != wanted:
        fresh = np.zeros(wanted)
        if cfg.optim.schedule == "adaptive":
            fresh[-3:] = (1.0, np.inf, 0.0)
        fresh[:size] = vector[:size]
        vector = fresh
    return TrainState(vector.astype(cfg.model.dtype), state.epoch_loss, state.epoch_samples,
                      state.epoch_correct)
