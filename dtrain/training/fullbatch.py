"""The full-batch engine: ``optim.name = "lbfgs"``, scipy's L-BFGS-B over task graphs.

The data is placed and loaded as for any Dask run: the engine holds a
:class:`~dtrain.training.cluster_data.ClusterData`, as the
:class:`~dtrain.training.engines.DaskEngine` does (shards where their partitions sit,
held-out splits beside them), and counts what it submits in the same
:class:`~dtrain.training.counters.Counters`.  Then scipy's
``minimize(method="L-BFGS-B")`` (:func:`dtrain.maths.lbfgs.minimize`) runs:

* on the driver, each loss and gradient it asks for one task graph over every shard
  (:func:`dtrain.taskgraph.fullbatch.evaluation`: forward-backward where the shards are,
  the fixed-order reduce tree), waited for;
* or, where every shard sits on one worker (and ``graph.fuse_steps``), as one task on that
  worker (:func:`dtrain.taskgraph.fullbatch.run_on_worker`), which sums each evaluation as
  that worker's graph would: no round trip per evaluation.

Either way each evaluation is the same bytes, and so is every iterate: the parameters do
not depend on the number of workers.  Each iteration is an epoch row (its iterate's
training loss and accuracy; the validation split is evaluated once, at the end, into the
last row); there is no checkpoint (scipy's L-BFGS memory cannot be saved), so a run that
is stopped begins again when resumed, and gives the bytes an uninterrupted run gives.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
from dask.task_spec import DataNode
from distributed import Client

from dtrain.core import keys
from dtrain.core.errors import Diverged, Stopped
from dtrain.deploy.workers import gather
from dtrain.maths.lbfgs import Minimized, minimize, raw_units
from dtrain.maths.optim import TrainState
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph import fullbatch
from dtrain.taskgraph.evaluation import add_evaluation
from dtrain.taskgraph.placement import Placement
from dtrain.taskgraph.records import Evaluate, FullBatch
from dtrain.taskgraph.window import Window
from dtrain.training import heldout
from dtrain.training.checkpoint import Checkpoints
from dtrain.training.cluster_data import ClusterData
from dtrain.training.counters import Counters
from dtrain.training.course import Outcome, Start, Stop, epoch_row, stop_before
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch


class FullBatchEngine:
    """A Dask run's data and cluster (:class:`~dtrain.training.cluster_data.ClusterData`),
    scipy's L-BFGS-B instead of windows of steps (see the module's docstring)."""

    def __init__(self, plan: Plan, client: Client):
        self.plan, self.client = plan, client
        self.run_id = plan.run
        self.cluster = ClusterData(plan, client)
        self.counters = Counters()
        self.evaluations = 0            # evaluations submitted from the driver so far

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        with self.cluster.in_use():
            return self._run(start, recorder, checkpoints, stop,
                             watch or Watch(self.plan.config.train))

    def _run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
             stop: Stop, watch: Watch) -> Outcome:
        p, cfg = self.plan, self.plan.config
        t0 = time.perf_counter()
        placement, held = self.cluster.load(start.step, recorder)
        stop_before(stop, p, start, checkpoints)
        began = time.perf_counter()
        one = cfg.graph.fuse_steps and len(set(placement.leaves)) == 1
        found = self._on_worker(start.state, placement) if one \
            else self._from_driver(start.state, placement, stop, checkpoints)
        state = TrainState(found.params)
        last = len(found.iterations)
        if not np.isfinite(found.params).all():
            raise Diverged(found.evaluations, max(last - 1, 0), float("nan"))
        val = self._evaluate(held.val, state, placement, found) if held.val is not None \
            else None
        rows = self._rows(found, val)
        for row in rows:
            recorder.epoch(row)
        seconds = time.perf_counter() - began
        test = heldout.evaluate_test(self.client, p, self.run_id, state, held.test,
                                     placement) if held.test is not None else None
        return Outcome(rows, state, state, self.cluster.normalization, test, seconds=seconds,
                       setup_seconds=began - t0, steps=found.evaluations,
                       samples=found.evaluations * p.train_samples,
                       **self.counters.summary(self.client, self.run_id, measured=not one),
                       **self.cluster.summary(),
                       solver={"name": "lbfgs", "iterations": last,
                               "evaluations": found.evaluations, "status": found.status,
                               "message": found.message, "one_task": one, "loss": found.loss})

    def _on_worker(self, start: TrainState, placement: Placement) -> Minimized:
        """The whole run as one task on the worker holding every shard."""
        p, cfg = self.plan, self.plan.config
        sizes = [b - a for a, b in p.ranges]
        leaf = fullbatch.one_leaf(sizes, placement, p.recipe, self.run_id)
        norm = self.cluster.normalization
        task = FullBatch(leaf, cfg.optim, cfg.model.l2, p.train_samples, cfg.train.epochs,
                         norm.shift, norm.scale)
        win = fullbatch.on_worker(0, TrainState(p.opt.params(start)), task, self.cluster.refs,
                                  placement.root, self.run_id)
        self.counters.fused_windows += 1
        return self._wait(win)[0]

    def _from_driver(self, start: TrainState, placement: Placement, stop: Stop,
                     checkpoints: Checkpoints) -> Minimized:
        """scipy here, each evaluation a graph over the workers."""
        p, cfg = self.plan, self.plan.config
        sizes = [b - a for a, b in p.ranges]
        located, norm = self.cluster.located, self.cluster.normalization

        def gradient(params: Any) -> Any:
            self.evaluations += 1
            win = fullbatch.evaluation(self.evaluations, params, self.cluster.refs, sizes,
                                       placement, p.recipe, self.run_id)
            moves = win.transfers(located)
            self.counters.predicted_bytes += sum(win.nbytes.get(k, 0) for k, _, _ in moves)
            self.counters.predicted_transfers += len(moves)
            self.counters.submitted(win)
            return self._wait(win)[0]

        def after(done: int) -> None:
            if stop.requested and done < cfg.train.epochs:
                raise Stopped(stop.requested, done, cfg.train.epochs, None,
                              checkpoints.run_dir)

        return minimize(gradient, p.opt.params(start), p.net, cfg.optim, cfg.model.l2,
                        p.train_samples, cfg.train.epochs, after,
                        raw_units(p.net, norm.shift, norm.scale))

    def _wait(self, win: Window) -> list[Any]:
        """Submit ``win`` and wait for its ends (a cluster left without workers: one line)."""
        futures = self.cluster.submit(win)
        try:
            return gather(self.client, futures, self.plan.config.cluster.timeout,
                          "; no checkpoint is kept by optim.name = 'lbfgs'")
        finally:
            for future in futures:
                future.release()

    def _evaluate(self, parts: Any, state: TrainState, placement: Placement,
                  found: Minimized) -> dict[str, Any]:
        """The validation split's loss and score at the last iterate (the last row's)."""
        win = Window()
        start = win.add(DataNode(keys.make(keys.STATE, found.evaluations + 1, "val",
                                           run=self.run_id), state), placement.root)
        epoch = max(len(found.iterations) - 1, 0)
        win.ends = [add_evaluation(win, Evaluate(self.plan.net, epoch), start,
                                   heldout.refs(parts), placement.root, self.run_id)]
        return self._wait(win)[0]

    def _rows(self, found: Minimized, val: dict[str, Any] | None) -> list[dict[str, Any]]:
        """An epoch row per iteration; the validation split's figures in the last."""
        p, n = self.plan, self.plan.train_samples
        rows, before = [], 0
        for i, it in enumerate(found.iterations, start=1):
            ev = {"epoch": i, "train_loss": it.loss,
                  "train_accuracy": None if p.net.regression else it.correct / n,
                  "loss": None, "accuracy": None}
            if val is not None and i == len(found.iterations):
                ev.update({k: val.get(k) for k in ("loss", "accuracy", "r2")})
            row = epoch_row(p, ev, it.seconds, 0)
            evaluations, before = it.evaluations - before, it.evaluations
            row.update(lr=None, steps=evaluations, evaluations=evaluations,
                       samples_per_second=evaluations * n / it.seconds if it.seconds else None)
            rows.append(row)
        return rows
