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
    lbfgs = result.summary.get("solver", {})
    est.loss_curve_ = (est.loss_curve_ if going_on else []) + losses
    est.loss_ = losses[-1] if losses else lbfgs["loss"]   # lbfgs: its start met gtol
    est.n_iter_ = lbfgs.get("iterations", len(rows))   # this fit's epochs (partial_fit: 1)
    seen = 0 if lbfgs else result.summary["train_samples"] * len(rows)   # sklearn: lbfgs 0
    est.t_ = (est.t_ if going_on else 0) + seen
    stopping = est.early_stopping and not incremental and not lbfgs
    est.best_loss_ = None if stopping else min(est.loss_curve_, default=est.loss_)
    scores = [r[est._val_score] for r in rows if r.get(est._val_score) is not None]
    before = getattr(est, "validation_scores_", None) if going_on else None
    est.validation_scores_ = (before or []) + scores if stopping and scores else None
    finite = [v for v in est.validation_scores_ or () if np.isfinite(v)]
    est.best_validation_score_ = max(finite) if stopping and finite else None
    layers = result.model.layers
    est.coefs_ = [result.params[f"W{n}"].T for n in range(1, len(layers))]
    est.intercepts_ = [result.params[f"b{n}"] for n in range(1, len(layers))]
    est.n_layers_ = len(layers)
    est.n_outputs_ = layers[-1]
    est.out_activation_ = result.model.output
    est.summary_ = result.summary
    est.run_dir_ = result.out
    if not all(np.isfinite(w).all() for w in est.coefs_ + est.intercepts_):
        raise ValueError("Solver produced non-finite parameter weights. The input data may "
                         "contain large values and need to be preprocessed. (Lowering "
                         "learning_rate_init or raising alpha may help.)")
    _warn(est, result, rows, incremental)


def _warn(est: Any, result: RunResult, rows: list[dict[str, Any]], incremental: bool) -> None:
    """scikit-learn's ConvergenceWarning where a limit stopped the fit (``max_iter``; lbfgs:
    scipy's status), and one where the loss diverged and early stopping kept an earlier
    epoch's parameters."""
    summary = result.summary
    if summary.get("stopped_because") == "diverged":
        warnings.warn(f"The training loss diverged in epoch {summary['stopped_early']} "
                      f"(validation score {rows[-1].get(est._val_score)}): the fit ended "
                      f"there and kept the parameters of epoch {summary['best_epoch']}, the "
                      f"best validation score; lower learning_rate_init or raise alpha.",
                      ConvergenceWarning, stacklevel=6)
    elif "solver" in summary:
        from scipy.optimize import OptimizeResult
        from sklearn.utils.optimize import _check_optimize_result

        solver = summary["solver"]
        _check_optimize_result("lbfgs", OptimizeResult(
            status=solver["status"], message=solver["message"], nit=solver["iterations"]),
            est.max_iter)
    elif not incremental and len(rows) == est.max_iter and not summary.get("stopped_early"):
        warnings.warn(f"Stochastic Optimizer: Maximum iterations ({est.max_iter}) reached "
                      f"and the optimization hasn't converged yet.", ConvergenceWarning,
                      stacklevel=6)


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
