"""A window: many consecutive steps as one graph, with where each task runs and what it weighs.

The driver submits a window at once, starting from the state as a literal
(``state-<step>``): the scheduler can recompute anything inside it after a
worker loss, and forgets it once the window is done.  A :class:`Window`
records each task's worker and output size, so it can say which values must
cross between workers (:meth:`Window.transfers`) before anything runs.
"""
from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dask.task_spec import DataNode, Task
from dask.tokenize import normalize_token

from dtrain.core import keys
from dtrain.maths.optim import TrainState


@dataclass(frozen=True)
class DataItem:
    """A loading task: ``fn(*args, *inputs)`` pinned (loosely) to ``worker``; its key starts
    with ``name``.  ``inputs`` are the keys of data already on the cluster (a Dask
    collection's partitions, whose futures the engine holds).  Where the worker changes,
    the driver submits a fresh one there."""

    name: tuple[str | int, ...]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    worker: str
    inputs: tuple[Any, ...] = ()


class TaskGraph(dict):
    """A plain dict of tasks, with a Dask token of its own: the graph is submitted once and
    its keys are already unique, while tokenizing it task by task (what ``Client.get`` does
    to name it) costs the driver about 0.3 ms per task on every window's critical path."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.token = uuid.uuid4().hex


@normalize_token.register(TaskGraph)
def _token(graph: TaskGraph) -> str:
    return graph.token


@dataclass
class Window:
    """A graph of consecutive steps, with the placement and output size of every key.

    ``ends`` are the keys whose values make up the state after the window;
    ``join`` turns those values into one :class:`~dtrain.maths.optim.TrainState`.
    """

    dsk: TaskGraph = field(default_factory=TaskGraph)     # {key: Task | DataNode}
    where: dict[str, list[str]] = field(default_factory=dict)
    nbytes: dict[str, int] = field(default_factory=dict)    # as Dask's sizeof counts them
    ends: list[str] = field(default_factory=list)
    join: Callable[[list[Any]], TrainState] = lambda values: values[0]
    evals: dict[int, str] = field(default_factory=dict)     # epoch -> evaluate key
    fused: tuple[bool, str] | None = None   # whether a worker's shards share a task, and why
    meta: str | None = None     # a window fused into one task: the key of its timings (its
                                # end's, where that one task brings both: :meth:`unpack`)
    steps_fused: Any = None     # ... and the tasks it runs inside (taskgraph.fuse.Chain)
    pieces: tuple[str, ...] = ()    # a window cut into a task per worker: those tasks

    def step_tasks(self) -> int:
        """Tasks of the training steps: every task but the starting state and evaluations."""
        return sum(keys.kind_of(name) not in (keys.STATE, keys.EVALUATE) for name in self.dsk
                   if name != self.meta)

    @property
    def end_in_meta(self) -> bool:
        """Whether the window's one end comes in its meta, as the meta's first value."""
        return self.meta is not None and self.ends == [self.meta]

    def unpack(self, values: list[Any]) -> tuple[list[Any], Any]:
        """The values of the ``ends``, and the meta (a :class:`~dtrain.taskgraph.fuse.Ran`
        whose values are the evaluations), from what was gathered: the ends' values, then
        the meta's, or the one value of an end that is its meta."""
        if not self.end_in_meta:
            return values[:-1], values[-1]
        ran = values[0]
        return [ran.values[0]], dataclasses.replace(ran, values=ran.values[1:])

    def add(self, node: Task | DataNode, worker: str, nbytes: int = 0) -> str:
        self.dsk[node.key] = node
        self.where[node.key] = [worker]
        self.nbytes[node.key] = nbytes
        return node.key

    def transfers(self, located: dict[str, str]) -> list[tuple[str, str, str]]:
        """``(key, from, to)`` for every value that must cross between workers to run this
        graph, once per receiving worker; ``located`` places keys from outside the graph."""
        moves = set()
        for name, node in self.dsk.items():
            to = self.where[name][0]
            for dep in node.dependencies:
                src = self.where[dep][0] if dep in self.where else located.get(dep, to)
                if src != to:
                    moves.add((dep, src, to))
        return sorted(moves)

    def transfer_bytes(self, located: dict[str, str]) -> int:
        """Bytes that must cross between workers to run this graph."""
        return sum(self.nbytes.get(k, 0) for k, _, _ in self.transfers(located))
