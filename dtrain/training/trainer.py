"""The training driver: plan a run, run it on an engine, record it.

:func:`train` and :func:`resume` are the public entry points (the CLI is a
thin layer over them).  They validate everything they can before any cluster
starts (:func:`~dtrain.training.plan.plan`), then run the plan on an engine
(:mod:`dtrain.training.engines`: in this process for the serial reference,
as Dask task graphs for every other strategy) and write the run directory.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from distributed import Client

from dtrain.core.config import Config
from dtrain.core.errors import Diverged, Stopped, UserError
from dtrain.deploy.connect import connect
from dtrain.deploy.signals import StopSignals
from dtrain.observe.console import Echo
from dtrain.observe.metrics import peak_rss_mb
from dtrain.observe.recorder import Recorder
from dtrain.observe.rundir import new_run_dir
from dtrain.training import checkpoint
from dtrain.training.checkpoint import Checkpoints
from dtrain.training.engines import DaskEngine, Outcome, SerialEngine, Start
from dtrain.training.plan import Plan, plan


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
        Run directory for ``config.toml``, ``metrics.jsonl``, ``checkpoint.npz``,
        ``params.npz`` and ``summary.json``; None writes no files.
    echo
        Called with each console line; None for silence.

    Raises
    ------
    UserError
        For anything wrong with the config or the data, before training
        starts where it can be known then.
    Diverged
        When the training loss becomes NaN or infinite.
    """
    the_plan = plan(config)
    return _run(the_plan, Recorder(config, out, echo), Start(the_plan.initial_state()), client)


def resume(run_dir: str | Path, *, config: Config | None = None, client: Client | None = None,
           echo: Echo | None = print) -> RunResult:
    """Continue a run that was killed, from its last checkpoint.

    Parameters
    ----------
    run_dir
        The run directory of the interrupted run.
    config
        Defaults to the run's ``config.toml``; if given, it may differ only in
        ``[cluster]`` (where to run), not in what to compute.
    client, echo
        As for :func:`train`.

    Returns
    -------
    RunResult
        Whose ``params`` are byte-for-byte those of an uninterrupted run.
    """
    return resume_checked(check_resume(run_dir, config), client=client, echo=echo)


@dataclass(frozen=True)
class Resumption:
    """A run directory checked for resuming, with its config and last checkpoint (None: the
    run was killed before its first one)."""

    run_dir: Path
    config: Config
    checkpoint: checkpoint.Checkpoint | None


def check_resume(run_dir: str | Path, config: Config | None = None) -> Resumption:
    """Everything :func:`resume` checks before it starts a cluster (a run dtrain started and
    did not finish, the same config but for ``[cluster]``, a readable checkpoint), reading
    the checkpoint once."""
    run_dir = Path(run_dir)
    config = checkpoint.resumable(run_dir, config)
    saved = checkpoint.load(run_dir)
    return Resumption(run_dir, config, saved[0] if saved is not None else None)


def resume_checked(point: Resumption, *, client: Client | None = None,
                   echo: Echo | None = print) -> RunResult:
    """:func:`resume` from a :func:`check_resume` result."""
    the_plan, ckpt = plan(point.config), point.checkpoint
    start = Start(ckpt.state, ckpt.step, ckpt.epochs_done) if ckpt is not None \
        else Start(the_plan.initial_state())
    recorder = Recorder(point.config, point.run_dir, echo, resume_epochs=start.epochs_done)
    if start.step:
        recorder.say(f"resuming {point.run_dir} at step {start.step} of "
                     f"{len(the_plan.schedule)} (epoch {start.epochs_done + 1})")
    return _run(the_plan, recorder, start, client)


def _run(the_plan: Plan, recorder: Recorder, start: Start, client: Client | None) -> RunResult:
    with recorder:
        recorder.start(the_plan.run, the_plan.schedule.steps_per_epoch, the_plan.train_samples)
        keep = Checkpoints(recorder.path, the_plan.config, recorder.checkpointed)
        try:
            with StopSignals() as signals, _engine(the_plan, client, recorder) as engine:
                outcome = engine.run(start, recorder, keep, signals)
        except Diverged as exc:
            exc.note = recorder.checkpoint_note()
            raise
        except KeyboardInterrupt:           # a second Ctrl-C: at once, from wherever it was
            saved = recorder.saved[0] if recorder.saved else None
            raise Stopped("SIGINT", None, len(the_plan.schedule), saved, recorder.path) \
                from None
        params = the_plan.net.named(the_plan.opt.params(outcome.state))
        summary = _summary(the_plan, outcome)
        recorder.finish(params, summary)
    return RunResult(outcome.metrics, summary, params, recorder.path)


@contextlib.contextmanager
def _engine(plan: Plan, client: Client | None,
            recorder: Recorder) -> Iterator[SerialEngine | DaskEngine]:
    cfg, strategy = plan.config, plan.strategy
    if strategy.in_process:
        yield SerialEngine(plan)
    elif client is not None:
        with recorder.attached(client):
            yield DaskEngine(plan, client)
    else:
        needed, c = strategy.min_workers, cfg.cluster
        one_each = c.kind == "local" or c.layout == "hybrid"   # a worker per count (not per job)
        if not c.scheduler_address and one_each and 0 < c.workers < needed:
            raise UserError(f"graph.strategy = '{strategy.name}' needs {needed} workers "
                            f"({strategy.workers_word.removeprefix('the head + ')}), found "
                            f"{cfg.cluster.workers}; use --workers {needed}")
        with connect(cfg.cluster, needed, plan.leaves) as own, recorder.attached(own):
            yield DaskEngine(plan, own)


def default_out_dir(config_path: str | Path | None) -> Path:
    """A new directory under ``runs/`` named after the time and the config."""
    return new_run_dir(Path("runs"), Path(config_path).stem if config_path else "iris")


def _summary(plan: Plan, outcome: Outcome) -> dict[str, Any]:
    """What ``summary.json`` says about a finished run."""
    cfg, net = plan.config, plan.net
    last = outcome.metrics[-1] if outcome.metrics else {}
    return {
        "dataset": plan.info.name,
        "strategy": cfg.graph.strategy,
        "workers": outcome.workers,
        "threads": outcome.graph.get("threads", 0),
        "layout": cfg.cluster.layout,
        "shards": len(plan.ranges),
        "fan_in": plan.recipe.fan_in,
        "epochs": cfg.train.epochs,
        "steps": len(plan.schedule),
        "batch_size": min(cfg.train.batch_size, plan.train_samples),
        "parameters": net.size,
        "train_samples": plan.train_samples,
        "val_samples": plan.info.val,
        "test_samples": plan.info.test,
        "seconds": outcome.seconds,
        "setup_seconds": outcome.setup_seconds,
        "samples_per_second": outcome.samples / outcome.seconds
        if outcome.seconds else None,
        "final_train_loss": last.get("train_loss"),
        "final_train_accuracy": last.get("train_accuracy"),
        "final_val_accuracy": last.get("val_accuracy"),
        "test_loss": outcome.test["loss"] if outcome.test else None,
        "test_accuracy": outcome.test["accuracy"] if outcome.test else None,
        **_timing(outcome),
        **_comm(outcome),
        **_graph(outcome),
        "work_split": outcome.split,
        "driver_peak_rss_mb": round(peak_rss_mb(), 1),
        "worker_peak_rss_mb": outcome.worker_rss,
    }


def _comm(outcome: Outcome) -> dict[str, Any]:
    """Bytes between workers: as the graphs predict, and as Dask recorded them."""
    if not outcome.comm or not outcome.steps:
        return {"comm_bytes_per_step": None, "comm_bytes_measured_per_step": None}
    return {"comm_bytes_per_step": outcome.comm["predicted"] / outcome.steps,
            "comm_bytes_measured_per_step": outcome.comm["measured"] / outcome.steps,
            "comm_transfers": outcome.comm["transfers"]}


def _graph(outcome: Outcome) -> dict[str, Any]:
    """Tasks and transfers per step (the graphs' count; Dask's transfer records), and whether
    a worker's shards shared a task."""
    g, steps = outcome.graph, outcome.steps
    if not g or not steps:
        return {"tasks_per_step": None, "transfers_per_step": None}
    fused = g.get("fused")
    return {"tasks_per_step": g["tasks"] / steps,
            "transfers_per_step": outcome.comm["predicted_transfers"] / steps,
            "transfers_measured_per_step": outcome.comm["transfers"] / steps,
            "fused_shards": None if fused is None else {"fused": fused[0], "why": fused[1]}}


def _timing(outcome: Outcome) -> dict[str, Any]:
    """Efficiency (time in forward-backward / wall time, over workers) and per-step overhead
    (wall time per step minus the compute on the step's critical path)."""
    c, steps = outcome.compute, outcome.steps
    if not steps or not outcome.seconds or not c:
        return {"efficiency": None, "step_seconds": None, "overhead_per_step": None}
    step = outcome.seconds / steps
    lanes = max(outcome.graph.get("threads", 0), outcome.workers, 1)   # tasks side by side
    return {"efficiency": c["forward_backward_seconds"] / (outcome.seconds * lanes),
            "step_seconds": step, "compute_per_step": c["critical_seconds"] / steps,
            "overhead_per_step": step - c["critical_seconds"] / steps,
            "task_seconds": {k.removesuffix("_seconds"): v for k, v in c.items()
                             if k.endswith("_seconds") and k != "critical_seconds"}}
