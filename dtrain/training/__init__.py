"""Training: a run from its config to its run directory.

Holds the plan, fixed and checked before any cluster starts
(:mod:`~dtrain.training.plan`), or on the cluster for data already there
(:mod:`~dtrain.training.collections`: Dask collections and files the workers
read); the course every run follows, its windows, epoch rows and stops
(:mod:`~dtrain.training.course`), early stopping
(:mod:`~dtrain.training.stopping`); the engines that run it, in the driver
(:mod:`~dtrain.training.serial`) or as Dask task graphs
(:mod:`~dtrain.training.engines`; full-batch L-BFGS:
:mod:`~dtrain.training.fullbatch`), with the parts the Dask engines hold: their data on
the cluster and its placement (:mod:`~dtrain.training.cluster_data`, with the held-out
data, :mod:`~dtrain.training.heldout`), what they count
(:mod:`~dtrain.training.counters`) and what makes a window into tasks
(:mod:`~dtrain.training.launch`); checkpoints and resuming
(:mod:`~dtrain.training.checkpoint`); the public :func:`train`,
:func:`train_on` and :func:`resume` (:mod:`~dtrain.training.trainer`), and what a run's
``summary.json`` and ``model.json`` say (:mod:`~dtrain.training.summary`); and
pictures of what a config would run (:mod:`~dtrain.training.pictures`).

May import: :mod:`dtrain.core`, :mod:`dtrain.maths`, :mod:`dtrain.data`,
:mod:`dtrain.taskgraph`, :mod:`dtrain.deploy`, :mod:`dtrain.observe`,
:mod:`dtrain.inference`.
"""
