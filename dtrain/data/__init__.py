"""Data: reading datasets, the seeded split and normalization, shards and minibatch order.

Holds the readers (:mod:`~dtrain.data.readers`, text tables in
:mod:`~dtrain.data.tables`, missing values in :mod:`~dtrain.data.missing`), the split,
normalization and
sizes (:mod:`~dtrain.data.prepare`) and the shards that live on the workers
with the order their rows are drawn in (:mod:`~dtrain.data.shards`).  The
driver asks only for sizes; the workers read the data, inside loading tasks.

May import: :mod:`dtrain.core`.
"""
