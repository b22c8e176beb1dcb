"""Model parallelism's maths: a network split into slices, and one slice's forward and backward.

Layers go in pairs ("blocks"): the first layer of a block is split by rows
(slice ``m`` owns the hidden units ``U_m``: ``W_r[U_m, :]`` and ``b_r[U_m]``),
the second by columns (``W_c[:, U_m]``).  With an odd number of layers the
last one is a *head* that the root keeps whole, with the column layers'
biases.  :class:`Slicing` says which numbers of the flat parameter vector
each slice owns; :func:`slice_forward` and :func:`slice_backward` are one
slice's share of a block, side by side.  The task graph that runs them is
:mod:`dtrain.taskgraph.modelparallel`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dtrain.maths.model import Layout, Network
from dtrain.maths.optim import TrainState


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


# --- the maths of one slice, forward and backward side by side ----------------------------------

def views(layout_units: int, n_in: int, n_out: int, v):
    """A slice's ``W_r`` rows, ``b_r`` and ``W_c`` columns: views into its flat vector ``v``."""
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


