"""A graph pass: a step's sums that every worker reads are reduced in segments, worker to worker.

With replicated updates (the ``allreduce`` default) every worker reads each step's
root level of partial sums (:func:`dtrain.taskgraph.dataparallel.add_replicated_step`).
In a window cut across workers (:mod:`dtrain.taskgraph.span`) the maker of each of
those sums would send it whole to every other worker: on 4 workers at fan-in 2, the
two makers each send 3 buffers a step and the two others 1, 8 buffers in all.

This pass reduces such a step the way MPI's allreduce moves a large buffer (a
reduce-scatter, then an allgather), in one node per worker and step,
``allreduce-<step>-<s>`` (:class:`~dtrain.taskgraph.span.Allreduce`).  The tree's
buffers are cut into as many segments as workers read the sums
(:func:`~dtrain.taskgraph.treesum.even_parts`), each where it was made (a forward-backward's
buffer, or a reduce whose inputs all sit on its worker, which stays as it was); worker
``s`` sums segment ``s`` over the rest of the tree, the same buffers nested as the
reduce tasks and the readers added them, and sends its sum to every other reader; each
reader puts the segments back together and reads that one buffer where it read the root
level.  Each number is the sum of the same numbers in the same order: the same bytes.
Each worker sends ``2 (W - 1) / W`` buffers' worth a step (6 buffers in all on 4
workers, none more than 1.5), in ``2 (W - 1)`` messages.

The engine runs it on a window that spans workers (through the scheduler a step keeps a
task per reduce), before :func:`dtrain.taskgraph.span.steps`, where it pays: on at least
:data:`MIN_WORKERS` readers (on 2, the tree moves the same bytes in half the messages),
at most :data:`MAX_SEGMENTS` (beyond, a worker's ``2 (W - 1)`` messages a step outweigh
the bytes saved against the tree's ``log W`` hops) and segments of at least
:data:`MIN_SEGMENT_BYTES` (a small net's step is latency: its tree is left as built).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dask.task_spec import GraphNode, Task, TaskRef

from dtrain.core import keys
from dtrain.taskgraph.fuse import in_order
from dtrain.taskgraph.records import ForwardBackward, Update
from dtrain.taskgraph.span import Allreduce, allreduce
from dtrain.taskgraph.treesum import Tree, even_parts
from dtrain.taskgraph.window import Window

MIN_WORKERS = 3                 # readers of a step's sums, at least
MAX_SEGMENTS = 16               # ... and at most
MIN_SEGMENT_BYTES = 16 << 10    # the smallest segment worth its own messages


def _reads(node: GraphNode) -> tuple[int, tuple[int, ...], int] | None:
    """For a task that applies replicated updates from partial sums: where its partial sums
    start among its arguments, how many each step has (``widths``, as its record has them)
    and how many steps; None for any other task.  Its record says which it is: a
    ``ForwardBackward`` with ``updates``, or an ``Update`` (an ``update`` key may hold
    another record: local SGD's ``Average``)."""
    record = node.args[0] if isinstance(node, Task) and node.args else None
    if isinstance(record, ForwardBackward) and record.updates is not None:
        return 2 + len(record.group.shards), record.updates.widths, len(record.updates.steps)
    if isinstance(record, Update):
        return 2, record.widths, len(record.steps)
    return None


def _by_step(refs: Sequence[Any], widths: tuple[int, ...], steps: int) -> list[tuple]:
    """Partial sums in turn by step: ``widths[j]`` for step ``j``, the rest for the last (as
    :func:`~dtrain.taskgraph.tasks.update_state` reads them)."""
    out, at = [], 0
    for width in widths[:steps - 1]:
        out.append(tuple(refs[at:at + width]))
        at += width
    out.append(tuple(refs[at:]))
    return out


def _rewritten(node: Task, start: int, groups: list[tuple]) -> Task:
    """``node`` reading ``groups`` (each step's partial sums), with the widths they have."""
    record, widths = node.args[0], tuple(map(len, groups))
    record = dataclasses.replace(record, updates=dataclasses.replace(
        record.updates, widths=widths)) if isinstance(record, ForwardBackward) \
        else dataclasses.replace(record, widths=widths)
    return Task(node.key, node.func, record, *node.args[1:start],
                *(ref for group in groups for ref in group))


class _Step:
    """One step's sums (``top``, the root level) and the ``readers`` that read them: the
    tree above them down to the buffers summed where they were made."""

    def __init__(self, win: Window, top: tuple[str, ...], readers: list[str], run: str,
                 itemsize: int):
        self.win, self.readers = win, readers
        self.values: list[str] = []
        self.whole: dict[str, bool] = {}
        tree = tuple(self._tree(k) for k in top)
        self.tree: Tree = tree if len(tree) > 1 else tree[0]
        self.holders = tuple(win.where[v][0] for v in self.values)
        self.n = max(win.nbytes.get(k, 0) for k in top) // itemsize    # numbers per buffer
        self.worth = self.n * itemsize >= MIN_SEGMENT_BYTES * len(readers) and \
            set(self.holders) <= set(readers)
        step = keys.parse(top[0]).step
        self.tag = keys.make(keys.ALLREDUCE, step, run=run)
        self.names = [keys.make(keys.ALLREDUCE, step, s, run=run) for s in range(len(readers))]

    def _stays(self, key: str) -> bool:
        """A buffer summed whole where it was made: not a reduce, or one whose inputs all
        stay on its worker."""
        if key not in self.whole:
            here = self.win.where[key][0]
            self.whole[key] = keys.kind_of(key) != keys.REDUCE or all(
                self.win.where[d][0] == here and self._stays(d)
                for d in self.win.dsk[key].dependencies)
        return self.whole[key]

    def _tree(self, key: str) -> Tree:
        if self._stays(key):
            self.values.append(key)
            return len(self.values) - 1
        return tuple(self._tree(a.key) for a in self.win.dsk[key].args[1:])

    def nodes(self) -> list[tuple[Task, str]]:
        """Each reader's ``allreduce-<step>-<s>``, and where it runs."""
        return [(Task(name, allreduce,
                      Allreduce(self.tree, self.holders, tuple(self.readers), s, self.n,
                                self.tag),
                      *(TaskRef(v) for v, h in zip(self.values, self.holders) if h == w)), w)
                for s, (name, w) in enumerate(zip(self.names, self.readers))]


def split(win: Window, run: str, itemsize: int) -> Window:
    """``win`` with each step's sums that :data:`MIN_WORKERS` to :data:`MAX_SEGMENTS`
    workers read reduced in segments (see the module docstring); unchanged where none are.

    Parameters
    ----------
    win
        A window as a builder made it.
    run
        The run id that ends every key.
    itemsize
        Bytes per number of the gradient buffers.
    """
    order = in_order(win.dsk)
    readers: dict[tuple[str, ...], dict[str, None]] = {}     # a step's sums -> their readers
    reads: dict[str, tuple[int, list[tuple]]] = {}
    for key in order:
        found = _reads(win.dsk[key])
        if found is None:
            continue
        start, widths, steps = found
        groups = _by_step(win.dsk[key].args[start:], widths, steps)
        reads[key] = start, groups
        for group in groups:
            readers.setdefault(tuple(a.key for a in group), {})[win.where[key][0]] = None
    found_steps = {top: _Step(win, top, list(who), run, itemsize)
                   for top, who in readers.items() if MIN_WORKERS <= len(who) <= MAX_SEGMENTS}
    plans = {top: step for top, step in found_steps.items() if step.worth}
    if not plans:
        return win
    out = Window(ends=list(win.ends), join=win.join, evals=dict(win.evals), fused=win.fused)
    for key in order:
        node = win.dsk[key]
        if key in reads:
            start, groups = reads[key]
            worker, new = win.where[key][0], []
            for group in groups:
                step = plans.get(tuple(a.key for a in group))
                if step is None:
                    new.append(group)
                    continue
                if step.names[0] not in out.dsk:    # every reader's, side by side: no
                    for task, where in step.nodes():    # worker waits in one for a peer
                        out.add(task, where, win.nbytes.get(group[0].key, 0))  # in another
                new.append((TaskRef(step.names[step.readers.index(worker)]),))
            node = _rewritten(node, start, new)
        out.add(node, win.where[key][0], win.nbytes.get(key, 0))
    return _pruned(out)


def _pruned(win: Window) -> Window:
    """``win`` without the reduces nobody reads any more (those the segments replaced)."""
    wanted = {*win.ends, *win.evals.values()}
    while True:
        read = {d for node in win.dsk.values() for d in node.dependencies}
        gone = [k for k in win.dsk if k not in read and k not in wanted
                and keys.kind_of(k) == keys.REDUCE]
        if not gone:
            return win
        for k in gone:
            del win.dsk[k], win.where[k], win.nbytes[k]


def traffic(win: Window, itemsize: int) -> tuple[int, int]:
    """The messages and bytes ``win``'s allreduce nodes send between workers, which its
    edges do not show (each node's inputs and readers are on its own worker)."""
    messages = nbytes = 0
    for node in win.dsk.values():
        task = node.args[0] if isinstance(node, Task) and node.args else None
        if not isinstance(task, Allreduce):
            continue
        of, me = len(task.readers), task.readers[task.index]
        held = sum(h == me for h in task.holders)
        for s, cut in enumerate(even_parts(task.n, of)):
            copies = of - 1 if s == task.index else held    # its sum to the others, or
            messages += copies                              # its buffers' segment s
            nbytes += copies * len(cut) * itemsize
    return messages, nbytes
