"""Model parallelism: split each hidden layer's units across slices, not the data.

Layers go in pairs ("blocks"): the first layer of a block is split by rows
(slice ``m`` owns the hidden units ``U_m``: ``W_r[U_m, :]`` and ``b_r[U_m]``),
the second by columns (``W_c[:, U_m]``).  With an odd number of layers the
last one is a *head* that the root keeps whole, with the column layers'
biases.  Every worker holds the whole training set, loaded once, so only
activations the width of a block's output cross the network, not weights::

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
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from dask.sizeof import sizeof
from dask.task_spec import DataNode, Task, TaskRef

from dtrain import live
from dtrain.data import Shard, load_shards
from dtrain.graph import DataItem, Recipe, Window
from dtrain.model import (ACTIVATIONS, LOSSES, TAIL, Layout, Network, align_on_unpickle,
                          array_module)
from dtrain.optim import Optimizer, Step, TrainState, update
from dtrain.placement import Placement, Worker
from dtrain.reduction import tree
from dtrain.tasks import evaluate
from dtrain.tasktypes import key


# --- layout ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Slicing:
    """How a network's parameters are split into ``slices`` per block, plus the root's share."""

    net: Network
    slices: int

    @property
    def blocks(self) -> int:
        return (len(self.net.layers) - 1) // 2

    @property
    def head(self) -> bool:
        return (len(self.net.layers) - 1) % 2 == 1

    def units(self, j: int) -> list[tuple[int, int]]:
        """Hidden units ``(start, stop)`` of each slice in block ``j``."""
        edges = np.linspace(0, self.net.layers[2 * j + 1], self.slices + 1).round().astype(int)
        return list(zip(edges[:-1].tolist(), edges[1:].tolist()))

    @cached_property
    def index(self) -> dict[tuple[int, int], np.ndarray]:
        """Positions in the full parameter vector of slice ``(j, m)``'s parameters, in the
        slice's order: ``W_r`` rows, ``b_r``, ``W_c`` columns (as ``(outputs, units)``)."""
        out = {}
        for j in range(self.blocks):
            (wr, br), (wc, _) = self.net.slices[2 * j], self.net.slices[2 * j + 1]
            n_in, hidden = self.net.layers[2 * j], self.net.layers[2 * j + 1]
            n_out = self.net.layers[2 * j + 2]
            for m, (u0, u1) in enumerate(self.units(j)):
                cols = wc.start + np.arange(n_out)[:, None] * hidden + np.arange(u0, u1)
                out[j, m] = np.concatenate([np.arange(wr.start + u0 * n_in, wr.start + u1 * n_in),
                                            np.arange(br.start + u0, br.start + u1),
                                            cols.ravel()])
        return out

    @cached_property
    def root_index(self) -> np.ndarray:
        """Positions of the root's parameters: each block's column bias, then the head."""
        parts = [np.arange(self.net.slices[2 * j + 1][1].start, self.net.slices[2 * j + 1][1].stop)
                 for j in range(self.blocks)]
        if self.head:
            w, b = self.net.slices[-1]
            parts += [np.arange(w.start, w.stop), np.arange(b.start, b.stop)]
        return np.concatenate(parts)

    def layout(self, j: int, m: int) -> Layout:
        u = self.units(j)[m][1] - self.units(j)[m][0]
        n_in, n_out = self.net.layers[2 * j], self.net.layers[2 * j + 2]
        return Layout(u * (n_in + 1 + n_out), (slice(0, u * n_in), slice(u * n_in + u, None)))

    @property
    def root_layout(self) -> Layout:
        size = len(self.root_index)
        head = slice(size - self.net.layers[-1] * (self.net.layers[-2] + 1),
                     size - self.net.layers[-1]) if self.head else None
        return Layout(size, (head,) if head else ())

    def _gather(self, vector, index, slots: int):
        P = self.net.size
        return np.concatenate([vector[index + s * P] for s in range(slots + 1)])

    def split(self, state: TrainState, slots: int) -> tuple[TrainState, dict]:
        """The root's state (with the epoch sums) and each slice's, from a full state."""
        v = state.vector
        root = state.with_vector(self._gather(v, self.root_index, slots))
        return root, {jm: TrainState(self._gather(v, idx, slots)) for jm, idx in self.index.items()}

    def join(self, root: TrainState, parts: dict, slots: int) -> TrainState:
        """The full state from the root's and the slices' (the inverse of :meth:`split`)."""
        P = self.net.size
        v = np.empty(P * (1 + slots), dtype=root.vector.dtype)
        for index, part in [(self.root_index, root)] + [(self.index[jm], parts[jm])
                                                      for jm in self.index]:
            n = len(index)
            for s in range(slots + 1):
                v[index + s * P] = part.vector[s * n:(s + 1) * n]
        return root.with_vector(v)


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


# --- the maths of one slice, forward and backward side by side ----------------------------------

def _views(layout_units: int, n_in: int, n_out: int, v):
    u = layout_units
    Wr = v[: u * n_in].reshape(u, n_in)                        # (U, I)
    br = v[u * n_in: u * n_in + u]                             # (U,)
    Wc = v[u * n_in + u: u * (n_in + 1 + n_out)].reshape(n_out, u)   # (O, U)
    return Wr, br, Wc


def slice_forward(xp, act, Wr, br, Wc, A):
    a = act(xp, A @ Wr.T + br)                                 # (B, U)
    return a, a @ Wc.T                                         # (B, O) partial pre-activation


def slice_backward(xp, act, act_backward, Wr, br, Wc, A, dZ, need_dA: bool):
    a, _ = slice_forward(xp, act, Wr, br, Wc, A)               # recomputed, not shipped
    gWc = dZ.T @ a                                             # (O, U)
    dz = (dZ @ Wc) * act_backward(xp, a)                       # (B, U)
    gWr = dz.T @ A                                             # (U, I)
    grad = xp.concatenate([gWr.ravel(), dz.sum(axis=0), gWc.ravel()])
    return grad, (dz @ Wr if need_dA else None)                # dA share (B, I)


# --- tasks ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    """The constants of one model-parallel run, baked into its tasks."""

    net: Network
    slicing: Slicing
    opt: Optimizer
    shuffle_seed: int | None
    recipe: Recipe
    run: str

    def dims(self, j: int, m: int) -> tuple[int, int, int]:
        u0, u1 = self.slicing.units(j)[m]
        return u1 - u0, self.net.layers[2 * j], self.net.layers[2 * j + 2]


def minibatch(shards: list[Shard], step: Step, seed: int | None):
    """The whole global minibatch of ``step`` (every worker holds every shard)."""
    rows = [s.batch(step.epoch, lo, hi, seed) for s, (lo, hi) in zip(shards, step.bounds)]
    return np.concatenate([r[0] for r in rows]), np.concatenate([r[1] for r in rows])


def _input(spec: Spec, step: Step, j: int, below, shards):
    return minibatch(shards, step, spec.shuffle_seed)[0] if j == 0 else below


def forward(spec: Spec, step: Step, j: int, m: int, prev: SliceOut, below, shards):
    """Slice ``m`` of block ``j``: its partial pre-activation of the block's output."""
    xp = array_module(prev.state.vector)
    Wr, br, Wc = _views(*spec.dims(j, m), prev.state.vector)
    act, _ = ACTIVATIONS[spec.net.activation]
    with np.errstate(all="ignore"):
        return slice_forward(xp, act, Wr, br, Wc, _input(spec, step, j, below, shards))[1]


def combine(spec: Spec, j: int, root: TrainState, *partials):
    """Root: a block's output activation from the slices' partials and its column bias."""
    xp = array_module(partials[0])
    act, _ = ACTIVATIONS[spec.net.activation]
    bias = root.vector[_bias_slice(spec, j)]
    with np.errstate(all="ignore"):
        return act(xp, _sum(partials) + bias)                 # (B, O)


def loss(spec: Spec, step: Step, root: TrainState, shards, *partials) -> Signal:
    """Root: the last block's output, the head, the loss and dL/dZ of the last block."""
    xp = array_module(partials[0])
    act, act_backward = ACTIVATIONS[spec.net.activation]
    y = minibatch(shards, step, spec.shuffle_seed)[1]
    last = spec.slicing.blocks - 1
    with np.errstate(all="ignore"):
        Z = _sum(partials) + root.vector[_bias_slice(spec, last)]           # (B, O)
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
        correct = int((logits.argmax(axis=1) == y).sum())
        return Signal(dZ, xp.concatenate([dZ.sum(axis=0), *head]), float(total), correct)


def backward(spec: Spec, step: Step, j: int, m: int, prev: SliceOut, below, signal: Signal,
             shards) -> SliceOut:
    """Slice ``m`` of block ``j``: gradients, the slice's update, and its dA share."""
    xp = array_module(prev.state.vector)
    Wr, br, Wc = _views(*spec.dims(j, m), prev.state.vector)
    act, act_backward = ACTIVATIONS[spec.net.activation]
    A = _input(spec, step, j, below, shards)
    with np.errstate(all="ignore"):
        grad, dA = slice_backward(xp, act, act_backward, Wr, br, Wc, A, signal.dZ, j > 0)
        opt = Optimizer(spec.opt.cfg, spec.slicing.layout(j, m), spec.opt.l2)
        tail = xp.zeros(TAIL, grad.dtype)              # no loss or count of its own
        state = opt.apply(prev.state, xp.concatenate([grad, tail]), step)
    return SliceOut(state, dA)


def input_grad(out: SliceOut):
    """The dA share alone: all the root needs from a backward task."""
    return out.dA


def back_combine(spec: Spec, j: int, A, *shares) -> Signal:
    """Root: dL/dZ of block ``j``'s output from the shares of dL/dA of block ``j + 1``."""
    xp = array_module(A)
    _, act_backward = ACTIVATIONS[spec.net.activation]
    with np.errstate(all="ignore"):
        dZ = _sum(shares) * act_backward(xp, A)                # (B, O)
    return Signal(dZ, dZ.sum(axis=0))


def root_update(spec: Spec, step: Step, root: TrainState, last: Signal, *earlier: Signal):
    """Root: the column biases (block order) and the head, one optimizer step."""
    xp = array_module(root.vector)
    grads = {spec.slicing.blocks - 1: last.grads}
    grads.update({j: s.grads for j, s in enumerate(earlier)})
    head = last.grads[spec.net.layers[2 * spec.slicing.blocks]:]
    parts = [grads[j][: spec.net.layers[2 * j + 2]] for j in range(spec.slicing.blocks)]
    tail = xp.asarray([last.loss, last.correct], dtype=root.vector.dtype)
    buf = xp.concatenate([*parts, head, tail])          # [grad | loss | correct]
    opt = Optimizer(spec.opt.cfg, spec.slicing.root_layout, spec.opt.l2)
    new = update(opt, step, True, root, buf)
    if spec.recipe.reports(step):
        live.step_event(spec.recipe.events(spec.run), step, root, new)
    return new


def evaluate_joined(spec: Spec, epoch: int, root: TrainState, part, *outs: SliceOut):
    parts = dict(zip(spec.slicing.index, (o.state for o in outs)))
    full = spec.slicing.join(root, parts, spec.opt.slots)
    return evaluate(spec.net, epoch, full, part)


def _sum(arrays):
    total = arrays[0] + arrays[1] if len(arrays) > 1 else arrays[0].copy()
    for a in arrays[2:]:
        total += a
    return total


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
    """``graph.strategy = "model-parallel"``: ``graph.slices`` slices per block, placed on the
    workers in contiguous groups; the root (block outputs, loss, biases, head) runs with
    slice 0.  Every worker that holds a slice loads the whole training set once."""

    min_workers = 1

    def __init__(self, recipe: Recipe, slices: int, run: str, data_cfg, ranges, n_train: int,
                 dtype: str):
        self.spec = Spec(recipe.net, Slicing(recipe.net, slices), recipe.opt, recipe.shuffle_seed,
                         recipe, run)
        self.recipe, self.load = recipe, (data_cfg, tuple(ranges), n_train, dtype)
        self.item = np.dtype(recipe.net.dtype).itemsize

    def place(self, workers: Sequence[Worker | str]) -> Placement:
        addresses = [w.address if isinstance(w, Worker) else w for w in workers]
        m = self.spec.slicing.slices
        leaves = tuple(addresses[i * len(addresses) // m] for i in range(m))
        return Placement(leaves, leaves[0])

    def hosts(self, placement: Placement) -> list[str]:
        return list(dict.fromkeys(placement.leaves))

    def data(self, placement: Placement) -> list[DataItem]:
        return [DataItem(("load-train", j), load_shards, self.load, w)
                for j, w in enumerate(self.hosts(placement))]

    def window(self, steps: Sequence[Step], start: TrainState, refs: Sequence[TaskRef],
               val: TaskRef | None, placement: Placement, run: str) -> Window:
        sl, spec, win = self.spec.slicing, self.spec, Window()
        data_on = dict(zip(self.hosts(placement), refs))
        root_ref = data_on[placement.root]
        root_part, parts = sl.split(start, self.recipe.opt.slots)
        s0 = steps[0].index
        root = win.add(DataNode(key("state", s0, "root", run=run), root_part), placement.root,
                       sizeof(root_part))
        prev = {(j, m): win.add(DataNode(key("state", s0, j, m, run=run), SliceOut(st)),
                                placement.leaves[m], sizeof(st))
                for (j, m), st in parts.items()}
        for step in steps:
            root = self._step(win, step, root, prev, data_on, root_ref, placement, run)
            if step.last:
                win.evals[step.epoch] = win.add(Task(
                    key("evaluate", step.epoch + 1, run=run), evaluate_joined, spec, step.epoch,
                    TaskRef(root), val, *(TaskRef(prev[jm]) for jm in sl.index)), placement.root)
        win.ends = [root, *(prev[jm] for jm in sl.index)]
        slots = self.recipe.opt.slots
        win.join = lambda values: sl.join(values[0], dict(zip(sl.index, (o.state for o in values[1:]))),
                                          slots)
        return win

    def _step(self, win, step, root, prev, data_on, root_ref, placement, run) -> str:
        spec, sl, s, B = self.spec, self.spec.slicing, step.index, step.count
        k = max(2, min(self.recipe.fan_in, sl.slices))
        layers, below = spec.net.layers, {}
        for j in range(sl.blocks):                                   # forward, block by block
            width = B * layers[2 * j + 2] * self.item
            leaves = []
            for m, w in enumerate(placement.leaves):
                name = key("forward", s, j, m, run=run)
                win.add(Task(name, forward, spec, step, j, m, TaskRef(prev[j, m]),
                             TaskRef(below[j]) if j else None, data_on[w]), w, width)
                leaves.append((name, m, w))
            top, _, _ = tree(win, f"{s}f{j}", leaves, placement.root, k, True, width, run)
            if j < sl.blocks - 1:
                below[j + 1] = win.add(Task(key("combine", s, j, run=run), combine, spec, j,
                                            TaskRef(root), *(TaskRef(t[0]) for t in top)),
                                       placement.root, width)
            else:
                head = layers[-1] * (layers[-2] + 1) if sl.head else 0
                signal = win.add(Task(key("loss", s, run=run), loss, spec, step, TaskRef(root),
                                      root_ref, *(TaskRef(t[0]) for t in top)),
                                 placement.root, (B * layers[2 * j + 2] + layers[2 * j + 2] + head)
                                 * self.item + 64)
        last, earlier = signal, {}
        for j in reversed(range(sl.blocks)):                         # backward, block by block
            share = B * layers[2 * j] * self.item if j else 0
            shares = []
            for m, w in enumerate(placement.leaves):
                name = key("backward", s, j, m, run=run)
                st_bytes = sizeof(TrainState(np.empty(sl.layout(j, m).size * (1 + spec.opt.slots),
                                                      spec.net.dtype)))
                win.add(Task(name, backward, spec, step, j, m, TaskRef(prev[j, m]),
                             TaskRef(below[j]) if j else None, TaskRef(signal),
                             data_on[w]), w, st_bytes + share)
                prev[j, m] = name
                if j:
                    shares.append((win.add(Task(key("input-grad", s, j, m, run=run), input_grad,
                                                TaskRef(name)), w, share), m, w))
            if j:
                top, _, _ = tree(win, f"{s}b{j}", shares, placement.root, k, True, share, run)
                signal = earlier[j - 1] = win.add(
                    Task(key("back-combine", s, j - 1, run=run), back_combine, spec, j - 1,
                         TaskRef(below[j]), *(TaskRef(t[0]) for t in top)), placement.root,
                    (B + 1) * layers[2 * j] * self.item + 64)
        root_bytes = sizeof(TrainState(np.empty(sl.root_layout.size * (1 + spec.opt.slots),
                                                spec.net.dtype)))
        return win.add(Task(key("update", s, run=run), root_update, spec, step, TaskRef(root),
                            TaskRef(last), *(TaskRef(earlier[j]) for j in range(sl.blocks - 1))),
                       placement.root, root_bytes)
