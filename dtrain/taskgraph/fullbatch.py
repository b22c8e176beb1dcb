"""Full-batch evaluations as task graphs, and a whole L-BFGS run as one task on one worker.

An L-BFGS iteration (``optim.name = "lbfgs"``) needs the loss and gradient over the whole
training set, once or a few times (its line search).  Each such evaluation is a
data-parallel step without its update::

    state-<e>                          the parameters to evaluate, a literal on the root
    forward-backward-<e>-<shard>       every row of the shard, on the worker holding it (a
                                       worker's shards in one task where the tree groups them)
    reduce-<e>-<level>-<first shard>   the tree, fan-in k, children in shard order
    reduce-<e>-total                   the root level's sum, on the root: ``[grad | loss |
                                       correct]``, for the driver

so its bytes are the same on any number of workers; the driver runs scipy's L-BFGS-B on
them (:mod:`dtrain.training.fullbatch`).  Where every shard sits on one worker the whole
run goes there instead, as one task (``lbfgs-<e>``, :func:`run_on_worker`), each
evaluation the one ``forward-backward`` that worker's graph has (every shard, summed as
the tree sums them): no round trip per evaluation, the same bytes, as a fused window
(:mod:`~dtrain.taskgraph.fuse`) runs a window of steps.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.maths.lbfgs import Minimized, minimize, raw_units
from dtrain.maths.optim import Step, TrainState
from dtrain.taskgraph.dataparallel import fuse_choice, leaf_tasks, step_leaves, step_tree
from dtrain.taskgraph.placement import Placement
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.records import ForwardBackward, FullBatch, Reduce
from dtrain.taskgraph.tasks import forward_backward, reduce
from dtrain.taskgraph.window import Window

TOTAL = "total"     # the part that names an evaluation's sum on the root


def full_step(index: int, sizes: Sequence[int]) -> Step:
    """Evaluation ``index`` as a step: every row of each shard (of ``sizes`` rows), in
    order, no update."""
    return Step(index, 0, 0, 0.0, sum(sizes), True, True, tuple((0, n) for n in sizes))


def evaluation(index: int, params: Any, shards: Sequence[TaskRef], sizes: Sequence[int],
               placement: Placement, recipe: Recipe, run: str) -> Window:
    """The graph of evaluation ``index`` at ``params`` (P,) (see the module's docstring):
    its end, ``reduce-<index>-total``, is the summed buffer ``[grad (P) | loss | correct]``
    in host memory."""
    win = Window()
    step = full_step(index, sizes)
    fuse, why = fuse_choice(recipe, placement, max(sizes))
    recipe = dataclasses.replace(recipe, fuse_shards="true" if fuse else "false")
    state = win.add(DataNode(keys.make(keys.STATE, index, run=run), TrainState(params)),
                    placement.root, recipe.state_bytes)
    leaves = step_leaves(keys.FORWARD_BACKWARD, index, shards, placement, run)
    top, crosses, spec = step_tree(win, index, leaves, placement, recipe, run)
    for name, _, worker, group, refs in leaf_tasks(leaves, spec, step, shards, placement,
                                                    recipe):
        task = ForwardBackward(recipe.net, None, step.epoch, group, crosses[name])
        win.add(Task(name, forward_backward, task, TaskRef(state), *refs), worker,
                recipe.leaf_bytes)
    total = Task(keys.make(keys.REDUCE, index, TOTAL, run=run), reduce, Reduce(True),
                 *(TaskRef(g[0]) for g in top))
    win.ends = [win.add(total, placement.root, recipe.leaf_bytes)]
    win.fused = (fuse, why)
    return win


def one_leaf(sizes: Sequence[int], placement: Placement, recipe: Recipe,
             run: str) -> ForwardBackward:
    """The record of the one ``forward-backward`` an evaluation has where every shard sits
    on ``placement``'s one worker (its shards fused, summed as the tree sums them)."""
    shards = [TaskRef(keys.make(keys.LOAD_SHARD, i, run=run)) for i in range(len(sizes))]
    win = evaluation(0, None, shards, sizes, placement,
                     dataclasses.replace(recipe, fuse_shards="true"), run)
    (leaf,) = [node.args[0] for key, node in win.dsk.items()
               if keys.kind_of(key) == keys.FORWARD_BACKWARD]
    return leaf


def run_on_worker(task: FullBatch, state: TrainState, *shards: Any) -> Minimized:
    """A whole L-BFGS run from ``state``, in this task (see :class:`FullBatch`)."""
    net = task.leaf.net

    def gradient(params: Any) -> Any:
        return forward_backward(task.leaf, TrainState(params), *shards)

    return minimize(gradient, state.vector[:net.size], net, task.optim, task.l2, task.samples,
                    task.iterations, units=raw_units(net, task.shift, task.scale))


def on_worker(index: int, start: TrainState, task: FullBatch, shards: Sequence[TaskRef],
              worker: str, run: str) -> Window:
    """The graph of a whole L-BFGS run on ``worker``: ``lbfgs-<index>`` from the literal
    state ``start``; its end is the run's :class:`~dtrain.maths.lbfgs.Minimized`."""
    win = Window()
    state = win.add(DataNode(keys.make(keys.STATE, index, run=run), start), worker)
    win.ends = [win.add(Task(keys.make(keys.LBFGS, index, run=run), run_on_worker, task,
                             TaskRef(state), *shards), worker)]
    return win
