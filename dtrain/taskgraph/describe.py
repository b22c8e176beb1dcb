"""On the driver: a window that spans workers, described to each worker instead of built.

The builders build a window step by step, and the span pass cuts it into a chain per
worker (:mod:`~dtrain.taskgraph.span`): the driver's work grows with the workers times
the steps (70-100 us per worker and step), which at a few hundred nodes is slower than
the steps themselves.  For the data-parallel steps with replicated updates (the
``allreduce`` strategies), each worker can build its own chain
(:mod:`~dtrain.taskgraph.expand`), so the driver only

* once per mesh, works out each worker's :class:`~dtrain.taskgraph.expand.Setup`: its
  share of the schedule, its shards, and its part of every step's sum
  (:func:`layout`: the schedule of messages :mod:`~dtrain.taskgraph.collective` predicts
  fastest for this net on these workers), made into a ``context-<mesh>-<rank>`` task on
  the worker beside its shards (:func:`context_tasks`);
* per window, hands each worker a :class:`~dtrain.taskgraph.expand.Description` of a few
  hundred bytes (:func:`window`).

What the scheduler sees of a window: a task per worker (``window-<first>-<last>-w<rank>``,
as a cut window's), and one more on the collector that brings the end and the meta
(``kept-<step>``).
The step-by-step graph stays what dtrain draws, and what ``graph.fuse_steps = false``
runs; its bytes and these are the same (``tests/test_describe.py``).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.deploy import p2p
from dtrain.maths.optim import TrainState
from dtrain.taskgraph import collective, handoff
from dtrain.taskgraph.expand import (Described, Description, Setup, Steps, context, end_and_meta,
                                     run_window)
from dtrain.taskgraph.placement import Placement
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.treesum import flat
from dtrain.taskgraph.window import Window


@dataclass(frozen=True)
class Layout:
    """Described windows on one placement: the workers by rank, the collector's rank (the
    placement's root: it evaluates and returns the end), each shard's rank, the schedule
    of every step's sum, and each schedule's predicted seconds."""

    workers: tuple[str, ...]
    collector: int
    rank_of: tuple[int, ...]
    schedule: str
    predicted: dict[str, float]
    programs: tuple[collective.Program, ...]
    where_made: bool = False        # each step's update made where its sum is (see layout)

    def traffic(self, n: int) -> tuple[int, int]:
        """Messages and numbers every worker together sends a step."""
        got = [p.traffic(n) for p in self.programs]
        return sum(m for m, _ in got), sum(b for _, b in got)


def describable(recipe: Recipe, placement: Placement, server: bool, local_sgd: bool) -> bool:
    """Whether a window on ``placement`` can be described rather than built: replicated
    data-parallel steps (not a parameter server, not local SGD) over several workers, the
    root among them."""
    workers = set(placement.leaves)
    return (recipe.replicated and not server and not local_sgd and recipe.sync_every == 1
            and len(workers) > 1 and placement.root in workers)


def layout(recipe: Recipe, placement: Placement, one_machine: bool,
           workers: Sequence[str] | None = None, cores: int | None = None) -> Layout:
    """The ranks (``workers``, the mesh's order; by default the order of their first
    shard), and the schedule of the step's sum :func:`~dtrain.taskgraph.collective.choose`
    finds fastest for the net's buffer on the mesh's wire (``one_machine``: Unix sockets
    between workers, which share its ``cores``).

    With ``graph.update = "auto"``, an optimizer whose update goes by segments (plain SGD)
    and CPU workers, each step's update is made where its sum is made (``where_made``): by
    each worker on its segment in the halving schedules, by the one or two workers that add
    the root in the tree schedules, and the schedule's last messages carry the new
    parameters instead of the sum; every worker's copy is still the same bytes, and one
    update's work is done a step instead of one per worker.  Otherwise every worker
    applies the whole update to its copy."""
    workers = tuple(workers if workers is not None else dict.fromkeys(placement.leaves))
    rank = {w: r for r, w in enumerate(workers)}
    rank_of = tuple(rank[w] for w in placement.leaves)
    n = recipe.net.buffer_size
    itemsize = np.dtype(recipe.net.dtype).itemsize
    wire = collective.LOCAL_WIRE if one_machine else collective.TCP_WIRE
    best, times = collective.choose(len(rank_of), recipe.fan_in, rank_of, len(workers), n,
                                    itemsize, wire, rank[placement.root],
                                    cores if one_machine else None)
    progs = collective.programs(len(rank_of), recipe.fan_in, rank_of, len(workers), best,
                                rank[placement.root])
    where_made = recipe.auto_update and recipe.opt.by_segment and not placement.gpus
    return Layout(workers, rank[placement.root], rank_of, best, times, progs, where_made)


def steps_of(schedule: Any, shards: Sequence[int]) -> Steps:
    """A worker's share of the plan's :class:`~dtrain.training.plan.Schedule`."""
    per = schedule.steps_per_epoch
    counts = tuple(schedule[t].count for t in range(per))
    return Steps(tuple(schedule.rates), counts,
                 np.ascontiguousarray(schedule.bounds[:, list(shards)]))


def setups(recipe: Recipe, schedule: Any, placement: Placement, lay: Layout, mesh: p2p.Mesh,
           val: Any) -> list[tuple[str, Setup, list[int], list[Any]]]:
    """Each worker's :class:`~dtrain.taskgraph.expand.Setup`, its shards and the held-out
    data its context reads (``val``: the validation data as the builders take it: one
    shard's reference, ``(reference, worker)`` parts, or None)."""
    parts = list(val) if isinstance(val, tuple) else []
    holder = {i: (lay.workers.index(w) if w in lay.workers else lay.collector)
              for i, (_, w) in enumerate(parts)}
    out = []
    for r, w in enumerate(lay.workers):
        mine = [s for s, rank in enumerate(lay.rank_of) if rank == r]
        here = r == lay.collector
        held_parts = tuple(i for i in range(len(parts)) if holder[i] == r)
        setup = Setup(recipe, lay.programs[r], r, lay.collector, tuple(mine),
                      steps_of(schedule, mine), mesh, w in placement.gpus,
                      val=here and val is not None and not parts, parts=held_parts,
                      part_ranks=tuple(sorted(holder.items())) if parts else (),
                      where_made=lay.where_made)
        held = [val] if setup.val else [parts[i][0] for i in held_parts]
        out.append((w, setup, mine, held))
    return out


def context_tasks(made: list[tuple[str, Setup, list[int], list[Any]]], shards: Sequence[TaskRef],
                  name: Callable[[int], str]) -> list[tuple[str, Task]]:
    """``context-<...>`` per worker (``name(rank)``): its context, made beside its shards."""
    return [(w, Task(name(setup.rank), context, setup, *(shards[s] for s in mine), *held))
            for w, setup, mine, held in made]


def window(first: int, last: int, run: str, lay: Layout, contexts: Sequence[str],
           start: handoff.Handed | handoff.Fresh | TrainState, keep: handoff.Handed,
           timeout: float, follows: int | None, trim: Callable[[tuple], tuple] | None,
           evals: dict[int, str], state_bytes: int, fused: tuple[bool, str] | None
           ) -> Window:
    """The window of steps ``first`` to ``last`` as a task per worker, each built there from
    its description and its context (``contexts[rank]``, a key); ``start``: the state kept
    on each worker (a ``Handed``), made from the seed there (``Fresh``) or, a literal
    state, sent to each; ``evals``: the evaluations of epochs that end in it, by epoch.
    Its end, ``kept-<last + 1>`` on the collector, brings the window's meta too."""
    out = Window(ends=[keys.make(keys.KEPT, last + 1, run=run)], evals=dict(evals),
                 fused=fused)
    home = lay.workers[lay.collector]
    literal: tuple[TaskRef, ...] = ()
    if isinstance(start, TrainState):
        out.add(DataNode(keys.make(keys.STATE, first, run=run), start), home, state_bytes)
        literal, start = (TaskRef(keys.make(keys.STATE, first, run=run)),), None
    desc = Described.of(Description(run, first, last, start, keep, timeout, follows))
    names = []
    for r, w in enumerate(lay.workers):
        key = keys.make(keys.WINDOW, first, last, f"w{r}", run=run)
        names.append(out.add(Task(key, run_window, desc, TaskRef(contexts[r]), *literal), w,
                             state_bytes if r == lay.collector else 0))
    out.meta = out.add(Task(out.ends[0], end_and_meta, 1 + len(evals), trim,  # (both: one
                            TaskRef(names[lay.collector])), home, state_bytes)   # task)
    out.pieces = tuple(names)
    return out


def fused_note(lay: Layout) -> tuple[bool, str]:
    """Whether a worker's shards share a task, and why (the summary's line)."""
    shared = any(not isinstance(sub, int) and len(flat(sub)) > 1
                 for p in lay.programs for _, sub in p.made)
    return shared, ("each worker sums the subtrees of shards it holds in one task, in the "
                    "tree's order (described windows)")
