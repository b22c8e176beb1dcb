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

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


Leaf = tuple[str, int, str]         # (key, first shard, worker); leaf p's first shard is p
Spec = int | tuple                  # a leaf's shard, or the nesting of a fused group's shards
Node = tuple[int, int]              # (level, first leaf): a leaf at level 0, else a reduce


@dataclass(frozen=True)
class Shape:
    """A reduce tree's structure, which is every step's (see :func:`shape`): the root
    level's inputs ``top`` (each with its worker), each reduce task's node, children and
    worker in the order they are added, for every value the tree reads whether it must leave
    its worker (``crosses``), and the leaves left (by first leaf) with the leaves each sums
    (``spec``).  Shared by every step that has it: read, never changed."""

    top: tuple[tuple[Node, str], ...]
    reduces: tuple[tuple[Node, tuple[Node, ...], str], ...]
    crosses: dict[Node, bool]
    spec: dict[int, Spec]


@functools.lru_cache(maxsize=32)
def shape(workers: tuple[str, ...], root: str, k: int, fuse: bool, readers: tuple[str, ...] = (),
          fusable: bool = False) -> Shape:
    """The tree that reduces leaves on ``workers`` (leaf ``p`` on ``workers[p]``) level by
    level with fan-in ``k``; see :func:`tree`.  It depends on the placement only, so a window
    works it out once, not once a step (a step at 256 nodes of 16 shards has 4,096 leaves)."""
    level: list[tuple[Node, str]] = [((0, p), w) for p, w in enumerate(workers)]
    spec: dict[int, Spec] = dict(enumerate(range(len(workers))))
    readers_of: dict[Node, set[str]] = {}
    planned: list[tuple[Node, tuple[Node, ...], str]] = []

    def joins(group: list[tuple[Node, str]]) -> bool:       # one worker's leaves: one leaf
        return fusable and len(group) > 1 and len({w for _, w in group}) == 1 and \
            all(node[0] == 0 for node, _ in group)

    depth = tree_depth(len(workers), k)
    for d in range(1, depth + 1):
        groups = [level[j:j + k] for j in range(0, len(level), k)]
        if d == depth and fuse and not joins(groups[0]):
            break                                   # the root task is this level's root
        level = []
        for group in groups:
            if len(group) == 1:
                level.append(group[0])
                continue
            if joins(group):
                first = group[0][0][1]
                spec[first] = tuple(spec[node[1]] for node, _ in group)
                for node, _ in group[1:]:
                    del spec[node[1]]
                level.append(group[0])
                continue
            node, worker = (d, group[0][0][1]), root if d == depth else group[0][1]
            for child, _ in group:
                readers_of.setdefault(child, set()).add(worker)
            planned.append((node, tuple(child for child, _ in group), worker))
            level.append((node, worker))
    for node, _ in level:
        readers_of.setdefault(node, set()).update({root, *readers})
    produced = {(0, p): workers[p] for p in spec} | {node: w for node, _, w in planned}
    crosses = {node: any(r != produced[node] for r in readers_of.get(node, ()))
               for node in produced}
    return Shape(tuple(level), tuple(planned), crosses, spec)


def add(win: Window, tree_shape: Shape, leaf: Callable[[int], str], tag: str, run: str,
        nbytes: int) -> tuple[list[Leaf], dict[str, bool]]:
    """Add ``tree_shape``'s reduce tasks to ``win`` (leaf ``p`` named ``leaf(p)``, reduces
    ``reduce-<tag>-<level>-<first leaf>``); returns the root level's inputs and, by key,
    whether each value the tree reads must leave its worker."""
    def name(node: Node) -> str:
        d, first = node
        return leaf(first) if d == 0 else keys.make(keys.REDUCE, tag, d, first, run=run)

    crosses = {name(node): c for node, c in tree_shape.crosses.items()}
    for node, children, worker in tree_shape.reduces:
        key = name(node)
        win.add(Task(key, reduce, Reduce(crosses[key]), *(TaskRef(name(c)) for c in children)),
                worker, nbytes)
    return [(name(node), node[1], worker) for node, worker in tree_shape.top], crosses


def tree(win: Window, tag: str, leaves: list[Leaf], root: str, k: int, fuse: bool,
         nbytes: int, run: str, readers: Sequence[str] = (), fusable: bool = False
         ) -> tuple[list[Leaf], dict[str, bool], dict[str, Spec]]:
    """Reduce ``leaves`` (in leaf order, leaf ``p``'s first shard ``p``) level by level with
    fan-in ``k``.

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
    got = shape(tuple(w for _, _, w in leaves), root, k, fuse, tuple(readers), fusable)
    top, crosses = add(win, got, lambda p: leaves[p][0], tag, run, nbytes)
    return top, crosses, {leaves[p][0]: sp for p, sp in got.spec.items()}
