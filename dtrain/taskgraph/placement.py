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
    """Where each partition's shard lives: on the worker that already holds the partition,
    unless that worker holds more than its fair share of rows by over
    ``BALANCE_SLACK``; then its last partitions go, one by one, to the worker holding the
    fewest rows, while that evens the load (a partition too big to even anything stays).
    Partitions on a worker that is gone go where they even the load best.  Deterministic:
    the same holders, rows and workers give the same answer."""
    fair = sum(rows) / max(len(workers), 1)
    owner = [h if h in workers else None for h in holders]
    load = {w: sum(r for o, r in zip(owner, rows) if o == w) for w in workers}
    for i in sorted((i for i, o in enumerate(owner) if o is None), key=lambda i: -rows[i]):
        owner[i] = min(workers, key=lambda w: (load[w], w))
        load[owner[i]] += rows[i]
    for w in sorted(workers, key=lambda w: -load[w]):
        for i in reversed([i for i, o in enumerate(owner) if o == w]):
            if load[w] <= fair * (1 + BALANCE_SLACK):
                break
            to = min(workers, key=lambda v: (load[v], v))
            if load[to] + rows[i] >= load[w]:       # moving it would not even the load
                continue
            owner[i], load[w], load[to] = to, load[w] - rows[i], load[to] + rows[i]
    return tuple(owner)


def place_partitions(workers: Sequence[Worker | str], holders: Sequence[str],
                     rows: Sequence[int], server: bool = False) -> Placement:
    """:func:`place` for shards that are partitions already on workers (``holders``):
    each stays where it is, unless :func:`balance` moves it.  With a ``server`` the first
    worker only reduces and updates, so its partitions go to the others."""
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    head, trainers = (workers[0], workers[1:]) if server else (None, workers)
    leaves = balance(holders, rows, [w.address for w in trainers])
    return Placement(leaves, head.address if head else leaves[0],
                     frozenset(w.address for w in workers if w.gpu))
