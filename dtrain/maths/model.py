"""Fully connected networks as pure functions over an array module ``xp``.

A dense layer's forward and backward stand side by side in :mod:`~dtrain.maths.dense`
(activations, the affine layer, the losses); :class:`Network` chains them.  ``xp`` is NumPy
or CuPy; nothing here knows which.  Shapes: ``B`` batch rows, ``I`` inputs,
``O`` outputs of a layer, ``C`` classes (or ``T`` targets of a regression),
``P`` parameters.

Parameters live in one flat vector ``[W1, b1, W2, b2, ...]`` (``W`` is
``(O, I)``, row-major); :meth:`Network.unflatten` gives per-layer views, so a
training step moves one buffer.  Gradients are written straight into the
views of one flat buffer too: ``[grad (P) | loss | correct]``, the summed
loss and the number of correct predictions trailing the gradient (``TAIL``).

Every function also takes a stack of shards, ``S`` leading the shapes (``x`` (S, B,
I), ``y`` (S, B)), and gives each shard what it alone gives, byte for byte: the
same BLAS call per shard (``matmul`` calls it once per matrix of a stack),
elementwise maths, and sums over a shard's own rows only; so a worker's tiny
shards pay NumPy's per-call cost once, not once per shard
(:meth:`Network.loss_and_grad`).

A classifier's targets ``y`` are class indices (B,); a regression's
(``squared-error``, ``poisson``: :data:`~dtrain.core.config.VALUE_LOSSES`) are real
values (B, T), used as given (not normalized), and it counts no correct
predictions (0).  ``binary-cross-entropy`` has one logistic output per
label: two classes as indices (B,) into one output (the second class's
probability), or several labels as 0/1 indicators (B, L) (multilabel).

Convolutional nets (``model.layers`` with :mod:`~dtrain.core.layerspec` entries and an
``input_shape`` (C, H, W)) take the same flat rows ``x`` (B, C H W) and reshape them to
images; their layers' maths is :mod:`~dtrain.maths.conv`, and a convolution's filters
``W`` (F, C, K, K) and biases ``b`` (F,) take their place in the flat vector as a dense
layer's do, in the order of the layers.

Sample weights ``w`` (B,), where given, weigh each row's loss and its
gradient (``sum_i w_i loss_i``); None (unweighted) computes the unweighted sums, with no
weighting step in between.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from dtrain.core import layerspec
from dtrain.core.arrays import array_module, to_host
from dtrain.core.config import VALUE_LOSSES, ModelConfig
from dtrain.core.layerspec import Conv, Dropout, Flatten, Pool
from dtrain.maths import conv as cv
from dtrain.maths.dense import (ACTIVATIONS, LOSSES, PREDICTIONS, binary_cross_entropy,
                                classes_at, cross_entropy, identity, identity_backward,
                                label_targets, linear_backward, linear_forward, mse, one_hot,
                                poisson, relu, relu_backward, sigmoid, sigmoid_backward,
                                squared_error, tanh, tanh_backward)

__all__ = [   # the network; the layers' maths (maths.dense) is named from here too
    "TAIL", "Network", "Layout", "noise", "sklearn_init", "l2_penalty",
    "ACTIVATIONS", "LOSSES", "PREDICTIONS", "binary_cross_entropy", "classes_at",
    "cross_entropy", "identity", "identity_backward", "label_targets", "linear_backward",
    "linear_forward", "mse", "one_hot", "poisson", "relu", "relu_backward", "sigmoid",
    "sigmoid_backward", "squared_error", "tanh", "tanh_backward"]

TAIL = 2    # numbers after the gradient in a buffer: summed loss (at P), correct predictions


# --- the network ---------------------------------------------------------------------

_WORKSPACE = cv.Workspace()


def _work(xp, n: int):
    """Where op ``n`` of a network keeps its large intermediates on the host (kept per
    thread: :class:`~dtrain.maths.conv.Workspace`); fresh arrays elsewhere."""
    return _WORKSPACE.for_layer(n) if xp is np else None


@dataclass(frozen=True)
class Network:
    """Architecture of a fully connected net and the layout of its flat parameters.

    Parameters
    ----------
    layers
        Sizes, input first and classes (or targets) last, e.g. ``(784, 128, 10)``.
    activation
        Hidden-layer activation: ``"sigmoid"``, ``"tanh"``, ``"relu"`` or ``"identity"``.
    loss
        ``"cross-entropy"`` (softmax outputs), ``"mse"`` (sigmoid outputs),
        ``"binary-cross-entropy"`` (a logistic output per label),
        ``"squared-error"`` (identity outputs, real targets: a regression) or ``"poisson"``
        (exponential outputs, targets >= 0).
    dtype
        ``"float32"`` or ``"float64"``.
    init
        How :meth:`init` draws the parameters: ``"auto"`` or ``"scikit-learn"``.
    input_shape
        ``(C, H, W)`` of the images a convolutional net takes (its rows hold ``C H W``
        features in that order); ``()`` for a fully connected net.
    seed
        Seeds dropout's masks, with the step and the shard (:meth:`loss_and_grad`'s
        ``noise``).

    Layers may be sizes and :mod:`~dtrain.core.layerspec` specs (convolution, pooling,
    flatten, dropout): the activation follows each convolution and each hidden dense layer.
    """

    layers: tuple[Any, ...]
    activation: str
    loss: str
    dtype: str
    init_scheme: str = "auto"
    input_shape: tuple[int, ...] = ()
    seed: int = 0

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> Network:
        return cls(tuple(cfg.layers), cfg.activation, cfg.loss, cfg.dtype, cfg.init,
                   tuple(cfg.input_shape), cfg.seed)

    @cached_property
    def dense(self) -> bool:
        """Whether every layer is a dense layer's size (a fully connected net)."""
        return layerspec.dense_only(self.layers)

    @cached_property
    def walk(self) -> list[layerspec.Step]:
        """The layers with their shapes (:func:`~dtrain.core.layerspec.walk`)."""
        return layerspec.walk(self.layers, self.input_shape)

    @property
    def features(self) -> int:
        """Input features a row holds (``C H W`` for images)."""
        return self.layers[0] if self.dense else math.prod(self.walk[0].shape_in)

    @property
    def outputs(self) -> int:
        """Outputs: the classes (or targets)."""
        return self.layers[-1]

    @cached_property
    def ops(self) -> list[tuple[str, Any, int]]:
        """The forward pass as ``(kind, walk step, index)``: ``kind`` is ``"dense"``,
        ``"conv"`` (index: its parameters' place in :meth:`unflatten`), ``"act"``,
        ``"pool"``, ``"flatten"`` or ``"dropout"`` (index: its entry in ``layers``)."""
        ops: list[tuple[str, Any, int]] = []
        last = max(n for n, st in enumerate(self.walk) if isinstance(st.layer, int))
        p, offset = 0, len(self.layers) - len(self.walk)
        for n, st in enumerate(self.walk):
            layer = st.layer
            if isinstance(layer, (int, Conv)):
                ops.append(("dense" if isinstance(layer, int) else "conv", st, p))
                p += 1
                if n != last:
                    ops.append(("act", st, -1))
            elif isinstance(layer, Pool):
                ops.append(("pool", st, -1))
            elif isinstance(layer, Flatten):
                ops.append(("flatten", st, -1))
            elif isinstance(layer, Dropout):
                ops.append(("dropout", st, n + offset))
        return ops

    @property
    def regression(self) -> bool:
        """Whether the targets are real values (B, T) rather than class indices (B,)."""
        return self.loss in VALUE_LOSSES

    def correct(self, z, y):
        """Rows whose largest output is their class (logistic outputs: every label on the
        right side of 0), as an array scalar where ``z`` lives (no wait for a GPU); 0 for a
        regression: nothing to count."""
        if self.regression:
            return 0
        if self.loss == "binary-cross-entropy":
            return ((z > 0) == (label_targets(z, y) > 0.5)).all(axis=-1).sum(axis=-1)
        return (z.argmax(axis=-1) == y).sum(axis=-1)

    @cached_property
    def shapes(self) -> list[tuple[int, ...]]:
        """Each weighted layer's ``W`` shape: ``(O, I)`` dense, ``(F, C, K, K)`` a
        convolution's filters."""
        if self.dense:
            return list(zip(self.layers[1:], self.layers[:-1]))
        out: list[tuple[int, ...]] = []
        for kind, st, _ in self.ops:
            if kind == "dense":
                out.append((st.layer, st.shape_in[0]))
            elif kind == "conv":
                k = st.layer.kernel
                out.append((st.layer.conv, st.shape_in[0], k, k))
        return out

    @cached_property
    def slices(self) -> list[tuple[slice, slice]]:
        """Flat-vector slices of each layer's ``W`` and ``b``."""
        out, at = [], 0
        for shape in self.shapes:
            n, o = math.prod(shape), shape[0]
            out.append((slice(at, at + n), slice(at + n, at + n + o)))
            at += n + o
        return out

    @property
    def size(self) -> int:
        """Number of parameters ``P``."""
        return self.slices[-1][1].stop

    def flops(self, rows: float) -> float:
        """Floating-point operations of a forward-backward over ``rows`` rows: about
        ``6 rows P`` (2 per weight forward, 4 backward); a convolution's filters count once
        per output position."""
        if self.dense:
            return 6 * rows * self.size
        uses = sum(math.prod(shape) * (st.shape_out[1] * st.shape_out[2] if kind == "conv"
                                       else 1)
                   for (kind, st, _), shape in zip([o for o in self.ops
                                                    if o[0] in ("dense", "conv")], self.shapes))
        return 6 * rows * uses

    @property
    def weight_slices(self) -> list[slice]:
        """Where the weight matrices are (the L2 penalty's domain; biases are exempt)."""
        return [w for w, _ in self.slices]

    def unflatten(self, flat) -> list[tuple[Any, Any]]:
        """Per-layer ``(W, b)`` views into ``flat`` (no copies); of each row of a stack of
        flat vectors (S, P): ``W`` (S, O, I) and ``b`` (S, O)."""
        lead = flat.shape[:-1]
        return [(flat[..., w].reshape(lead + shape), flat[..., b])
                for (w, b), shape in zip(self.slices, self.shapes)]

    def named(self, flat) -> dict[str, np.ndarray]:
        """``{"W1": ..., "b1": ..., ...}`` as host arrays, e.g. for ``params.npz``."""
        flat = to_host(flat)
        out = {}
        for n, (W, b) in enumerate(self.unflatten(flat), start=1):
            out[f"W{n}"], out[f"b{n}"] = np.array(W), np.array(b)
        return out

    def init(self, seed: int):
        """Seeded initial parameters.  ``init_scheme`` ``"auto"``: Glorot-uniform (sigmoid,
        tanh) or He-normal (relu) weights, zero biases; ``"scikit-learn"``: as scikit-learn's
        MLPs draw them (:func:`sklearn_init`)."""
        if self.init_scheme == "scikit-learn":
            return sklearn_init(self, seed)
        rng = np.random.default_rng(seed)
        flat = np.zeros(self.size, dtype=np.float64)
        for (W, _), shape in zip(self.unflatten(flat), self.shapes):
            i = math.prod(shape[1:])                        # fan in
            o = shape[0] * math.prod(shape[2:])             # fan out
            if self.activation == "relu":
                W[...] = rng.normal(0.0, np.sqrt(2.0 / i), size=shape)
            else:
                limit = np.sqrt(6.0 / (i + o))
                W[...] = rng.uniform(-limit, limit, size=shape)
        return flat.astype(self.dtype)

    def forward(self, params, x):
        """Hidden activations and output logits: ``[x, a1, ..., z_out]`` (a convolutional
        net: ``[x, z_out]``)."""
        if not self.dense:
            return [x, self._run(array_module(params), self.unflatten(params), x)[0]]
        return self._forward(array_module(params), self.unflatten(params), x)

    def _run(self, xp, layers, x, noise=None):
        """Any net's forward pass over ``x`` (B, I): ``(z_out, caches)``, a cache per op of
        :attr:`ops` for :meth:`_back`.  ``noise``: dropout's ``((key, rows), ...)`` blocks of
        rows (None: no dropout, as at evaluation)."""
        act, _ = ACTIVATIONS[self.activation]
        a = x.reshape((x.shape[0], *self.walk[0].shape_in))       # (B, C, H, W) or (B, I)
        caches: list[Any] = []
        for n, (kind, st, p) in enumerate(self.ops):
            layer = st.layer
            if kind == "dense":
                W, b = layers[p]
                cache, a = a, linear_forward(xp, a, W, b)          # (B, O)
            elif kind == "conv":
                W, b = layers[p]
                shape = a.shape
                a, cols = cv.conv2d_forward(xp, a, W, b, layer.stride, layer.padding,
                                            _work(xp, n))
                cache = (cols, shape)                              # a: (B, F, OH, OW)
            elif kind == "act":                # in place: a is this net's own intermediate
                a = xp.maximum(a, 0, out=a) if self.activation == "relu" else act(xp, a)
                cache = a
            elif kind == "pool":
                out = cv.pool_forward(xp, a, layer.pool, layer.size, layer.step, _work(xp, n))
                cache, a = (a, out), out                           # (B, C, OH, OW)
            elif kind == "flatten":
                cache, a = a.shape, cv.flatten_forward(xp, a)      # (B, C H W)
            else:                                                  # dropout
                cache = None
                if noise is not None and layer.dropout > 0:
                    cache = cv.dropout_mask(xp, a.shape, layer.dropout,
                                            [((self.seed, *key, p), rows) for key, rows in noise],
                                            a.dtype)
                    a = cv.dropout_forward(xp, a, cache)
            caches.append(cache)
        return a, caches

    def _back(self, xp, layers, grads, dz, caches) -> None:
        """Backward through :attr:`ops` from dL/dz_out ``dz``, writing each weighted layer's
        gradient into ``grads`` (views of the buffer)."""
        _, act_backward = ACTIVATIONS[self.activation]
        first = next(n for n, (kind, _, _) in enumerate(self.ops) if kind in ("dense", "conv"))
        for n in reversed(range(len(self.ops))):
            kind, st, p = self.ops[n]
            cache, layer = caches[n], st.layer
            need = n > first                       # nothing before the first weights learns
            if kind == "dense":
                W, _ = layers[p]
                dW, db = grads[p]
                dz = linear_backward(xp, dz, cache, W, dW, db, need_dx=need)
            elif kind == "conv":
                W, _ = layers[p]
                dW, db = grads[p]
                dz = cv.conv2d_backward(xp, dz, cache[0], cache[1], W, dW, db, layer.stride,
                                        layer.padding, need_dx=need, work=_work(xp, n))
            elif kind == "act":
                if self.activation == "relu":
                    dz = dz * (cache > 0)              # (cache > 0) is relu_backward's mask
                else:
                    dz = dz * act_backward(xp, cache)
            elif kind == "pool":
                dz = cv.pool_backward(xp, dz, cache[0], cache[1], layer.pool, layer.size,
                                      layer.step, _work(xp, n))
            elif kind == "flatten":
                dz = cv.flatten_backward(xp, dz, cache)
            elif cache is not None:
                dz = cv.dropout_backward(xp, dz, cache)
            if not need:
                return

    def _forward(self, xp, layers, x):
        act, _ = ACTIVATIONS[self.activation]
        outs = [x]
        for n, (W, b) in enumerate(layers):
            z = linear_forward(xp, outs[-1], W, b)          # (B, O)
            outs.append(z if n == len(layers) - 1 else act(xp, z))
        return outs

    @property
    def buffer_size(self) -> int:
        """Length of a gradient buffer: ``P + TAIL``."""
        return self.size + TAIL

    def loss_and_grad(self, params, x, y, w=None, out=None, noise=None):
        """Summed loss and gradient over a batch, as one flat buffer.

        Returns ``buf`` of length ``P + 2``: ``buf[:P]`` is the gradient of the
        summed per-sample loss, ``buf[P]`` the summed loss and ``buf[P + 1]``
        the number of correct predictions (argmax of the outputs, before this
        step's update; 0 for a regression).  Sums (not means) so that shards add up exactly (the
        count is an integer, exact in float); the update divides by the batch
        size.  With sample weights ``w`` (B,) the loss and gradient are the weighted sums
        ``sum_i w_i loss_i`` (the count stays a count of rows).  ``out``: a contiguous
        ``(P + 2,)`` buffer to write into (shared memory) instead of a new one, or for a
        stack ``(S, P + 2)`` rows that are each contiguous; the same values either way.

        A stack of shards of equal rows, ``x`` (S, B, I) and ``y`` (S, B) (``w`` (S, B)),
        gives one buffer per shard (S, P + 2), each the bytes ``loss_and_grad(params,
        x[s], y[s])`` gives (``tests/test_model.py``).

        ``noise`` keys dropout's masks (a net without dropout ignores it):
        ``((key, rows), ...)``, blocks of the batch's rows in order, each ``key`` a tuple of
        integers naming the step and the shard (e.g. ``(epoch, first row, shard)``), with
        :attr:`seed`; a stack takes one such tuple per shard.  None: no dropout.
        """
        xp = array_module(params)
        if out is None:
            buf = xp.zeros((*x.shape[:-2], self.buffer_size), dtype=params.dtype)
        else:
            buf = out
            buf[...] = 0
        if x.shape[-2] == 0:
            return buf
        with np.errstate(all="ignore"):     # a diverging run is caught by the update's check
            if self.dense:
                return self._loss_and_grad(xp, params, x, y, buf, w)
            if x.ndim == 3:                 # a stack: each shard alone, its own bytes
                for s in range(x.shape[0]):
                    self._general(xp, params, x[s], y[s], buf[s], None if w is None else w[s],
                                  None if noise is None else noise[s])
                return buf
            return self._general(xp, params, x, y, buf, w, noise)

    def _general(self, xp, params, x, y, buf, w=None, noise=None):
        """:meth:`loss_and_grad` of any net over one batch ``x`` (B, I)."""
        layers = self.unflatten(params)
        z, caches = self._run(xp, layers, x, noise)
        loss, dz = LOSSES[self.loss](xp, z, y) if w is None else LOSSES[self.loss](xp, z, y, w)
        P = self.size
        buf[..., P] = loss
        buf[..., P + 1] = self.correct(z, y)
        self._back(xp, layers, self.unflatten(buf[..., :P]), dz, caches)
        return buf

    def _loss_and_grad(self, xp, params, x, y, buf, w=None):
        _, act_backward = ACTIVATIONS[self.activation]
        layers = self.unflatten(params)
        outs = self._forward(xp, layers, x)
        loss, dz = LOSSES[self.loss](xp, outs[-1], y) if w is None \
            else LOSSES[self.loss](xp, outs[-1], y, w)      # dz (B, C)
        P = self.size
        buf[..., P] = loss
        buf[..., P + 1] = self.correct(outs[-1], y)
        grads = self.unflatten(buf[..., :P])
        for n in reversed(range(len(layers))):
            W, _ = layers[n]
            dW, db = grads[n]
            dx = linear_backward(xp, dz, outs[n], W, dW, db, need_dx=n > 0)
            if n > 0:
                dz = dx * act_backward(xp, outs[n])          # (B, I) through layer n's activation
        return buf

    def evaluate(self, params, x, y, chunk: int = 8192) -> tuple[float, int, int]:
        """``(summed loss, correct predictions, rows)`` over a dataset, in chunks (no correct
        predictions for a regression: 0)."""
        with np.errstate(all="ignore"):
            return self._evaluate(array_module(params), params, x, y, chunk)

    def _evaluate(self, xp, params, x, y, chunk):
        loss, correct = 0.0, 0
        for start in range(0, x.shape[0], chunk):
            xs, ys = x[start:start + chunk], y[start:start + chunk]
            z = self.forward(params, xs)[-1]                 # (B, C)
            loss += float(LOSSES[self.loss](xp, z, ys)[0])
            correct += int(self.correct(z, ys))
        return loss, correct, int(x.shape[0])

    def predictions(self, params, x, chunk: int = 8192):
        """A regression's predictions (N, T) over a dataset, in chunks as :meth:`evaluate`
        takes them: the output layer's inputs, through its output function (the identity,
        or ``exp`` for ``poisson``)."""
        xp = array_module(params)
        out = xp.empty((x.shape[0], self.outputs), dtype=params.dtype)    # (N, T)
        output = PREDICTIONS[self.loss]
        with np.errstate(all="ignore"):
            for start in range(0, x.shape[0], chunk):
                out[start:start + chunk] = output(xp, self.forward(params,
                                                                   x[start:start + chunk])[-1])
        return out


def noise(epoch: int, parts) -> tuple:
    """Dropout's keys for a batch of shards' rows laid end to end: ``parts`` lists each
    shard's ``(index, first row, last row)`` of this epoch's order, in the batch's order;
    gives :meth:`Network.loss_and_grad`'s ``noise``, ``(((epoch, first row, index),
    rows), ...)``: the step and the shard, so a shard's mask does not depend on where it
    runs or what it is computed beside."""
    return tuple(((epoch, lo, index), hi - lo) for index, lo, hi in parts)


@dataclass(frozen=True)
class Layout:
    """A flat parameter vector that is not a whole network (a model-parallel slice):
    its size and where its weights are, which is all an optimizer needs."""

    size: int
    weight_slices: tuple[slice, ...]


def sklearn_init(net: Network, seed: int) -> np.ndarray:
    """Parameters as scikit-learn's ``MLPClassifier`` and ``MLPRegressor`` draw them, with
    ``numpy.random.RandomState(seed)`` (a seed of 2**32 or more through ``MT19937``): layer
    by layer, weights ``(I, O)`` then biases ``(O,)``, both uniform in ``+-sqrt(6 / (I +
    O))`` (``sqrt(2 / (I + O))`` for sigmoid hidden layers); so an integer
    ``random_state`` starts from scikit-learn's very numbers.  Dense nets only."""
    if not net.dense:
        raise ValueError("model.init = 'scikit-learn' draws dense layers only; use 'auto'")
    rng = np.random.RandomState(seed) if seed < 2 ** 32 \
        else np.random.RandomState(np.random.MT19937(seed))
    factor = 2.0 if net.activation == "sigmoid" else 6.0
    flat = np.zeros(net.size, dtype=np.float64)                     # (P,)
    for (W, b), (o, i) in zip(net.unflatten(flat), net.shapes):
        bound = np.sqrt(factor / (i + o))
        W[...] = rng.uniform(-bound, bound, (i, o)).T                # (O, I)
        b[...] = rng.uniform(-bound, bound, o)                       # (O,)
    return flat.astype(net.dtype)


def l2_penalty(net: Network, params, l2: float) -> float:
    """``0.5 * l2 * sum(||W||^2)`` over weight matrices (biases are not penalised)."""
    return 0.5 * l2 * sum(float((params[w] * params[w]).sum()) for w, _ in net.slices)
