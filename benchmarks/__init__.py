"""dtrain's benchmark suite: every contender, on the same workloads and data, in one run.

``python -m benchmarks`` (see ``benchmarks/README.md``).  The harness
(:mod:`benchmarks.run`) launches each contender in processes of its own:

* :mod:`benchmarks.local`: dtrain's ``serial`` reference and dtrain on a LocalCluster;
* :mod:`benchmarks.mpi_trainers`: hand-written mpi4py Allreduce and parameter-server trainers;
* :mod:`benchmarks.torch_ddp`: PyTorch DistributedDataParallel over gloo;
* :mod:`benchmarks.rank_rss`: dtrain under ``mpiexec``, each rank reporting its memory.

Every contender reads the same run directory (``config.toml``, a dtrain config) and
leaves the same files there (``metrics.jsonl``, ``params.npz``, ``rss.json``).
"""
