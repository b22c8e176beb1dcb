"""Placement: which worker holds which shard (or model slice), and where the update runs.

Shards go to workers in contiguous blocks, so a reduce subtree over
neighbouring shards stays on one worker; blocks are sized so the slowest
worker finishes first when CPU and GPU workers mix.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Worker:
    """A worker as placement sees it: its address, whether it computes on a GPU, and its
    relative speed (measured when CPU and GPU workers mix; else 1); and its task threads
    (which tasks may skip the thread pool: :func:`dtrain.training.engines.inline_kinds`).

    Measured workers also say how long a step's forward-backward over ``n`` of their rows
    takes: ``overhead + n / weight`` seconds (``weight`` in samples per second, counting
    every core a CPU worker computes its shards on; ``overhead``: a GPU's kernel launches,
    whatever the rows)."""

    address: str
    gpu: bool = False
    weight: float = 1.0
    threads: int = 1
    overhead: float = 0.0

    def seconds(self, rows: float) -> float:
        """Predicted forward-backward seconds over ``rows`` rows (0 for none)."""
        return self.overhead + rows / self.weight if rows else 0.0


@dataclass(frozen=True)
class Choice:
    """One way to assign the shards when CPU and GPU workers mix: its ``name``, the shards
    each of its ``workers`` holds (``counts``) and the predicted ``seconds`` of a step."""

    name: str
    workers: tuple[Worker, ...]
    counts: tuple[int, ...]
    seconds: float


def choices(workers: Sequence[Worker], shards: int, rows: float, sync: float) -> list[Choice]:
    """Every assignment worth predicting, fastest first: the shards over every worker, over
    the GPU workers alone, over the CPU workers alone (each in blocks sized by speed,
    :func:`blocks`).

    A synchronous step ends when the slowest worker's shards are done (``rows`` rows a
    shard: :meth:`Worker.seconds`), and when more than one worker holds shards it pays
    ``sync`` seconds more: the gradients cross workers and a window can no longer run as one
    task (:mod:`~dtrain.taskgraph.fuse`), so each step costs scheduler round trips.  That is
    why a fast GPU alone usually beats a GPU helped by CPUs, and a CPU alone beats a GPU on
    a tiny net, whose kernel launches cost more than its maths.  Ties go to fewer workers.
    """
    subsets = [list(workers), [w for w in workers if w.gpu], [w for w in workers if not w.gpu]]
    out, seen = [], set()
    for ws in filter(None, subsets):
        counts = blocks([w.weight for w in ws], shards)
        busy = [(w, n) for w, n in zip(ws, counts) if n]
        key = tuple((w.address, n) for w, n in busy)
        if key in seen:             # all workers, but the fast kind took every shard
            continue
        seen.add(key)
        kinds = {w.gpu for w, _ in busy}
        name = "all workers" if len(kinds) > 1 else "GPUs only" if True in kinds else "CPUs only"
        seconds = max(w.seconds(n * rows) for w, n in busy) + (sync if len(busy) > 1 else 0.0)
        out.append(Choice(name, tuple(ws), tuple(counts), seconds))
    return sorted(out, key=lambda c: (c.seconds, sum(n > 0 for n in c.counts)))


@dataclass(frozen=True)
class Placement:
    """Where tasks run: leaf ``i``'s tasks (shard ``i``, or slice ``i`` of a model-parallel
    net) on ``leaves[i]``, the update on ``root``; ``gpus`` are the GPU workers."""

    leaves: tuple[str, ...]
    root: str
    gpus: frozenset[str] = frozenset()

    @property
    def workers(self) -> list[str]:
        return sorted(set(self.leaves) | {self.root})


def place(workers: Sequence[Worker | str], shards: int, server: bool = False) -> Placement:
    """Assign shards to workers in contiguous blocks, so a reduce subtree stays on one worker.

    Blocks are sized by the workers' weights (equal unless calibrated): a GPU
    worker ten times faster than a CPU worker gets ten times the shards.
    Without a ``server`` every worker holds shards and the update runs with
    shard 0; with one (a parameter server) the first worker is the head: it
    reduces and updates and holds no shard.
    """
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    head, trainers = (workers[0], workers[1:]) if server else (None, workers)
    counts = blocks([w.weight for w in trainers], shards)
    owner = tuple(w.address for w, n in zip(trainers, counts) for _ in range(n))
    return Placement(owner, head.address if head else owner[0],
                     frozenset(w.address for w in workers if w.gpu))


def blocks(weights: Sequence[float], shards: int) -> list[int]:
    """Shards per worker, in worker order, so the slowest worker finishes first.

    Blocks proportional to the weights, unless shards are too few to split
    that finely; then the fewest-time blocks (a worker too slow to help gets
    none: a GPU five times faster than a CPU takes all 4 shards, rather than
    3 while the CPU takes 1 and makes everyone wait for it).  No worker is a caller's bug
    (a ValueError saying so): the engine waits for workers before it places.
    """
    if not len(weights):
        raise ValueError(f"no worker to place {shards} shard(s) on")
    edges = np.cumsum(weights) / sum(weights)
    owner = [min(int(np.searchsorted(edges, (i + 0.5) / shards)), len(weights) - 1)
             for i in range(shards)]
    counts = [owner.count(j) for j in range(len(weights))]

    def slowest(c: list[int]) -> float:
        return max(n / w for n, w in zip(c, weights) if n)

    def fill(limit: float) -> list[int] | None:       # greedy blocks within a time limit
        out, left = [], shards
        for w in weights:
            out.append(min(left, int(limit * w + 1e-9)))
            left -= out[-1]
        return None if left else out

    times = sorted({n / w for w in weights for n in range(1, shards + 1)})
    lo, hi = 0, len(times) - 1
    while lo < hi:                                     # the least feasible time limit
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fill(times[mid]) else (mid + 1, hi)
    best = fill(times[lo])
    return best if best is not None and slowest(best) < slowest(counts) * (1 - 1e-9) \
        else counts


BALANCE_SLACK = 0.25    # a worker may hold this much more than its fair share before it gives


def balance(holders: Sequence[str], rows: Sequence[int], workers: Sequence[str]
            ) -> tuple[str, ...]:
    """Where each partition's shard lives: every worker a block of consecutive partitions.

    A block is a subtree of the fixed-order reduce (a worker's shards are one stacked task,
    and only the block's sum crosses to another worker); one worker's partitions scattered
    among another's make every tree pair a message between them, each step.  Partitions
    already in such blocks stay where they are unless a worker holds more than its fair
    share of the rows by over ``BALANCE_SLACK`` (or is gone).  Otherwise the partitions
    are cut into blocks of about equal rows (:func:`row_blocks`), and each block goes to
    the worker already holding most of its rows, so that the fewest rows move.
    Deterministic: the same holders, rows and workers give the same answer; the bytes a
    run computes do not depend on it."""
    if not workers:
        raise ValueError(f"no worker to place {len(holders)} partition(s) on")
    fair = sum(rows) / len(workers)
    load = {w: sum(r for h, r in zip(holders, rows) if h == w) for w in workers}
    if all(h in load for h in holders) and _in_blocks(holders) \
            and max(load.values()) <= fair * (1 + BALANCE_SLACK):
        return tuple(holders)
    from scipy.optimize import linear_sum_assignment
    cuts = row_blocks(rows, len(workers))                          # W + 1 edges
    held = np.zeros((len(workers), len(workers)))                  # (block, worker) rows
    column = {w: j for j, w in enumerate(workers)}
    for b in range(len(workers)):
        for i in range(cuts[b], cuts[b + 1]):
            if holders[i] in column:
                held[b, column[holders[i]]] += rows[i]
    blocks_, owners = linear_sum_assignment(held, maximize=True)
    to = dict(zip(blocks_, owners))
    return tuple(workers[to[b]] for b in range(len(workers))
                 for _ in range(cuts[b], cuts[b + 1]))


def _in_blocks(holders: Sequence[str]) -> bool:
    """Whether each holder's partitions are consecutive."""
    runs = [h for i, h in enumerate(holders) if i == 0 or holders[i - 1] != h]
    return len(runs) == len(set(runs))


def row_blocks(rows: Sequence[int], parts: int) -> list[int]:
    """The ``parts + 1`` edges of ``parts`` blocks of consecutive items of about equal
    ``rows``: each inner edge where the running sum comes closest to its share, no block
    empty while there are items for it."""
    n, total = len(rows), float(sum(rows))
    cum = np.concatenate([[0.0], np.cumsum(rows, dtype=np.float64)])      # (n + 1,)
    edges = [0]
    for j in range(1, parts):
        lo, hi = edges[-1] + (1 if edges[-1] < n - (parts - j) else 0), n - (parts - j)
        hi = max(hi, lo)
        edge = lo + int(np.argmin(np.abs(cum[lo:hi + 1] - total * j / parts)))
        edges.append(min(edge, n))
    return edges + [n]


def place_partitions(workers: Sequence[Worker | str], holders: Sequence[str],
                     rows: Sequence[int], server: bool = False) -> Placement:
    """:func:`place` for shards that are partitions already on workers (``holders``):
    each stays where it is, unless :func:`balance` moves it (into blocks, or to balance).
    With a ``server`` the first worker only reduces and updates, so its partitions go to
    the others."""
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    head, trainers = (workers[0], workers[1:]) if server else (None, workers)
    leaves = balance(holders, rows, [w.address for w in trainers])
    return Placement(leaves, head.address if head else leaves[0],
                     frozenset(w.address for w in workers if w.gpu))
