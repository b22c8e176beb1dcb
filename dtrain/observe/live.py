"""Live metrics of a run, kept on the Dask scheduler for the ``/dtrain`` page and Prometheus.

How the numbers travel, none of it on the training's critical path:

* every ``graph.step_events`` steps (and at each epoch's last step), at most
  one per ``graph.step_event_gap`` seconds (the run's last step always), the
  ``update`` task sends a ``step`` event from its worker
  (:mod:`dtrain.core.events`, which also lists the events and their fields);
* the driver sends ``start``, ``epoch`` and ``end`` events with
  ``Client.log_event``;
* :class:`DtrainPlugin`, a scheduler plugin the driver registers through
  ``Client.register_plugin`` (so it also reaches a scheduler in another
  process, e.g. under MPI), sees those events through the plugin's
  ``log_event`` hook and every finished task through its ``transition``
  hook: the same records distributed's task stream keeps.  It holds a
  bounded :class:`~dtrain.observe.runlog.RunLog` per run, serves the
  ``/dtrain`` page (:mod:`dtrain.observe.livepage`), exports Prometheus gauges
  on the scheduler's ``/metrics``, and has the dashboard name tasks by their
  kind (:func:`dtrain.core.internals.relabel_tasks`).
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any

from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

from dtrain.core import broadcast, events, internals, keys
from dtrain.observe.runlog import BUSY_WINDOW, KEEP_RUNS, RunLog

PLUGIN_NAME = "dtrain"
SPANS_HANDLER = "dtrain_spans"      # the scheduler's handler for a window's spans
STEPS = "steps"     # the Progress panel's row of training steps, beside the task prefixes'


_PLUGINS: weakref.WeakSet[DtrainPlugin] = weakref.WeakSet()


class DtrainPlugin(SchedulerPlugin):
    """Collects dtrain's events and task records on the scheduler; serves ``/dtrain``."""

    name = PLUGIN_NAME
    idempotent = True          # one per scheduler, whatever the number of runs

    def __init__(self) -> None:
        self.runs: dict[str, RunLog] = {}
        self.scheduler: Any = None
        self.installed: list[str] = []

    async def start(self, scheduler: Any) -> None:
        from dtrain.observe import livepage

        self.scheduler = scheduler
        _PLUGINS.add(self)
        self.installed = internals.relabel_tasks(keys.kind_of,
                                                 {**keys.COLORS, STEPS: keys.color(keys.UPDATE)})
        progress = internals.add_progress_rows(_progress_rows)
        if progress:
            self.installed.append(progress)
        handlers = getattr(scheduler, "handlers", None)
        if isinstance(handlers, dict):
            handlers[SPANS_HANDLER] = self.on_spans
            self.installed.append(SPANS_HANDLER)
        if livepage.install(scheduler, self):
            self.installed.append("/dtrain")
        if _register_prometheus():
            self.installed.append("prometheus")

    async def close(self) -> None:
        _PLUGINS.discard(self)         # no gauges from a closed scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        run = events.run_of_topic(topic)
        if run is None or not isinstance(msg, dict):
            return
        log = self.runs.get(run)
        if log is None:
            log = self.runs[run] = RunLog(run)
            while len(self.runs) > KEEP_RUNS:
                del self.runs[next(iter(self.runs))]
        log.on_event(msg)

    def on_spans(self, run: str | None = None, groups: Any = None) -> None:
        """The scheduler's ``dtrain_spans`` handler: a window's spans and timings, sent by
        the driver as the window ends (:func:`send_spans`)."""
        log = self.runs.get(run) if isinstance(run, str) else None
        if log is not None and isinstance(groups, list | tuple):
            log.on_spans(list(groups))

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish == "memory":
            log = self.runs.get(keys.run_of(key))   # type: ignore[arg-type]
            if log is not None:
                log.on_task(key, kwargs)

    def latest(self) -> RunLog | None:
        """The run that started last."""
        return next(reversed(self.runs.values()), None)

    def worker_names(self) -> dict[str, str]:
        return {addr: str(ws.name) for addr, ws in self.scheduler.workers.items()}

    def nthreads(self) -> dict[str, int]:
        return {addr: max(ws.nthreads, 1) for addr, ws in self.scheduler.workers.items()}


def _progress_rows() -> dict[str, tuple[int, int]]:
    """The Progress panel's ``steps`` row: the training steps done and to do of the latest
    run still training on a live plugin of this process (a window task counts as one task,
    whatever its steps)."""
    for plugin in list(_PLUGINS):
        log = plugin.latest()
        if log is None or log.finished or not log.meta:
            continue
        total = int(log.meta.get("steps_per_epoch", 0)) * int(log.meta.get("epochs", 0))
        done = log.last_step["step"] if log.last_step else 0
        if total:
            return {STEPS: (done, total)}
    return {}


# --- driver side --------------------------------------------------------------------------

def install(client: Client) -> None:
    """Register :class:`DtrainPlugin` on the client's scheduler (once per scheduler; on a
    cluster that keeps dtrain's plugins, once: :func:`dtrain.core.broadcast.once`)."""
    broadcast.once(client, PLUGIN_NAME,
                   lambda: client.register_plugin(DtrainPlugin(), name=PLUGIN_NAME))


def send_spans(client: Client, run: str, groups: tuple) -> bool:
    """Send a window's spans and timings (:attr:`dtrain.taskgraph.fuse.Ran.spans`) to the
    scheduler's plugin, never waiting for it; not as an event, which the scheduler would
    keep in its event log and send to the topic's subscribers."""
    return internals.call_scheduler_soon(client, SPANS_HANDLER, run=run, groups=groups)


def _timeline_on_scheduler(dask_scheduler: Any, run: str) -> dict[str, Any] | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    log = plugin.runs.get(run) if plugin is not None else None
    return log.timeline(plugin.worker_names()) if log is not None else None


def fetch_timeline(client: Client, run: str) -> dict[str, Any] | None:
    """The task records the scheduler kept for ``run`` (None if it has none)."""
    return client.run_on_scheduler(_timeline_on_scheduler, run=run)


def _last_step_on_scheduler(dask_scheduler: Any, run: str) -> dict[str, Any] | None:
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    log = plugin.runs.get(run) if plugin is not None else None
    return log.last_step if log is not None else None


def fetch_last_step(client: Client, run: str) -> dict[str, Any] | None:
    """The newest ``step`` event the scheduler kept for ``run`` (None before the first)."""
    return client.run_on_scheduler(_last_step_on_scheduler, run=run)


# --- Prometheus ---------------------------------------------------------------------------

class _Collector:
    """dtrain's gauges for the latest run of every live plugin in this process."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ("run",)) -> Any:
            return GaugeMetricFamily(f"dtrain_{name}", doc, labels=list(labels))

        g = {"step": gauge("step", "Training steps done"),
             "epoch": gauge("epoch", "Current epoch (from 1)"),
             "loss": gauge("train_loss", "Training loss of the last reported minibatch"),
             "train_accuracy": gauge("train_accuracy", "Training accuracy over the current "
                                     "epoch's minibatches so far"),
             "rate": gauge("samples_per_second", "Training samples per second"),
             "val_loss": gauge("val_loss", "Validation loss after the last epoch"),
             "val_accuracy": gauge("val_accuracy", "Validation accuracy after the last epoch"),
             "busy": gauge("worker_busy_fraction", f"Share of the last {BUSY_WINDOW:g} s each "
                           "worker spent computing the run's tasks", ("run", "worker"))}
        for plugin in list(_PLUGINS):
            log = plugin.latest()
            if log is None or plugin.scheduler is None:
                continue
            step, labels = log.last_step, [log.run]
            if step is not None:
                for name in ("step", "epoch", "loss"):
                    g[name].add_metric(labels, step["loss" if name == "loss" else name])
                if step["rate"] is not None:
                    g["rate"].add_metric(labels, step["rate"])
                if step.get("epoch_accuracy") is not None:
                    g["train_accuracy"].add_metric(labels, step["epoch_accuracy"])
            elif log.epochs and log.epochs[-1].get("train_accuracy") is not None:
                g["train_accuracy"].add_metric(labels, log.epochs[-1]["train_accuracy"])
            if log.epochs:
                for name in ("val_loss", "val_accuracy"):
                    if log.epochs[-1].get(name) is not None:
                        g[name].add_metric(labels, log.epochs[-1][name])
            names = plugin.worker_names()
            for addr, shares in log.busy(time.time(), plugin.nthreads()).items():
                g["busy"].add_metric([log.run, names.get(addr, addr)],
                                     max(0.0, 1.0 - shares["idle"] - shares.get("recv-wait", 0.0)))
        yield from g.values()


_registered = False


def _register_prometheus() -> bool:
    """Add :class:`_Collector` to prometheus_client's registry, which ``/metrics`` serves."""
    global _registered
    if not _registered:
        try:
            from prometheus_client import REGISTRY
        except ImportError:
            return False
        REGISTRY.register(_Collector())
        _registered = True
    return True
