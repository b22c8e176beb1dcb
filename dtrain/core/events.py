"""Live events: the messages a run sends about itself, and the one place tasks send them from.

A port between the layers: task functions (:mod:`dtrain.taskgraph`) call
:func:`step_event`; the driver sends ``start``, ``epoch`` and ``end``; the
observers (:mod:`dtrain.observe`) read them, on the scheduler and on the
driver.  Every event of a run is a dict on the topic :func:`topic` with a
``kind``:

* ``start``: ``run``, ``dataset``, ``strategy``, ``epochs``, ``steps_per_epoch``,
  ``train_samples``, ``workers``;
* ``step``: ``step`` (steps done), ``epoch`` (from 1), ``loss`` (the
  minibatch's mean loss), ``epoch_loss`` and ``epoch_accuracy`` (running means
  over the epoch so far; the accuracy None for a regression), ``seen`` (samples
  so far this epoch), ``t`` (time);
* ``epoch``: a ``metrics.jsonl`` row;
* ``end``.

A ``step`` event leaves a worker with ``Worker.log_event``: queued on the
worker's batched stream, never waited for, so it is off the training's
critical path.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

TOPIC_PREFIX = "dtrain-"
KEEP = 20               # runs whose last send time a worker remembers


def topic(run: str) -> str:
    """The event topic of a run."""
    return TOPIC_PREFIX + run


def run_of_topic(name: str) -> str | None:
    """The run of a dtrain topic, None for other topics."""
    return name[len(TOPIC_PREFIX):] if name.startswith(TOPIC_PREFIX) else None


@dataclass(frozen=True)
class StepEvents:
    """Where a task sends ``step`` events: the run's topic, each worker at most one per
    ``gap`` seconds, but always for the run's ``final`` step (the live page ends on the
    run's last numbers): a live view needs a few a second, and a message costs a tiny step
    more than its compute (iris's 7-step epochs, an event at each epoch's end: 0.26 ms a
    step against 0.16 without)."""

    run: str
    gap: float = 0.0
    accuracy: bool = True       # False: a regression; its events carry no accuracy (None)
    final: int = -1             # the index of the run's last step


class _LastSent:
    """When this process last sent an event of each run (bounded)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def due(self, events: StepEvents, always: bool) -> bool:
        now = time.monotonic()
        with self.lock:
            if not always and now - self.at.get(events.run, -math.inf) < events.gap:
                return False
            if len(self.at) >= KEEP and events.run not in self.at:
                self.at.clear()
            self.at[events.run] = now
            return True


_last_sent = _LastSent()


def step_event(events: StepEvents, step: Any, before: Any, after: Any) -> None:
    """Send a ``step`` event for ``step`` (a :class:`~dtrain.maths.optim.Step`) from the
    worker running this task, given the train states before and after it.  A no-op outside
    a Dask worker, or within ``events.gap`` seconds of this worker's last one for the run."""
    worker = due(events, step)
    if worker is not None:
        send(worker, events, step, before, after)


def due(events: StepEvents, step: Any) -> Any | None:
    """The worker running this task if a ``step`` event is due from it now (None: outside a
    Dask worker, or within ``events.gap`` seconds of its last one for the run)."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):     # serial code, dask.get, a thread pool
        return None
    return worker if _last_sent.due(events, always=step.index == events.final) else None


def send(worker: Any, events: StepEvents, step: Any, before: Any, after: Any) -> None:
    """Send ``step``'s event from ``worker`` (see :func:`step_event`)."""
    step_loss = after.epoch_loss - (0.0 if step.first else before.epoch_loss)
    worker.log_event(topic(events.run), {
        "kind": "step", "step": step.index + 1, "epoch": step.epoch + 1,
        "loss": step_loss / step.count, "epoch_loss": after.epoch_loss / after.epoch_samples,
        "epoch_accuracy": after.epoch_correct / after.epoch_samples if events.accuracy
        else None,
        "seen": after.epoch_samples, "t": time.time()})
