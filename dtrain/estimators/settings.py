"""An estimator's parameters checked, and turned into the dtrain run config they mean.

scikit-learn's names map to dtrain's keys as :func:`config` says: the
network is ``[features, *hidden_layer_sizes, outputs]``, initialized as
scikit-learn initializes it (``model.init = "scikit-learn"``); ``solver``,
``momentum`` and ``nesterovs_momentum`` pick ``optim.name`` and
``optim.nesterov``; ``learning_rate`` and ``power_t`` (sgd only, as in
scikit-learn) the schedule; ``alpha`` becomes ``model.l2 = alpha / batch``
(scikit-learn adds ``alpha * W / batch`` to the minibatch's mean gradient,
dtrain adds ``l2 * W``: the same step for a full minibatch; with sample
weights ``alpha / (batch * mean weight)``, as scikit-learn divides by the
minibatch's summed weights); ``early_stopping`` splits off
``validation_fraction`` of every partition and watches the validation score
(accuracy, R^2), otherwise the training loss is watched, in both cases by
scikit-learn's rule (``train.stopping``: the best so far by ``tol``, more
than ``n_iter_no_change`` epochs: :func:`stopping`); ``solver="lbfgs"`` is
``optim.name = "lbfgs"``, a full batch, ``max_iter`` iterations, ``max_fun``
and ``tol`` scipy's ``maxfun`` and ``gtol``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtrain.core.config import Config, load_config

ACTIVATIONS = {"relu": "relu", "tanh": "tanh", "logistic": "sigmoid", "identity": "identity"}
SOLVERS = ("adam", "sgd", "lbfgs")
SCHEDULES = ("constant", "invscaling", "adaptive")     # learning_rate
LOSSES = {"squared_error": "squared-error", "poisson": "poisson"}   # MLPRegressor's loss
DTYPES = ("auto", "float32", "float64")
STRATEGIES = ("auto", "allreduce", "parameter-server", "local-sgd")  # those that train on partitions
ADAPTIVE_FACTOR = 0.2   # learning_rate="adaptive" divides the rate by 5, as scikit-learn
NO_MAX_LOSS = float(np.finfo(np.float64).max)   # only a non-finite loss diverges, as in sklearn

PARAMS_DOC = """
    Parameters
    ----------
    hidden_layer_sizes : int or sequence of int, default=(100,)
        Units of each hidden layer.
    activation : {"relu", "tanh", "logistic", "identity"}, default="relu"
        Hidden-layer activation ("logistic" is dtrain's sigmoid).
    solver : {"adam", "sgd", "lbfgs"}, default="adam"
        "sgd" is dtrain's sgd, or momentum when ``momentum > 0``.  "lbfgs": full-batch
        L-BFGS, scipy's L-BFGS-B on the driver (on the worker when one holds every
        partition), each loss and gradient over the whole training set one task graph.
    alpha : float, default=1e-4
        L2 penalty, as scikit-learn's: dtrain's ``model.l2 = alpha / batch``.
    batch_size : int or "auto", default="auto"
        Global minibatch; "auto" is ``min(200, training rows)``.
    learning_rate : {"constant", "invscaling", "adaptive"}, default="constant"
        The schedule of ``solver="sgd"`` (Adam's rate is constant, as in scikit-learn):
        invscaling is ``learning_rate_init / (t + 1) ** power_t`` with ``t`` the samples
        seen before the epoch; adaptive divides it by 5 after more than
        ``n_iter_no_change`` epochs without the training loss improving by ``tol``.
    learning_rate_init : float, default=1e-3
        The (initial) learning rate.
    power_t : float, default=0.5
        The invscaling exponent.
    max_iter : int, default=200
        Epochs (lbfgs: iterations).
    shuffle : bool, default=True
        Reshuffle each shard every epoch.
    random_state : int, RandomState or None, default=None
        Seeds the weights and every shuffle and split; None draws a fresh seed from NumPy's
        global random state at each fit, as scikit-learn does.
    tol : float, default=1e-4
        An epoch improves when its training loss is below the best so far by at least
        ``tol`` (with early stopping: its validation score above the best by at least
        ``tol``), as in scikit-learn; lbfgs: scipy's ``gtol``.
    verbose : bool, default=False
        Print scikit-learn's lines: ``Iteration N, loss = X`` per epoch (lbfgs: per
        iteration) and, with early stopping, ``Validation score: X``.
    warm_start : bool, default=False
        A fit goes on from the previous fit's state instead of starting afresh.
    momentum : float, default=0.9
        For ``solver="sgd"``; 0 is plain SGD.
    nesterovs_momentum : bool, default=True
        Nesterov's momentum (as scikit-learn computes it) for ``solver="sgd"``.
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of every partition, stop when its score (accuracy,
        R^2) stops improving, and keep the best epoch's parameters (also where the loss
        diverges: the fit ends there with a warning).  Not for lbfgs, as in scikit-learn.
    validation_fraction : float, default=0.1
        See ``early_stopping``.
    beta_1, beta_2, epsilon : float, default=0.9, 0.999, 1e-8
        Adam's.
    n_iter_no_change : int or numpy.inf, default=10
        Training stops after more than ``n_iter_no_change`` epochs in a row without an
        improvement (see ``tol``), as in scikit-learn; ``numpy.inf``: never.
    max_fun : int, default=15000
        lbfgs: the most loss and gradient evaluations (scipy's ``maxfun``).
    client : distributed.Client or None, default=None
        Train on this Dask cluster.  Without one, Dask inputs use the default client if
        there is one, and everything else a LocalCluster this process starts once and
        shares (see :mod:`dtrain.estimators.cluster`).
    strategy : {"auto", "allreduce", "parameter-server", "local-sgd"}, default="auto"
        dtrain's ``graph.strategy`` (those that train on partitions where they sit).
        "auto" is allreduce: scikit-learn's synchronous minibatch step, wherever the
        partitions sit (on several workers, each window runs as one task per worker and
        the step's sums go worker to worker), with the same bytes on any number of
        workers.  local-sgd trains a copy per partition on its own rows and averages the
        copies every ``sync_every`` steps: another algorithm, used only when asked.
    sync_every : int or "epoch", default="epoch"
        local-sgd: the steps between averagings; "epoch": once per pass over the data.
    fan_in : int, default=2
        Children per reduce task.
    dtype : {"auto", "float64", "float32"}, default="auto"
        The network's arithmetic; "auto": scikit-learn's, float32 for float32 ``X`` and
        float64 otherwise (lbfgs: float64, as scikit-learn's lbfgs gives).
    normalize : {"auto", "standardize", "minmax", "none"}, default="auto"
        The input normalization fitted on the training rows (part of the model); "auto":
        "standardize" for "adam" and "sgd", "none" for "lbfgs" (scikit-learn's problem as
        given: L-BFGS's steps adapt to the features' scales, and its iterates are then
        scikit-learn's to rounding).
    shards : int or "auto", default="auto"
        The partitions NumPy and pandas inputs are cut into (Dask inputs keep theirs);
        "auto": one per 20 MFLOP of a step's forward-backward (lbfgs: of an evaluation over
        every row), 1 to 16 (a small step stays one pass over its minibatch), at most one
        per row; it depends on the data and the network, not on the machine.
    rebalance : {"auto", "never", "always"}, default="auto"
        Dask inputs: whether partitions move between workers before the fit, so that each
        worker holds a block of consecutive partitions (fewer of the reduce tree's sums
        cross between workers each step).  "auto" moves them only where the saving
        predicted over the fit's steps exceeds the move's cost, and no more than a
        receiving worker's free memory; "never" trains every partition where it sits;
        "always" moves into blocks.  The fitted parameters are the same bytes whichever;
        ``summary_["data_moved"]`` says what moved and why, or why nothing did.
    out : str, Path or None, default=None
        A run directory: each fit writes a normal dtrain run there (``dtrain.load(out)``).
"""


LOSS_DOC = """
    loss : {"squared_error", "poisson"}, default="squared_error"
        The regressor's: half the squared error with identity outputs, or half the Poisson
        deviance with exponential outputs (targets >= 0), as scikit-learn's."""


def _bad(name: str, value: Any, rule: str) -> ValueError:
    return ValueError(f"{name} = {value!r}: must be {rule}")


def _number(est: Any, name: str, low: float, high: float = np.inf, *, low_open: bool = False,
            high_open: bool = False, integer: bool = False) -> None:
    value = getattr(est, name)
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and \
        (value > low if low_open else value >= low) and \
        (value < high if high_open else value <= high)
    if not ok:
        rule = f"{'an integer' if integer else 'a number'} {'>' if low_open else '>='} {low:g}"
        if high != np.inf:
            rule += f" and {'<' if high_open else '<='} {high:g}"
        raise _bad(name, value, rule)


def check_params(est: Any) -> None:
    """A ValueError naming the first parameter that dtrain cannot train with, and why."""
    if est.solver not in SOLVERS:
        raise _bad("solver", est.solver, "'lbfgs', 'sgd' or 'adam'")
    if est.activation not in ACTIVATIONS:
        raise _bad("activation", est.activation, "'relu', 'tanh', 'logistic' or 'identity'")
    hidden(est.hidden_layer_sizes)
    if not (est.batch_size == "auto" or isinstance(est.batch_size, numbers.Integral)
            and not isinstance(est.batch_size, bool) and est.batch_size >= 1):
        raise _bad("batch_size", est.batch_size, "'auto' or an integer >= 1")
    _number(est, "alpha", 0)
    _number(est, "learning_rate_init", 0, low_open=True)
    _number(est, "max_iter", 1, integer=True)
    _number(est, "tol", 0)
    if est.learning_rate not in SCHEDULES:
        raise _bad("learning_rate", est.learning_rate, "'constant', 'invscaling' or 'adaptive'")
    _number(est, "power_t", 0)
    _number(est, "max_fun", 1, integer=True)
    if not isinstance(est.nesterovs_momentum, (bool, np.bool_)):
        raise _bad("nesterovs_momentum", est.nesterovs_momentum, "True or False")
    loss = getattr(est, "loss", None)
    if loss is not None and loss not in LOSSES:
        raise _bad("loss", loss, "'squared_error' or 'poisson'")
    _number(est, "momentum", 0, 1, high_open=True)
    _number(est, "beta_1", 0, 1, high_open=True)
    _number(est, "beta_2", 0, 1, high_open=True)
    _number(est, "epsilon", 0, low_open=True)
    _number(est, "validation_fraction", 0, 1, low_open=True, high_open=True)
    if est.n_iter_no_change != np.inf:
        _number(est, "n_iter_no_change", 1, integer=True)
    _number(est, "fan_in", 2, integer=True)
    if est.sync_every != "epoch":
        _number(est, "sync_every", 1, integer=True)
    if est.shards != "auto":
        _number(est, "shards", 1, integer=True)
    if est.strategy not in STRATEGIES:
        raise _bad("strategy", est.strategy, f"one of {', '.join(map(repr, STRATEGIES))} (the "
                   f"strategies that train on partitions where they sit)")
    if est.solver == "lbfgs" and est.strategy not in ("auto", "allreduce"):
        raise ValueError(f"strategy = {est.strategy!r} with solver = 'lbfgs': each L-BFGS "
                         f"evaluation is the loss and gradient over every partition, summed "
                         f"by allreduce's tree; use strategy = 'auto' or 'allreduce'")
    if est.dtype not in DTYPES:
        raise _bad("dtype", est.dtype, "'auto', 'float32' or 'float64'")
    if est.normalize not in ("auto", "standardize", "minmax", "none"):
        raise _bad("normalize", est.normalize, "'auto', 'standardize', 'minmax' or 'none'")
    if not isinstance(est.random_state, np.random.RandomState):    # drawn from at fit time
        seed(est.random_state)


def normalize(est: Any) -> str:
    """The inputs' normalization: ``normalize``, with "auto" as the solver wants it."""
    if est.normalize != "auto":
        return est.normalize
    return "none" if est.solver == "lbfgs" else "standardize"


def hidden(sizes: Any) -> tuple[int, ...]:
    """``hidden_layer_sizes`` as a tuple of positive sizes (an integer is one layer)."""
    one = isinstance(sizes, numbers.Integral) and not isinstance(sizes, bool)
    try:
        layers = (int(sizes),) if one else tuple(sizes)
    except TypeError:
        layers = None
    if layers is None or not all(isinstance(n, numbers.Integral) and not isinstance(n, bool)
                                 and n >= 1 for n in layers):
        raise _bad("hidden_layer_sizes", sizes, "a positive integer or a sequence of them")
    return tuple(int(n) for n in layers)


def seed(random_state: Any) -> int:
    """The seed of the weights and of every shuffle and split: ``random_state`` if an
    integer; drawn from it if a ``RandomState``, from NumPy's global ``RandomState`` if
    None (a fresh seed per fit, as scikit-learn's ``check_random_state(None)``)."""
    if random_state is None:
        random_state = np.random.mtrand._rand
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool) and \
            0 <= random_state < 2 ** 63:
        return int(random_state)
    raise _bad("random_state", random_state, "None, an integer >= 0 or a numpy RandomState")


def step_flops(est: Any, X: Any) -> float:
    """About the FLOP of a step's forward-backward on ``X`` (``6 * batch * parameters``,
    one output assumed; lbfgs: an evaluation's, over every row): what ``shards="auto"``
    sizes the shards by."""
    shape = getattr(X, "shape", ())
    if len(shape) != 2 or not all(isinstance(n, numbers.Integral) for n in shape):
        return 0.0                                  # a Dask input keeps its own partitions
    rows, features = shape
    if not rows:
        return 0.0
    layers = [int(features), *hidden(est.hidden_layer_sizes), 1]
    size = sum(a * b + b for a, b in zip(layers, layers[1:]))
    b = rows if est.solver == "lbfgs" else \
        min(200 if est.batch_size == "auto" else int(est.batch_size), rows)
    return 6.0 * b * size


def batch(est: Any, rows: int) -> int:
    """The minibatch: ``batch_size``, or ``min(200, rows)`` for ``"auto"``; at most the
    training rows (full batch)."""
    if est.batch_size == "auto":
        return min(200, rows)
    if est.batch_size > rows:
        import warnings

        warnings.warn(f"Got `batch_size` larger than sample size ({rows}). It is going to be "
                      f"clipped", UserWarning, stacklevel=6)
    return min(int(est.batch_size), rows)


@dataclass(frozen=True)
class Shape:
    """What a run's config needs to know of its data."""

    features: int
    outputs: int
    train_rows: int
    partitions: int
    label: str = ""
    values: bool = False        # real targets or 0/1 label indicators, not class labels
    weight_scale: float = 1.0   # training rows / their summed sample weights
    x_dtype: str = "float64"    # the features' floats: float32 where X is all float32


def strategy(est: Any) -> str:
    """``graph.strategy`` for ``strategy``: as given, "auto" the synchronous step (lbfgs:
    allreduce, its full-batch evaluations' tree, whatever was given)."""
    if est.solver == "lbfgs":
        return "allreduce"
    return "allreduce" if est.strategy == "auto" else est.strategy


def split(est: Any, incremental: bool) -> tuple[float, float, float]:
    """Every partition's training, validation and test shares (lbfgs ignores early stopping,
    as scikit-learn's does)."""
    if est.early_stopping and not incremental and est.solver != "lbfgs":
        return (1 - est.validation_fraction, est.validation_fraction, 0.0)
    return (1.0, 0.0, 0.0)


def schedule(est: Any, samples_seen: int = 0) -> dict[str, Any]:
    """``[optim]``'s schedule keys for ``learning_rate`` (sgd only: scikit-learn's Adam
    keeps its rate constant); ``samples_seen``: the samples trained on before this fit (a
    ``partial_fit`` going on), where invscaling's clock starts.  Adaptive with
    ``n_iter_no_change = inf`` never lowers the rate: constant."""
    kind = est.learning_rate if est.solver == "sgd" else "constant"
    if kind == "invscaling":
        return {"schedule": kind, "power_t": float(est.power_t), "samples_seen": samples_seen}
    if kind == "adaptive" and est.n_iter_no_change != np.inf:
        return {"schedule": kind, "patience": int(est.n_iter_no_change),
                "min_delta": float(est.tol), "gamma": ADAPTIVE_FACTOR}
    return {"schedule": "constant"}


def stopping(est: Any, incremental: bool, sched: str) -> dict[str, Any]:
    """``[train]``'s stopping keys, scikit-learn's rule: an epoch improves when its training
    loss is below the best by at least ``tol`` (``early_stopping``: its validation score,
    accuracy or R^2, above the best by at least ``tol``), and the fit stops after more than
    ``n_iter_no_change`` epochs without one (``train.patience`` is one more); under the
    adaptive schedule those epochs lower the rate instead (the update counts them on the
    training loss) and the fit ends where the rate falls to 0.  With early stopping the
    best epoch's parameters are kept, also where the loss diverges.  lbfgs stops where
    scipy's L-BFGS-B stops."""
    if incremental or est.solver == "lbfgs":
        return {}
    early = bool(est.early_stopping)
    never = est.n_iter_no_change == np.inf or sched == "adaptive"
    return {"patience": 0 if never else int(est.n_iter_no_change) + 1,
            "min_delta": float(est.tol), "monitor": "val_score" if early else "train_loss",
            "keep_best": early, "stopping": "scikit-learn",
            "diverged": "keep-best" if early else "error"}


def dtype(est: Any, x_dtype: str) -> str:
    """``model.dtype``: ``dtype``, or for "auto" scikit-learn's: the float32 of a float32
    ``X`` (``x_dtype``), else float64; lbfgs float64 (scikit-learn's lbfgs works in, and
    returns, float64)."""
    if est.dtype != "auto":
        return est.dtype
    return "float32" if x_dtype == "float32" and est.solver != "lbfgs" else "float64"


def config(est: Any, shape: Shape, loss: str, *, incremental: bool, init_from: str = "",
           seed_value: int = 0, samples_seen: int = 0) -> Config:
    """The dtrain config of one fit (``incremental``: one epoch of ``partial_fit``)."""
    full = est.solver == "lbfgs"                         # every evaluation: every row
    b = shape.train_rows if full else batch(est, shape.train_rows)
    sched = schedule(est, samples_seen)
    optim = "lbfgs" if full else "adam" if est.solver == "adam" else \
        "momentum" if est.momentum > 0 else "sgd"
    return load_config({
        "data": {"dataset": "collection", "label": shape.label,
                 "split": list(split(est, incremental)), "normalize": normalize(est),
                 "shards": shape.partitions, "shuffle": bool(est.shuffle), "seed": seed_value,
                 "rebalance": est.rebalance,
                 **({"target": "value"} if shape.values else {})},
        "model": {"layers": [shape.features, *hidden(est.hidden_layer_sizes), shape.outputs],
                  "activation": ACTIVATIONS[est.activation], "loss": loss,
                  "l2": float(est.alpha) / b * shape.weight_scale,
                  "dtype": dtype(est, shape.x_dtype), "seed": seed_value,
                  "init": "scikit-learn", "init_from": init_from},
        "optim": {"name": optim, "lr": float(est.learning_rate_init),
                  **({"momentum": float(est.momentum),
                      "nesterov": bool(est.nesterovs_momentum)} if optim == "momentum" else {}),
                  "beta1": float(est.beta_1), "beta2": float(est.beta_2),
                  "eps": float(est.epsilon), "max_fun": int(est.max_fun),
                  "gtol": float(est.tol), **sched},
        "train": {"epochs": 1 if incremental else est.max_iter,
                  "batch_size": min(b, shape.train_rows),
                  "max_loss": NO_MAX_LOSS,
                  **stopping(est, incremental, sched["schedule"])},
        "graph": {"strategy": strategy(est), "fan_in": est.fan_in,
                  "sync_every": -(-shape.train_rows // b)
                  if est.sync_every == "epoch" else est.sync_every},
        "cluster": {"dashboard_address": ""},
    })
