"""Live metrics of a run, kept on the Dask scheduler for the ``/dtrain`` page and Prometheus.

How the numbers travel, none of it on the training's critical path:

* every ``graph.step_events`` steps (and at each epoch's last step), at most
  one per ``graph.step_event_gap`` seconds, the ``update`` task sends a
  ``step`` event from its worker with
  ``Worker.log_event`` (queued on the worker's batched stream; the task does
  not wait for it);
* the driver sends ``start``, ``epoch`` and ``end`` events with
  ``Client.log_event``;
* :class:`DtrainPlugin`, a scheduler plugin the driver registers through
  ``Client.register_plugin`` (so it also reaches a scheduler in another
  process, e.g. under MPI), sees those events through the plugin's
  ``log_event`` hook and every finished task through its ``transition``
  hook: the same records distributed's task stream keeps.  It holds a
  bounded :class:`RunLog` per run, serves the ``/dtrain`` page
  (:mod:`dtrain.livepage`), exports Prometheus gauges on the scheduler's
  ``/metrics``, and makes the task names readable (:mod:`dtrain.readable`).

Events are on the topic ``dtrain-<run>``.
"""
from __future__ import annotations

import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from distributed import Client
from distributed.diagnostics.plugin import SchedulerPlugin

from dtrain.tasktypes import family, run_of, task_type

logger = logging.getLogger(__name__)

PLUGIN_NAME = "dtrain"
TOPIC_PREFIX = "dtrain-"
KEEP_RUNS = 5            # runs remembered by the scheduler plugin
STEP_POINTS = 20_000     # step events kept per run
TIMELINE_LIMIT = 20_000  # task records kept per run (the newest)
BUSY_WINDOW = 10.0       # seconds over which busy vs idle is measured


def topic(run: str) -> str:
    """The event topic of a run."""
    return TOPIC_PREFIX + run


# --- worker side --------------------------------------------------------------------------

@dataclass(frozen=True)
class StepEvents:
    """Where a task sends ``step`` events: the run's topic, each worker at most one per
    ``gap`` seconds (an epoch's last step always): a live view needs a few a second, and a
    message per step costs a near-zero-compute step about a fifth of its time."""

    run: str
    gap: float = 0.0


_sent: dict[str, float] = {}       # run -> when this process last sent one of its events


def step_event(events: StepEvents, step: Any, before: Any, after: Any) -> None:
    """Send a ``step`` event from the worker running this update (no-op outside a worker,
    or within ``events.gap`` seconds of this worker's last one for the run)."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):     # serial code, dask.get, a thread pool
        return
    now = time.monotonic()
    if not step.last and now - _sent.get(events.run, -math.inf) < events.gap:
        return
    if len(_sent) > 4 * KEEP_RUNS and events.run not in _sent:
        _sent.clear()
    _sent[events.run] = now
    step_loss = after.epoch_loss - (0.0 if step.first else before.epoch_loss)
    worker.log_event(topic(events.run), {
        "kind": "step", "step": step.index + 1, "epoch": step.epoch + 1,
        "loss": step_loss / step.count, "epoch_loss": after.epoch_loss / after.epoch_samples,
        "epoch_accuracy": after.epoch_correct / after.epoch_samples,
        "seen": after.epoch_samples, "t": time.time()})


class StepRate:
    """Samples per second over the last ``span`` ``step`` events of one run."""

    def __init__(self, train_samples: int, span: int = 10):
        self.train_samples = train_samples
        self.points: deque[tuple[float, int]] = deque(maxlen=span + 1)

    def add(self, msg: dict[str, Any]) -> float | None:
        self.points.append((msg["t"], (msg["epoch"] - 1) * self.train_samples + msg["seen"]))
        (t0, n0), (t1, n1) = self.points[0], self.points[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None


# --- scheduler side -----------------------------------------------------------------------

class RunLog:
    """What the scheduler remembers of one run; every list is bounded."""

    def __init__(self, run: str):
        self.run = run
        self.meta: dict[str, Any] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=STEP_POINTS)
        self.steps_seen = 0                        # step events ever received
        self.epochs: list[dict[str, Any]] = []
        self.tasks: deque[tuple] = deque(maxlen=TIMELINE_LIMIT)
        self.tasks_seen = 0
        self.finished = False
        self._rate = StepRate(1)

    def on_event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "start":
            self.meta = dict(msg)
            self._rate = StepRate(int(msg.get("train_samples") or 1))
        elif kind == "step":
            self.steps.append({**msg, "rate": self._rate.add(msg)})
            self.steps_seen += 1
        elif kind == "epoch":
            self.epochs.append(dict(msg))
        elif kind == "end":
            self.finished = True

    def on_task(self, key: str, kwargs: dict[str, Any]) -> None:
        """Keep a finished task's compute and transfer intervals."""
        worker, thread = kwargs.get("worker"), kwargs.get("thread")
        for ss in kwargs.get("startstops") or ():
            if ss.get("action") in ("compute", "transfer"):
                self.tasks.append((key, worker, thread, ss["action"], ss["start"], ss["stop"]))
        self.tasks_seen += 1

    @property
    def last_step(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    def busy(self, now: float, nthreads: dict[str, int],
             window: float = BUSY_WINDOW) -> dict[str, dict[str, float]]:
        """Per worker, the fraction of ``window`` seconds (times threads) spent computing
        each task type or receiving data; ``idle`` is the rest."""
        lo = now - window
        out = {w: {} for w in nthreads}
        for key, worker, _, action, start, stop in reversed(self.tasks):
            if stop < lo - 60:          # records arrive roughly in order; stop scanning
                break
            if worker not in out or stop <= lo:
                continue
            kind = family(task_type(key)) if action == "compute" else "transfer"
            share = (min(stop, now) - max(start, lo)) / (window * nthreads[worker])
            out[worker][kind] = out[worker].get(kind, 0.0) + max(share, 0.0)
        for shares in out.values():
            shares["idle"] = max(0.0, 1.0 - sum(shares.values()))
        return out

    def timeline(self, workers: dict[str, str]) -> dict[str, Any]:
        """The kept task records, as written to ``timeline.json``."""
        return {"run": self.run, "tasks_seen": self.tasks_seen, "limit": TIMELINE_LIMIT,
                "workers": workers,
                "columns": ["key", "worker", "thread", "action", "start", "stop"],
                "rows": [list(r) for r in self.tasks]}


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
        from dtrain import livepage, readable

        self.scheduler = scheduler
        _PLUGINS.add(self)
        self.installed = readable.install()
        if livepage.install(scheduler):
            self.installed.append("/dtrain")
        if _register_prometheus():
            self.installed.append("prometheus")

    async def close(self) -> None:
        _PLUGINS.discard(self)         # no gauges from a closed scheduler

    def log_event(self, topic: str, msg: Any) -> None:
        if not topic.startswith(TOPIC_PREFIX) or not isinstance(msg, dict):
            return
        run = topic[len(TOPIC_PREFIX):]
        log = self.runs.get(run)
        if log is None:
            log = self.runs[run] = RunLog(run)
            while len(self.runs) > KEEP_RUNS:
                del self.runs[next(iter(self.runs))]
        log.on_event(msg)

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if start == "processing" and finish == "memory":
            log = self.runs.get(run_of(key))   # type: ignore[arg-type]
            if log is not None:
                log.on_task(key, kwargs)

    def latest(self) -> RunLog | None:
        """The run that started last."""
        return next(reversed(self.runs.values()), None)

    def worker_names(self) -> dict[str, str]:
        return {addr: str(ws.name) for addr, ws in self.scheduler.workers.items()}

    def nthreads(self) -> dict[str, int]:
        return {addr: max(ws.nthreads, 1) for addr, ws in self.scheduler.workers.items()}


# --- driver side --------------------------------------------------------------------------

def install(client: Client) -> None:
    """Register :class:`DtrainPlugin` on the client's scheduler (once per scheduler)."""
    client.register_plugin(DtrainPlugin(), name=PLUGIN_NAME)


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
                g["busy"].add_metric([log.run, names.get(addr, addr)], 1.0 - shares["idle"])
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
