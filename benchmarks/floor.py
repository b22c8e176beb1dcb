"""Dask's floor under dtrain's step: graphs of dtrain's shape with the maths taken out.

``python -m benchmarks.floor RUN_DIR [floor|chain]`` runs one of two graphs.

**floor** (``dask-floor``).  It starts the cluster ``dtrain-allreduce``
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

**chain** (``dask-chain``, ``dask-chain-threads``): the bare chain of the
issue's first measurement, on the run's own cluster (W processes, or one
process with W threads).  Each step is one ``chain-leaf`` task per shard
(shard ``i`` on the worker that would hold it), a fan-in 2 tree of
``chain-sum`` tasks over them in shard order (each on its first child's
worker) and one ``chain-final`` task on the first worker, which the next
step's leaves all read: ``2 W`` tasks a step, the shape of dtrain's step with
root updates and a task per shard.  Every task returns a buffer the size of
dtrain's gradient buffer and computes nothing.  It also writes
``summary.json`` with its ``tasks_per_step``.
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


def chain(steps: int, leaves: list[int], numbers: int, dtype: str
          ) -> tuple[dict[str, Task], dict[str, int]]:
    """``chain-leaf``, ``chain-sum`` and ``chain-final`` tasks of ``steps`` steps over
    ``len(leaves)`` shards (shard ``i`` on worker ``leaves[i]``), and each task's worker."""
    dsk: dict[str, Task] = {}
    where: dict[str, int] = {}

    def add(name: str, worker: int, *deps: str) -> tuple[str, int]:
        dsk[name] = Task(name, exchange, numbers, dtype, *map(TaskRef, deps))
        where[name] = worker
        return name, worker

    for s in range(steps):
        before = (f"chain-final-{s - 1}",) if s else ()
        level = [add(f"chain-leaf-{s}-{i}", w, *before) for i, w in enumerate(leaves)]
        depth = 0
        while len(level) > 1:
            depth += 1
            level = [add(f"chain-sum-{s}-{depth}-{j}", pair[0][1], *(k for k, _ in pair))
                     if len(pair) > 1 else pair[0]
                     for j, pair in enumerate(level[i:i + 2] for i in range(0, len(level), 2))]
        add(f"chain-final-{s}", leaves[0], level[0][0])
    return dsk, where


def run(run_dir: Path, kind: str = "floor") -> None:
    cfg, the_plan = load_run(run_dir)
    per_epoch, epochs = the_plan.schedule.steps_per_epoch, cfg.train.epochs
    steps = per_epoch * epochs
    with connect(cfg.cluster, the_plan.strategy.min_workers, the_plan.leaves) as client:
        tuned = tuning.low_latency(client) if cfg.cluster.low_latency else False
        inline = tuned and tuning.inline_executor(client)
        addresses = worker_addresses(client)
        n = len(addresses)
        if kind == "chain":
            owners = the_plan.builder.place([str(w) for w in range(n)]).leaves
            dsk, where = chain(steps, [int(w) for w in owners], the_plan.net.buffer_size,
                               cfg.model.dtype)
            ends = [[f"chain-final-{(e + 1) * per_epoch - 1}"] for e in range(epochs)]
            (run_dir / "summary.json").write_text(json.dumps(
                {"tasks_per_step": len(dsk) / steps}))
        else:
            dsk = graph(steps, n, the_plan.net.buffer_size, cfg.model.dtype)
            where = {key: int(key.rsplit("-", 1)[1]) for key in dsk}
            ends = [[f"exchange-{(e + 1) * per_epoch - 1}-{w}" for w in range(n)]
                    for e in range(epochs)]
        with dask.annotate(workers=lambda key: [addresses[where[key]]], allow_other_workers=True,
                           executor=tuning.INLINE if inline else "default"):
            start = time.perf_counter()
            futures = client.get(dsk, [k for keys in ends for k in keys], sync=False)
        rows, per = [], len(ends[0])
        for e in range(epochs):
            wait(futures[e * per:(e + 1) * per])
            now = time.perf_counter()
            rows.append(epoch_row(the_plan, e + 1, now - start, None, 0))
            start = now
        peaks = client.run(peak_rss_mb)
        workers = [peaks[a] for a in addresses]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_rss(run_dir, peak_rss_mb(), workers)


if __name__ == "__main__":
    run(Path(sys.argv[1]), *sys.argv[2:3])
