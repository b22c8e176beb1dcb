"""dtrain's own contenders, one run per process: ``python -m benchmarks.local RUN_DIR``.

``graph.strategy = "serial"`` runs the one-process NumPy reference; every other
strategy (``allreduce``, ``parameter-server``, ``local-sgd``, ``model-parallel``)
starts a LocalCluster of ``cluster.workers`` worker processes of
``cluster.threads_per_worker`` threads (one, but for ``dtrain-threads``; both 0,
as ``cluster.layout`` says, for ``dtrain-default``; no dashboard) and trains
through :func:`dtrain.train` with a client on it, as a user would.
"""
from __future__ import annotations

import sys
from pathlib import Path

import dtrain
from dtrain.deploy.connect import connect
from dtrain.deploy.workers import worker_addresses
from dtrain.training.plan import plan

from benchmarks.common import peak_rss_mb, write_rss


def run(run_dir: Path) -> None:
    cfg = dtrain.load_config(run_dir / "config.toml")
    if cfg.graph.strategy == "serial":
        dtrain.train(cfg, out=run_dir, echo=None)
        write_rss(run_dir, None, [peak_rss_mb()])
        return
    the_plan = plan(cfg)                    # the cluster python -m dtrain would start
    with connect(cfg.cluster, the_plan.strategy.min_workers, the_plan.leaves) as client:
        dtrain.train(cfg, client=client, out=run_dir, echo=None)
        peaks = client.run(peak_rss_mb)
        workers = [peaks[addr] for addr in worker_addresses(client)]
    write_rss(run_dir, peak_rss_mb(), workers)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
