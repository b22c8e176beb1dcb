"""The graph passes, in one place and one order: a built window to what is submitted.

The builders build a window step by step (``forward-backward``, ``reduce``, ``update``,
``evaluate``).  :func:`optimize` turns it into what the engine submits, the way dask's
``optimize`` chains its passes over a graph, each pass a function of the graph alone:

1. :func:`dtrain.taskgraph.segments.split` (``graph.reduce = "segments"``, a window on
   several workers): a step's sums reduced in segments, worker to worker;
2. :func:`dtrain.taskgraph.handoff.rewrite`: the window ends in ``kept-<stop>`` and starts
   from the state kept where it starts (or made there from the seed);
3. with ``graph.fuse_steps``, :func:`dtrain.taskgraph.fuse.steps` (every task on one
   worker: one task) or :func:`dtrain.taskgraph.span.steps` (several: a task per worker,
   its crossings messages over a mesh).

It also counts what the window sends between workers, as the graph says before any pass
hides it in a chain (:class:`Passed`).  Windows of the allreduce strategies across workers
are not built and passed at all, but described (:mod:`~dtrain.taskgraph.describe`).

A pass reads what a node says it is: its kind, from its key
(:func:`dtrain.core.keys.kind_of`), and where it reads a task's arguments, the type of their
record (:mod:`~dtrain.taskgraph.records`); never which function the task calls.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtrain.deploy import p2p
from dtrain.taskgraph import fuse, handoff, segments, span
from dtrain.taskgraph.window import Window


@dataclass(frozen=True)
class Options:
    """What the passes need beside the window: its ``run`` and steps ``start`` to ``stop -
    1``; ``fuse_steps`` and ``segments`` (the config's); ``itemsize`` (a gradient number's
    bytes); the handoff's ``take``, ``made``, ``wait`` and ``attempt``; the fused or cut
    window's ``trim``, ``follows`` and ``timeout`` (a peer's longest wait); ``mesh``:
    the mesh of a set of workers (the engine's, opened or reused)."""

    run: str
    start: int
    stop: int
    fuse_steps: bool = True
    segments: bool = False
    itemsize: int = 4
    take: bool = False
    made: handoff.Fresh | None = None
    wait: float = 0.0
    attempt: int = 0
    trim: Callable[[tuple], tuple] | None = None
    follows: int | None = None
    timeout: float = 60.0
    mesh: Callable[[list[str]], p2p.Mesh] | None = None


@dataclass(frozen=True)
class Passed:
    """A window after the passes, and what it sends between workers each window: messages
    and bytes (``located`` placing the keys from outside it), ``segmented`` if its sums go
    in segments, the bytes of the literal state it still carries."""

    win: Window
    messages: int
    nbytes: int
    segmented: bool
    literal_bytes: int


def optimize(win: Window, opts: Options, located: dict[Any, str] | None = None) -> Passed:
    """``win`` through the passes, in order (see the module docstring)."""
    messages = nbytes = 0
    segmented = False
    if opts.segments and opts.fuse_steps and fuse.one_worker(win) is None:
        win = segments.split(win, opts.run, opts.itemsize)
        messages, nbytes = segments.traffic(win, opts.itemsize)
        segmented = messages > 0
    moves = win.transfers(located or {})
    messages += len(moves)
    nbytes += sum(win.nbytes.get(k, 0) for k, _, _ in moves)
    win = handoff.rewrite(win, opts.run, opts.start, opts.stop, opts.take, opts.made, opts.wait,
                          opts.attempt)
    literal = handoff.literal_size(win)
    if opts.fuse_steps:                                 # a task per worker and window
        if fuse.one_worker(win) is not None:
            win = fuse.steps(win, opts.start, opts.stop - 1, opts.run, opts.trim)
        elif win.dsk:
            if opts.mesh is None:
                raise ValueError("a window across workers needs a mesh to be cut")
            win = span.steps(win, opts.start, opts.stop - 1, opts.run,
                             opts.mesh(span.workers_of(win)), opts.timeout, opts.trim,
                             opts.follows)
    return Passed(win, messages, nbytes, segmented, literal)
