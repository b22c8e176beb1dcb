"""The reference engine: one process, NumPy, every global minibatch in one piece."""
from __future__ import annotations

import time

from dtrain.data.prepare import normalization
from dtrain.data.shards import load_part, load_shard, minibatch
from dtrain.maths.model import noise
from dtrain.maths.optim import update
from dtrain.observe.recorder import Recorder
from dtrain.taskgraph.records import Evaluate
from dtrain.taskgraph.tasks import evaluate
from dtrain.training.checkpoint import Checkpoint, Checkpoints
from dtrain.training.course import (Outcome, Start, Stop, chosen, epoch_row, stop_here,
                                    windows)
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch


class SerialEngine:
    """The reference: one process, NumPy, every global minibatch in one piece."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, start: Start, recorder: Recorder, checkpoints: Checkpoints,
            stop: Stop = Stop(), watch: Watch | None = None) -> Outcome:
        p, cfg = self.plan, self.plan.config
        watch = watch or Watch(cfg.train)
        t0 = time.perf_counter()
        shards = [load_shard(src) for src in p.sources]
        val = load_part(cfg.data, "val", cfg.model.dtype, norm=p.norm)
        test = load_part(cfg.data, "test", cfg.model.dtype, norm=p.norm)
        norm = normalization(cfg.data, p.norm)
        state, rows = start.state, list(recorder.metrics)
        began = last = time.perf_counter()
        fb = upd = 0.0
        done = start.step
        for window in windows(p, start.step):
            for t in window:
                step = p.schedule[t]
                x, y = minibatch(shards, step.epoch, step.bounds, p.recipe.shuffle_seed)
                t1 = time.perf_counter()
                grad = p.net.loss_and_grad(p.opt.params(state), x, y, noise=noise(
                    step.epoch, [(s.index, *b) for s, b in zip(shards, step.bounds)]))
                t2 = time.perf_counter()
                state = update(p.opt, step, True, state, grad)
                fb, upd, done = fb + t2 - t1, upd + time.perf_counter() - t2, t + 1
                if step.last:
                    now = time.perf_counter()
                    row = epoch_row(p, evaluate(Evaluate(p.net, step.epoch), state, val),
                                     now - last, start.step)
                    last = now
                    rows.append(row)
                    recorder.epoch(row)
                    if watch.see(row, state):
                        break
            if watch.stopped:
                break
            checkpoints.save(Checkpoint(window.stop, window.stop // p.schedule.steps_per_epoch,
                                        state, watch.best_state))
            stop_here(stop, p, window.stop, checkpoints)
        seconds = time.perf_counter() - began
        final = chosen(watch, state)
        result = evaluate(Evaluate(p.net, -1), final, test) if p.info.test else None
        compute = {"forward_backward_seconds": fb, "reduce_seconds": 0.0, "update_seconds": upd,
                   "critical_seconds": fb + upd}
        return Outcome(rows, final, state, norm, result, 0, seconds, began - t0,
                       done - start.step, p.schedule.samples(start.step, done), compute)
