"""Hand-written mpi4py trainers, the seeds' two approaches, with dtrain's model and maths.

Run under MPI: ``mpiexec -n N python -m mpi4py -m benchmarks.mpi_trainers RUN_DIR``
(``-m mpi4py``: an exception on one rank aborts them all instead of hanging), where
``RUN_DIR/config.toml`` is a dtrain config whose ``graph.strategy`` picks:

* ``allreduce`` (collective): every rank holds its block of shards, computes
  their summed gradient buffer for each minibatch, ``Allreduce``\\ s it and
  applies the same update;
* ``parameter-server`` (non-collective): rank 0 holds no data and does not
  train; the others send their gradient buffers to it (``Gather``), it sums
  them in rank order, updates, and ``Bcast``\\ s the new parameters.

The model, optimizer, split, normalization, shards and minibatch order are
dtrain's own (:mod:`dtrain.maths`, :mod:`dtrain.data`),
so these trainers differ from dtrain only in how they communicate.  Rank 0
writes ``metrics.jsonl`` and ``params.npz`` as dtrain does, and ``rss.json``.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from dtrain.core.arrays import sum_in_order
from dtrain.maths.optim import Optimizer, Step, TrainState
from dtrain.observe.rundir import RunDir

from benchmarks.common import (epoch_row, load_run, own_shards, peak_rss_mb,
                               write_rss)


def local_gradient(p, params, shards, step: Step) -> np.ndarray:
    """Summed gradient buffer (gradient, loss, ...) of this rank's rows of the minibatch, in
    shard order; zeros on a rank without shards."""
    grads = [p.net.loss_and_grad(params, *s.batch(step.epoch, *step.bounds[s.index],
                                                  p.recipe.shuffle_seed)) for s in shards]
    return sum_in_order(*grads) if grads else np.zeros(p.net.buffer_size, dtype=params.dtype)


class Allreduce:
    """Every rank trains and keeps the whole state; one ``Allreduce`` per step."""

    def __init__(self, comm: MPI.Comm, opt: Optimizer, state: TrainState):
        self.comm, self.opt, self.state = comm, opt, state

    @property
    def params(self) -> np.ndarray:
        return self.opt.params(self.state)

    def step(self, grad: np.ndarray, step: Step) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        self.state = self.opt.apply(self.state, grad, step)


class ParameterServer:
    """Rank 0 keeps the state and updates; the others send gradients and receive parameters."""

    def __init__(self, comm: MPI.Comm, opt: Optimizer, state: TrainState):
        self.comm, self.opt, self.state = comm, opt, state
        self.params = opt.params(state).copy()
        self.inbox = np.empty((comm.size, opt.net.buffer_size),
                              dtype=state.vector.dtype) if comm.rank == 0 else None

    def step(self, grad: np.ndarray, step: Step) -> None:
        self.comm.Gather(grad, self.inbox, root=0)          # rank 0 sends an ignored row
        if self.comm.rank == 0:
            self.state = self.opt.apply(self.state, sum_in_order(*self.inbox[1:]), step)
            self.params[...] = self.opt.params(self.state)
        self.comm.Bcast(self.params, root=0)


def main(run_dir: Path) -> None:
    comm = MPI.COMM_WORLD
    cfg, p = load_run(run_dir)
    strategy = cfg.graph.strategy
    if strategy not in ("allreduce", "parameter-server"):
        raise SystemExit(f"mpi_trainers: graph.strategy must be allreduce or parameter-server, "
                         f"not {strategy!r}")
    shards = own_shards(p, comm.size, comm.rank)
    trainer = (Allreduce if strategy == "allreduce" else ParameterServer)(
        comm, p.opt, p.initial_state())
    out = RunDir(run_dir, cfg) if comm.rank == 0 else None
    comm.Barrier()
    start = time.perf_counter()
    for t in range(len(p.schedule)):
        step = p.schedule[t]
        if step.first:
            began = time.perf_counter()
        trainer.step(local_gradient(p, trainer.params, shards, step), step)
        if step.last and out is not None:
            state = trainer.state
            out.add_epoch(epoch_row(p, step.epoch + 1, time.perf_counter() - began,
                                    state.epoch_loss, state.epoch_samples))
    seconds = time.perf_counter() - start
    peaks = comm.gather(peak_rss_mb(), root=0)
    if out is not None:
        out.finish(p.net.named(trainer.params), {
            "strategy": strategy, "workers": comm.size - (strategy == "parameter-server"),
            "shards": len(p.ranges), "steps": len(p.schedule), "seconds": seconds})
        driver = peaks[0] if strategy == "parameter-server" else None
        write_rss(run_dir, driver, peaks[1:] if driver is not None else peaks)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
