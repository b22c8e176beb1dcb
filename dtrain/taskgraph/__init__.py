"""Task graphs: each window of training steps as a plain dict of Dask tasks, and what they run.

Holds the strategies, one object each (:mod:`~dtrain.taskgraph.strategies`);
their graph builders (:mod:`~dtrain.taskgraph.dataparallel`,
:mod:`~dtrain.taskgraph.modelparallel`), and the full-batch evaluations of L-BFGS
with its loop as one task on one worker (:mod:`~dtrain.taskgraph.fullbatch`); the reduce tree
(:mod:`~dtrain.taskgraph.reduction`) and a group's subtree summed in one place
(:mod:`~dtrain.taskgraph.treesum`); which worker holds which shard
(:mod:`~dtrain.taskgraph.placement`); the typed record of every task
(:mod:`~dtrain.taskgraph.records`) and the functions the tasks run on the
workers (:mod:`~dtrain.taskgraph.tasks`); a window's container
(:mod:`~dtrain.taskgraph.window`) and the run's constants
(:mod:`~dtrain.taskgraph.recipe`); the passes over a built window: one on one
worker as one task (:mod:`~dtrain.taskgraph.fuse`), one that spans workers as
a task per worker whose crossings are messages (:mod:`~dtrain.taskgraph.span`,
over :mod:`dtrain.deploy.p2p`), the state handed over between windows
(:mod:`~dtrain.taskgraph.handoff`).  A window of the allreduce strategies across
workers is described on the driver (:mod:`~dtrain.taskgraph.describe`) and built
by each worker (:mod:`~dtrain.taskgraph.expand`), its steps' sums carried by
:mod:`~dtrain.taskgraph.collective`.  Builders are pure: they return graphs,
they never talk to a cluster.

May import: :mod:`dtrain.core`, :mod:`dtrain.maths`, :mod:`dtrain.data`, :mod:`dtrain.deploy`.
"""
