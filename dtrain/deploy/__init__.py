"""Deploy: getting the Dask cluster a run trains on, and tuning it.

Holds the embedded LocalCluster (:mod:`~dtrain.deploy.local`), batch jobs
through dask-jobqueue (:mod:`~dtrain.deploy.jobqueue`), a running scheduler
and the choice between them (:mod:`~dtrain.deploy.connect`), how many workers
each starts and with how many threads (:mod:`~dtrain.deploy.layout`), the MPI
ranks' roles and lifecycle (:mod:`~dtrain.deploy.mpi`) with one GPU per worker
rank (:mod:`~dtrain.deploy.rankgpus`), GPU workers (:mod:`~dtrain.deploy.devices`),
the workers a client sees (:mod:`~dtrain.deploy.workers`), TLS and the
dashboard link (:mod:`~dtrain.deploy.options`), latency and allocator tuning
(:mod:`~dtrain.deploy.tuning`), the log filters (:mod:`~dtrain.deploy.logs`), the
removal of dtrain's plugins from a scheduler that outlives the run
(:mod:`~dtrain.deploy.plugins`), and the messages between the workers of a window that
spans them (:mod:`~dtrain.deploy.p2p`: buffers, ranks, a run id), and a worker
process's state between tasks, held by a worker plugin (:mod:`~dtrain.deploy.runtime`).
It knows nothing of what is trained: a run is handed in as a callable.

May import: :mod:`dtrain.core`.
"""
