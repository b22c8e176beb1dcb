"""Shards and minibatches: the training set cut into fixed shards that live on workers.

After the split and normalization (:mod:`dtrain.data.prepare`) the training
split is repeated ``replicate`` times and cut into ``shards`` contiguous
shards.  Each shard is built on its worker by a loading task
(:func:`load_shard`), so a lost shard can be rebuilt by running its task
again and the driver never holds the training set.  :func:`epoch_bounds`
says which rows of each shard form each minibatch.
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.sizeof import sizeof

from dtrain.core.arrays import align_on_unpickle, array_module, on_device, on_gpu
from dtrain.core.config import DataConfig
from dtrain.core.modelfile import Normalization
from dtrain.core.errors import DataError
from dtrain.data.prepare import prepared
from dtrain.data.readers import synthetic_rows


@align_on_unpickle
@dataclass(frozen=True)
class Shard:
    """One fixed slice of the (replicated) training set, living on a worker."""

    index: int
    x: Any            # (n, D)
    y: Any            # (n,) class indices, or (n, T) a regression's targets in x's dtype
    w: Any = None     # (n,) sample weights in x's dtype, or None: unweighted
    _arrays = ("x", "y", "w")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def rows(self, epoch: int, lo: int, hi: int, seed: int | None) -> Any:
        """Which rows are ``lo:hi`` of this epoch's order (shuffled when ``seed`` is not
        None): a slice, or an index array where the shard lives (a GPU shard's order is
        kept on the GPU, so a step sends the device nothing)."""
        if seed is None:
            return slice(lo, hi)
        if on_gpu(self.x):
            return _device_order(seed, epoch, self.index, len(self))[lo:hi]
        return _epoch_order(seed, epoch, self.index, len(self))[lo:hi]

    def batch(self, epoch: int, lo: int, hi: int, seed: int | None):
        """Rows ``lo:hi`` of this epoch's order (shuffled when ``seed`` is not None)."""
        rows = self.rows(epoch, lo, hi, seed)
        return self.x[rows], self.y[rows]

    def weights(self, epoch: int, lo: int, hi: int, seed: int | None):
        """The sample weights of :meth:`batch`'s rows (B,), or None for an unweighted shard."""
        return None if self.w is None else self.w[self.rows(epoch, lo, hi, seed)]


@sizeof.register(Shard)
def _sizeof_shard(shard: Shard) -> int:
    return int(shard.x.nbytes + shard.y.nbytes + (0 if shard.w is None else shard.w.nbytes))


@functools.lru_cache(maxsize=64)
def _epoch_order(seed: int, epoch: int, shard: int, n: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, shard]).permutation(n)


@functools.lru_cache(maxsize=64)
def _device_order(seed: int, epoch: int, shard: int, n: int, offset: int = 0) -> Any:
    """:func:`_epoch_order` (``seed`` None: the rows in order) plus ``offset``, in GPU
    memory (copied there once per epoch and shard)."""
    order = np.arange(n) if seed is None else _epoch_order(seed, epoch, shard, n)
    return on_device(order + offset, True)


class _Stacks:
    """GPU shards laid end to end, one device copy per group of shards (while they live)."""

    def __init__(self, keep: int = 8):
        self.keep, self.made = keep, {}

    def __call__(self, shards: Sequence[Shard]) -> tuple[Any, Any, list[int]]:
        key = tuple(map(id, shards))
        hit = self.made.get(key)
        if hit is not None and all(r() is s for r, s in zip(hit[0], shards)):
            return hit[1]
        xp = array_module(shards[0].x)
        starts = np.cumsum([0] + [len(s) for s in shards[:-1]]).tolist()
        value = (xp.concatenate([s.x for s in shards]), xp.concatenate([s.y for s in shards]),
                 starts)
        while len(self.made) >= self.keep:
            self.made.pop(next(iter(self.made)))
        self.made[key] = ([weakref.ref(s) for s in shards], value)
        return value


_stacks = _Stacks()


def group_batch(shards: Sequence[Shard], epoch: int, bounds: Sequence[tuple[int, int]],
                seed: int | None) -> tuple[Any, Any]:
    """The rows ``bounds[i]`` of each GPU shard ``i``'s epoch order, laid end to end as
    :func:`minibatch` lays them: gathered in one pass from the shards stacked on the device
    once, with each epoch's orders kept there, so a step costs two gathers and a join of
    index slices, and sends the device nothing."""
    x, y, starts = _stacks(shards)
    xp = array_module(x)
    rows = xp.concatenate([_device_order(seed, epoch, s.index, len(s), at)[lo:hi]
                           for s, (lo, hi), at in zip(shards, bounds, starts)])
    return x[rows], y[rows]


def stacked_batch(shards: Sequence[Shard], epoch: int, bounds: Sequence[tuple[int, int]],
                  seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``bounds[i]`` of each host shard ``i``'s epoch order, stacked: ``x`` (S, B,
    I) and ``y`` (S, B) or (S, B, T), every ``bounds[i]`` of ``B`` rows.  Each shard's rows
    are gathered straight into its place (one copy, as :meth:`Shard.batch` makes), the same
    values as its :meth:`Shard.batch`: what a stack of tiny shards is computed from in one
    pass (:meth:`~dtrain.maths.model.Network.loss_and_grad`)."""
    first, (lo0, hi0) = shards[0], bounds[0]
    x = np.empty((len(shards), hi0 - lo0, *first.x.shape[1:]), first.x.dtype)   # (S, B, I)
    y = np.empty((len(shards), hi0 - lo0, *first.y.shape[1:]), first.y.dtype)   # (S, B, ...)
    for i, (shard, (lo, hi)) in enumerate(zip(shards, bounds)):
        rows = shard.rows(epoch, lo, hi, seed)
        if isinstance(rows, slice):
            x[i], y[i] = shard.x[rows], shard.y[rows]
        else:
            np.take(shard.x, rows, axis=0, out=x[i])
            np.take(shard.y, rows, axis=0, out=y[i])
    return x, y


def shard_ranges(n_train: int, replicate: int, shards: int) -> list[tuple[int, int]]:
    """``(start, stop)`` rows of each shard in the replicated training set."""
    total = n_train * replicate
    if shards > total:
        raise DataError(f"data.shards = {shards} but there are only {total} training samples; "
                        f"use at most {total} shards")
    bounds = np.linspace(0, total, shards + 1).round().astype(int)  # contiguous, near-equal
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _training_rows(cfg: DataConfig, start: int, stop: int, n_train: int,
                   norm: Normalization | None):
    base = np.arange(start, stop) % n_train  # replication repeats the training split
    if cfg.dataset == "synthetic" and cfg.normalize == "none" and norm is None:
        return synthetic_rows(cfg, base)  # generate only these rows
    x, y = prepared(cfg, norm)[0]["train"]
    return x[base], y[base]


@dataclass(frozen=True)
class ShardSource:
    """Where shard ``index`` comes from: rows ``start:stop`` of the replicated training set
    (``n_train`` rows before replication), as ``dtype``, in GPU memory if ``gpu`` (and the
    worker has a usable GPU), normalized with ``norm`` (None: fitted on the training split).
    The loading task's record."""

    data: DataConfig
    index: int
    start: int
    stop: int
    n_train: int
    dtype: str
    gpu: bool = False
    norm: Normalization | None = None


def sources(cfg: DataConfig, ranges: Sequence[tuple[int, int]], n_train: int, dtype: str,
            norm: Normalization | None = None) -> list[ShardSource]:
    """The loading records of shards cut at ``ranges``."""
    return [ShardSource(cfg, i, a, b, n_train, dtype, norm=norm)
            for i, (a, b) in enumerate(ranges)]


def _targets(y: np.ndarray, dtype: str) -> np.ndarray:
    """Class indices as they are; a regression's real targets (N, T) in the model's dtype,
    as the loss compares them (not normalized)."""
    return np.ascontiguousarray(y, dtype=dtype) if y.dtype.kind == "f" else y


def load_shard(src: ShardSource) -> Shard:
    """Loading task: build one shard on this worker."""
    x, y = _training_rows(src.data, src.start, src.stop, src.n_train, src.norm)
    return Shard(src.index, on_device(np.ascontiguousarray(x, dtype=src.dtype), src.gpu),
                 on_device(_targets(y, src.dtype), src.gpu))


def load_shards(srcs: tuple[ShardSource, ...]) -> list[Shard]:
    """Loading task: every shard, on one worker (model parallelism shares the whole set)."""
    return [load_shard(src) for src in srcs]


def load_part(cfg: DataConfig, part: str, dtype: str, gpu: bool = False,
              norm: Normalization | None = None) -> Shard:
    """Loading task: the ``"val"`` or ``"test"`` split as one shard."""
    x, y = prepared(cfg, norm)[0][part]
    return Shard(-1, on_device(np.ascontiguousarray(x, dtype=dtype), gpu),
                 on_device(_targets(y, dtype), gpu))


def minibatch(shards: Sequence[Shard], epoch: int, bounds: Sequence[tuple[int, int]],
              seed: int | None) -> tuple[Any, Any]:
    """A whole global minibatch in one piece: rows ``bounds[i]`` of each shard ``i``'s epoch
    order, in shard order (the serial reference, and model parallelism, which holds every
    shard on every worker)."""
    rows = [s.batch(epoch, lo, hi, seed) for s, (lo, hi) in zip(shards, bounds)]
    return np.concatenate([r[0] for r in rows]), np.concatenate([r[1] for r in rows])  # (B, D), (B,)


def _keys_at_most(n: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """How many of each shard's keys ``(2 r + 1) / (2 n)`` are at most ``p / q``, in
    integers (exact): ``(T, S)`` for ``n`` (S,) and ``p``, ``q`` (T, 1)."""
    return np.clip((2 * n * p // q - 1) // 2 + 1, 0, n)


def _keys_below(n: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """As :func:`_keys_at_most`, for the keys strictly below ``p / q``."""
    return np.clip(((2 * n * p - 1) // q - 1) // 2 + 1, 0, n)


def epoch_bounds(sizes: list[int], batch_size: int) -> np.ndarray:
    """Which rows of each shard make up each minibatch of an epoch.

    Returns ``c`` of shape ``(steps + 1, shards)``: step ``t`` takes rows
    ``c[t, i]:c[t + 1, i]`` of shard ``i``'s epoch order.  The shards are
    interleaved in proportion to their sizes (sample ``r`` of a shard of
    ``n`` sits at position ``(r + 1/2) / n``, ties by shard id), so every
    minibatch has exactly ``batch_size`` samples (the last one the rest) and
    draws evenly from all shards, whatever their sizes.

    Computed without a row of memory per sample (the driver plans runs of any
    size): for each cut ``k``, the ``k``-th smallest key is found by a binary
    search in each shard, in exact integer arithmetic (rows per shard below about
    10**9); the rows below it count, and then its ties in shard order.
    """
    n = np.asarray(sizes, dtype=np.int64)                                  # (S,)
    total = int(n.sum())
    steps = -(-total // batch_size)
    cuts = np.minimum(np.arange(steps + 1, dtype=np.int64) * batch_size, total)   # (T,)
    k = cuts[:, None]                                                      # (T, 1)
    p, q = np.ones_like(k), np.zeros_like(k)               # the k-th key, p / q (q = 0: none)
    for j in np.flatnonzero(n):
        lo, hi = np.zeros_like(k), np.full_like(k, n[j])   # shard j's first key with k at most it
        while (lo < hi).any():
            mid = (lo + hi) // 2
            enough = _keys_at_most(n, 2 * mid + 1, 2 * n[j]).sum(axis=1, keepdims=True) >= k
            hi, lo = np.where(enough, mid, hi), np.where(enough, lo, mid + 1)
        pj, qj = 2 * lo + 1, np.full_like(k, 2 * n[j])
        smaller = (lo < n[j]) & ((q == 0) | (pj * q < p * qj))
        p, q = np.where(smaller, pj, p), np.where(smaller, qj, q)
    q = np.where(q == 0, 1, q)                                             # only where k = 0
    below = _keys_below(n, p, q)                                           # (T, S)
    ties = _keys_at_most(n, p, q) - below                                  # (T, S): 0 or 1
    counts = below + ties * (np.cumsum(ties, axis=1) <= k - below.sum(axis=1, keepdims=True))
    counts[cuts == 0] = 0
    return counts
