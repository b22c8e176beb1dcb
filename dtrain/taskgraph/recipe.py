"""The run's constants that graph builders need, decided once by the strategy."""
from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np
from dask.sizeof import sizeof

from dtrain.core.events import StepEvents
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step, TrainState


@dataclass(frozen=True)
class Recipe:
    """What the builders bake into a run's tasks; small.

    ``fan_in`` is already normalised (:meth:`~dtrain.taskgraph.strategies.Strategy.fan_in`);
    ``sync_every`` is 1 for strategies that synchronise every step; ``leaf_bytes`` is what
    a leaf sends up the reduce tree (the strategy's communication accounting).
    """

    net: Network
    opt: Optimizer
    shuffle_seed: int | None
    fan_in: int = 2
    leaf_bytes: int = 0
    fuse_update: bool = True
    sync_every: int = 1            # steps per unit (a local SGD round)
    step_events: int = 0           # send a step event every this many steps (0: never)
    replicated: bool = False       # every worker applies each update
    auto_update: bool = False      # graph.update = "auto": replicated, but plain SGD's update
                                   # made where the step's sum is (describe.layout)
    state_every: int = 1           # replicated: steps between the tasks keeping each state
    fuse_shards: str = "true"      # a worker's reduce subtree in one leaf task: "true",
                                   # "false", "auto" (see dataparallel.fuse_choice)
    step_event_gap: float = 0.0    # step events: at most one per this many seconds per worker
    final_step: int = -1           # the run's last step, whose event is always sent
    keep_states: bool = False      # evaluations return their epoch's state (early stopping)
    fuse_steps: bool = False       # a window on one worker runs as one task (taskgraph.fuse)
    root_sum: bool = False         # replicated, read on 3 or more workers: the tree's root
                                   # sum is a task on the root that every worker reads (see
                                   # dataparallel.add_replicated_step)
    cores: str = "threads"         # a worker's shards in one task: on its core processes
                                   # ("processes", "auto") or its threads (taskgraph.cores)

    def events(self, run: str) -> StepEvents:
        """Where the tasks of ``run`` send their step events."""
        return StepEvents(run, self.step_event_gap, accuracy=not self.net.regression,
                          final=self.final_step)

    def reports(self, step: Step) -> bool:
        """Whether ``step``'s update may send a step event (every ``step_events`` steps and
        at each epoch's end; :class:`~dtrain.core.events.StepEvents` spaces them in time)."""
        return self.step_events > 0 and (step.last or (step.index + 1) % self.step_events == 0)

    def events_for(self, step: Step, run: str) -> StepEvents | None:
        """Where ``step``'s update sends its event, or None if it sends none."""
        return self.events(run) if self.reports(step) else None

    @property
    def state_bytes(self) -> int:
        """Size of a TrainState as Dask's ``sizeof`` counts it."""
        return _state_bytes(self.net.size * (1 + self.opt.slots), self.net.dtype)

    def unit_starts(self, step: Step) -> bool:
        """Whether ``step`` begins a unit (a local SGD round, aligned to its epoch's start)
        rather than continuing one."""
        return step.position % self.sync_every == 0


@functools.lru_cache(maxsize=64)            # asked for every task of every window
def _state_bytes(length: int, dtype: str) -> int:
    return sizeof(TrainState(np.empty(length, dtype)))
