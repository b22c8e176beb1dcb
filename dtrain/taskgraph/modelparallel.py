"""Model parallelism's tasks and graph: each hidden layer's units split across slices.

The split and one slice's maths are :mod:`dtrain.maths.slicing`.  Every
worker holds the whole training set, loaded once, so only activations the
width of a block's output cross the network, not weights::

    forward-<s>-<j>-<m>      z = A W_r[U_m]^T + b_r[U_m]; a = act(z); partial = a W_c[:, U_m]^T
    reduce-<s>f<j>-...       tree sum of the partials over slices, in slice order
    combine-<s>-<j>          (root) A_next = act(sum + b_c)           (blocks before the last)
    loss-<s>                 (root) logits, loss, correct predictions, dL/dZ; head and
                             bias gradients
    backward-<s>-<j>-<m>     recompute a, then dW_c, dW_r, db_r and this slice's update;
                             for j > 0 also the slice's share of dL/dA (input-grad-<s>-<j>-<m>)
    reduce-<s>b<j>-...       tree sum of those shares
    back-combine-<s>-<j>     (root) dL/dZ for block j - 1
    update-<s>               (root) the head and the column biases

The backward task recomputes its slice's hidden activations instead of
shipping them from the forward task: one more ``A W_r^T`` product buys not
moving ``B x |U_m|`` numbers.  Each slice's state (parameters and optimizer
slots) never leaves its worker during a window.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.core.arrays import align_on_unpickle, array_module, sum_in_order
from dtrain.core.events import step_event
from dtrain.data.shards import ShardSource, load_shards
from dtrain.maths.model import ACTIVATIONS, LOSSES, TAIL
from dtrain.maths.optim import Optimizer, Step, TrainState, update
from dtrain.maths.slicing import Slicing, slice_backward, slice_forward, views
from dtrain.taskgraph.placement import Placement, Worker
from dtrain.taskgraph.recipe import Recipe
from dtrain.taskgraph.records import (BackCombine, Combine, Evaluate, EvaluateSlices, Loss,
                                      RootUpdate, SliceBackward, SliceForward, Spec)
from dtrain.taskgraph.reduction import tree
from dtrain.taskgraph.tasks import evaluate
from dtrain.taskgraph.window import DataItem, Window


@align_on_unpickle
@dataclass(frozen=True)
class SliceOut:
    """A backward task's result: the slice's new state, and (blocks after the first) the
    slice's share of dL/dA for the block below."""

    state: TrainState
    dA: Any = None
    _arrays = ("dA",)


@dataclass(frozen=True)
class Signal:
    """What the root sends back down: dL/dZ of a block's output, with the root's own
    gradients (column bias, head) and, from the loss, the summed loss and the number of
    correct predictions."""

    dZ: Any
    grads: Any
    loss: float = 0.0
    correct: int = 0


@sizeof.register(SliceOut)
def _sizeof_out(out: SliceOut) -> int:
    return sizeof(out.state) + (int(out.dA.nbytes) if out.dA is not None else 0)


@sizeof.register(Signal)
def _sizeof_signal(sig: Signal) -> int:
    return int(sig.dZ.nbytes + sig.grads.nbytes) + 64


# --- tasks ---------------------------------------------------------------------------------------

def _input(spec: Spec, step: Step, j: int, below, shards):
    return spec.minibatch(step, shards)[0] if j == 0 else below


def forward(task: SliceForward, prev: SliceOut, below, shards):
    """Slice ``m`` of block ``j``: its partial pre-activation of the block's output."""
    spec, j, m = task.spec, task.block, task.slice
    xp = array_module(prev.state.vector)
    Wr, br, Wc = views(*spec.dims(j, m), prev.state.vector)
    act, _ = ACTIVATIONS[spec.net.activation]
    with np.errstate(all="ignore"):
        return slice_forward(xp, act, Wr, br, Wc, _input(spec, task.step, j, below, shards))[1]


def combine(task: Combine, root: TrainState, *partials):
    """Root: a block's output activation from the slices' partials and its column bias."""
    spec = task.spec
    xp = array_module(partials[0])
    act, _ = ACTIVATIONS[spec.net.activation]
    bias = root.vector[_bias_slice(spec, task.block)]
    with np.errstate(all="ignore"):
        return act(xp, sum_in_order(*partials) + bias)             # (B, O)


def loss(task: Loss, root: TrainState, shards, *partials) -> Signal:
    """Root: the last block's output, the head, the loss and dL/dZ of the last block."""
    spec = task.spec
    xp = array_module(partials[0])
    act, act_backward = ACTIVATIONS[spec.net.activation]
    y = spec.minibatch(task.step, shards)[1]
    last = spec.slicing.blocks - 1
    with np.errstate(all="ignore"):
        Z = sum_in_order(*partials) + root.vector[_bias_slice(spec, last)]     # (B, O)
        head = []
        if spec.slicing.head:
            Wh, bh = _head(spec, root.vector)
            A = act(xp, Z)
            logits = A @ Wh.T + bh                                           # (B, C)
            total, dlogits = LOSSES[spec.net.loss](xp, logits, y)
            head = [(dlogits.T @ A).ravel(), dlogits.sum(axis=0)]
            dZ = (dlogits @ Wh) * act_backward(xp, A)
        else:
            logits = Z
            total, dZ = LOSSES[spec.net.loss](xp, Z, y)
        correct = int(spec.net.correct(logits, y))
        return Signal(dZ, xp.concatenate([dZ.sum(axis=0), *head]), float(total), correct)


def backward(task: SliceBackward, prev: SliceOut, below, signal: Signal, shards) -> SliceOut:
    """Slice ``m`` of block ``j``: gradients, the slice's update, and its dA share."""
    spec, j, m = task.spec, task.block, task.slice
    xp = array_module(prev.state.vector)
    Wr, br, Wc = views(*spec.dims(j, m), prev.state.vector)
    act, act_backward = ACTIVATIONS[spec.net.activation]
    A = _input(spec, task.step, j, below, shards)
    with np.errstate(all="ignore"):
        grad, dA = slice_backward(xp, act, act_backward, Wr, br, Wc, A, signal.dZ, j > 0)
        opt = Optimizer(spec.opt.cfg, spec.slicing.layout(j, m), spec.opt.l2)
        tail = xp.zeros(TAIL, grad.dtype)              # no loss or count of its own
        state = opt.apply(prev.state, xp.concatenate([grad, tail]), task.step)
    return SliceOut(state, dA)


def input_grad(out: SliceOut):
    """``input-grad-<step>-<block>-<slice>`` (no constants): the dA share alone, all the root
    needs from a backward task."""
    return out.dA


def back_combine(task: BackCombine, A, *shares) -> Signal:
    """Root: dL/dZ of block ``j``'s output from the shares of dL/dA of block ``j + 1``."""
    xp = array_module(A)
    _, act_backward = ACTIVATIONS[task.spec.net.activation]
    with np.errstate(all="ignore"):
        dZ = sum_in_order(*shares) * act_backward(xp, A)           # (B, O)
    return Signal(dZ, dZ.sum(axis=0))


def root_update(task: RootUpdate, root: TrainState, last: Signal, *earlier: Signal):
    """Root: the column biases (block order) and the head, one optimizer step."""
    spec = task.spec
    xp = array_module(root.vector)
    grads = {spec.slicing.blocks - 1: last.grads}
    grads.update({j: s.grads for j, s in enumerate(earlier)})
    head = last.grads[spec.net.layers[2 * spec.slicing.blocks]:]
    parts = [grads[j][: spec.net.layers[2 * j + 2]] for j in range(spec.slicing.blocks)]
    tail = xp.asarray([last.loss, last.correct], dtype=root.vector.dtype)
    buf = xp.concatenate([*parts, head, tail])          # [grad | loss | correct]
    opt = replace(spec.opt, net=spec.slicing.root_layout)       # its max_loss too
    new = update(opt, task.step, True, root, buf)
    if task.events is not None:
        step_event(task.events, task.step, root, new)
    return new


def evaluate_slices(task: EvaluateSlices, root: TrainState, part, *outs: SliceOut):
    """``evaluate`` on the state joined from the root's and the slices'."""
    spec = task.spec
    parts = dict(zip(spec.slicing.index, (o.state for o in outs)))
    full = spec.slicing.join(root, parts, spec.opt.slots)
    return evaluate(Evaluate(spec.net, task.epoch, task.keep), full, part)


def _bias_slice(spec: Spec, j: int) -> slice:
    start = sum(spec.net.layers[2 * i + 2] for i in range(j))
    return slice(start, start + spec.net.layers[2 * j + 2])


def _head(spec: Spec, root_vector):
    o, i = spec.net.layers[-1], spec.net.layers[-2]
    start = sum(spec.net.layers[2 * j + 2] for j in range(spec.slicing.blocks))
    return (root_vector[start:start + o * i].reshape(o, i),
            root_vector[start + o * i:start + o * i + o])


# --- the graph -------------------------------------------------------------------------------------

class ModelParallel:
    """The graph builder of ``model-parallel``: ``slices`` slices per block, placed on the
    workers in contiguous groups; the root (block outputs, loss, biases, head) runs with
    slice 0.  Every worker that holds a slice loads the whole training set once
    (``sources``, every shard's loading record)."""

    min_workers = 1

    def __init__(self, recipe: Recipe, slices: int, sources: Sequence[ShardSource]):
        self.spec = Spec(recipe.net, Slicing(recipe.net, slices), recipe.opt, recipe.shuffle_seed)
        self.recipe, self.sources = recipe, tuple(sources)
        self.item = np.dtype(recipe.net.dtype).itemsize

    def place(self, workers: Sequence[Worker | str]) -> Placement:
        addresses = [w.address if isinstance(w, Worker) else w for w in workers]
        m = self.spec.slicing.slices
        leaves = tuple(addresses[i * len(addresses) // m] for i in range(m))
        return Placement(leaves, leaves[0])

    def hosts(self, placement: Placement) -> list[str]:
        return list(dict.fromkeys(placement.leaves))

    def data(self, placement: Placement) -> list[DataItem]:
        return [DataItem((keys.LOAD_TRAIN, j), load_shards, (self.sources,), w)
                for j, w in enumerate(self.hosts(placement))]

    def window(self, steps: Sequence[Step], start: TrainState, refs: Sequence[TaskRef],
               val: TaskRef | None, placement: Placement, run: str) -> Window:
        sl, spec, win = self.spec.slicing, self.spec, Window()
        data_on = dict(zip(self.hosts(placement), refs))
        root_ref = data_on[placement.root]
        root_part, parts = sl.split(start, self.recipe.opt.slots)
        s0 = steps[0].index
        root = win.add(DataNode(keys.make(keys.STATE, s0, "root", run=run), root_part), placement.root,
                       sizeof(root_part))
        prev = {(j, m): win.add(DataNode(keys.make(keys.STATE, s0, j, m, run=run), SliceOut(st)),
                                placement.leaves[m], sizeof(st))
                for (j, m), st in parts.items()}
        for step in steps:
            root = self._step(win, step, root, prev, data_on, root_ref, placement, run)
            if step.last:
                win.evals[step.epoch] = win.add(Task(
                    keys.make(keys.EVALUATE, step.epoch + 1, run=run), evaluate_slices,
                    EvaluateSlices(spec, step.epoch, self.recipe.keep_states), TaskRef(root), val,
                    *(TaskRef(prev[jm]) for jm in sl.index)), placement.root)
        win.ends = [root, *(prev[jm] for jm in sl.index)]
        slots = self.recipe.opt.slots
        win.join = lambda values: sl.join(values[0], dict(zip(sl.index, (o.state for o in values[1:]))),
                                          slots)
        return win

    def _step(self, win, step, root, prev, data_on, root_ref, placement, run) -> str:
        spec, sl, s, B = self.spec, self.spec.slicing, step.index, step.count
        k = self.recipe.fan_in                                       # normalised to slices
        layers, below = spec.net.layers, {}
        for j in range(sl.blocks):                                   # forward, block by block
            width = B * layers[2 * j + 2] * self.item
            leaves = []
            for m, w in enumerate(placement.leaves):
                name = keys.make(keys.FORWARD, s, j, m, run=run)
                win.add(Task(name, forward, SliceForward(spec, step, j, m), TaskRef(prev[j, m]),
                             TaskRef(below[j]) if j else None, data_on[w]), w, width)
                leaves.append((name, m, w))
            top, _, _ = tree(win, f"{s}f{j}", leaves, placement.root, k, True, width, run)
            if j < sl.blocks - 1:
                below[j + 1] = win.add(Task(keys.make(keys.COMBINE, s, j, run=run), combine,
                                            Combine(spec, j), TaskRef(root),
                                            *(TaskRef(t[0]) for t in top)),
                                       placement.root, width)
            else:
                head = layers[-1] * (layers[-2] + 1) if sl.head else 0
                signal = win.add(Task(keys.make(keys.LOSS, s, run=run), loss, Loss(spec, step),
                                      TaskRef(root), root_ref, *(TaskRef(t[0]) for t in top)),
                                 placement.root, (B * layers[2 * j + 2] + layers[2 * j + 2] + head)
                                 * self.item + 64)
        last, earlier = signal, {}
        for j in reversed(range(sl.blocks)):                         # backward, block by block
            share = B * layers[2 * j] * self.item if j else 0
            shares = []
            for m, w in enumerate(placement.leaves):
                name = keys.make(keys.BACKWARD, s, j, m, run=run)
                st_bytes = sizeof(TrainState(np.empty(sl.layout(j, m).size * (1 + spec.opt.slots),
                                                      spec.net.dtype)))
                win.add(Task(name, backward, SliceBackward(spec, step, j, m), TaskRef(prev[j, m]),
                             TaskRef(below[j]) if j else None, TaskRef(signal),
                             data_on[w]), w, st_bytes + share)
                prev[j, m] = name
                if j:
                    shares.append((win.add(Task(keys.make(keys.INPUT_GRAD, s, j, m, run=run),
                                                input_grad, TaskRef(name)), w, share), m, w))
            if j:
                top, _, _ = tree(win, f"{s}b{j}", shares, placement.root, k, True, share, run)
                signal = earlier[j - 1] = win.add(
                    Task(keys.make(keys.BACK_COMBINE, s, j - 1, run=run), back_combine,
                         BackCombine(spec, j - 1), TaskRef(below[j]),
                         *(TaskRef(t[0]) for t in top)), placement.root,
                    (B + 1) * layers[2 * j] * self.item + 64)
        root_bytes = sizeof(TrainState(np.empty(sl.root_layout.size * (1 + spec.opt.slots),
                                                spec.net.dtype)))
        task = RootUpdate(spec, step, self.recipe.events_for(step, run))
        return win.add(Task(keys.make(keys.UPDATE, s, run=run), root_update, task, TaskRef(root),
                            TaskRef(last), *(TaskRef(earlier[j]) for j in range(sl.blocks - 1))),
                       placement.root, root_bytes)
