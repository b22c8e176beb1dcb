"""``MLPClassifier`` and ``MLPRegressor``: dtrain behind scikit-learn's estimator API.

``fit`` is a dtrain run (:func:`dtrain.training.trainer.train_on`) on the
given data where it sits: NumPy and pandas inputs cut into ``shards``
partitions, Dask collections in their own partitions, each partition a shard
on the worker that holds it.  ``predict`` is the trained
:class:`dtrain.Model`: on NumPy in this process, on a Dask collection as a
lazy Dask array (one task per block, the model one key of the graph).

The parameters, fitted attributes and outputs are scikit-learn's (its MLPs'
initialization, two classes as one logistic output, multilabel and
multi-output targets, sample weights, the learning-rate schedules, Nesterov's
momentum, ``solver="lbfgs"`` as scipy's L-BFGS-B over full-batch task graphs,
``loss="poisson"``, the stopping rule, the input's float dtype, ``verbose``'s
lines, ``ValueError`` for bad input).  Where the two differ (README, "From
Python and Dask", lists every parameter and attribute):

* The inputs of "adam" and "sgd" are standardized as dtrain's runs normalize
  them (``normalize``, statistics from the training rows), and the
  normalization is part of the model, so ``coefs_`` and ``intercepts_`` act on
  normalized features ("lbfgs": on ``X`` as given, as scikit-learn's).
* ``loss_curve_`` and ``loss_`` are dtrain's ``train_loss``: the mean
  per-sample loss of the epoch's minibatches, without the L2 term (lbfgs: of
  each iteration's iterate; scikit-learn's lbfgs keeps no curve).
* With early stopping, a loss that diverges ends the fit there (best
  parameters kept, NaN score recorded, a ``ConvergenceWarning``); scikit-learn
  trains on to ``max_iter``.  The adaptive schedule counts epochs on the
  training loss also with early stopping (scikit-learn: the validation score).
* The validation split is every partition's own, not stratified; one class in
  ``y`` is refused (scikit-learn fits a constant classifier).
* A minibatch's weighted gradient is divided by its rows, with the weights
  scaled to average 1 over the training rows (scikit-learn: by the
  minibatch's summed weights); the same for a full batch.
* ``partial_fit`` and a ``warm_start`` fit go on from the last state
  (parameters and optimizer slots) with the first fit's normalization; Adam's
  bias correction starts again with each call.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from dtrain.core.config import REBALANCE
from dtrain.core.errors import Diverged, UserError
from dtrain.deploy.signals import AT_ONCE, StopSignals
from dtrain.estimators import cluster, fitting, inputs, settings
from dtrain.estimators.inputs import TrainingData, is_dask


class _MLP(BaseEstimator):
    """What the classifier and the regressor share: parameters, fitting, predicting."""

    _classifier = True
    _val_score = "val_accuracy"         # an epoch row's validation score (higher is better)
    # checked by scikit-learn's own validation (InvalidParameterError); the rest by
    # settings.check_params, whose errors say more than a constraint can
    _parameter_constraints: dict = {"rebalance": [StrOptions(set(REBALANCE))]}

    def __init__(self, hidden_layer_sizes: Any = (100,), activation: str = "relu", *,
                 solver: str = "adam", alpha: float = 0.0001, batch_size: int | str = "auto",
                 learning_rate: str = "constant", learning_rate_init: float = 0.001,
                 power_t: float = 0.5, max_iter: int = 200, shuffle: bool = True,
                 random_state: Any = None, tol: float = 1e-4, verbose: bool = False,
                 warm_start: bool = False, momentum: float = 0.9,
                 nesterovs_momentum: bool = True, early_stopping: bool = False,
                 validation_fraction: float = 0.1, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, n_iter_no_change: int = 10, max_fun: int = 15000,
                 client: Any = None, strategy: str = "auto", sync_every: int | str = "epoch",
                 fan_in: int = 2, dtype: str = "auto", normalize: str = "auto",
                 shards: int | str = "auto", rebalance: str = "auto",
                 out: str | Path | None = None):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.client = client
        self.strategy = strategy
        self.sync_every = sync_every
        self.fan_in = fan_in
        self.dtype = dtype
        self.normalize = normalize
        self.shards = shards
        self.rebalance = rebalance
        self.out = out

    # --- scikit-learn's protocol -----------------------------------------------------------

    def __sklearn_clone__(self) -> _MLP:
        """A clone whose ``client`` is this one's, by reference (scikit-learn's ``clone``
        would deep-copy it, and a Client cannot be copied); every other parameter is cloned
        as scikit-learn clones it."""
        params = {name: value if name == "client" else clone(value, safe=False)
                  for name, value in self.get_params(deep=False).items()}
        new = type(self)(**params)
        if hasattr(self, "_metadata_request"):
            new._metadata_request = clone(self._metadata_request)
        if hasattr(self, "_sklearn_output_config"):
            new._sklearn_output_config = dict(self._sklearn_output_config)
        return new

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its client (a connection to one cluster): the fitted model,
        attributes and state travel; a later fit uses the default or embedded cluster."""
        state = dict(super().__getstate__())      # a copy: this estimator keeps its client
        state["client"] = None
        return state

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = False
        tags.input_tags.sparse = True       # densified block by block, on the workers
        return tags

    # --- fitting ---------------------------------------------------------------------------

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> _MLP:
        """Train on ``X`` (rows by features) and ``y`` (their labels or values).

        ``X`` may be a NumPy array, a scipy.sparse matrix, a pandas DataFrame, a
        dask.array or a dask.dataframe; ``y`` an array (a classifier's labels or 0/1
        label indicators, a regressor's targets), a Series (pandas or Dask, with ``X``'s
        partitions) or the name of ``X``'s label column; ``sample_weight`` one weight per
        row (for Dask inputs a dask array or Series with ``X``'s partitions), or None.

        Returns
        -------
        self
        """
        return self._fit(X, y, incremental=False, sample_weight=sample_weight)

    def _check_solver(self) -> bool:
        """``partial_fit`` is there for the stochastic solvers only, as in scikit-learn."""
        if self.solver not in ("sgd", "adam"):
            raise AttributeError(f"partial_fit is only available for stochastic optimizers. "
                                 f"{self.solver} is not stochastic.")
        return True

    def _fit(self, X: Any, y: Any, *, incremental: bool, classes: Any = None,
             sample_weight: Any = None) -> _MLP:
        """A fit: Ctrl-C, SIGTERM and SIGUSR1 raise :class:`dtrain.Stopped` (or, while
        nothing is on the cluster yet, a Ctrl-C ``KeyboardInterrupt``), as in
        :func:`dtrain.train`."""
        with StopSignals(AT_ONCE) as signals:
            return self._fit_here(X, y, signals, incremental=incremental, classes=classes,
                                  sample_weight=sample_weight)

    def _fit_here(self, X: Any, y: Any, signals: StopSignals, *, incremental: bool,
                  classes: Any, sample_weight: Any) -> _MLP:
        self._validate_params()
        settings.check_params(self)
        if incremental and self.early_stopping:
            raise ValueError("partial_fit does not support early_stopping=True")
        self._check_targets(y)
        data = inputs.training_data(X, y, shards=self.shards, classifier=self._classifier,
                                    sample_weight=sample_weight,
                                    step_flops=settings.step_flops(self, X))
        going_on = (incremental or self.warm_start) and hasattr(self, "model_")
        if going_on and data.features != self.n_features_in_:
            raise ValueError(f"X has {data.features} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input.")
        wanted = fitting.wanted_classes(self, data, classes, going_on, incremental)
        signals.at_edges()          # the cluster, the data on it: a stop waits for the run
        client = cluster.client_for(self.client, data.dask)
        try:
            with client.as_current():         # dtrain's waits ask for the current client
                fitting.run(self, data, client, wanted, going_on=going_on,
                            incremental=incremental)
                return self
        except Diverged as exc:
            raise ValueError(f"Solver produced non-finite parameter weights. The input data "
                             f"may contain large values and need to be preprocessed. (The "
                             f"training loss became {exc.loss} in epoch {exc.epoch + 1}; "
                             f"lowering learning_rate_init or raising alpha may help.)") \
                from None
        except UserError as exc:
            if isinstance(exc, ValueError):
                raise
            raise ValueError(str(exc)) from exc     # bad input is a ValueError here

    def _check_targets(self, y: Any) -> None:
        """Checks of ``y`` that one estimator makes (the regressor's: Poisson targets are
        not negative); none here."""

    def _say(self, row: dict[str, Any]) -> None:
        """``verbose``: scikit-learn's lines for an epoch (lbfgs: an iteration)."""
        print(f"Iteration {row['epoch']}, loss = {row['train_loss']:.8f}")
        score = row.get(self._val_score)
        if self.early_stopping and self.solver != "lbfgs" and score is not None:
            print(f"Validation score: {score:f}")

    def _output(self, classes: np.ndarray, data: TrainingData) -> tuple[str, int]:
        """The loss and the number of outputs: softmax outputs for three classes or more,
        one logistic output for two, one per label of a multilabel ``y``."""
        if data.multilabel:
            return "binary-cross-entropy", len(classes)
        if len(classes) == 2:
            return "binary-cross-entropy", 1
        return "cross-entropy", len(classes)

    # --- predicting ------------------------------------------------------------------------

    def _rows(self, X: Any) -> Any:
        check_is_fitted(self)
        return inputs.predict_input(self, X)

    def predict(self, X: Any) -> Any:
        """The prediction for each row of ``X``: a NumPy array, or for a Dask collection a
        lazy dask.array (nothing is computed until asked)."""
        rows = self._rows(X)
        out = self.model_.predict(rows)
        if getattr(self, "_multilabel", False):         # indicators, in y's own dtype
            return out.astype(self._label_dtype)
        return _as_input_float(out, rows) if not self._classifier else out

    def _compute(self, lazy: Any) -> Any:
        """A lazy result computed on the estimator's cluster (its client, the default
        client, or the embedded cluster)."""
        return cluster.client_for(self.client, True).compute(lazy).result()

    def _dask_y(self, X: Any, y: Any) -> Any:
        """``y`` as a dask.array beside ``predict(X)``: a column name of ``X``, a dask
        Series, or an array."""
        import dask.array as da

        if isinstance(y, str):
            y = X[y]
        if is_dask(y) and not isinstance(y, da.Array):
            y = y.to_dask_array()
        return y if is_dask(y) else da.from_array(np.asarray(y))


def _as_input_float(out: Any, rows: Any) -> Any:
    """``out`` as float32 where the rows given were float32 (scikit-learn's outputs keep
    the input's precision); else as it is."""
    return out.astype(np.float32) if getattr(rows, "dtype", None) == np.float32 else out


class MLPClassifier(ClassifierMixin, _MLP):
    __doc__ = f"""A multi-layer perceptron classifier trained by dtrain on a Dask cluster.

    scikit-learn's ``MLPClassifier`` API (with its parameter names), for NumPy, scipy.sparse,
    pandas, dask.array and dask.dataframe inputs: softmax outputs for three classes or more,
    one logistic output for two, one per label for multilabel 0/1 indicators; see
    :mod:`dtrain.estimators.mlp` for where it differs.
    {settings.PARAMS_DOC}
    Attributes
    ----------
    classes_ : ndarray
        The class labels, sorted (multilabel: the label indices).
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` had string column names.
    loss_ : float
        The last epoch's training loss.
    loss_curve_ : list of float
        The training loss of each epoch (over ``partial_fit`` and warm-start fits).
    n_iter_ : int
        Epochs of the last fit (``partial_fit``: 1).
    t_ : int
        Training samples seen (over ``partial_fit`` and warm-start fits).
    best_loss_ : float or None
        The lowest training loss (None with early stopping).
    validation_scores_, best_validation_score_ : list of float, float
        With early stopping: each epoch's validation accuracy, and the best.
    coefs_, intercepts_ : list of ndarray
        Layer ``i``'s weights ``(inputs, outputs)`` and biases, on normalized inputs.
    n_layers_, n_outputs_ : int
        Layers (input and output included) and outputs (two classes: 1).
    out_activation_ : str
        ``"softmax"`` or ``"logistic"``.
    model_ : dtrain.Model
        The trained model (its normalization, network and classes).
    summary_ : dict
        The run's ``summary.json`` (``data_moved``: partitions moved to balance workers).
    run_dir_ : Path or None
        ``out``, where the run's files are.

    Examples
    --------
    >>> from sklearn.datasets import load_iris
    >>> X, y = load_iris(return_X_y=True)
    >>> clf = dtrain.MLPClassifier(max_iter=50).fit(X, y)      # doctest: +SKIP
    >>> clf.score(X, y)                                         # doctest: +SKIP
    """

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags

    @available_if(_MLP._check_solver)
    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None,
                    classes: Any = None) -> MLPClassifier:
        """One epoch on ``X`` and ``y`` from the current state (optimizer slots included).

        ``classes``, every class the calls will see, is required on the first call (as in
        scikit-learn); later calls may hold some of them only.
        """
        if not hasattr(self, "model_"):
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            if len(np.unique(np.asarray(classes))) < 2:
                raise ValueError(f"classes = {classes!r}: a classifier needs at least 2")
        elif classes is not None and not getattr(self, "_multilabel", False) and \
                not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
            raise ValueError(f"`classes={classes!r}` is not the same as on last call to "
                             f"partial_fit, was: {self.classes_!r}")
        return self._fit(X, y, incremental=True, classes=classes, sample_weight=sample_weight)

    def predict_proba(self, X: Any) -> Any:
        """Class probabilities ``(rows, classes)``, columns in ``classes_`` order (two
        classes: ``1 - p`` and ``p`` of the logistic output; multilabel: each label's); lazy
        for a Dask collection; float32 for float32 rows."""
        rows = self._rows(X)
        return _as_input_float(self.model_.predict_proba(rows), rows)

    def predict_log_proba(self, X: Any) -> Any:
        """The logarithm of :meth:`predict_proba`."""
        return np.log(self.predict_proba(X))

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy on ``X`` and ``y`` (multilabel: rows with every label right); for Dask
        inputs computed on the cluster, partition by partition (``y`` may name ``X``'s
        label column)."""
        if not (is_dask(X) or is_dask(y)):
            return super().score(X, y, sample_weight)
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported with Dask inputs")
        hits = self.predict(X) == self._dask_y(X, y)
        if getattr(self, "_multilabel", False):
            hits = hits.all(axis=1)
        return float(self._compute(hits.mean()))


class MLPRegressor(RegressorMixin, _MLP):
    __doc__ = f"""A multi-layer perceptron regressor trained by dtrain on a Dask cluster.

    scikit-learn's ``MLPRegressor`` API: identity outputs and half the squared error
    (dtrain's ``model.loss = "squared-error"``), or exponential outputs and half the
    Poisson deviance (``loss="poisson"``); R^2 score; one target or several.

    {settings.PARAMS_DOC.replace("----------", "----------" + settings.LOSS_DOC, 1)}
    """

    _classifier = False
    _val_score = "val_r2"

    def __init__(self, loss: str = "squared_error", hidden_layer_sizes: Any = (100,),
                 activation: str = "relu", *, solver: str = "adam", alpha: float = 0.0001,
                 batch_size: int | str = "auto", learning_rate: str = "constant",
                 learning_rate_init: float = 0.001, power_t: float = 0.5, max_iter: int = 200,
                 shuffle: bool = True, random_state: Any = None, tol: float = 1e-4,
                 verbose: bool = False, warm_start: bool = False, momentum: float = 0.9,
                 nesterovs_momentum: bool = True, early_stopping: bool = False,
                 validation_fraction: float = 0.1, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-8, n_iter_no_change: int = 10, max_fun: int = 15000,
                 client: Any = None, strategy: str = "auto", sync_every: int | str = "epoch",
                 fan_in: int = 2, dtype: str = "auto", normalize: str = "auto",
                 shards: int | str = "auto", rebalance: str = "auto",
                 out: str | Path | None = None):
        self.loss = loss
        super().__init__(
            hidden_layer_sizes, activation, solver=solver, alpha=alpha, batch_size=batch_size,
            learning_rate=learning_rate, learning_rate_init=learning_rate_init,
            power_t=power_t, max_iter=max_iter, shuffle=shuffle, random_state=random_state,
            tol=tol, verbose=verbose, warm_start=warm_start, momentum=momentum,
            nesterovs_momentum=nesterovs_momentum, early_stopping=early_stopping,
            validation_fraction=validation_fraction, beta_1=beta_1, beta_2=beta_2,
            epsilon=epsilon, n_iter_no_change=n_iter_no_change, max_fun=max_fun,
            client=client, strategy=strategy, sync_every=sync_every, fan_in=fan_in, dtype=dtype,
            normalize=normalize, shards=shards, rebalance=rebalance, out=out)

    def _output(self, classes: np.ndarray, data: TrainingData) -> tuple[str, int]:
        return settings.LOSSES[self.loss], data.targets

    def _check_targets(self, y: Any) -> None:
        """Poisson targets are not negative: an in-memory ``y`` here, in the words of
        scikit-learn's PoissonRegressor (its MLPRegressor takes them, to a NaN loss); a
        Dask one, or a column of ``X``, on the workers by the loss."""
        if self.loss != "poisson" or is_dask(y) or isinstance(y, str):
            return
        try:
            negative = bool((np.asarray(y, dtype=np.float64) < 0).any())
        except (TypeError, ValueError):
            return                              # not numbers: training_data says so
        if negative:
            raise ValueError("Some value(s) of y are negative which is not allowed for "
                             "Poisson regression (loss='poisson').")

    @available_if(_MLP._check_solver)
    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """One epoch on ``X`` and ``y`` from the current state (optimizer slots included)."""
        return self._fit(X, y, incremental=True, sample_weight=sample_weight)

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """R^2 on ``X`` and ``y`` (several targets: their mean); for Dask inputs computed on
        the cluster."""
        if not (is_dask(X) or is_dask(y)):
            return super().score(X, y, sample_weight)
        if sample_weight is not None:
            raise ValueError("sample_weight is not supported with Dask inputs")
        import dask.array as da

        predicted, truth = self.predict(X), self._dask_y(X, y).astype(np.float64)
        residual = ((truth - predicted) ** 2).sum(axis=0)
        total = ((truth - truth.mean(axis=0)) ** 2).sum(axis=0)
        res, tot = self._compute(da.stack([residual, total]))
        res, tot = np.atleast_1d(res), np.atleast_1d(tot)
        r2 = np.where(tot > 0, 1 - res / np.where(tot > 0, tot, 1.0), 0.0)
        return float(r2.mean())
