"""A fit of an estimator as a dtrain run.

:func:`wanted_classes` says which classes a fit learns where that is known before the data
is on the cluster (the fitted ones, ``partial_fit``'s ``classes``, an in-memory ``y``'s);
:func:`run` puts the data on the cluster, describes its partitions (their statistics say
how many rows, features and labels there are), makes the run's config from the
estimator's parameters (:mod:`~dtrain.estimators.settings`), trains it with
:func:`~dtrain.training.trainer.train_on` from the last state where the fit goes on
(:mod:`~dtrain.estimators.fitted`), and records the fitted attributes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dtrain.core.errors import ConfigError
from dtrain.data import partitions
from dtrain.data.partitions import PartSpec
from dtrain.estimators import fitted, settings
from dtrain.estimators.inputs import TrainingData
from dtrain.training import collections
from dtrain.training.trainer import train_on


def wanted_classes(est: Any, data: TrainingData, classes: Any, going_on: bool,
                   incremental: bool) -> np.ndarray | None:
    """The classes to learn, where known before the data is on the cluster: the
    fitted ones (going on), ``partial_fit``'s ``classes``, or an in-memory ``y``'s."""
    if not est._classifier:
        return None
    if going_on and data.multilabel != getattr(est, "_multilabel", False):
        raise ValueError("y is multilabel (0/1 indicators) in one fit and not in the other; "
                         "fit with warm_start=False to start again")
    if data.multilabel:
        if going_on and len(data.classes) != len(est.classes_):
            raise ValueError(f"y has {len(data.classes)} labels, the fitted model "
                             f"{len(est.classes_)}")
        return data.classes
    if incremental:
        return est.classes_ if going_on else np.unique(np.asarray(classes))
    if data.classes is not None and len(data.classes) < 2:
        raise ValueError(f"y holds 1 class ({data.classes.tolist()[0]!r}): dtrain's "
                         f"classifier needs at least 2 (scikit-learn's MLPClassifier fits "
                         f"one that always predicts it); give y another class")
    return data.classes


def run(est: Any, data: TrainingData, client: Any, wanted: np.ndarray | None, *,
        going_on: bool, incremental: bool) -> None:
    """Fit ``est`` on ``data``: put the data on the cluster, learn what the config needs
    from its partitions' statistics, run it (:func:`~dtrain.training.trainer.train_on`),
    and record what the run made (:func:`~dtrain.estimators.fitted.record`).  ``wanted``:
    the classes to learn, where known before (:func:`wanted_classes`); ``going_on``: from
    the last fit's state; ``incremental``: a ``partial_fit``."""
    seed = settings.seed(est.random_state)
    coll = data.collection(client)
    values = not est._classifier or data.multilabel      # real targets, or indicators
    if wanted is not None and not values:
        coll.classes = tuple(wanted.tolist())
    split = settings.split(est, incremental)
    stats = collections.describe(client, coll, PartSpec(coll.columns, split, seed,
                                                        regression=values), est.fan_in)
    partitions.check(stats, len(coll.futures), regression=values)
    if split[1] and stats.val < 2:
        raise ValueError(f"The validation set is too small: validation_fraction = "
                         f"{est.validation_fraction} of each partition gives "
                         f"{stats.val} of {stats.rows} rows, and early_stopping needs at "
                         f"least 2. Increase 'validation_fraction' or the size of your "
                         f"dataset.")
    found = np.asarray(stats.labels) if wanted is None else wanted
    if going_on and est._classifier and not incremental:
        same_classes(est, found)
    loss, outputs = est._output(found, data)
    shape = settings.Shape(data.features, outputs, stats.train, len(coll.futures),
                           data.label, values, stats.train / stats.mass if stats.mass else 1.0,
                           data.x_dtype)
    seen = est.t_ if going_on and incremental else 0
    with fitted.starting_point(est, going_on) as (init_from, initial):
        try:
            cfg = settings.config(est, shape, loss, incremental=incremental,
                                  init_from=init_from, seed_value=seed, samples_seen=seen)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if initial is not None:
            if tuple(cfg.model.layers) != est.model_.spec.layers:
                raise ValueError(f"the fitted network is {list(est.model_.spec.layers)}, "
                                 f"this fit's {list(cfg.model.layers)}: "
                                 f"hidden_layer_sizes changed; fit with warm_start=False "
                                 f"to start again")
            initial = fitted.fit_state(initial, cfg)
        result = train_on(cfg, lambda c: coll, client=client, out=est.out, echo=None,
                          initial=initial, on_epoch=est._say if est.verbose else None)
    fitted.record(est, result, data, found, going_on, incremental)


def same_classes(est: Any, found: np.ndarray) -> None:
    """A ``warm_start`` fit learns the classes of the fit before it, as in scikit-learn."""
    if len(found) != len(est.classes_) or not np.array_equal(found, est.classes_):
        raise ValueError(f"warm_start can only be used where `y` has the same classes as "
                         f"in the previous call to fit. Previously got {est.classes_}, "
                         f"`y` has {found}")
