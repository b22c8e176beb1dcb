"""On a worker: a window described by the driver, built here into this worker's chain and run.

A window that spans workers reaches each worker as a :class:`Description` of a few
hundred bytes (its steps, where its state starts and is kept, its place in the run's
order of windows, :mod:`~dtrain.taskgraph.describe`), beside this worker's
:class:`Context`, made here once per mesh: its share of the schedule, its shards, its
part of each step's sum (:class:`~dtrain.taskgraph.collective.Program`) and the mesh.
:func:`run_window` expands the two into the worker's chain, step by step::

    state-<first>               the state kept here by the window before (or made, or sent)
    forward-backward-<t>-<s>    a subtree of shards held here, summed as the tree sums it
    allreduce-<t>-w<rank>       this worker's part of the step's sum (collective.run); where
                                the update is made where the sum is (Setup.where_made), its
                                piece of the root's sum updated here and sent on
    update-<t>-<s>              each worker's copy of the state after the step: updated from
                                the whole sum, or adopting the new parameters
    evaluate-<epoch>            at an epoch's end, on the collector
    kept-<stop>                 the end state, kept here for the next window

and runs it as a cut window's chain runs (:func:`dtrain.taskgraph.span.run_on`: its
messages over the mesh, its timings to the collector).  Every number of the sum is added
in the tree's order and updated by the same elementwise rule, wherever that is done, so
each copy is the same bytes, and those of one worker.  The driver's work per window is a
description per worker, whatever the number of steps.
"""
from __future__ import annotations

import dataclasses
import pickle
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dask.task_spec import TaskRef

from dtrain.core import keys
from dtrain.core.errors import UserError
from dtrain.deploy import p2p
from dtrain.maths.optim import Step, TrainState
from dtrain.taskgraph import collective, fuse, handoff, span
from dtrain.taskgraph.dataparallel import TINY_FLOPS
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.records import Evaluate, ForwardBackward, Group, Update
from dtrain.taskgraph.tasks import (adopt_update, evaluate, evaluate_part, evaluate_parts,
                                    forward_backward, update_state)
from dtrain.taskgraph.treesum import Tree, flat

FORMAT = 2                      # the description's format: a worker reads this one only
                                # (2: the update may be made where the sum is, Setup.where_made)
MAGIC = b"dtrW"
_HEAD = struct.Struct("!4sHI")  # magic, format, length of the pickle that follows


class DescriptionError(UserError):
    """A worker cannot build the window it was handed (another dtrain's format, a truncated
    description): the window fails with this one line."""


@dataclass(frozen=True)
class Steps:
    """A worker's share of the run's schedule: each epoch's learning rate, each position's
    samples, and the rows of this worker's shards at each position (``bounds``: (positions
    + 1, shards here)); a step is rebuilt from them, without the other shards' rows."""

    rates: tuple[float, ...]
    counts: tuple[int, ...]
    bounds: Any                             # (steps per epoch + 1, shards here) int64

    def step(self, index: int) -> Step:
        per = len(self.counts)
        epoch, t = divmod(index, per)
        return Step(index, epoch, t, self.rates[epoch], self.counts[t], t == 0, t == per - 1, ())

    def rows(self, t: int, p: int) -> tuple[int, int]:
        """Rows of this worker's ``p``-th shard in position ``t``'s minibatch."""
        return int(self.bounds[t, p]), int(self.bounds[t + 1, p])


@dataclass(frozen=True)
class Setup:
    """What a worker needs of a run on a mesh, made on the driver once per mesh: the
    ``recipe``, its ``program`` (rank ``rank``; the collector evaluates and returns the
    end), its ``shards`` (global indices, in order; their data arrive with the context
    task), its schedule (``steps``), the ``mesh``, whether it computes on a GPU, and its
    held-out data: ``val`` the one shard (on the collector), or ``parts`` (part indices)
    evaluated here and sent to the collector, whose ``part_ranks`` says who sends which."""

    recipe: Recipe
    program: collective.Program
    rank: int
    collector: int
    shards: tuple[int, ...]
    steps: Steps
    mesh: p2p.Mesh
    gpu: bool = False
    val: bool = False
    parts: tuple[int, ...] = ()
    part_ranks: tuple[tuple[int, int], ...] = ()     # (part, rank): every part, collector's
    where_made: bool = False        # each step's update made where its sum is (Layout's)


@dataclass(frozen=True)
class Context:
    """A :class:`Setup` with this worker's shards and held-out data, as its task made it."""

    setup: Setup
    shards: tuple[Any, ...]
    held: tuple[Any, ...]


def context(setup: Setup, *data: Any) -> Context:
    """``context-<mesh>-w<rank>``: the worker's context (``data``: its shards in order, then
    its held-out data), made where it runs."""
    n = len(setup.shards)
    return Context(setup, tuple(data[:n]), tuple(data[n:]))


@dataclass(frozen=True)
class Description:
    """A window as the driver describes it to one worker: steps ``first`` to ``last`` of
    ``run``; it starts from ``start`` (the state kept here, made from the seed) or, None,
    from the state given as its input, and keeps its end as ``keep``; ``timeout``: the
    longest wait for a peer; ``follows``: the first step of the window before it on the
    same mesh, still running when this one was launched; ``trim``: as the fused window's."""

    run: str
    first: int
    last: int
    start: handoff.Handed | handoff.Fresh | None
    keep: handoff.Handed
    timeout: float
    follows: int | None = None


@dataclass(frozen=True)
class Described:
    """A :class:`Description` as bytes: a header (format, length) and its pickle, so that a
    worker tells one it cannot read from a window it can run (:func:`read`)."""

    data: bytes

    @classmethod
    def of(cls, desc: Description) -> Described:
        body = pickle.dumps(desc, protocol=5)
        return cls(_HEAD.pack(MAGIC, FORMAT, len(body)) + body)


def read(described: Described, where: str) -> Description:
    """The description in ``described``; raises :class:`DescriptionError` (naming the worker
    ``where``) for another format or a truncated one."""
    data = getattr(described, "data", b"")
    head = data[:_HEAD.size]
    if len(head) < _HEAD.size or head[:4] != MAGIC:
        raise DescriptionError(f"worker {where} cannot build its window: the description is "
                               f"not a dtrain window description ({len(data)} bytes)")
    _, fmt, length = _HEAD.unpack(head)
    if fmt != FORMAT:
        raise DescriptionError(f"worker {where} cannot build its window: the description has "
                               f"format {fmt}, this worker's dtrain reads format {FORMAT} "
                               f"(run the same dtrain version on the driver and the workers)")
    body = data[_HEAD.size:]
    if len(body) != length:
        raise DescriptionError(f"worker {where} cannot build its window: the description is "
                               f"truncated ({len(body)} of {length} bytes)")
    try:
        desc = pickle.loads(body)
    except Exception as exc:
        raise DescriptionError(f"worker {where} cannot build its window: the description "
                               f"does not unpickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(desc, Description):
        raise DescriptionError(f"worker {where} cannot build its window: the description "
                               f"holds a {type(desc).__name__}")
    return desc


def step_sum(program: collective.Program, tag: str, *made: Any) -> Any:
    """``allreduce-<t>-w<rank>``: this worker's part of the step's sum, over the running
    window's connections; returns the whole sum."""
    return _over_mesh(program, tag, made, None)


def step_sum_update(program: collective.Program, tag: str, task: Update, state: TrainState,
                    *made: Any) -> Any:
    """``allreduce-<t>-w<rank>`` where the update is made where the sum is
    (:attr:`Setup.where_made`): this worker's part of the step's sum, each piece of the
    root's sum made here updated at once (:meth:`~dtrain.maths.optim.Optimizer.segment_step`)
    and sent on as new parameters; returns ``[new params | loss | correct]``, whole."""
    opt, step = task.opt, task.steps[-1]
    return _over_mesh(program, tag, made,
                      lambda lo, piece: opt.segment_step(state, piece, lo, step))


def _over_mesh(program: collective.Program, tag: str, made: tuple,
               at_root: Callable[[int, Any], Any] | None) -> Any:
    link = span.current()
    clock = time.perf_counter

    def recv(rank: int, name: str) -> Any:       # its waits drawn as their own spans
        start = clock()
        got = link.recv(rank, name)
        fuse.note(span.RECV_WAIT, start, clock(), keys.ALLREDUCE)
        return got

    return collective.run(program, made, tag, lambda r, t, x: link.send((r,), t, x), recv,
                          at_root)


def _group(shards: tuple[int, ...], subtree: Tree, rows: tuple[tuple[int, int], ...],
           recipe: Recipe, gpu: bool) -> Group:
    """The :class:`Group` of a subtree this worker sums: its shards' rows this step, their
    nesting, and how many threads may share them (none for tiny shards or a GPU)."""
    if isinstance(subtree, int):
        return Group.one(subtree, rows[0])
    at = {s: p for p, s in enumerate(shards)}

    def positions(t: Tree) -> Tree:
        return at[t] if isinstance(t, int) else tuple(positions(c) for c in t)

    worth = recipe.net.flops(max(hi - lo for lo, hi in rows)) > TINY_FLOPS
    threads = len(shards) if worth and not gpu else 1
    return Group(shards, rows, positions(subtree), threads,
                 processes=threads > 1 and recipe.cores != "threads")


def chain(ctx: Context, desc: Description) -> tuple[fuse.Chain, tuple, tuple]:
    """This worker's chain of the window (see the module docstring), the ranks it sends to
    and reads from, as the collector's outputs: the end, then the evaluations."""
    s, run = ctx.setup, desc.run
    r, recipe, prog = s.rank, s.recipe, s.program
    here = s.rank == s.collector
    nodes: list[tuple[str, Any, tuple]] = []
    kinds: list[str | None] = []
    local = {g: p for p, g in enumerate(s.shards)}
    made = [(sub, tuple(flat(sub))) for _, sub in prog.made]
    shard_keys = [f"shard-{g}" for g in s.shards]
    held_keys = [f"held-{i}" for i in range(len(ctx.held))]
    to, frm = (set(x) for x in prog.peers())

    state = f"{keys.STATE}-{desc.first}-{run}"
    if desc.start is None:
        state = "literal"
    elif isinstance(desc.start, handoff.Handed):
        nodes.append((state, handoff.take, (desc.start,)))
        kinds.append(keys.STATE)
    else:
        nodes.append((state, handoff.fresh, (desc.start,)))
        kinds.append(keys.STATE)
    evals: list[str] = []
    for t in range(desc.first, desc.last + 1):
        step = s.steps.step(t)
        pos = step.position
        sums = []
        for sub, shards in made:
            rows = tuple(s.steps.rows(pos, local[g]) for g in shards)
            record = ForwardBackward(recipe.net, recipe.shuffle_seed, step.epoch,
                                     _group(shards, sub, rows, recipe, s.gpu), False)
            key = f"{keys.FORWARD_BACKWARD}-{t}-{shards[0]}-{run}"
            nodes.append((key, forward_backward,
                          (record, TaskRef(state), *(TaskRef(shard_keys[local[g]])
                                                     for g in shards))))
            kinds.append(keys.FORWARD_BACKWARD)
            sums.append(TaskRef(key))
        total = f"{keys.ALLREDUCE}-{t}-w{r}-{run}"
        new = f"{keys.UPDATE}-{t}-{s.shards[0]}-{run}"
        update = Update(recipe.opt, (step,), t == desc.last,
                        recipe.events_for(step, run) if here else None)
        if s.where_made:
            nodes.append((total, step_sum_update, (prog, str(t), update, TaskRef(state), *sums)))
            nodes.append((new, adopt_update, (update, TaskRef(state), TaskRef(total))))
        else:
            nodes.append((total, step_sum, (prog, str(t), *sums)))
            nodes.append((new, update_state, (update, TaskRef(state), TaskRef(total))))
        kinds += [keys.ALLREDUCE, keys.UPDATE]
        state = new
        if step.last:
            record = Evaluate(recipe.net, step.epoch, recipe.keep_states)
            name = keys.make(keys.EVALUATE, step.epoch + 1, run=run)
            if s.val or not s.part_ranks:
                if here:
                    nodes.append((name, evaluate, (record, TaskRef(state),
                                                   TaskRef(held_keys[0]) if s.val else None)))
                    kinds.append(keys.EVALUATE)
                    evals.append(name)
                continue
            for i, part in enumerate(s.parts):      # this worker's parts, each sent on
                key = keys.make(keys.EVALUATE, step.epoch + 1, part, run=run)
                nodes.append((key, evaluate_part, (record, TaskRef(state),
                                                   TaskRef(held_keys[i]))))
                kinds.append(keys.EVALUATE)
                if not here:
                    nodes.append((key, span.send, ((s.collector,), key, TaskRef(key))))
                    kinds.append(span.SEND)
                    to.add(s.collector)
            if here:
                refs = []
                for part, rank in s.part_ranks:
                    key = keys.make(keys.EVALUATE, step.epoch + 1, part, run=run)
                    if rank != r:
                        nodes.append((key, span.recv, (rank, key)))
                        kinds.append(span.RECV)
                        frm.add(rank)
                    refs.append(TaskRef(key))
                nodes.append((name, evaluate_parts, (record, TaskRef(state), *refs)))
                kinds.append(keys.EVALUATE)
                evals.append(name)
    end = keys.make(keys.KEPT, desc.last + 1, run=run)
    nodes.append((end, handoff.keep, (desc.keep, TaskRef(state))))
    kinds.append(keys.KEPT)
    outputs = (end, *evals) if here else ()
    built = fuse.chain_of(nodes, kinds, outputs, desc.last - desc.first + 1, run)
    return built, tuple(sorted(to)), tuple(sorted(frm))


def run_window(described: Described, ctx: Context, *literal: Any) -> fuse.Ran:
    """``window-<first>-<last>-w<rank>``: build this worker's chain from ``described`` and
    ``ctx`` (``literal``: the start state, where the description says it is given) and run
    it over the mesh (raises :class:`DescriptionError` for a description it cannot read,
    :class:`~dtrain.deploy.p2p.Misplaced` on a worker that is not its rank)."""
    from distributed import get_worker

    try:
        here = get_worker().address
    except ValueError:
        here = None
    s = ctx.setup
    try:
        desc = read(described, here or "(not a Dask worker)")
    except DescriptionError as exc:        # its peers stop at once, not at their timeout
        try:
            p2p.node(s.mesh.run, s.rank).abort(str(exc))
        except p2p.Misplaced:
            pass
        raise
    if here != s.mesh.workers[s.rank]:
        raise p2p.Misplaced(f"rank {s.rank}'s window task of mesh {s.mesh.run} ran on "
                            f"{here}, not on {s.mesh.workers[s.rank]} (which left)")
    fuse.leave_pool()
    built, to, frm = chain(ctx, desc)
    inputs = {**dict(zip((f"shard-{g}" for g in s.shards), ctx.shards)),
              **{f"held-{i}": h for i, h in enumerate(ctx.held)},
              "literal": literal[0] if literal else None}
    piece = span.Piece(built, s.mesh, s.rank, to, frm, desc.timeout,
                       None if s.rank == s.collector else s.collector,
                       tuple(r for r in range(len(s.mesh.workers)) if r != s.collector)
                       if s.rank == s.collector else (), desc.first, desc.follows)
    return span.run_on(p2p.node(s.mesh.run, s.rank), piece, *(inputs[k] for k in built.inputs))


def end_and_meta(outputs: int, trim: Any, ran: fuse.Ran) -> fuse.Ran:
    """``kept-<step>`` of a described window, on the collector: its end state and its meta
    in one value, one task for the scheduler where a fused window has two (the pick of
    the end, the meta): :func:`~dtrain.taskgraph.span.span_meta`'s evaluations
    (``trim``-med) and every chain's timings, the end state before the evaluations
    (:meth:`~dtrain.taskgraph.window.Window.unpack` takes it out)."""
    meta = span.span_meta(tuple(range(1, outputs)), outputs, trim, ran)
    return dataclasses.replace(meta, values=(ran.values[0], *meta.values))
