"""Maths: the network and its training step as pure functions over NumPy or CuPy.

Holds the dense layers, activations and losses (:mod:`~dtrain.maths.dense`), the
flat-parameter network that chains them (:mod:`~dtrain.maths.model`), convolution,
pooling, flatten and dropout (:mod:`~dtrain.maths.conv`), the optimizers over one flat
state, the update and the local SGD round (:mod:`~dtrain.maths.optim`), full-batch L-BFGS
over scipy's L-BFGS-B (:mod:`~dtrain.maths.lbfgs`), the model-parallel split of a network
into slices (:mod:`~dtrain.maths.slicing`), and a regression's figures from sums that add
up over parts (:mod:`~dtrain.maths.scores`).  Nothing here knows about Dask, files or
workers.

May import: :mod:`dtrain.core`.
"""
