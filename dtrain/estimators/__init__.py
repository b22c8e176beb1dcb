"""Estimators: dtrain behind scikit-learn's API, trained on data where it already sits.

Holds ``MLPClassifier`` and ``MLPRegressor`` (:mod:`~dtrain.estimators.mlp`):
scikit-learn estimators whose ``fit`` is a dtrain run on NumPy, pandas or Dask
collections, each partition a shard on the worker that holds it, and whose
``predict`` is a loaded model (:mod:`dtrain.inference`); what they take in
(:mod:`~dtrain.estimators.inputs`), their parameters as a run's config
(:mod:`~dtrain.estimators.settings`), a fit as a run (:mod:`~dtrain.estimators.fitting`),
what a run makes of them and where the next fit starts (:mod:`~dtrain.estimators.fitted`).

May import: :mod:`dtrain.core`, :mod:`dtrain.maths`, :mod:`dtrain.data`,
:mod:`dtrain.taskgraph`, :mod:`dtrain.deploy`, :mod:`dtrain.observe`,
:mod:`dtrain.training`, :mod:`dtrain.inference`.
"""
