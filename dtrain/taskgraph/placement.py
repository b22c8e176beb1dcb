"""Placement: which worker holds which shard (or model slice), and where the update runs.

Shards go to workers in contiguous blocks, so a reduce subtree over
neighbouring shards stays on one worker; blocks are sized so the slowest
worker finishes first when CPU and GPU workers mix.  Partitions already on the
cluster stay where they are unless moving them into such blocks pays for itself
over the run (:func:`rebalance`, with the measured figures it predicts by).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Worker:
    """A worker as placement sees it: its address, whether it computes on a GPU, and its
    relative speed (measured when CPU and GPU workers mix; else 1); and its task threads
    (which tasks may skip the thread pool: :func:`dtrain.training.cluster_data.inline_kinds`).

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
    moves: Moves | None = field(default=None, compare=False)   # partitions: what moved, why

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


# --- whether moving partitions pays (issue 50) --------------------------------------------------
#
# dtrain cannot import benchmarks/, so the measured figures the prediction uses live here.
MESSAGE_SECONDS = 0.3e-3
"""What a value crossing workers adds to a step of a window across workers, whatever its
size: the step time measured with partitions dealt out in turn less that in blocks, over
the crossings it adds.  2.4 against 0.85 ms a step with 5 more crossings (0.31 ms each;
8 partitions on 2 workers, ``python -m benchmarks.estimators``'s dask.dataframe fit,
docs/performance.md, issue 36); 1.3-1.7 against 0.3-0.4 ms with 3 more, and 1.5-3.1
against 0.7-1.4 ms at 160 steps (0.25-0.55 ms each; tests/test_rebalance.py's 8
partitions, an (8,) net, 2026-11-29).  Far above the mesh's own 0.012 ms a message
(``python -m benchmarks.p2p``: half a 1 KiB round trip between polling peers): in a step
the reader is asleep in its read (woken, on these 2-core machines, after another process
had the core), and a worker's partitions among another's are no longer one stacked
forward-backward.  Priced at the mesh's figure, fits of about 10 to 300 steps stayed
interleaved and ran up to 1.5 times slower than moved.  Dedicated cores would pay less
per message; too high a figure costs a needless move, once, too low one every step."""
MESSAGE_BYTES_PER_SECOND = 5.3e9
"""... and its bytes: the 3.2 MiB message over TCP, 1.28 ms there and back, less the
1 KiB one's (``python -m benchmarks.p2p``, the table in ARCHITECTURE.md "Across
workers"; ``benchmarks.model``'s ``p2p_bandwidth``).  TCP, not the faster Unix socket,
so that crossings are never priced below what they cost between machines."""
FETCH_SECONDS = 1.96e-3
"""A partition moved by Dask, whatever its size: what a dependency from another worker adds
to a task, ``fetch`` of ``python -m benchmarks.model``'s constants (2026-11-25,
benchmarks/README.md)."""
FETCH_BYTES_PER_SECOND = 2.99e9
"""... and its bytes: Dask's bandwidth between two worker processes there (an 8 MiB
payload)."""
FLOPS_PER_THREAD = 2e9
"""A forward-backward's rate on one BLAS thread for the small nets this decision is close
for (``benchmarks.model`` measured 0.2-230 GFLOP/s per network and batch; the rate of
``dataparallel.TINY_FLOPS``'s ~1 ms for 2 MFLOP)."""

@dataclass(frozen=True)
class Fit:
    """What a fit will do, as the decision to move partitions sees it: ``steps`` left to
    run, ``batch`` rows a step, ``params`` in the net, ``grad_bytes`` in a leaf's gradient
    (what crosses per reduce message), the reduce tree's ``fan_in``."""

    steps: int
    batch: int
    params: int
    grad_bytes: int
    fan_in: int = 2


@dataclass(frozen=True)
class Moves:
    """The answer of :func:`rebalance`: each partition's worker (``leaves``), the
    partitions that move, and why; the predicted seconds the blocks would save over the
    fit's steps and those the move would cost (``None`` where nothing was predicted)."""

    leaves: tuple[str, ...]
    moved: tuple[int, ...]
    why: str
    saving_seconds: float | None = None
    move_seconds: float | None = None


def crossings(leaves: Sequence[str], fan_in: int) -> int:
    """Values that cross workers each step when leaf ``i`` sits on ``leaves[i]``: the
    fixed-order tree of ``fan_in`` sums each group where its first child is, and the root's
    sum is read on every worker holding leaves (replicated updates).  A worker's
    consecutive leaves cost nothing; one worker's leaves among another's, a message per
    pair and step."""
    level, n = list(leaves), 0
    while len(level) > 1:
        groups = [level[j:j + fan_in] for j in range(0, len(level), fan_in)]
        n += sum(w != g[0] for g in groups for w in g[1:])
        level = [g[0] for g in groups]
    return n + len(set(leaves)) - 1


def step_seconds(leaves: Sequence[str], rows: Sequence[int], fit: Fit,
                 threads: dict[str, int]) -> float:
    """Predicted seconds a step spends on ``leaves``' placement: its crossings (each
    :data:`MESSAGE_SECONDS` plus the gradient's bytes) and the busiest worker's share of
    the batch (``6 * params`` FLOP a row at :data:`FLOPS_PER_THREAD` per thread)."""
    total = max(1, sum(rows))
    load: dict[str, int] = {}
    for w, r in zip(leaves, rows):
        load[w] = load.get(w, 0) + r
    compute = max(fit.batch * r / total * 6 * fit.params / (FLOPS_PER_THREAD *
                                                               max(1, threads.get(w, 1)))
                  for w, r in load.items()) if load else 0.0
    return crossings(leaves, fit.fan_in) * (MESSAGE_SECONDS + fit.grad_bytes /
                                             MESSAGE_BYTES_PER_SECOND) + compute


def move_seconds(moved: Sequence[int], nbytes: Sequence[int]) -> float:
    """Predicted seconds to move partitions ``moved`` (of ``nbytes`` each) once, by Dask."""
    return sum(FETCH_SECONDS + nbytes[i] / FETCH_BYTES_PER_SECOND for i in moved)


def rebalance(holders: Sequence[str | None], rows: Sequence[int], nbytes: Sequence[int],
              workers: Sequence[Worker | str], mode: str = "always", fit: Fit | None = None,
              free: dict[str, float] | None = None) -> Moves:
    """Where each partition's shard lives: where it sits, or moved once into blocks
    (:func:`balance`), as ``mode`` says (``data.rebalance``, the estimators' ``rebalance``).

    ``"never"`` leaves every partition where it is; ``"always"`` takes :func:`balance`'s
    blocks; ``"auto"`` takes them only where the move pays for itself over the ``fit``: the
    steps' predicted seconds in place (:func:`step_seconds`: crossings and the busiest
    worker's rows) against the blocks' plus the move (:func:`move_seconds`), and only
    where no receiving worker gets more bytes than its ``free`` memory.  Whatever the mode,
    a partition whose holder is not among ``workers`` (gone, or a parameter server's head)
    goes where the blocks put it: it is not held where it could train.  The bytes a run
    computes do not depend on the answer: the reduce tree is fixed in partition order."""
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    names = [w.address for w in workers]
    blocks_ = balance([h or "" for h in holders], rows, names)
    stay = tuple(h if h in names else b for h, b in zip(holders, blocks_))

    def moves(leaves: Sequence[str]) -> tuple[int, ...]:
        return tuple(i for i, (h, w) in enumerate(zip(holders, leaves)) if h is not None
                     and h != w)

    forced = moves(stay)
    if mode == "never" or stay == blocks_:
        why = "rebalance = 'never': every partition trains where it sits"             if mode == "never" else "the partitions already sit in blocks of consecutive "             "partitions of about equal rows"
        if forced:
            why += f"; {len(forced)} held off the training workers moved to one"
        return Moves(stay, forced, why)
    if mode == "always" or fit is None:
        return Moves(blocks_, moves(blocks_), "rebalance = 'always': each worker a block of "
                     "consecutive partitions of about equal rows")
    threads = {w.address: w.threads for w in workers}
    saving = fit.steps * (step_seconds(stay, rows, fit, threads) -
                          step_seconds(blocks_, rows, fit, threads))
    cost = move_seconds(moves(blocks_), nbytes) - move_seconds(forced, nbytes)
    said = (f"over {fit.steps:,} steps in blocks a predicted {saving:.3g} s saved, against "
            f"{cost:.3g} s to move {len(moves(blocks_)) - len(forced)} partition(s)")
    incoming: dict[str, int] = {}
    for i in moves(blocks_):
        incoming[blocks_[i]] = incoming.get(blocks_[i], 0) + nbytes[i]
    short = sorted(w for w, b in incoming.items() if free and b > free.get(w, float("inf")))
    if saving > cost and not short:
        return Moves(blocks_, moves(blocks_), f"rebalance = 'auto': moving pays: {said}",
                     saving, cost)
    why = f"rebalance = 'auto': moving does not pay: {said}" if not short else \
        (f"rebalance = 'auto': moving would pay ({said}) but {', '.join(short)} has too "
         f"little free memory for what would move to it")
    if forced:
        why += f"; {len(forced)} held off the training workers moved to one"
    return Moves(stay, forced, why, saving, cost)


def place_partitions(workers: Sequence[Worker | str], holders: Sequence[str | None],
                     rows: Sequence[int], server: bool = False, nbytes: Sequence[int] = (),
                     mode: str = "always", fit: Fit | None = None,
                     free: dict[str, float] | None = None) -> Placement:
    """:func:`place` for shards that are partitions already on workers (``holders``):
    each stays where it is, unless :func:`rebalance` moves it (``mode``: into blocks
    always, never, or where the ``fit`` pays for the move of ``nbytes`` within the
    receivers' ``free`` memory); the answer is the placement's ``moves``.  With a
    ``server`` the first worker only reduces and updates, so its partitions go to the
    others."""
    workers = [w if isinstance(w, Worker) else Worker(w) for w in workers]
    head, trainers = (workers[0], workers[1:]) if server else (None, workers)
    moves = rebalance(holders, rows, list(nbytes) or [0] * len(holders), trainers, mode, fit,
                      free)
    leaves = moves.leaves
    return Placement(leaves, head.address if head else leaves[0],
                     frozenset(w.address for w in workers if w.gpu), moves)
