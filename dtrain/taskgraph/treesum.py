"""A group's reduce subtree summed in one place, the same bits as the reduce tasks' sums.

A group of shards that one task computes (:class:`~dtrain.taskgraph.records.Group`)
nests its positions as the reduce tree would, ``((0, 1), (2, 3))`` at fan-in 2.
Whatever sums it (one thread, :mod:`~dtrain.taskgraph.cores`' processes each
adding its own subtrees first), each element adds the same numbers in the same
order as :func:`dtrain.core.arrays.sum_in_order` adds whole buffers, children in
order: so the bytes never depend on who added what.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from dtrain.core.arrays import sum_in_order

Tree = int | tuple          # a position, or the nesting of several


def even_parts(n: int, ways: int) -> list[range]:
    """``range(n)`` cut into ``ways`` consecutive parts, part ``j`` from ``j * n // ways``:
    sizes that differ by one at most (shards over threads or processes, the numbers of a
    buffer over workers)."""
    return [range(n * j // ways, n * (j + 1) // ways) for j in range(ways)]


def flat(tree: Tree) -> list[int]:
    """The positions of ``tree``, in order."""
    return [tree] if isinstance(tree, int) else [i for t in tree for i in flat(t)]


def nested_sum(tree: Tree, bufs: Any) -> Any:
    """The tree's sums over ``bufs`` (``bufs[p]`` at position ``p``), level by level,
    children in order."""
    if isinstance(tree, int):
        return bufs[tree]
    return sum_in_order(*(nested_sum(t, bufs) for t in tree))


def sum_in_place(tree: Tree, bufs: np.ndarray) -> int:
    """Sum the subtree ``tree`` of ``bufs``' rows into its first position's row, as
    :func:`nested_sum` adds them; returns that position."""
    if isinstance(tree, int):
        return tree
    firsts = [sum_in_place(t, bufs) for t in tree]
    with np.errstate(all="ignore"):
        for other in firsts[1:]:
            bufs[firsts[0]] += bufs[other]
    return firsts[0]


@functools.lru_cache(maxsize=64)
def _own_subtrees(tree: Tree, mine: frozenset[int]) -> tuple:
    """The largest subtrees of ``tree`` of several positions, all of them ``mine``."""
    if isinstance(tree, int):
        return ()
    if set(flat(tree)) <= mine:
        return (tree,)
    return tuple(s for t in tree for s in _own_subtrees(t, mine))


def sum_subtrees(tree: Tree, mine: Sequence[int], bufs: np.ndarray) -> None:
    """Sum each largest subtree of ``tree`` whose positions are all ``mine`` into its first
    row (what :func:`collapsed` leaves of the tree for the rest of the sum)."""
    for t in _own_subtrees(tree, frozenset(mine)):
        sum_in_place(t, bufs)


@functools.lru_cache(maxsize=64)
def collapsed(tree: Tree, parts: tuple[range, ...]) -> Tree:
    """``tree`` with each largest subtree wholly within one of ``parts`` as its first
    position (where :func:`sum_subtrees` left its sum): what is left to add."""
    part = {p: j for j, r in enumerate(parts) for p in r}
    positions = flat(tree)
    if len({part[p] for p in positions}) == 1:
        return positions[0]
    return tuple(collapsed(t, parts) for t in tree)
