"""A graph pass: a window that spans workers runs as one task per worker, its crossings messages.

The builders build a window step by step (``forward-backward``, ``reduce``,
``update``, ``evaluate``): that is the graph dtrain shows and tests.  Where
its tasks sit on several workers, every value that crosses between them (a
shard group's partial sum to its tree parent, the root level's sums back to
every worker, a parameter server's new state to its workers) would be a
scheduler round trip, each step: 2 to 66 times what an MPI loop costs on the
same machine (ARCHITECTURE.md).  This pass, run by the engine after the
builder where :func:`dtrain.taskgraph.fuse.steps` does not apply, cuts the
window into one chain per worker, ``window-<first>-<last>-w<rank>-<run>``:
that worker's tasks in one global order of the graph
(:func:`~dtrain.taskgraph.fuse.in_order`), with every edge between workers
turned into a message over the mesh (:mod:`dtrain.deploy.p2p`): a ``send``
right after the task that makes a value another worker reads, a ``recv``
right before the first task here that reads a value made elsewhere.  A sum
of two values made on two workers, which the second also reads (the root's
sum of the tree's root level, read on every worker), is made on both, each
sending it to half of the others (:func:`_twice`): the exchange of an
allreduce by recursive doubling at the top of the tree.  The maths are the
same functions of the same values in the same order, so the bytes are those
of the step-by-step graph and of one worker.

What the scheduler sees of a window is one task per worker, the ends picked
out of the chain that holds them (their keys unchanged), and
``window-<first>-<last>-meta-<run>``: the evaluations and every chain's
timings, as a fused window's meta.  Because each worker runs its tasks in the
same global order and a send never waits, no chain waits for one that waits
for it.  If one chain fails (a peer lost, its own error), it shuts the mesh
down as it raises, so the others stop at their next message instead of
waiting for it (:class:`~dtrain.deploy.p2p.Broken`).
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dask.task_spec import Task, TaskRef

from dtrain.core import keys
from dtrain.core.arrays import array_module, like, on_gpu, to_host
from dtrain.deploy import p2p, runtime
from dtrain.taskgraph.fuse import (CRITICAL, META, Packed, Ran, chain_of, in_order, leave_pool,
                                   pick, plain, run_chain)
from dtrain.taskgraph.treesum import Tree, even_parts, nested_sum
from dtrain.taskgraph.window import Window

SEND, RECV = "send", "recv"     # the message nodes' kinds in a chain's timings
RECV_WAIT = "recv-wait"         # the waits for a peer inside a node (fuse.note)
SPANS = 2048        # spans a window keeps over all its workers (each chain its share)
REPORT = "report"   # the tag of a chain's timings, sent to the collector once it ran
DIRECT = 3          # a value read on up to this many other workers is sent to each by its maker


@dataclass(frozen=True)
class Piece:
    """One worker's chain of a window that spans workers: rank ``rank`` of ``mesh``; it
    sends to the ranks ``to`` and reads from the ranks ``frm``; no read waits longer than
    ``timeout`` seconds.  Once its chain ran, it sends its timings to rank ``report`` (the
    collector's), or, the collector, reads those of the ranks ``collect``: a window is over
    when every one of its tasks is, and a task that stops answering ends the collector's.
    A window launched while the one before it runs starts on a worker only once that
    one's task there ended (``follows``; :meth:`dtrain.deploy.p2p.Node.turn`).  The
    chain travels pickled (:class:`~dtrain.taskgraph.fuse.Packed`)."""

    chain: Packed
    mesh: p2p.Mesh
    rank: int
    to: tuple[int, ...]
    frm: tuple[int, ...]
    timeout: float
    report: int | None = None
    collect: tuple[int, ...] = ()
    first: int = 0                  # the window's first step: its turn on the node ...
    follows: int | None = None      # ... after the window of this first step, if given


def _local() -> threading.local:
    """Each thread's running piece's link (a chain's message nodes use it): a part of this
    process's runtime."""
    return runtime.here().part("links", threading.local)


def current() -> p2p.Link:
    """The running window's connections (in a chain's message nodes)."""
    return _local().link


def recv(rank: int, tag: str) -> Any:
    """A message node: the value of ``tag``, made by rank ``rank``."""
    return _local().link.recv(rank, tag)


def send(ranks: tuple[int, ...], tag: str, value: Any) -> Any:
    """A message node: send ``value`` as ``tag`` to ``ranks``; it stays here as it was."""
    _local().link.send(ranks, tag, value)
    return value


@dataclass(frozen=True)
class Allreduce:
    """A message node that talks to several workers: ``allreduce-<step>-<s>``, worker
    ``readers[s]``'s part of a step's sums reduced in segments
    (:mod:`~dtrain.taskgraph.segments`).  ``tree`` nests the positions of the buffers it
    sums (of ``n`` numbers each; buffer ``i`` made on worker ``holders[i]``) as the reduce
    tasks and the readers summed them; reader ``s`` sums segment ``s``
    (:func:`~dtrain.taskgraph.treesum.even_parts`); ``tag`` names the step's messages.
    Inputs: the buffers made on this worker, in position order."""

    tree: Tree
    holders: tuple[str, ...]
    readers: tuple[str, ...]
    index: int
    n: int
    tag: str

    def to(self) -> set[str]:
        """The workers it sends to."""
        return set(self.readers) - {self.readers[self.index]}

    def frm(self) -> set[str]:
        """The workers it reads from."""
        return (set(self.holders) | set(self.readers)) - {self.readers[self.index]}


def allreduce(task: Allreduce, *mine: Any) -> Any:
    """See :class:`Allreduce`: this worker's buffers cut and each segment sent to its
    reader, this worker's segment summed over ``tree`` and sent to every other reader,
    and the whole sum put back together from the segments (the bytes of the tree's sum,
    number for number).  Every send goes out before the first read."""
    link, me, of = current(), task.readers[task.index], len(task.readers)
    rank = link.mesh.rank
    held = [i for i, h in enumerate(task.holders) if h == me]
    bufs = dict(zip(held, mine))
    cuts = [slice(c.start, c.stop) for c in even_parts(task.n, of)]
    for j in range(1, of):      # segment s to reader s, the next reader's first (so that
        s = (task.index + j) % of           # not every worker sends to reader 0 first)
        for i in held:
            link.send([rank(task.readers[s])], f"{task.tag}/{i}/{s}", to_host(bufs[i][cuts[s]]))
    own = cuts[task.index]                  # the segment this worker sums
    parts = [bufs[i][own] if i in bufs else link.recv(rank(h), f"{task.tag}/{i}/{task.index}")
             for i, h in enumerate(task.holders)]
    mine_sum = nested_sum(task.tree, parts)
    others = [rank(r) for r in task.readers if r != me]
    link.send(others, f"{task.tag}/sum/{task.index}", to_host(mine_sum))
    sums = [mine_sum if s == task.index else link.recv(rank(r), f"{task.tag}/sum/{s}")
            for s, r in enumerate(task.readers)]
    ref = next((x for x in sums if on_gpu(x)), sums[0])
    return array_module(ref).concatenate([like(x, ref) for x in sums])


def run_piece(piece: Piece, *inputs: Any) -> Ran:
    """``window-<first>-<last>-w<rank>``: this worker's chain, its messages over the mesh
    (raises :class:`~dtrain.deploy.p2p.Misplaced` on a worker that is not rank ``rank``)."""
    from distributed import get_worker

    mesh = piece.mesh
    try:
        here = get_worker().address
    except ValueError:
        here = None
    if here != mesh.workers[piece.rank]:
        raise p2p.Misplaced(f"rank {piece.rank}'s window task of mesh {mesh.run} ran on "
                            f"{here}, not on {mesh.workers[piece.rank]} (which left)")
    leave_pool()
    return run_on(p2p.node(mesh.run, piece.rank), piece, *inputs)


def run_on(node: p2p.Node, piece: Piece, *inputs: Any) -> Ran:
    """Run ``piece``'s chain with ``node``'s connections; if it fails, shut the mesh down
    first, so that its peers stop at their next message."""
    try:
        if piece.follows is not None:
            node.turn(piece.follows, piece.timeout)
        to = (*piece.to, *([piece.report] if piece.report is not None else ()))
        _local().link = link = node.link(piece.mesh, to, (*piece.frm, *piece.collect),
                                         piece.timeout)
        try:
            ran = run_chain(piece.chain, *inputs,
                            spans=max(64, SPANS // len(piece.mesh.workers)))
            ran = dataclasses.replace(ran, sent=(link.messages, link.bytes), via=link.via())
            if piece.report is not None:
                link.send([piece.report], REPORT, dataclasses.replace(ran, values=()))
            out = merged(ran, [link.recv(r, REPORT) for r in piece.collect])
            link.finish()
            return out
        finally:
            node.done(piece.first)
    except BaseException as exc:
        node.abort(f"rank {piece.rank}'s window task failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        _local().link = None


def merged(mine: Ran, others: list[Ran]) -> Ran:
    """The collector's result with every other chain's timings: seconds summed (the critical
    path: the longest chain's), messages and bytes sent summed, and how they went."""
    rans = [mine, *others]
    seconds: Counter[str] = Counter()
    for ran in rans:
        seconds.update(ran.seconds)
    seconds[CRITICAL] = max(ran.seconds.get(CRITICAL, 0.0) for ran in rans)   # side by side
    return dataclasses.replace(
        mine, seconds=dict(seconds), steps=max(ran.steps for ran in rans),
        sent=(sum(r.sent[0] for r in rans), sum(r.sent[1] for r in rans)),
        via=tuple(sorted({v for r in rans for v in r.via})),
        spans=tuple(g for r in rans for g in r.spans))


def span_meta(evals: tuple[int, ...], outputs: int, trim: Callable[[tuple], tuple] | None,
              ran: Ran) -> Ran:
    """A spanning window's evaluations (positions ``evals`` among the collector's outputs,
    ``trim``-med), every chain's timings (:func:`merged`), and when each of the window's
    ends and evaluations was done (0: an end on another worker)."""
    values = tuple(ran.values[i] for i in evals)
    before = (*(0.0,) * (outputs - len(evals)), *(ran.before_end[i] for i in evals))
    if len(ran.before_end) == len(ran.values) == outputs:       # every output here
        before = ran.before_end
    return dataclasses.replace(ran, values=values if trim is None else trim(values),
                               before_end=tuple(before))


def _parent(at: int) -> int:
    """A binomial tree's parent of position ``at`` (> 0): ``at`` less its highest bit."""
    return at - (1 << (at.bit_length() - 1))


@functools.lru_cache(maxsize=64)
def _spread(n: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """Who passes on a value made at position 0 of ``n`` members (the maker, then its other
    readers): each position that sends and the positions it sends to, parents before their
    children.  To up to :data:`DIRECT` readers the maker sends itself; to more, down a
    binomial tree (the farthest subtree first, as MPI's broadcast): no member sends more
    than ``log2 n`` copies, the last arriving ``ceil(log2 n)`` hops after it was made."""
    if n - 1 <= DIRECT:
        return ((0, tuple(range(1, n))),)
    out = []
    for at in sorted(range(n), key=lambda i: (i.bit_count(), i)):   # by depth: parents first
        kids = tuple(at + (1 << j) for j in reversed(range(n.bit_length()))
                     if (1 << j) > at and at + (1 << j) < n)
        out.append((at, kids))
    return tuple(out)       # the same for every value read as widely: worked out once


def workers_of(win: Window) -> list[str]:
    """The workers ``win``'s tasks sit on, in the order their first task was added."""
    return list(dict.fromkeys(where[0] for where in win.where.values()))


@dataclass
class Cut:
    """A window cut into chains: each worker's ``nodes`` (``(key, function, arguments)``)
    and their ``kinds``, the ranks each sends ``to`` and reads ``frm``, and ``sequence``:
    every ``(worker, node index)`` in the one global order the chains follow (what a model
    of the window's time walks)."""

    nodes: dict[str, list[tuple[str, Any, tuple[Any, ...]]]]
    kinds: dict[str, list[str | None]]
    to: dict[str, set[int]]
    frm: dict[str, set[int]]
    sequence: list[tuple[str, int]]

    def add(self, worker: str, node: tuple[str, Any, tuple[Any, ...]], kind: str | None
            ) -> None:
        self.sequence.append((worker, len(self.nodes[worker])))
        self.nodes[worker].append(node)
        self.kinds[worker].append(kind)


def _twice(win: Window, order: list[str], where: dict[str, str],
           readers: dict[str, dict[str, None]], rank: dict[str, int]
           ) -> dict[str, dict[str, list[str]]]:
    """Sums worth making on both their inputs' workers: a ``reduce`` of two values made on
    two workers, read on the second's (the root's sum of a fan-in-2 tree's root level,
    which every worker reads: :func:`dtrain.taskgraph.dataparallel.add_replicated_step`).
    The second input's maker gets the first input too (the message that brought it the
    sum) and adds the two itself, in the same order: the same bytes, a hop sooner; each
    maker then sends the sum to half of the other readers (the lower ranks to the maker
    of lower rank), down a binomial tree of half the members.  Returns ``{key: {maker:
    its readers}}``; ``readers`` gains the input's new reader."""
    out: dict[str, dict[str, list[str]]] = {}
    for k in order:
        node = win.dsk[k]
        if k not in readers or keys.kind_of(k) != keys.REDUCE or not isinstance(node, Task):
            continue
        refs = [a for a in node.args if type(a) is TaskRef]
        if len(refs) != 2 or any(a.key not in where for a in refs):
            continue
        first, second = (where[a.key] for a in refs)
        if first != where[k] or second == first or second not in readers[k]:
            continue                # (the first input to the second maker: no message more)
        low, high = sorted((first, second), key=rank.__getitem__)
        others = sorted((r for r in readers[k] if r != second), key=rank.__getitem__)
        half = (len(others) + 1) // 2
        readers.setdefault(refs[0].key, {})[second] = None
        out[k] = {low: others[:half], high: others[half:]}
    return out


def cut(win: Window, rank: dict[str, int]) -> Cut:
    """Each worker's chain of ``win`` (``rank``: every worker's rank in the mesh): its tasks
    in one global order of the graph, a ``recv`` before the first task that reads a value
    made on another worker, a ``send`` after each value other workers read (down a binomial
    tree to more than :data:`DIRECT` of them, each relay right after the maker); a sum of
    two values made on two workers and read on the second's is made on both
    (:func:`_twice`)."""
    order = in_order(win.dsk)
    where = {k: win.where[k][0] for k in order}
    readers: dict[str, dict[str, None]] = {}        # key -> the other workers reading it
    for k in order:
        for dep in win.dsk[k].dependencies:
            if dep in where and where[dep] != where[k]:
                readers.setdefault(dep, {})[where[k]] = None
    twice = _twice(win, order, where, readers, rank)
    out = Cut({w: [] for w in rank}, {w: [] for w in rank}, {w: set() for w in rank},
              {w: set() for w in rank}, [])
    got: dict[str, set[str]] = {w: set() for w in rank}
    sender: dict[tuple[str, str], int] = {}     # (worker, key) -> the rank that sends it

    def task(w: str, key: str, fn: Any, args: tuple[Any, ...]) -> None:
        """Task ``key`` on worker ``w``, after a ``recv`` of each input made elsewhere."""
        for a in args:
            src = where.get(a.key) if type(a) is TaskRef else None
            if src is not None and src != w and a.key not in got[w]:
                frm = sender.get((w, a.key), rank[src])
                out.add(w, (a.key, recv, (frm, a.key)), RECV)
                got[w].add(a.key)
                out.frm[w].add(frm)
        out.add(w, (key, fn, args), keys.kind_of(key))
        got[w].add(key)
        if args and isinstance(args[0], Allreduce):     # it talks to several workers itself
            out.to[w].update(rank[p] for p in args[0].to())
            out.frm[w].update(rank[p] for p in args[0].frm())

    for k in order:
        w = where[k]
        key, fn, args = plain(win.dsk[k])
        makers = twice.get(k, {w: list(readers.get(k, ()))})
        for m in makers:
            task(m, key, fn, args)
        for m, them in makers.items():
            if not them:
                continue
            members = [m, *sorted(them, key=rank.__getitem__)]
            for at, kids in _spread(len(members)):
                me = members[at]
                if at:          # a relay: the value as soon as it comes, passed on at once
                    parent = rank[members[_parent(at)]]
                    out.add(me, (key, recv, (parent, key)), RECV)
                    got[me].add(key)
                    out.frm[me].add(parent)
                if kids:
                    ranks = tuple(rank[members[c]] for c in kids)
                    out.add(me, (key, send, (ranks, key, TaskRef(key))), SEND)
                    out.to[me].update(ranks)
                    sender.update(((members[c], key), rank[me]) for c in kids)
    return out


def steps(win: Window, first: int, last: int, run: str, mesh: p2p.Mesh, timeout: float,
          trim: Callable[[tuple], tuple] | None = None, follows: int | None = None
          ) -> Window:
    """``win`` cut into one task per worker whose edges between workers are messages (see
    the module docstring); ``mesh`` must hold every worker of ``win``.

    Parameters
    ----------
    win
        A window as a builder made it, on several workers.
    first, last
        The window's first and last step (they name its tasks).
    run
        The run id that ends every key.
    mesh
        The participants (:func:`dtrain.deploy.p2p.open_mesh`).
    timeout
        The longest a chain waits for a peer's message or connection.
    trim
        As :func:`dtrain.taskgraph.fuse.steps`' (early stopping's states).
    follows
        For a window launched while the one before it runs, on the same mesh: that
        window's first step.  Each task here starts only once that window's task on its
        worker ended: the two never read one worker's connections at once, and none waits
        for its peers while the window before still runs.
    """
    rank = {w: mesh.rank(w) for w in workers_of(win)}
    c = cut(win, rank)
    outputs = (*win.ends, *win.evals.values())
    where = {k: win.where[k][0] for k in outputs}
    # the collector: where the evaluations are (the root), which the meta reads alone
    collector = where[next(iter(win.evals.values()), win.ends[0] if win.ends else "")] \
        if outputs else next(iter(rank))
    if any(where[k] != collector for k in win.evals.values()):
        raise ValueError(f"the evaluations of window {first}-{last} sit on several workers")
    out = Window(ends=list(win.ends), join=win.join, evals=dict(win.evals), fused=win.fused)
    names, found = [], {}
    for i, w in enumerate(rank):
        mine = tuple(k for k in outputs if where[k] == w)
        found.update({k: (i, at) for at, k in enumerate(mine)})
        chain = chain_of(c.nodes[w], c.kinds[w], mine, last - first + 1, run)
        here = w == collector
        piece = Piece(Packed.of(chain), mesh, rank[w], tuple(sorted(c.to[w])), tuple(sorted(c.frm[w])),
                      timeout, None if here else rank[collector],
                      tuple(sorted(rank[v] for v in rank if v != w)) if here else (),
                      first, follows)
        names.append(out.add(Task(keys.make(keys.WINDOW, first, last, f"w{rank[w]}", run=run),
                                  run_piece, piece, *map(TaskRef, chain.inputs)), w,
                             sum(win.nbytes.get(k, 0) for k in mine)))
    for key in win.ends:
        i, at = found[key]
        out.add(Task(key, pick, TaskRef(names[i]), at), where[key], win.nbytes.get(key, 0))
    home = list(rank).index(collector)
    mine = [k for k in outputs if where[k] == collector]
    out.meta = out.add(Task(keys.make(keys.WINDOW, first, last, META, run=run), span_meta,
                            tuple(mine.index(k) for k in win.evals.values()), len(outputs),
                            trim, TaskRef(names[home])), collector)
    out.pieces = tuple(names)
    return out
