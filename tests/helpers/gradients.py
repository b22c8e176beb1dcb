"""Gradients by central differences, for the gradient checks of the layers and the nets."""
from __future__ import annotations

import numpy as np


def central_differences(f, params: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of ``f`` at ``params``."""
    out = np.empty(params.size)
    for i in range(params.size):
        e = np.zeros(params.size)
        e[i] = eps
        out[i] = (f(params + e) - f(params - e)) / (2 * eps)
    return out
