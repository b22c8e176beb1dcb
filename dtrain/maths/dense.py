"""A dense network's layers as pure functions over an array module ``xp``: activations, the
affine layer, and the output layer with its loss.

Each forward and backward stand side by side.  ``xp`` is NumPy or CuPy; nothing here knows
which.  Shapes: ``B`` batch rows, ``I`` inputs, ``O`` outputs of a layer, ``C`` classes (or
``T`` targets of a regression); every function also takes a stack of shards, ``S`` leading
the shapes, and gives each shard what it alone gives (the layout and the stacks:
:mod:`~dtrain.maths.model`, whose :class:`~dtrain.maths.model.Network` chains these).

A loss takes the output layer's pre-activations ``z`` and the targets, and returns the loss
summed over the rows and its gradient ``dL/dz``: a classifier's targets ``y`` are class
indices (B,); a regression's (``squared-error``, ``poisson``) real values (B, T);
``binary-cross-entropy`` takes two classes as indices (B,) into one logistic output, or
0/1 indicators (B, L).  Sample weights ``w`` (B,), where given, weigh each row's loss and
its gradient (``sum_i w_i loss_i``); None computes the unweighted sum.
"""
from __future__ import annotations

from dtrain.core.errors import DataError


# --- activations: forward from z, backward from the output a ---------------------

def sigmoid(xp, z):
    return 0.5 * xp.tanh(0.5 * z) + 0.5          # overflow-free form of 1/(1+e^-z)


def sigmoid_backward(xp, a):
    return a * (1 - a)


def tanh(xp, z):
    return xp.tanh(z)


def tanh_backward(xp, a):
    return 1 - a * a


def identity(xp, z):
    return z


def identity_backward(xp, a):
    return xp.ones_like(a)


def relu(xp, z):
    return xp.maximum(z, 0)


def relu_backward(xp, a):
    return (a > 0).astype(a.dtype)


ACTIVATIONS = {
    "sigmoid": (sigmoid, sigmoid_backward),
    "tanh": (tanh, tanh_backward),
    "relu": (relu, relu_backward),
    "identity": (identity, identity_backward),    # linear hidden layers (a bottleneck)
}


# --- affine layer ---------------------------------------------------------------

def linear_forward(xp, x, W, b):
    return x @ W.T + b                            # (B, O) = (B, I) @ (I, O) + (O,)


def linear_backward(xp, dz, x, W, dW, db, need_dx=True):
    """Write dL/dW and dL/db into ``dW``, ``db``; return dL/dx (or None)."""
    xp.matmul(dz.swapaxes(-1, -2), x, out=dW)     # (O, I) = (O, B) @ (B, I)
    dz.sum(axis=-2, out=db)                       # (O,)
    return dz @ W if need_dx else None            # (B, I) = (B, O) @ (O, I)


# --- output layer + loss: per-sample loss summed over the batch ---------------------

def classes_at(xp, y):
    """Where each row's class is in outputs (B, C): ``(rows, y)`` for ``y`` (B,), and
    ``(shards, rows, y)`` for a stack ``y`` (S, B)."""
    if y.ndim == 1:                               # one batch: the per-step case, kept lean
        return xp.arange(y.shape[0]), y
    lead = [xp.arange(n).reshape((-1,) + (1,) * (y.ndim - 1 - k)) for k, n in enumerate(y.shape)]
    return (*lead, y)


def one_hot(xp, y, classes, dtype):
    t = xp.zeros((*y.shape, classes), dtype=dtype)     # (B, C)
    t[classes_at(xp, y)] = 1
    return t


def _total(a):
    """The sum of all of a batch's entries ``a`` (B, C), one per shard of a stack."""
    return a.sum(axis=(-2, -1))                   # scalar (or (S,))


def _weighted(rows, dz, w):
    """``(sum_i w_i rows_i, w_i dz_i)``: per-row losses ``rows`` (B,) and their gradients
    ``dz`` (B, C) weighted by ``w`` (B,)."""
    w = w.astype(dz.dtype, copy=False)
    return (w * rows).sum(axis=-1), dz * w[..., None]     # scalar, (B, C)


def cross_entropy(xp, z, y, w=None):
    """Softmax + cross-entropy. Returns (loss summed over rows, dL/dz)."""
    shifted = z - z.max(axis=-1, keepdims=True)   # (B, C)
    e = xp.exp(shifted)                           # (B, C)
    s = e.sum(axis=-1, keepdims=True)             # (B, 1)
    at = classes_at(xp, y)
    per_row = xp.log(s[..., 0]) - shifted[at]     # (B,)
    dz = e / s                                    # (B, C) softmax
    dz[at] -= 1
    return (per_row.sum(axis=-1), dz) if w is None else _weighted(per_row, dz, w)


def mse(xp, z, y, w=None):
    """Sigmoid outputs + squared error 0.5*||a - onehot||^2. Returns (loss sum, dL/dz)."""
    a = sigmoid(xp, z)                            # (B, C)
    diff = a - one_hot(xp, y, z.shape[-1], z.dtype)
    dz = diff * sigmoid_backward(xp, a)           # (B, C)
    if w is None:
        return 0.5 * _total(diff * diff), dz
    return _weighted(0.5 * (diff * diff).sum(axis=-1), dz, w)


def squared_error(xp, z, t, w=None):
    """Identity outputs + squared error 0.5*||z - t||^2 against real targets ``t`` (B, T).
    Returns (loss summed over rows, dL/dz)."""
    diff = z - t.astype(z.dtype, copy=False)      # (B, T)
    if w is None:
        return 0.5 * _total(diff * diff), diff
    return _weighted(0.5 * (diff * diff).sum(axis=-1), diff, w)


def label_targets(z, y):
    """``y`` as 0/1 targets of the logistic outputs ``z`` (B, L), in ``z``'s dtype: class
    indices (B,) of two classes for one output, or indicators (B, L)."""
    return y.reshape(z.shape).astype(z.dtype, copy=False)        # (B, L)


def binary_cross_entropy(xp, z, y, w=None):
    """Logistic outputs + binary cross-entropy, summed over the labels:
    ``softplus(z) - t z = -t log(a) - (1 - t) log(1 - a)`` with ``a = sigmoid(z)``, in a
    form that neither overflows nor loses ``log(a)`` to rounding.  ``y``: class indices
    (B,) of two classes with one output, or 0/1 indicators (B, L).
    Returns (loss summed over rows, dL/dz)."""
    t = label_targets(z, y)                                          # (B, L)
    elementwise = xp.maximum(z, 0) - t * z + xp.log1p(xp.exp(-xp.abs(z)))   # (B, L)
    dz = sigmoid(xp, z) - t                                          # (B, L)
    if w is None:
        return _total(elementwise), dz
    return _weighted(elementwise.sum(axis=-1), dz, w)


def poisson(xp, z, t, w=None):
    """Exponential outputs + half the Poisson deviance against targets ``t`` >= 0 (B, T),
    summed over the targets: ``t log(t / a) - t + a`` with ``a = exp(z)`` (``t log t`` is 0
    at ``t = 0``), scikit-learn's ``loss="poisson"``.  Returns (loss summed over rows,
    dL/dz = a - t)."""
    t = t.astype(z.dtype, copy=False)                                # (B, T)
    if bool((t < 0).any()):
        raise DataError(f"a target is {float(t[t < 0].ravel()[0])}: the Poisson loss learns "
                        f"targets >= 0 (counts, rates)")
    a = xp.exp(z)                                                    # (B, T)
    safe = xp.where(t > 0, t, 1)                                     # log's argument
    elementwise = xp.where(t > 0, t * (xp.log(safe) - z), 0) - t + a   # (B, T)
    dz = a - t                                                       # (B, T)
    if w is None:
        return _total(elementwise), dz
    return _weighted(elementwise.sum(axis=-1), dz, w)


LOSSES = {"cross-entropy": cross_entropy, "mse": mse, "squared-error": squared_error,
          "binary-cross-entropy": binary_cross_entropy, "poisson": poisson}
PREDICTIONS = {"squared-error": identity, "poisson": lambda xp, z: xp.exp(z)}   # regressions'
                                                    # outputs: what the output layer passes on
