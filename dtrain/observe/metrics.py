"""Where the time and memory go: per-run task timings on the scheduler, peak RSS.

:class:`StepTimer` is a scheduler plugin that adds up, per run, the compute
time the workers report for each ``forward-backward``, ``reduce`` and
``update`` task, and the compute on each step's critical path (the slowest
shard, the slowest task of each reduce level, the update; a replicated
update is off that path, its copy inside the next ``forward-backward`` on
it).  It keeps only the steps still in flight, so its memory does not grow
with the run.
"""
from __future__ import annotations

import resource
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dask.sizeof import sizeof
from distributed import Client, SchedulerPlugin, WorkerPlugin

from dtrain.core import internals, keys
from dtrain.core.broadcast import on_workers


def _compute_seconds(startstops: Any) -> float:
    return sum(s["stop"] - s["start"] for s in startstops or () if s.get("action") == "compute")


@dataclass
class _Run:
    forward_backward: float = 0.0
    reduce: float = 0.0
    update: float = 0.0
    updates: int = 0
    critical: float = 0.0                       # summed over finished steps
    tasks: int = 0                              # every task of the run the scheduler ran
    open: dict[tuple, float] = field(default_factory=dict)   # slowest task per level in flight


ROOT = (keys.COMBINE, keys.LOSS, keys.BACK_COMBINE)    # model-parallel root tasks


class StepTimer(SchedulerPlugin):
    """Sums task compute time per run (keys ``<kind>-<step>-...-<run>``), and counts the
    tasks of each run that the scheduler ran (the scheduler's own count, whatever the graphs
    said).

    The model's maths (``forward-backward``, ``local-sgd``, and model-parallel
    ``forward``/``backward`` tasks) counts as forward-backward work.
    """

    name = "dtrain-step-timer"
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = defaultdict(_Run)

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if start != "processing" or finish not in ("memory", "erred"):
            return
        k = keys.parse(key)
        if k is None:
            return
        self.runs[k.run].tasks += 1
        if k.step is None or finish != "memory":
            return
        step, r = k.step, self.runs[k.run]
        seconds = _compute_seconds(kwargs.get("startstops"))
        if k.kind in keys.WORK:
            r.forward_backward += seconds
            at = (step, k.kind)
            r.open[at] = max(r.open.get(at, 0.0), seconds)
        elif k.kind == keys.REDUCE:
            r.reduce += seconds
            at = (step, *k.tree)                    # one tree level: its tasks run side by side
            r.open[at] = max(r.open.get(at, 0.0), seconds)
        elif k.kind in ROOT:
            r.open[step, key] = seconds             # root tasks run one after another
        elif k.kind == keys.UPDATE:
            r.update += seconds
            done = [at for at in r.open if at[0] <= step]   # a step, or a round ending here
            if k.replicated:    # off the critical path, and the first one ends the step
                r.critical += sum(r.open.pop(at) for at in done)
                r.updates += bool(done)
            else:
                r.critical += seconds + sum(r.open.pop(at) for at in done)
                r.updates += 1

    def report(self, run: str) -> dict[str, float]:
        """The totals of ``run``, forgotten once read."""
        r = self.runs.pop(run, _Run())
        return {"forward_backward_seconds": r.forward_backward, "reduce_seconds": r.reduce,
                "update_seconds": r.update, "critical_seconds": r.critical, "updates": r.updates,
                "scheduler_tasks": r.tasks}


class TransferCounter(WorkerPlugin):
    """Counts, per run, the bytes each worker receives from other workers: Dask's own
    record of every value that arrived by transfer (a ``flight -> memory`` transition)."""

    name = "dtrain-transfer-counter"
    idempotent = True

    def setup(self, worker) -> None:
        self.worker = worker
        self.runs: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def transition(self, key, start, finish, **kwargs) -> None:
        run = keys.run_of(key) if start == "flight" and finish == "memory" else None
        if run is not None:
            value = self.worker.data.get(key) if key in self.worker.data else None
            totals = self.runs[run]
            totals[0] += sizeof(value) if value is not None else 0
            totals[1] += 1

    def report(self, run: str) -> tuple[int, int]:
        """``(bytes, transfers)`` received for ``run``, forgotten once read."""
        return tuple(self.runs.pop(run, (0, 0)))


def transfers(client: Client, run: str) -> dict[str, int]:
    """Bytes and transfers between workers for ``run``, summed over workers."""
    def report(dask_worker, run=run):
        plugin = dask_worker.plugins.get(TransferCounter.name)
        return plugin.report(run) if plugin is not None else (0, 0)
    per_worker = on_workers(client, report)
    return {"bytes": sum(b for b, _ in per_worker.values()),
            "transfers": sum(n for _, n in per_worker.values())}


def _timer_report(dask_scheduler, run: str) -> dict[str, float] | None:
    plugin = dask_scheduler.plugins.get(StepTimer.name)
    return plugin.report(run) if plugin is not None else None


def task_times(client: Client, run: str) -> dict[str, float] | None:
    """The StepTimer totals of ``run`` (None if the plugin is not installed)."""
    return client.run_on_scheduler(_timer_report, run=run)


def peak_rss_mb() -> float:
    """This process's peak resident memory, in MB.

    On Linux, ``VmHWM`` of ``/proc/self/status``: ``ru_maxrss`` keeps the peak of the
    program this process ran before ``exec``, the forked copy of its parent's memory (a
    driver started by a 700 MB benchmark reported 700 MB)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10        # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def worker_peak_rss_mb(client: Client) -> dict[str, float]:
    """Each worker's peak resident memory in MB, by worker name."""
    peaks = on_workers(client, peak_rss_mb)
    names = {a: str(w.get("name", a)) for a, w in internals.scheduler_workers(client).items()}
    return {names.get(addr, addr): round(mb, 1) for addr, mb in sorted(peaks.items())}
