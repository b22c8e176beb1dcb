"""The GPU floor under dtrain: dtrain's own maths on CuPy, with no Dask around it.

``python -m benchmarks.cupy_floor RUN_DIR`` loads every shard of
``RUN_DIR/config.toml`` onto the GPU and runs the schedule's steps in a plain
loop: a step's minibatch (each shard's rows of the step, in shard order,
gathered on the GPU), :meth:`~dtrain.maths.model.Network.loss_and_grad` over
it, and :func:`~dtrain.maths.optim.update`.  What ``dtrain-gpu`` spends above
this is dtrain's (its tasks, windows, checkpoints, metrics); what this
spends above ``torch-gpu`` is the maths' own kernels.  Writes
``metrics.jsonl`` and ``params.npz`` as dtrain does.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from dtrain.core.arrays import cupy, gpu_problem
from dtrain.maths.optim import update
from dtrain.observe.rundir import RunDir

from benchmarks.common import epoch_row, load_run, own_shards, peak_rss_mb, write_rss
from benchmarks.torch_gpu import epoch_rows


def main(run_dir: Path) -> None:
    cp = cupy()
    if cp is None:
        raise SystemExit(f"cupy-floor: {gpu_problem()}")
    cfg, p = load_run(run_dir)
    shards = own_shards(p, 1, 0)
    x = cp.asarray(np.concatenate([s.x for s in shards]))
    y = cp.asarray(np.concatenate([s.y for s in shards]))
    state = p.initial_state()
    state = state.with_vector(cp.asarray(state.vector))
    out = RunDir(run_dir, cfg)
    for epoch in range(p.schedule.epochs):
        rows = [cp.asarray(r) for r in epoch_rows(p, shards, epoch)]
        cp.cuda.Device().synchronize()
        began = time.perf_counter()
        for t, idx in enumerate(rows):
            step = p.schedule[epoch * p.schedule.steps_per_epoch + t]
            grad = p.net.loss_and_grad(state.vector[: p.net.size], x[idx], y[idx])
            state = update(p.opt, step, False, state, grad)
        cp.cuda.Device().synchronize()
        seconds = time.perf_counter() - began
        out.add_epoch(epoch_row(p, epoch + 1, seconds, state.epoch_loss, p.train_samples))
    out.finish(p.net.named(state.vector[: p.net.size]),
               {"strategy": "cupy-floor", "workers": 1, "steps": len(p.schedule)})
    write_rss(run_dir, None, [peak_rss_mb()])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
