"""A step's sum as an allreduce: the fixed shard-order tree, carried by a schedule of messages.

The bytes of a data-parallel step are fixed by one tree: the shards' gradients summed
level by level with fan-in ``k``, children in shard order (:func:`tree`; it depends on
the number of shards and the fan-in only, never on the workers).  Who adds which
numbers, and which messages carry them, is free, as long as every number of every sum
adds the same numbers in the same order: an elementwise sum cut into segments is the same
bits segment by segment.  So the *summation tree* is kept and the *communication* is
chosen apart from it, as ReproRed and Rabenseifner's allreduce separate them
(``shared/notes/reproducible-sum.md``, option A):

* each worker sums the largest subtrees whose shards it holds itself (``made``: one
  group of shards computed on its cores);
* the tree above those subtrees (``upper``) is summed by one of three schedules:

  ``halving``
      Rabenseifner's reduce-scatter: each upper node's sum is cut into one segment per
      worker under it, laid out so that each worker keeps a piece of what it held one
      level down; then an allgather (Bruck's: ``ceil(log2 W)`` rounds for any ``W``).
      About ``2 log2 W`` messages and ``2 N (W - 1) / W`` bytes a worker: what an MPI
      Allreduce of a large buffer costs.  ``halving4`` and ``halving8`` sum two and
      three levels of the tree a round (each worker reading from 3 or 7 others, the
      allgather of radix 4 or 8): half or a third of the rounds, for networks whose
      latency outweighs the messages' bytes.
  ``doubling``
      recursive doubling: every worker of a node adds the node's whole sum, having been
      sent its sibling subtrees' sums.  ``log2 W`` messages of ``N`` bytes a worker:
      the fewest messages, for small buffers.
  ``tree``
      each node added where its first worker is (the root's on the collector), then the
      sum sent down a binomial tree; ``tree2``: the root added on both of its makers,
      each sending it down its half of the others (the top of recursive doubling).

For a power-of-two number of workers holding equal blocks of shards, ``halving`` is
exactly Rabenseifner's schedule; for other counts it is the same rule, with a few more
messages where a subtree of one worker meets one of many.  Every schedule is a
:class:`Program` per worker, worked out once per placement (:func:`programs`), run each
step by :func:`run` over the mesh's connections, and timed by :func:`simulate` (which
the engine uses to pick the schedule: :func:`choose`).  Pure functions, but for
:func:`run`, which talks to the peers it is given.
"""
from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dtrain.core.arrays import array_module, like, on_gpu, sum_in_order, to_host
from dtrain.taskgraph.treesum import Tree, flat

HALVING, DOUBLING, TREE = "halving", "doubling", "tree"
HALVING4, HALVING8 = "halving4", "halving8"     # two, three levels of the tree a round
TREE2 = "tree2"                                 # the tree, its root added on both makers
SCHEDULES = (HALVING, HALVING4, HALVING8, DOUBLING, TREE, TREE2)
RADIX = {HALVING: 2, HALVING4: 4, HALVING8: 8}
SEND, RECV, ADD = "send", "recv", "add"


@functools.lru_cache(maxsize=32)
def tree(shards: int, k: int) -> Tree:
    """The summation tree of ``shards`` leaves at fan-in ``k``: level by level, ``k``
    consecutive nodes a group, a group of one passed up as it is (the tree
    :func:`dtrain.taskgraph.reduction.shape` builds tasks for)."""
    level: list[Tree] = list(range(shards))
    while len(level) > 1:
        level = [g[0] if len(g) == 1 else tuple(g)
                 for g in (level[j:j + k] for j in range(0, len(level), k))]
    return level[0]


@dataclass(frozen=True)
class Op:
    """One action of a worker's program: ``send`` the ``items`` (``(value, first segment,
    end segment)``, in order, as one message) to rank ``peer``, ``recv`` them from it, or
    ``add`` the item from the same segments of the values ``children``, in order.
    ``round`` names the message (a pair of workers exchanges at most one a round)."""

    kind: str
    round: int
    peer: int = -1
    items: tuple[tuple[int, int, int], ...] = ()
    children: tuple = ()        # value ids, nested where a round sums several levels


@dataclass(frozen=True)
class Program:
    """Worker ``rank``'s part of a step's sum: the subtrees it sums itself (``made``:
    ``(value, subtree of shard indices)``), its :class:`Op` s in order, and the root's
    value ``root``, which it holds whole at the end, cut into ``segments`` even parts of
    the buffer on the way (one: whole all along)."""

    rank: int
    schedule: str
    made: tuple[tuple[int, Tree], ...]
    ops: tuple[Op, ...]
    root: int
    segments: int

    def peers(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ranks it sends to and those it reads from."""
        to = sorted({op.peer for op in self.ops if op.kind == SEND})
        frm = sorted({op.peer for op in self.ops if op.kind == RECV})
        return tuple(to), tuple(frm)

    def traffic(self, n: int) -> tuple[int, int]:
        """Messages and numbers it sends a step, for a buffer of ``n`` numbers."""
        sends = [op for op in self.ops if op.kind == SEND]
        return len(sends), sum(_numbers(op.items, n, self.segments) for op in sends)


def _span(n: int, segments: int, a: int, b: int) -> tuple[int, int]:
    """Where segments ``a`` to ``b - 1`` of a buffer of ``n`` numbers lie."""
    return n * a // segments, n * b // segments


def _numbers(items: Sequence[tuple[int, int, int]], n: int, segments: int) -> int:
    return sum(hi - lo for lo, hi in (_span(n, segments, a, b) for _, a, b in items))


@dataclass
class _Upper:
    """The tree above the subtrees that one worker sums alone: each node's children and
    height, the ranks under it, and what each rank makes."""

    children: dict[int, tuple[int, ...]]
    height: dict[int, int]
    under: dict[int, tuple[int, ...]]     # ranks, in shard order of first appearance
    made: dict[int, list[tuple[int, Tree]]]
    maker: dict[int, int]
    root: int


def _upper(t: Tree, rank_of: Sequence[int]) -> _Upper:
    out = _Upper({}, {}, {}, defaultdict(list), {}, -1)

    def walk(node: Tree) -> int:
        ranks = list(dict.fromkeys(rank_of[s] for s in flat(node)))
        vid = len(out.height)
        if len(ranks) == 1:
            out.height[vid] = 0
            out.under[vid] = (ranks[0],)
            out.made[ranks[0]].append((vid, node))
            out.maker[vid] = ranks[0]
            return vid
        out.height[vid] = -1                      # reserve the id, children after it
        kids = tuple(walk(c) for c in node)
        out.children[vid] = kids
        out.height[vid] = 1 + max(out.height[c] for c in kids)
        out.under[vid] = tuple(dict.fromkeys(r for c in kids for r in out.under[c]))
        return vid

    out.root = walk(t)
    return out


def _merged(up: _Upper, v: int) -> list[int]:
    """The ranks under ``v`` in the order their segments of its sum lie in the buffer: its
    children's orders merged in proportion (two children of two ranks each: 0, 2, 1, 3),
    so that every rank keeps a piece of what it held one level down: Rabenseifner's
    halving, whose segments end on the ranks in bit-reversed order."""
    if v in up.maker:
        return [up.maker[v]]
    keyed = []
    for i, c in enumerate(up.children[v]):
        order = [r for r in _merged(up, c) if r not in {r for _, _, r in keyed}]
        keyed += [((t + 0.5) / len(order), i, r) for t, r in enumerate(order)]
    return [r for _, _, r in sorted(keyed)]


def _halves(up: _Upper, members: int) -> dict[int, dict[int, tuple[int, int]]]:
    """For every node, which segments (``[a, b)`` of ``members``) each of its ranks adds:
    at the root one segment each, in :func:`_merged` order; below, each rank's piece one
    level up grown into a contiguous share of all the segments (an even share where that
    holds the piece, else the piece with the gaps beside it), so that what a rank adds
    at a node it already holds of each child it is under."""
    out: dict[int, dict[int, tuple[int, int]]] = {}
    order = _merged(up, up.root)
    out[up.root] = {r: (p, p + 1) for p, r in enumerate(order)}
    todo = [up.root]
    while todo:
        v = todo.pop()
        for c in up.children.get(v, ()):
            mine = sorted((out[v][r], r) for r in up.under[c] if r in out[v])
            ranks = [r for _, r in mine]
            even = [(members * i // len(ranks), members * (i + 1) // len(ranks))
                    for i in range(len(ranks))]
            if all(e[0] <= a and b <= e[1] for e, ((a, b), _) in zip(even, mine)):
                out[c] = dict(zip(ranks, even))
            else:                       # each gap to the piece before it
                cuts = [0] + [a for (a, _), _ in mine[1:]] + [members]
                out[c] = {r: (cuts[i], cuts[i + 1]) for i, r in enumerate(ranks)}
            if c in up.children:
                todo.append(c)
    return out


@functools.lru_cache(maxsize=16)
def programs(shards: int, k: int, rank_of: tuple[int, ...], members: int, schedule: str,
             collector: int = 0) -> tuple[Program, ...]:
    """Every worker's :class:`Program` (by rank) for a step whose shard ``s`` sits on rank
    ``rank_of[s]`` of ``members`` workers; ``collector``: the rank that holds the root's
    sum first in the ``tree`` schedule.  Worked out once per placement."""
    if schedule not in SCHEDULES:
        raise ValueError(f"no schedule {schedule!r}: one of {', '.join(SCHEDULES)}")
    if set(rank_of) != set(range(members)):
        raise ValueError(f"every one of {members} workers must hold a shard")
    up = _upper(tree(shards, k), rank_of)
    radix = RADIX.get(schedule, 2)
    halving = schedule in RADIX
    segments = members if halving else 1
    held: dict[int, dict[int, tuple[int, int]]]
    if halving:
        held = _halves(up, members)
    elif schedule in (TREE, TREE2):
        held = {v: {collector if collector in up.under[v] else up.under[v][0]: (0, 1)}
                for v in up.children}
        kids = up.children.get(up.root, ())
        if schedule == TREE2 and len(kids) == 2:    # both makers of the root add it
            makers = [up.maker[c] if c in up.maker else next(iter(held[c])) for c in kids]
            if makers[0] != makers[1]:
                held[up.root] = {m: (0, 1) for m in makers}
    else:
        held = {v: {r: (0, 1) for r in sorted(up.under[v])} for v in up.children}
    for v, r in up.maker.items():
        held[v] = {r: (0, segments)}
    ops: dict[int, list[Op]] = {r: [] for r in range(members)}
    rnd = 0
    levels = radix.bit_length() - 1             # levels of the tree summed a round
    top = up.height[up.root]
    tops = sorted({*range(levels, top, levels), top})   # the heights whose sums are sent

    def below(c: int) -> Tree:
        """``c`` as the round reads it: itself where it is sent (a leaf, a round's top),
        else the nesting of what it sums, down to such values."""
        if c in up.maker or up.height[c] in tops:
            return c
        return tuple(below(g) for g in up.children[c])

    for h in tops:
        moves: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
        adds: list[tuple[int, Op]] = []
        for v in sorted(x for x in up.children if up.height[x] == h):
            kids = tuple(below(c) for c in up.children[v])
            for at, (a, b) in held[v].items():
                for c in flat(kids):
                    have = held[c]
                    if at in have:
                        continue
                    if schedule == DOUBLING:    # spread the readers over the holders
                        need = sorted(r for r in held[v] if r not in have)
                        src = sorted(have)[need.index(at) % len(have)]
                        moves[src, at].append((c, a, b))
                        continue
                    for src, (lo, hi) in sorted(have.items(), key=lambda x: x[1]):
                        if max(lo, a) < min(hi, b):
                            moves[src, at].append((c, max(lo, a), min(hi, b)))
                adds.append((at, Op(ADD, rnd, items=((v, a, b),), children=kids)))
        for (src, dst), items in sorted(moves.items()):
            ops[src].append(Op(SEND, rnd, dst, tuple(items)))
        for (src, dst), items in sorted(moves.items(), key=lambda m: (m[0][1], m[0][0])):
            ops[dst].append(Op(RECV, rnd, src, tuple(items)))
        for at, op in adds:
            ops[at].append(op)
        rnd += 1
    root = up.root
    if halving and members > 1:     # Bruck's allgather over the root's order, radix r:
        order = _merged(up, root)   # before a round of distance d, position p holds the
        dist = 1                    # segments p to p + d - 1, after it p to p + r d - 1
        while dist < members:
            offsets = [j * dist for j in range(1, radix) if j * dist < members]
            for p in range(members):
                for off in offsets:
                    count = min(dist, members - off)
                    ops[order[p]].append(Op(SEND, rnd, order[(p - off) % members],
                                            _wrapped(root, p, count, members)))
            for p in range(members):
                for off in offsets:
                    count, frm = min(dist, members - off), (p + off) % members
                    ops[order[p]].append(Op(RECV, rnd, order[frm],
                                            _wrapped(root, frm, count, members)))
            dist, rnd = dist * radix, rnd + 1
    elif schedule in (TREE, TREE2):  # binomial trees down from the root's makers, each
        sources = sorted(held[root]) if root in held else [collector]    # to its share
        if collector in sources:
            sources.remove(collector)
            sources.insert(0, collector)
        others = [r for r in range(members) if r not in sources]
        shares = [others[len(others) * i // len(sources):len(others) * (i + 1) // len(sources)]
                  for i in range(len(sources))]
        last = rnd
        for src0, share in zip(sources, shares):
            order, step, r = [src0, *share], 1, rnd
            while step < len(order):
                for at in range(min(step, len(order) - step)):
                    src, dst = order[at], order[at + step]
                    ops[src].append(Op(SEND, r, dst, ((root, 0, 1),)))
                    ops[dst].append(Op(RECV, r, src, ((root, 0, 1),)))
                step, r = step * 2, r + 1
            last = max(last, r)
        rnd = last
    return tuple(Program(r, schedule, tuple(up.made[r]), tuple(ops[r]), root, segments)
                 for r in range(members))


def _wrapped(v: int, first: int, count: int, members: int) -> tuple[tuple[int, int, int], ...]:
    """Segments ``first`` to ``first + count - 1`` of value ``v``, modulo ``members``."""
    end = first + count
    if end <= members:
        return ((v, first, end),)
    return ((v, first, members), (v, 0, end - members))


def run(program: Program, made: Sequence[Any], tag: str,
        send: Callable[[int, str, Any], None], recv: Callable[[int, str], Any],
        at_root: Callable[[int, Any], Any] | None = None) -> Any:
    """This worker's part of one step's sum: ``made`` holds the sums of its subtrees (in
    ``program.made``'s order); ``send(rank, tag, array)`` and ``recv(rank, tag)`` carry the
    messages.  Returns the root's whole sum: the bytes of the tree's sum, number for
    number.

    With ``at_root(lo, piece)``, each piece of the root's sum is replaced where it is made
    (numbers ``lo`` on of the buffer: a segment in the halving schedules, the whole where
    one or two workers add the root) by what ``at_root`` makes of it, before anything sends
    it: the messages that would carry the sum on carry that instead, and the value returned
    is it, whole.  The update of the step made where its sum is made (a segment a worker
    in the halving schedules, as ZeRO's first stage shards it)."""
    g = program.segments
    n = made[0].shape[0]
    pieces: dict[int, list[tuple[int, int, Any]]] = defaultdict(list)   # v -> (a, b, array)
    for (v, _), buf in zip(program.made, made):
        pieces[v].append((0, g, buf))
    for op in program.ops:
        if op.kind == SEND:
            parts = [to_host(_get(pieces, n, g, v, a, b)) for v, a, b in op.items]
            send(op.peer, f"{tag}.{op.round}", parts[0] if len(parts) == 1
                 else array_module(parts[0]).concatenate(parts))
        elif op.kind == RECV:
            got = recv(op.peer, f"{tag}.{op.round}")
            at = 0
            for v, a, b in op.items:
                lo, hi = _span(n, g, a, b)
                pieces[v].append((a, b, got[at:at + hi - lo]))
                at += hi - lo
        else:
            (v, a, b), = op.items
            made_here = _folded(pieces, n, g, op.children, a, b)
            if at_root is not None and v == program.root:
                made_here = at_root(_span(n, g, a, b)[0], made_here)
            pieces[v].append((a, b, made_here))
    return _get(pieces, n, g, program.root, 0, g)


# Module functions, not closures over ``pieces``: a closure that calls itself is a reference
# cycle, which keeps a step's sums (a gradient buffer each) alive until the cyclic garbage
# collector runs, so the next step's sums land in fresh, cache-cold memory
# (tests/test_collective.py holds this).

def _get(pieces: dict[int, list[tuple[int, int, Any]]], n: int, g: int, v: int, a: int,
         b: int) -> Any:
    """Segments ``a`` to ``b - 1`` of value ``v``: a view of the piece holding them, or the
    pieces that hold them side by side, put together."""
    found = sorted((p for p in pieces[v] if p[0] < b and p[1] > a), key=lambda p: p[0])
    parts = []
    for pa, pb, arr in found:
        start = _span(n, g, pa, pa)[0]
        s, e = _span(n, g, max(a, pa), min(b, pb))
        parts.append(arr[s - start:e - start])
        if pa <= a and pb >= b:             # one piece holds them all
            return parts[-1]
    first = next((x for x in parts if on_gpu(x)), parts[0])
    return array_module(first).concatenate([like(x, first) for x in parts])


def _folded(pieces: dict[int, list[tuple[int, int, Any]]], n: int, g: int, children: tuple,
            a: int, b: int) -> Any:
    """The children's segments ``a`` to ``b - 1`` summed in order; a nested child (the levels
    a round sums at once) summed first, as the tree sums it."""
    return sum_in_order(*(_get(pieces, n, g, c, a, b) if isinstance(c, int)
                          else _folded(pieces, n, g, c, a, b) for c in children))


@dataclass(frozen=True)
class Wire:
    """What the model charges: a message ``alpha`` seconds plus its bytes over
    ``bandwidth`` (a sender's messages leave one after another), each action of a program
    ``op`` seconds of the worker's own time, and each number added ``add`` seconds."""

    alpha: float
    bandwidth: float
    op: float = 0.0
    add: float = 0.0
    cpu: float = 0.0        # each side's CPU a message takes beyond alpha where cores are shared


# What the engine's choice assumes of the mesh, from ``python -m benchmarks.p2p`` on a
# 2-core AMD EPYC machine (half a round trip; the figures in ARCHITECTURE.md's table):
# between workers of one machine (a Unix socket) and between machines (TCP).
# ``cpu``: what a message cost beyond that where 4 workers shared 2 cores (P3, the tree with
# its root added twice against Rabenseifner's halving: 10 messages fewer, 0.3 ms a step less).
LOCAL_WIRE = Wire(alpha=11e-6, bandwidth=2.6e9, op=2e-6, add=0.4e-9, cpu=30e-6)
TCP_WIRE = Wire(alpha=12e-6, bandwidth=2.5e9, op=2e-6, add=0.4e-9, cpu=30e-6)


def simulate(progs: Sequence[Program], n: int, itemsize: int, wire: Wire,
             cores: int | None = None) -> float:
    """Seconds from the moment every worker has made its subtrees' sums until the last one
    holds the root's sum, with messages and adds costed as ``wire`` says; ``cores``: the
    workers share a machine of fewer cores, whose CPU every message takes on both sides
    (on loopback its latency and bytes are CPU): that work over the cores comes on top of
    the longest chain, which waits for it."""
    g = progs[0].segments
    work = 0.0

    def numbers(items: tuple[tuple[int, int, int], ...]) -> int:
        return _numbers(items, n, g)

    clock = [0.0] * len(progs)
    arrive: dict[tuple[int, int, int], float] = {}
    at = [0] * len(progs)
    rounds = max((op.round for p in progs for op in p.ops), default=-1) + 1
    for rnd in range(rounds):
        for p in progs:             # a round's sends first (they never wait) ...
            out = 0.0
            while at[p.rank] < len(p.ops) and p.ops[at[p.rank]].round == rnd and \
                    p.ops[at[p.rank]].kind == SEND:
                op = p.ops[at[p.rank]]
                size = numbers(op.items) * itemsize / wire.bandwidth
                out += size
                arrive[p.rank, op.peer, rnd] = clock[p.rank] + wire.alpha + out
                clock[p.rank] += wire.op
                work += 2 * (wire.alpha + size + wire.op + wire.cpu)
                at[p.rank] += 1
        for p in progs:             # ... then its reads and adds
            while at[p.rank] < len(p.ops) and p.ops[at[p.rank]].round == rnd:
                op = p.ops[at[p.rank]]
                if op.kind == RECV:
                    clock[p.rank] = max(clock[p.rank], arrive[op.peer, p.rank, rnd]) + wire.op
                elif op.kind == ADD:
                    cost = wire.op + numbers(op.items) * (len(flat(op.children)) - 1) * wire.add
                    clock[p.rank] += cost
                    work += cost
                at[p.rank] += 1
    path = max(clock)
    return path if cores is None or cores >= len(progs) else path + work / cores


def choose(shards: int, k: int, rank_of: tuple[int, ...], members: int, n: int,
           itemsize: int, wire: Wire, collector: int = 0, cores: int | None = None
           ) -> tuple[str, dict[str, float]]:
    """The schedule :func:`simulate` finds fastest for a buffer of ``n`` numbers (``cores``:
    the workers share a machine of so many), and each schedule's predicted seconds (a tie
    goes to the fewest messages: doubling, then halving by increasing radix, then the
    tree)."""
    times = {s: simulate(programs(shards, k, rank_of, members, s, collector), n, itemsize, wire,
                         cores)
             for s in (DOUBLING, HALVING, HALVING4, HALVING8, TREE2, TREE)}
    return min(times, key=times.__getitem__), times
