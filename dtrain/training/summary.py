"""What a finished run's files say of it: ``summary.json`` and ``model.json``.

:func:`run_summary` makes ``summary.json`` from the plan, the engine's
:class:`~dtrain.training.course.Outcome` (its counts: :mod:`~dtrain.training.counters`)
and early stopping's :class:`~dtrain.training.stopping.Watch`: the data and the network,
the epochs and steps run, the final and test figures, where the time went (efficiency,
per-step overhead, task seconds), what crossed between workers, how the graphs ran, and the
work per worker; :func:`head_cpu` the driver's CPU per step; :func:`model_spec` what
``model.json`` says of the network, its normalization and its classes.
"""
from __future__ import annotations

from typing import Any

from dtrain.core.modelfile import ModelSpec
from dtrain.core.version import __version__
from dtrain.observe.metrics import peak_rss_mb
from dtrain.training.course import Outcome
from dtrain.training.plan import Plan
from dtrain.training.stopping import Watch


def model_spec(plan: Plan, outcome: Outcome, watch: Watch) -> ModelSpec:
    """What ``model.json`` says: the network, its input normalization and class labels."""
    m, d = plan.config.model, plan.config.data
    images = {"image_size": list(d.image_size), "grayscale": d.grayscale} \
        if d.dataset in ("mnist", "image-folder") else {}
    if d.dataset == "image-folder":
        images["channels_first"] = True         # colour rows (C, H, W): data.readers.read_image
    values = plan.net.regression                # a regression names targets, not classes
    return ModelSpec(tuple(m.layers), m.activation, m.loss, m.dtype, outcome.normalization,
                     () if values else plan.info.labels, plan.info.names,
                     {"dataset": plan.info.name, "data_path": d.path or None, **images,
                      "label_column": d.label or None, "init_from": m.init_from or None,
                      "epochs": len(outcome.metrics), "train_samples": plan.train_samples,
                      **watch.summary(), "dtrain": __version__},
                     tuple(map(str, plan.info.labels)) if values else (),
                     tuple(m.input_shape))


def run_summary(plan: Plan, outcome: Outcome, watch: Watch, phases: dict[str, float]
             ) -> dict[str, Any]:
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
        "epochs_run": len(outcome.metrics),
        **watch.summary(),
        "steps": outcome.steps if outcome.solver else len(plan.schedule),  # lbfgs: evaluations
        "steps_run": outcome.steps if outcome.solver else
        (watch.stopped * plan.schedule.steps_per_epoch if watch.stopped
         else len(plan.schedule)),
        "batch_size": min(cfg.train.batch_size, plan.train_samples),
        "parameters": net.size,
        "train_samples": plan.train_samples,
        "val_samples": plan.info.val,
        "test_samples": plan.info.test,
        "seconds": outcome.seconds,
        "setup_seconds": outcome.setup_seconds,
        "phases": phases,
        "samples_per_second": outcome.samples / outcome.seconds
        if outcome.seconds else None,
        "final_train_loss": last.get("train_loss"),
        "final_train_accuracy": last.get("train_accuracy"),
        "final_val_accuracy": last.get("val_accuracy"),
        "test_loss": outcome.test["loss"] if outcome.test else None,
        "test_accuracy": outcome.test["accuracy"] if outcome.test else None,
        **_regression(plan, outcome),
        **_timing(outcome),
        **_comm(outcome),
        **_graph(outcome),
        "work_split": outcome.split,
        **({"data_moved": outcome.moved} if outcome.moved else {}),
        **({"solver": outcome.solver} if outcome.solver else {}),
        "driver_peak_rss_mb": round(peak_rss_mb(), 1),
        "worker_peak_rss_mb": outcome.worker_rss,
    }


def head_cpu(plan: Plan, marks: list[tuple[int, float]]) -> float | None:
    """This process's CPU (the driver's, and a LocalCluster's or the head rank's scheduler
    beside it) per training step in steady state, in milliseconds: between the first and the
    last epoch rows recorded (rows come as windows end), over the steps between their
    epochs; None where they are one window's."""
    if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
        return None
    (first, start), (last, end) = marks[0], marks[-1]
    return (end - start) * 1e3 / ((last - first) * plan.schedule.steps_per_epoch)


def _regression(plan: Plan, outcome: Outcome) -> dict[str, Any]:
    """A regression's test figures (each the mean over targets), computed on the worker with
    the test loss; nothing for a classifier."""
    if not plan.net.regression:
        return {}
    test = outcome.test or {}
    return {f"test_{k}": test.get(k) for k in ("r2", "rmse", "mae")}


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
            "fused_shards": None if fused is None else {"fused": fused[0], "why": fused[1]},
            "fused_windows": g.get("fused_windows", 0),
            "spanned_windows": g.get("spanned_windows", 0),
            "segmented_windows": g.get("segmented_windows", 0),
            "described_windows": g.get("described_windows", 0),
            "step_sum": g.get("step_sum"),
            "update_where_summed": g.get("update_where_summed", False),
            "worker_to_worker": g.get("via", []),
            "scheduler_tasks_per_step": outcome.compute["scheduler_tasks"] / steps
            if "scheduler_tasks" in outcome.compute else None,
            "window_reruns": g.get("reruns", []),
            "state_bytes_in_graphs": g.get("state_bytes_in_graphs", 0),
            "epoch_states_fetched": g.get("epoch_states_fetched", 0),
            "device_choice": g.get("choice") or None}


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
