"""Convolution, pooling, flattening and dropout as pure functions over an array module ``xp``.

Each layer's forward and backward stand side by side, as the dense layers' do in
:mod:`~dtrain.maths.model`.  ``xp`` is NumPy or CuPy; nothing here knows which.
Shapes: ``N`` batch rows, ``C`` input channels, ``H``, ``W`` an image's height and width,
``F`` filters (output channels), ``K`` a square kernel's side, ``OH``, ``OW`` the output's
height and width, ``L = OH * OW`` output positions.

Images are ``(N, C, H, W)`` as PyTorch and ONNX lay them out; a layer returns a view
whose memory is ``(C, N, H, W)``, the GEMM's natural output, which every function here
reads through its strides, so no layer copies to change the layout back.

A convolution is im2col and one GEMM: the input's ``K x K`` windows as a strided view
(no copy), copied once into a matrix of ``C K K`` rows and ``N L`` columns, which the
filters ``(F, C K K)`` multiply.  Its backward is two GEMMs (filters' gradient, columns' gradient) and col2im, a
loop over the ``K K`` kernel offsets (never over the batch), each a strided add.  Every
sum runs in a fixed order over a batch's own rows, so a shard's gradient is the same
bytes wherever it is computed.

Every function takes ``work``, where to put its large intermediate arrays: None (fresh
arrays) or a callable ``work(name, shape, dtype)`` giving an array to write over
(:class:`Workspace`), which must not be handed out again while the caller still reads
it.  Reusing them keeps a step's time where glibc hands freed memory back (a process
:mod:`dtrain.core.allocator` did not tune; Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``
low): there fresh arrays of megabytes are pages the kernel maps and zeroes every step,
which cost LeNet's step more than its GEMMs (12 ms instead of 6).
"""
from __future__ import annotations

import threading

import numpy as np


def _empty(xp, work, name: str, shape: tuple[int, ...], dtype):
    return xp.empty(shape, dtype=dtype) if work is None else work(name, shape, dtype)


class Workspace:
    """Arrays kept per thread between calls, one per ``(owner, name)``, for :mod:`numpy`
    (CuPy's memory pool already reuses its memory).  ``for_layer(owner)`` is the ``work``
    callable of one layer."""

    def __init__(self) -> None:
        self._local = threading.local()

    def for_layer(self, owner):
        kept = self._local.__dict__.setdefault("kept", {})

        def work(name: str, shape: tuple[int, ...], dtype):
            key = (owner, name)
            a = kept.get(key)
            if a is None or a.shape != tuple(shape) or a.dtype != dtype:
                a = kept[key] = np.empty(shape, dtype=dtype)
            return a
        return work


def out_size(n: int, kernel: int, stride: int, padding: int = 0) -> int:
    """Output positions along one side: ``floor((n + 2 padding - kernel) / stride) + 1``."""
    return (n + 2 * padding - kernel) // stride + 1


def windows(xp, x, kernel: int, stride: int):
    """The ``K x K`` windows of ``x`` (N, C, H, W) at ``stride``, as a strided view (no copy):
    (N, C, OH, OW, K, K), entry ``[n, c, i, j, a, b] = x[n, c, stride i + a, stride j + b]``."""
    N, C, H, W = x.shape
    OH, OW = out_size(H, kernel, stride), out_size(W, kernel, stride)
    sN, sC, sH, sW = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, (N, C, OH, OW, kernel, kernel), (sN, sC, stride * sH, stride * sW, sH, sW))


def pad(xp, x, padding: int, work=None):
    """``x`` (N, C, H, W) with ``padding`` zeros on each side of H and W, its memory
    (C, N, H', W') as the GEMM's outputs: (N, C, H + 2p, W + 2p)."""
    if padding == 0:
        return x
    N, C, H, W = x.shape
    out = _empty(xp, work, "pad", (C, N, H + 2 * padding, W + 2 * padding), x.dtype)
    out.fill(0)                                                             # (C, N, H', W')
    out[:, :, padding:padding + H, padding:padding + W] = x.transpose(1, 0, 2, 3)
    return out.transpose(1, 0, 2, 3)                                        # (N, C, H', W')


# --- convolution ------------------------------------------------------------------------

def conv2d_forward(xp, x, W, b, stride: int = 1, padding: int = 0, work=None):
    """A 2-D convolution (PyTorch's ``conv2d``, a cross-correlation).

    ``x`` (N, C, H, W), filters ``W`` (F, C, K, K), biases ``b`` (F,).  Returns ``(z,
    cols)``: ``z`` (N, F, OH, OW) (memory (F, N, OH, OW)) and the im2col matrix ``cols``
    (C K K, N L) that the backward reads: column ``(n, i, j)`` holds the window under
    output ``(i, j)`` of image ``n``, in ``W``'s (C, K, K) order.
    """
    F, C, K, _ = W.shape
    N = x.shape[0]
    win = windows(xp, pad(xp, x, padding, work), K, stride)   # (N, C, OH, OW, K, K) view
    OH, OW = win.shape[2], win.shape[3]
    cols = _empty(xp, work, "cols", (C * K * K, N * OH * OW), x.dtype)      # (CKK, N L)
    cols.reshape(C, K, K, N, OH, OW)[...] = win.transpose(1, 4, 5, 0, 2, 3)   # im2col: a copy
    z = _empty(xp, work, "z", (F, N * OH * OW), x.dtype)
    xp.matmul(W.reshape(F, C * K * K), cols, out=z)          # (F, N L) = (F, CKK) @ (CKK, N L)
    z += b[:, None]                                          # (F, N L) + (F, 1)
    return z.reshape(F, N, OH, OW).transpose(1, 0, 2, 3), cols   # (N, F, OH, OW)


def conv2d_backward(xp, dz, cols, x_shape, W, dW, db, stride: int = 1, padding: int = 0,
                    need_dx: bool = True, work=None):
    """Write dL/dW and dL/db into ``dW`` (F, C, K, K) and ``db`` (F,); return dL/dx
    (N, C, H, W) for ``x_shape``, or None.  ``dz`` (N, F, OH, OW), ``cols`` from the forward."""
    F, C, K, _ = W.shape
    N, _, OH, OW = dz.shape
    d2 = dz.transpose(1, 0, 2, 3).reshape(F, N * OH * OW)   # (F, N L); a view of GEMM memory
    xp.matmul(d2, cols.T, out=dW.reshape(F, C * K * K))      # (F, CKK) = (F, N L) @ (N L, CKK)
    d2.sum(axis=1, out=db)                                   # (F,)
    if not need_dx:
        return None
    dcols = _empty(xp, work, "dcols", (C * K * K, N * OH * OW), dz.dtype)
    xp.matmul(W.reshape(F, C * K * K).T, d2, out=dcols)      # (CKK, N L) = (CKK, F) @ (F, N L)
    dcols = dcols.reshape(C, K, K, N, OH, OW)
    _, _, H, Wd = x_shape
    Hp, Wp = H + 2 * padding, Wd + 2 * padding
    dx = _empty(xp, work, "dx", (C, N, Hp, Wp), dz.dtype)   # col2im, memory (C, N, H', W')
    dx.fill(0)
    for a in range(K):                                       # each kernel offset: a strided add
        for c in range(K):
            dx[:, :, a:a + stride * (OH - 1) + 1:stride, c:c + stride * (OW - 1) + 1:stride] \
                += dcols[:, a, c]                            # (C, N, OH, OW)
    dx = dx[:, :, padding:padding + H, padding:padding + Wd]
    return dx.transpose(1, 0, 2, 3)                          # (N, C, H, W)


# --- pooling ----------------------------------------------------------------------------

def _offsets(size: int, stride: int, OH: int, OW: int):
    """Each window offset ``(a, c)`` as the index of the entries at that offset of every
    window: ``x[index]`` is (N, C, OH, OW)."""
    for a in range(size):
        for c in range(size):
            yield (slice(None), slice(None), slice(a, a + stride * (OH - 1) + 1, stride),
                   slice(c, c + stride * (OW - 1) + 1, stride))


def pool_forward(xp, x, kind: str, size: int, stride: int, work=None):
    """Max (``kind = "max"``) or average (``"avg"``) pooling of ``x`` (N, C, H, W) over
    ``size x size`` windows at ``stride``, no padding: (N, C, OH, OW), in ``x``'s layout.
    A loop over the window's offsets, each an elementwise max or sum of strided views."""
    N, C, H, W = x.shape
    OH, OW = (H - size) // stride + 1, (W - size) // stride + 1
    at = list(_offsets(size, stride, OH, OW))
    if len(at) == 1:
        return x[at[0]] * x.dtype.type(1)
    combine = xp.maximum if kind == "max" else xp.add
    out = _empty(xp, work, "pool", (C, N, OH, OW), x.dtype).transpose(1, 0, 2, 3)
    combine(x[at[0]], x[at[1]], out=out)                     # (N, C, OH, OW)
    for index in at[2:]:
        combine(out, x[index], out=out)
    if kind == "avg":
        out *= x.dtype.type(1.0 / (size * size))
    return out


def pool_backward(xp, dout, x, out, kind: str, size: int, stride: int, work=None):
    """dL/dx (N, C, H, W) from ``dout`` (N, C, OH, OW), the forward's input ``x`` and
    output ``out``.  Max pooling sends each window's gradient to its first largest entry
    (in row-major order, as PyTorch does); average pooling spreads it evenly."""
    N, C, OH, OW = dout.shape
    H, W = x.shape[2:]
    dx = _empty(xp, work, "dpool", (C, N, H, W), x.dtype).transpose(1, 0, 2, 3)
    dx.fill(0)                                               # (N, C, H, W)
    apart = stride >= size                                   # windows do not overlap
    if kind == "avg":
        share = dout * x.dtype.type(1.0 / (size * size))     # (N, C, OH, OW)
        for index in _offsets(size, stride, OH, OW):
            if apart:
                dx[index] = share
            else:
                dx[index] += share
        return dx
    left = xp.ones(out.shape, dtype=bool)                    # windows not yet given theirs
    for index in _offsets(size, stride, OH, OW):
        hit = xp.equal(x[index], out)                        # (N, C, OH, OW)
        hit &= left
        if apart:
            xp.multiply(dout, hit, out=dx[index])
        else:
            dx[index] += dout * hit
        xp.greater(left, hit, out=left)                      # left and not hit
    return dx


# --- flatten --------------------------------------------------------------------------

def flatten_forward(xp, x):
    """(N, C, H, W) to (N, C H W) in PyTorch's (C, H, W) order (a copy where the memory
    is (N, H, W, C))."""
    return x.reshape(x.shape[0], -1)


def flatten_backward(xp, dout, shape):
    """(N, C H W) back to ``shape`` (N, C, H, W)."""
    return dout.reshape(shape)


# --- dropout --------------------------------------------------------------------------

def dropout_mask(xp, shape, rate: float, blocks, dtype):
    """Inverted dropout's scale ``keep / (1 - rate)`` of ``shape`` (N, ...), in ``dtype``.

    ``blocks``: ``((key, rows), ...)``, consecutive blocks of the batch's rows, each drawn
    from a generator seeded by its ``key`` (integers: the run's seed, the step, the shard,
    the layer) on the host, then moved where ``xp`` lives; so a shard's mask is the same
    bytes wherever it runs, and on CPU and GPU alike.
    """
    rest = tuple(shape[1:])
    parts = [np.random.default_rng([int(k) for k in key]).random((rows, *rest)) >= rate
             for key, rows in blocks]
    keep = np.concatenate(parts) if len(parts) > 1 else parts[0]          # (N, ...)
    scale = keep.astype(dtype) * np.asarray(1.0 / (1.0 - rate), dtype=dtype)
    return xp.asarray(scale)


def dropout_forward(xp, x, mask):
    """``x * mask`` (a mask of :func:`dropout_mask`)."""
    return x * mask


def dropout_backward(xp, dout, mask):
    """dL/dx: ``dout * mask``."""
    return dout * mask
