"""Dask's floor under dtrain's step: the same graph shape with the maths taken out.

``python -m benchmarks.floor RUN_DIR`` starts the cluster ``dtrain-allreduce``
gets (:func:`dtrain.deploy.connect.connect` on ``RUN_DIR/config.toml``, the same
low-latency streams and inline executor) and runs, for every minibatch of the
run's epochs, one ``exchange-<step>-<worker>`` task per worker that waits for
every worker's task of the step before and returns a fresh buffer the size of
dtrain's gradient buffer (``P + 2`` numbers of the run's dtype).  At 2 workers
that is the least a synchronous step across processes can be, and the skeleton
of dtrain's replicated allreduce step: each worker reads the other's partial
sum, then goes on.  The run pays the scheduler round trip, the worker-to-worker
fetch and the bytes of a dtrain step, and no forward-backward, update, kept
states, data or metrics.  (At more workers every worker reads every other, an
all-to-all that dtrain's reduce tree does not do: there it is no floor.)

The whole run is one graph, submitted before the clock starts for epoch 2, so
the per-epoch times (epoch 1, which carries the submission, is dropped like
every contender's) are the graph's execution alone: a floor no task graph of
this shape on this cluster goes under.  What dtrain spends above it is dtrain's;
the floor itself is distributed's, on this machine.  It writes
``metrics.jsonl`` (no loss: it trains nothing), ``rss.json`` and no
``params.npz``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import dask
import numpy as np
from dask.task_spec import Task, TaskRef
from distributed import wait

from dtrain.deploy import tuning
from dtrain.deploy.connect import connect
from dtrain.deploy.workers import worker_addresses

from benchmarks.common import epoch_row, load_run, peak_rss_mb, write_rss


def exchange(numbers: int, dtype: str, *previous: np.ndarray) -> np.ndarray:
    """A step with no maths: every worker's last buffer in, a fresh one of the same size out."""
    return np.zeros(numbers, dtype)


def graph(steps: int, workers: int, numbers: int, dtype: str) -> dict[str, Task]:
    """``exchange-<step>-<worker>`` for ``steps`` steps, each reading the step before's
    tasks of all ``workers``."""
    dsk: dict[str, Task] = {}
    for s in range(steps):
        before = [TaskRef(f"exchange-{s - 1}-{v}") for v in range(workers)] if s else []
        for w in range(workers):
            name = f"exchange-{s}-{w}"
            dsk[name] = Task(name, exchange, numbers, dtype, *before)
    return dsk


def run(run_dir: Path) -> None:
    cfg, the_plan = load_run(run_dir)
    per_epoch, epochs = the_plan.schedule.steps_per_epoch, cfg.train.epochs
    with connect(cfg.cluster) as client:
        tuned = tuning.low_latency(client) if cfg.cluster.low_latency else False
        inline = tuned and tuning.inline_executor(client)
        addresses = worker_addresses(client)
        n = len(addresses)
        dsk = graph(per_epoch * epochs, n, the_plan.net.buffer_size, cfg.model.dtype)
        ends = [[f"exchange-{(e + 1) * per_epoch - 1}-{w}" for w in range(n)]
                for e in range(epochs)]
        with dask.annotate(workers=lambda key: [addresses[int(key.rsplit("-", 1)[1])]],
                           allow_other_workers=True,
                           executor=tuning.INLINE if inline else "default"):
            start = time.perf_counter()
            futures = client.get(dsk, [k for keys in ends for k in keys], sync=False)
        rows = []
        for e in range(epochs):
            wait(futures[e * n:(e + 1) * n])
            now = time.perf_counter()
            rows.append(epoch_row(the_plan, e + 1, now - start, None, 0))
            start = now
        peaks = client.run(peak_rss_mb)
        workers = [peaks[a] for a in addresses]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_rss(run_dir, peak_rss_mb(), workers)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
