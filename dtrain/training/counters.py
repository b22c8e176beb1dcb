"""What a run on the cluster counts as it goes, and the part of its summary they make.

Both Dask engines (:class:`~dtrain.training.engines.DaskEngine`,
:class:`~dtrain.training.fullbatch.FullBatchEngine`) keep one :class:`Counters`: what the
graphs they submitted predict (tasks, values and bytes crossing workers), how their windows
ran (fused into a task on one worker, cut into a task per worker, described to each worker,
their sums reduced in segments, the messages the workers sent each other), the states sent
in graphs, and the windows run again.  :meth:`Counters.summary` adds what the cluster
recorded (:mod:`dtrain.observe.metrics`: task times, transfers, workers' memory) and makes
the :class:`~dtrain.training.course.Outcome`'s ``workers``, ``compute``, ``worker_rss``,
``comm`` and ``graph``, from which the trainer writes ``summary.json``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from distributed import Client

from dtrain.core import keys
from dtrain.deploy.workers import workers
from dtrain.observe import metrics
from dtrain.taskgraph import fuse
from dtrain.taskgraph.window import Window


@dataclass
class Counters:
    """A Dask run's counts so far (see the module's docstring)."""

    predicted_bytes: int = 0                    # what the graphs say crosses workers
    predicted_transfers: int = 0                # ... in how many values
    step_tasks: int = 0                         # the graphs' tasks of training steps
    fused: tuple[bool, str] | None = None       # the last window's fuse_choice
    fused_windows: int = 0                      # windows run as one task (fuse.steps)
    fused_seconds: Counter[str] = field(default_factory=Counter)   # ... their task seconds
    fused_steps: int = 0                        # ... and their steps
    literal_bytes: int = 0                      # states sent in graphs (not handed over)
    meshes: int = 0                             # meshes opened for windows across workers
    spanned_windows: int = 0                    # windows run as a task per worker
    segmented_windows: int = 0                  # ... their sums reduced in segments
    described_windows: int = 0                  # ... described, each worker building its own
    step_sum: str | None = None                 # ... the schedule of their steps' sums
    update_where_summed: bool = False           # ... described, each update made where its sum is
    sent: list[int] = field(default_factory=lambda: [0, 0])   # ... their messages and bytes
    via: set[str] = field(default_factory=set)  # ... and how they went (deploy.p2p)
    reruns: list[str] = field(default_factory=list)   # windows run again, and why

    def submitted(self, win: Window) -> None:
        """A graph submitted: its tasks of training steps, whether a worker's shards share
        a task, and whether it runs as a task per worker."""
        self.step_tasks += win.step_tasks()
        self.fused = win.fused or self.fused
        if win.pieces:
            self.spanned_windows += 1

    def ran(self, win: Window, ran: fuse.Ran) -> None:
        """A window fused into a task per worker ran (``ran``, its meta): its task seconds
        by kind, its steps, and what its workers sent each other."""
        self.fused_seconds.update(ran.seconds)
        self.fused_steps += ran.steps
        self.fused_windows += not win.pieces
        self.sent[0] += ran.sent[0]
        self.sent[1] += ran.sent[1]
        self.via.update(ran.via)

    def summary(self, client: Client, run: str, *, measured: bool = True,
                choice: dict[str, Any] | None = None, epoch_states: int = 0
                ) -> dict[str, Any]:
        """The :class:`~dtrain.training.course.Outcome`'s fields these counts make with
        what the cluster recorded of run ``run``: ``workers``, ``compute`` (the scheduler's
        task timers plus the fused windows' own), ``worker_rss``, ``comm`` (Dask's transfers
        plus the messages the workers sent each other) and ``graph``.  ``measured``: False
        where the whole run was one task (nothing moved, the timers saw nothing of it);
        ``choice``: the CPU and GPU assignment chosen; ``epoch_states``: epochs whose state
        came to the driver."""
        moved = metrics.transfers(client, run) if measured else {"bytes": 0, "transfers": 0}
        compute = _add_fused(metrics.task_times(client, run) or {}, self.fused_seconds,
                             self.fused_steps) if measured else {}
        threads = [i.get("nthreads", 1) for i in workers(client).values()]
        return {"workers": len(threads),
                "compute": compute,
                "worker_rss": metrics.worker_peak_rss_mb(client) if measured else {},
                "comm": {"predicted": self.predicted_bytes,       # Dask's and the mesh's
                         "measured": moved["bytes"] + self.sent[1],
                         "transfers": moved["transfers"] + self.sent[0],
                         "predicted_transfers": self.predicted_transfers},
                "graph": {"tasks": self.step_tasks, "fused": self.fused,
                          "threads": sum(threads),
                          "fused_windows": self.fused_windows,
                          "spanned_windows": self.spanned_windows,
                          "segmented_windows": self.segmented_windows, "meshes": self.meshes,
                          "described_windows": self.described_windows,
                          "step_sum": self.step_sum,
                          "update_where_summed": self.update_where_summed,
                          "via": sorted(self.via),
                          "reruns": self.reruns,
                          "state_bytes_in_graphs": self.literal_bytes,
                          "choice": choice or {},
                          "epoch_states_fetched": epoch_states}}


def _add_fused(compute: dict[str, float], seconds: Counter[str], steps: int
               ) -> dict[str, float]:
    """The StepTimer's totals (tasks the scheduler saw) plus the windows run as a task per
    worker (their tasks one after another in each, the longest on the critical path)."""
    if not steps:
        return compute
    work = sum(seconds[k] for k in keys.WORK)
    out = {"forward_backward_seconds": work, "reduce_seconds": seconds[keys.REDUCE],
           "update_seconds": seconds[keys.UPDATE], "updates": steps,
           "critical_seconds": seconds[fuse.CRITICAL]}
    return compute | {k: compute.get(k, 0) + v for k, v in out.items()}
