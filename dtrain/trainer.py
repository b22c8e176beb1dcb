"""The training driver: plan a run, feed its windows of task graphs to Dask, record it.

:func:`train` is the public entry point (the CLI is a thin layer over it).
It validates everything it can before any cluster starts, then runs one of
two engines over the same :class:`~dtrain.optim.Schedule`:

* ``serial``: the reference; no Dask, each global minibatch in one piece.
* ``allreduce`` / ``parameter-server``: shards built by loading tasks on
  the workers, and one task graph per window of steps (see
  :mod:`dtrain.graph`).  The driver waits only at window edges, for the
  state it needs to start the next window; evaluations come back on their
  own.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import numpy as np
from distributed import Client, Future, wait

from dtrain import cluster, data, graph
from dtrain.config import Config
from dtrain.errors import UserError
from dtrain.graph import Placement, Recipe
from dtrain.model import Network
from dtrain.optim import Optimizer, Schedule, TrainState
from dtrain.report import Echo, Recorder, new_run_dir


@dataclass
class RunResult:
    """What a run produced.

    Attributes
    ----------
    metrics
        One dict per epoch (the lines of ``metrics.jsonl``).
    summary
        The contents of ``summary.json``.
    params
        ``{"W1": ..., "b1": ..., ...}``, as saved in ``params.npz``.
    out
        The run directory, or None if the run wrote no files.
    """

    metrics: list[dict[str, Any]]
    summary: dict[str, Any]
    params: dict[str, np.ndarray]
    out: Path | None = None


@dataclass
class Plan:
    """Everything fixed before the first step: sizes, model, optimizer, schedule."""

    config: Config
    info: data.DatasetInfo
    ranges: list[tuple[int, int]]
    net: Network
    opt: Optimizer
    schedule: Schedule
    recipe: Recipe = field(init=False)
    run: str = field(init=False, default_factory=lambda: uuid.uuid4().hex[:8])  # ends every key

    def __post_init__(self) -> None:
        seed = self.config.data.seed if self.config.data.shuffle and \
            self.schedule.steps_per_epoch > 1 else None
        g = self.config.graph
        self.recipe = Recipe(self.net, self.opt, seed, g.strategy, g.fan_in, g.fuse_update,
                             g.step_events)

    @property
    def train_samples(self) -> int:
        return self.ranges[-1][1]

    def initial_state(self) -> TrainState:
        return self.opt.init_state(self.net.init(self.config.model.seed))


def plan(config: Config) -> Plan:
    """Check the config against the data and build the schedule; no cluster needed."""
    info = data.describe(config.data)
    layers = config.model.layers
    if layers[0] != info.features:
        raise UserError(f"model.layers[0] = {layers[0]} but {info.name} has {info.features} input "
                        f"features; set model.layers = [{info.features}, ..., {info.classes}]")
    if layers[-1] != info.classes:
        raise UserError(f"model.layers[-1] = {layers[-1]} but {info.name} has {info.classes} "
                        f"classes; set model.layers = [{info.features}, ..., {info.classes}]")
    ranges = data.shard_ranges(info.train, config.data.replicate, config.data.shards)
    net = Network.from_config(config.model)
    opt = Optimizer(config.optim, net, config.model.l2)
    schedule = Schedule([b - a for a, b in ranges], config.train.batch_size, config.optim,
                        config.train.epochs)
    return Plan(config, info, ranges, net, opt, schedule)


OnEpoch = Callable[[dict[str, Any]], None]


def train(config: Config, *, client: Client | None = None, out: str | Path | None = None,
          echo: Echo | None = print) -> RunResult:
    """Train a network as ``config`` says and return what it produced.

    Parameters
    ----------
    config
        From :func:`dtrain.load_config`.
    client
        Run on this Dask client's cluster.  Without one, a LocalCluster is
        started (or ``cluster.scheduler_address`` is used) and closed after.
        Ignored by the ``serial`` strategy.
    out
        Run directory for ``config.toml``, ``metrics.jsonl``, ``params.npz``
        and ``summary.json``; None writes no files.
    echo
        Called with each console line; None for silence.

    Raises
    ------
    UserError
        For anything wrong with the config or the data, before training
        starts where it can be known then.
    """
    the_plan = plan(config)
    with Recorder(config, out, echo) as recorder:
        recorder.start(the_plan.run, the_plan.schedule.steps_per_epoch, the_plan.train_samples)
        with _engine(the_plan, client, recorder) as engine:
            outcome = engine.run(recorder.epoch)
        params = the_plan.net.named(the_plan.opt.params(outcome.state))
        summary = _summary(the_plan, outcome)
        recorder.finish(params, summary)
    return RunResult(outcome.metrics, summary, params, recorder.path)


@contextlib.contextmanager
def _engine(plan: Plan, client: Client | None,
            recorder: Recorder) -> Iterator[SerialEngine | DaskEngine]:
    cfg = plan.config
    if cfg.graph.strategy == "serial":
        yield SerialEngine(plan)
    elif client is not None:
        with recorder.attached(client):
            yield DaskEngine(plan, client)
    else:
        needed = 2 if cfg.graph.strategy == "parameter-server" else 1
        if not cfg.cluster.scheduler_address and cfg.cluster.workers < needed:
            raise UserError(f"graph.strategy = 'parameter-server' needs {needed} workers (a head "
                            f"and at least one trainer), found {cfg.cluster.workers}; "
                            f"use --workers 2")
        with cluster.connect(cfg.cluster) as own, recorder.attached(own):
            yield DaskEngine(plan, own)


def default_out_dir(config_path: str | Path | None) -> Path:
    """A new directory under ``runs/`` named after the time and the config."""
    return new_run_dir(Path("runs"), Path(config_path).stem if config_path else "iris")


# --- engines ------------------------------------------------------------------------------

@dataclass
class Outcome:
    metrics: list[dict[str, Any]]
    state: TrainState
    test: dict[str, float] | None
    workers: int
    seconds: float
    setup_seconds: float


def _epoch_row(plan: Plan, ev: dict[str, float], seconds: float) -> dict[str, Any]:
    epoch = ev["epoch"]
    return {"epoch": epoch, "train_loss": ev.get("train_loss"),
            "val_loss": ev["loss"] if plan.info.val else None,
            "val_accuracy": ev["accuracy"] if plan.info.val else None,
            "seconds": seconds, "samples_per_second": plan.train_samples / seconds if seconds else None,
            "lr": plan.schedule.rates[epoch - 1], "steps": plan.schedule.steps_per_epoch}


class SerialEngine:
    """The reference: one process, NumPy, every global minibatch in one piece."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, on_epoch: OnEpoch) -> Outcome:
        p, cfg = self.plan, self.plan.config
        t0 = time.perf_counter()
        shards = [data.load_shard(cfg.data, i, a, b, p.info.train, cfg.model.dtype)
                  for i, (a, b) in enumerate(p.ranges)]
        val = data.load_part(cfg.data, "val", cfg.model.dtype)
        test = data.load_part(cfg.data, "test", cfg.model.dtype)
        state, metrics = p.initial_state(), []
        start = last = time.perf_counter()
        for t in range(len(p.schedule)):
            step = p.schedule[t]
            rows = [s.batch(step.epoch, lo, hi, p.recipe.shuffle_seed)
                    for s, (lo, hi) in zip(shards, step.bounds)]
            x = np.concatenate([r[0] for r in rows])               # (B, D)
            y = np.concatenate([r[1] for r in rows])               # (B,)
            grad = p.net.loss_and_grad(p.opt.params(state), x, y)
            state = p.opt.apply(state, grad, step)
            if step.last:
                now = time.perf_counter()
                row = _epoch_row(p, graph.evaluate(p.net, step.epoch, state, val), now - last)
                last = now
                metrics.append(row)
                on_epoch(row)
        seconds = time.perf_counter() - start
        result = graph.evaluate(p.net, -1, state, test) if p.info.test else None
        return Outcome(metrics, state, result, 0, seconds, start - t0)


class DaskEngine:
    """Shards on the workers, one task graph per window of steps."""

    def __init__(self, plan: Plan, client: Client):
        self.plan, self.client = plan, client
        self.run_id = plan.run

    def _key(self, name: str, *parts: int | str) -> str:
        return graph.key(name, *parts, run=self.run_id)

    def _load(self, placement: Placement) -> tuple[list[Future], Future | None, Future | None]:
        """Submit the loading tasks (pinned, loosely) and wait for the shards to exist."""
        p, cfg, c = self.plan, self.plan.config, self.client
        shards = [c.submit(data.load_shard, cfg.data, i, a, b, p.info.train, cfg.model.dtype,
                           key=self._key("load-shard", i), workers=[placement.shards[i]],
                           allow_other_workers=True)
                  for i, (a, b) in enumerate(p.ranges)]
        parts = [c.submit(data.load_part, cfg.data, part, cfg.model.dtype,
                          key=self._key(f"load-{part}"), workers=[placement.root],
                          allow_other_workers=True) if getattr(p.info, part) else None
                 for part in ("val", "test")]
        loading = shards + [f for f in parts if f is not None]
        wait(loading)
        for f in loading:
            if f.status == "error":
                f.result()  # re-raises the worker's exception here
        c.run(data.clear_cache)  # the shards are built; drop the workers' copies of the files
        return shards, parts[0], parts[1]

    def _submit(self, win: graph.Window) -> list[Future]:
        with dask.annotate(workers=win.where.__getitem__, allow_other_workers=True):
            return self.client.get(win.dsk, [win.end, *win.evals.values()], sync=False)

    def run(self, on_epoch: OnEpoch) -> Outcome:
        p, cfg = self.plan, self.plan.config
        t0 = time.perf_counter()
        workers = cluster.worker_addresses(self.client)
        if cfg.graph.strategy == "parameter-server" and len(workers) < 2:
            raise UserError(f"graph.strategy = 'parameter-server' needs 2 workers (a head and at "
                            f"least one trainer), found {len(workers)}")
        placement = graph.place(workers, len(p.ranges), cfg.graph.strategy)
        shards, val, test = self._load(placement)
        state, metrics = p.initial_state(), []
        finished: dict[int, float] = {}   # epoch -> when its evaluation arrived
        start = time.perf_counter()
        pending: list[tuple[int, Future]] = []
        total, size = len(p.schedule), cfg.graph.window
        for first in range(0, total, size):
            steps = [p.schedule[t] for t in range(first, min(first + size, total))]
            win = graph.window_graph(steps, state, shards, val, placement, p.recipe, self.run_id)
            end, *evals = self._submit(win)
            for epoch, fut in zip(win.evals, evals):
                fut.add_done_callback(lambda f, e=epoch: finished.setdefault(e, time.perf_counter()))
            self._drain(pending, metrics, finished, start, on_epoch)
            pending = list(zip(win.evals, evals))
            state = end.result()   # the one wait per window: the next window starts from here
            del end
        self._drain(pending, metrics, finished, start, on_epoch)
        seconds = time.perf_counter() - start
        result = None
        if test is not None:
            result = self.client.submit(graph.evaluate, p.net, -1, state, test,
                                        key=self._key("evaluate-test"), workers=[placement.root],
                                        allow_other_workers=True).result()
        return Outcome(metrics, state, result, len(workers), seconds, start - t0)

    def _drain(self, pending, metrics, finished, start, on_epoch: OnEpoch) -> None:
        """Turn finished evaluations into epoch rows, in epoch order."""
        for epoch, fut in pending:
            ev = fut.result()
            done = finished.get(epoch) or time.perf_counter()
            begin = finished.get(epoch - 1, start)
            row = _epoch_row(self.plan, ev, done - begin)
            metrics.append(row)
            on_epoch(row)


def _summary(plan: Plan, outcome: Outcome) -> dict[str, Any]:
    """What ``summary.json`` says about a finished run."""
    cfg, net = plan.config, plan.net
    last = outcome.metrics[-1] if outcome.metrics else {}
    return {
        "dataset": plan.info.name,
        "strategy": cfg.graph.strategy,
        "workers": outcome.workers,
        "shards": len(plan.ranges),
        "fan_in": graph.fan_in(cfg.graph.strategy, cfg.graph.fan_in, len(plan.ranges)),
        "epochs": cfg.train.epochs,
        "steps": len(plan.schedule),
        "batch_size": min(cfg.train.batch_size, plan.train_samples),
        "parameters": net.size,
        "train_samples": plan.train_samples,
        "val_samples": plan.info.val,
        "test_samples": plan.info.test,
        "seconds": outcome.seconds,
        "setup_seconds": outcome.setup_seconds,
        "samples_per_second": plan.train_samples * cfg.train.epochs / outcome.seconds
        if outcome.seconds else None,
        "final_train_loss": last.get("train_loss"),
        "final_val_accuracy": last.get("val_accuracy"),
        "test_loss": outcome.test["loss"] if outcome.test else None,
        "test_accuracy": outcome.test["accuracy"] if outcome.test else None,
    }
