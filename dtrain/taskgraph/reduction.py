"""The reduce tree of one step's sums: fan-in, depth, and the reduce tasks.

Leaves (a shard's gradient, or a model-parallel slice's share) are summed
level by level with fan-in ``k``, children always in leaf order, so the sums
are the same bits wherever they run: ``depth = ceil(log_k leaves)``; a group
of one passes through without a task.  A group whose leaves all sit on one
worker can instead be summed inside one leaf task (``fusable``; see
:class:`~dtrain.taskgraph.records.Group`).  The fan-in is normalised once, by
the strategy (:meth:`dtrain.taskgraph.strategies.Strategy.fan_in`).
"""
from __future__ import annotations

from collections.abc import Sequence

from dask.task_spec import Task, TaskRef

from dtrain.core import keys
from dtrain.taskgraph.records import Reduce
from dtrain.taskgraph.tasks import reduce
from dtrain.taskgraph.window import Window


def tree_depth(shards: int, k: int) -> int:
    """Reduce levels for ``shards`` leaves at fan-in ``k``: ``ceil(log_k shards)``."""
    depth, width = 0, shards
    while width > 1:
        width, depth = -(-width // k), depth + 1
    return depth


Leaf = tuple[str, int, str]         # (key, first shard, worker)
Spec = int | tuple                  # a leaf's shard, or the nesting of a fused group's shards


def _joins(group: list[Leaf], joinable: set[str]) -> bool:
    return len(group) > 1 and len({g[2] for g in group}) == 1 and \
        all(g[0] in joinable for g in group)


def tree(win: Window, tag: str, leaves: list[Leaf], root: str, k: int, fuse: bool,
         nbytes: int, run: str, readers: Sequence[str] = (), fusable: bool = False
         ) -> tuple[list[Leaf], dict[str, bool], dict[str, Spec]]:
    """Reduce ``leaves`` (in leaf order) level by level with fan-in ``k``.

    Returns the root level's inputs, for the root task to combine (``fuse``)
    or one reduce task's output; for every value the tree reads whether it
    must leave its worker (so a GPU producer knows to copy it to host); and
    the leaves left, each with the shards it sums (see ``fusable``).  The root
    level is read on ``root`` and on every worker in ``readers`` (replicated
    updates).  Keys are ``reduce-<tag>-<level>-<first leaf>``; a reduce runs
    where its first child runs, the last level on ``root``.  ``fusable``: a
    group whose children are all leaves on one worker becomes one leaf, under
    its first child's key, that sums them in the same order (a nested spec).
    """
    level, depth = leaves, tree_depth(len(leaves), k)
    spec: dict[str, Spec] = {name: i for name, i, _ in leaves}
    joinable = set(spec) if fusable else set()
    readers_of: dict[str, set[str]] = {}
    planned: list[tuple[str, list[Leaf], str]] = []
    for d in range(1, depth + 1):
        groups = [level[j:j + k] for j in range(0, len(level), k)]
        if d == depth and fuse and not _joins(groups[0], joinable):
            break                                   # the root task is this level's root
        level = []
        for group in groups:
            if len(group) == 1:
                level.append(group[0])
                continue
            if _joins(group, joinable):             # one worker's subtree: one leaf
                spec[group[0][0]] = tuple(spec[g[0]] for g in group)
                for g in group[1:]:
                    del spec[g[0]]
                level.append(group[0])
                continue
            first, worker = group[0][1], root if d == depth else group[0][2]
            name = keys.make(keys.REDUCE, tag, d, first, run=run)
            for g in group:
                readers_of.setdefault(g[0], set()).add(worker)
            planned.append((name, group, worker))
            level.append((name, first, worker))
    for g in level:
        readers_of.setdefault(g[0], set()).update({root, *readers})
    produced = {name: worker for name, _, worker in leaves if name in spec} | \
        {n: w for n, _, w in planned}
    crosses = {name: any(r != produced[name] for r in readers_of.get(name, ()))
               for name in produced}
    for name, group, worker in planned:
        win.add(Task(name, reduce, Reduce(crosses[name]), *(TaskRef(g[0]) for g in group)),
                worker, nbytes)
    return level, crosses, spec
