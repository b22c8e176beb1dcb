"""A regression's figures, from sums that add up over parts: MSE, RMSE, MAE and R^2.

:class:`TargetSums` holds, per target, the summed squared and absolute errors
and the targets' own count, mean and centred sum of squares.  Two parts'
sums merge exactly enough for R^2 (the centred sums by Chan et al.'s pairwise
formula, not ``sum t^2 - n mean^2``, which cancels badly), so an evaluation
cut into parts (tasks on a cluster) gives the figures of the whole.  Each
figure is per target (T,); the overall one is their plain mean, as
scikit-learn's ``multioutput="uniform_average"`` defines it.  R^2 of a
constant target is 1 if it is predicted exactly, else 0 (scikit-learn's
``force_finite``).  Host arrays (NumPy) only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class TargetSums:
    """Per-target sums over ``rows`` rows: squared errors ``sse``, absolute errors ``sae``,
    and the targets' ``mean`` and centred sum of squares ``m2``, each (T,) float64."""

    rows: int
    sse: np.ndarray
    sae: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def of(cls, z: np.ndarray, t: np.ndarray) -> TargetSums:
        """The sums of predictions ``z`` against targets ``t``, both (N, T)."""
        z, t = np.asarray(z, dtype=np.float64), np.asarray(t, dtype=np.float64)
        diff = z - t                                                   # (N, T)
        mean = t.mean(axis=0) if len(t) else np.zeros(t.shape[1])      # (T,)
        return cls(int(t.shape[0]), (diff * diff).sum(axis=0), np.abs(diff).sum(axis=0),
                   mean, ((t - mean) ** 2).sum(axis=0))

    def __add__(self, other: TargetSums) -> TargetSums:
        n = self.rows + other.rows
        if not self.rows or not other.rows:
            return other if not self.rows else self
        delta = other.mean - self.mean                                 # (T,)
        return TargetSums(n, self.sse + other.sse, self.sae + other.sae,
                          self.mean + delta * (other.rows / n),
                          self.m2 + other.m2 + delta * delta * (self.rows * other.rows / n))

    @property
    def targets(self) -> int:
        return int(self.sse.shape[0])

    def mse(self) -> np.ndarray:
        return self.sse / max(self.rows, 1)                            # (T,)

    def rmse(self) -> np.ndarray:
        return np.sqrt(self.mse())

    def mae(self) -> np.ndarray:
        return self.sae / max(self.rows, 1)

    def r2(self) -> np.ndarray:
        """``1 - sse / m2`` per target (T,)."""
        return r2(self.sse, self.m2)

    def overall(self) -> dict[str, float]:
        """``mse``, ``rmse``, ``mae`` and ``r2``: each the mean of the per-target figures."""
        return {name: float(np.mean(getattr(self, name)()))
                for name in ("mse", "rmse", "mae", "r2")}

    def per_target(self, names: tuple[str, ...]) -> dict[str, dict[str, float]]:
        """``{name: {"mse", "rmse", "mae", "r2"}}`` in target order."""
        figures = {k: getattr(self, k)() for k in ("mse", "rmse", "mae", "r2")}
        return {str(name): {k: float(v[j]) for k, v in figures.items()}
                for j, name in enumerate(names)}


def r2(sse: np.ndarray, m2: np.ndarray) -> np.ndarray:
    """R^2 per target (T,) from the summed squared errors and the targets' centred sums of
    squares: ``1 - sse / m2``; a constant target (``m2`` 0) scores 1 if predicted exactly,
    else 0."""
    sse, m2 = np.asarray(sse, dtype=np.float64), np.asarray(m2, dtype=np.float64)
    exact = np.where(sse == 0, 1.0, 0.0)
    ratio = np.divide(sse, m2, out=np.zeros_like(sse), where=m2 > 0)
    return np.where(m2 > 0, 1.0 - ratio, exact)
