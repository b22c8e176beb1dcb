"""Full-batch L-BFGS: scipy's L-BFGS-B over a network's flat parameters, as scikit-learn runs it.

``minimize`` asks ``gradient(params)`` for the summed buffer ``[grad (P) | loss |
correct]`` of the parameters ``params`` (P,) over the whole training set (a task graph's
fixed-order reduce, or one worker's shards summed in the same order: the same bytes) and
hands scipy scikit-learn's objective::

    f(params) = loss / n + 0.5 * l2 * sum ||W||^2         (l2 = alpha / n: scikit-learn's)
    grad f    = grad / n + l2 * W                         (biases unpenalised)

with ``n`` the training rows (sample weights are scaled to sum to them).  The update
itself is scipy's ``minimize(method="L-BFGS-B")``, scikit-learn's and dask-glm's,
stopped by ``maxiter`` (iterations), ``maxfun`` (evaluations) and ``gtol``.  It runs on
one BLAS thread wherever it runs (the driver or a worker): scipy's L-BFGS-B calls BLAS,
whose bits depend on its thread count, and the result must not depend on where it ran.
Host arrays (NumPy) in and out; the network's own dtype for ``params``, float64 for scipy.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtrain.core.arrays import to_host
from dtrain.core.config import OptimConfig
from dtrain.maths.model import Network, l2_penalty

REMEMBERED = 8      # evaluations kept to find an iterate's loss and correct count again


@dataclass(frozen=True)
class Iteration:
    """One L-BFGS iteration's end: the mean training loss of its iterate (without the L2
    term), its correct predictions, the objective scipy minimizes, the evaluations so
    far, and the seconds since the previous iteration ended."""

    loss: float
    correct: int
    objective: float
    evaluations: int
    seconds: float


@dataclass(frozen=True)
class Minimized:
    """What ``minimize`` found: the last iterate (P,) in the network's dtype and its mean
    training loss, each iteration (none where the start already met ``gtol``), the
    evaluations made, and scipy's ``status`` (0: converged; 1: ``maxiter`` or ``maxfun``
    reached; 2: stopped otherwise, e.g. no step lowers the loss) and message."""

    params: np.ndarray
    loss: float
    iterations: tuple[Iteration, ...]
    evaluations: int
    status: int
    message: str


def objective(net: Network, params: np.ndarray, buf: Any, l2: float,
              samples: float) -> tuple[float, np.ndarray]:
    """scikit-learn's objective and its gradient (float64) at ``params`` (P,), from the
    summed buffer ``buf`` (P + 2,) of the training set's ``samples`` rows."""
    P = net.size
    summed = np.asarray(to_host(buf), dtype=np.float64)                     # (P + 2,)
    x = np.asarray(params, dtype=np.float64)                                # (P,)
    grad = summed[:P] / samples                                             # (P,)
    for w in net.weight_slices:
        grad[w] += l2 * x[w]
    return float(summed[P] / samples) + l2_penalty(net, x, l2), grad


def minimize(gradient: Callable[[np.ndarray], Any], start: np.ndarray, net: Network,
             cfg: OptimConfig, l2: float, samples: float, iterations: int,
             after: Callable[[int], None] | None = None) -> Minimized:
    """Run scipy's L-BFGS-B from ``start`` (P,) for at most ``iterations`` iterations and
    ``cfg.max_fun`` evaluations of ``gradient`` (see the module's docstring);
    ``after(done)`` is called after each iteration (it may raise to stop the run)."""
    from scipy.optimize import minimize as scipy_minimize
    from threadpoolctl import threadpool_limits

    P = net.size
    seen: dict[bytes, tuple[float, int]] = {}       # an evaluated point -> its loss, correct
    done: list[Iteration] = []
    count, clock = [0], [time.perf_counter()]

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        params = x.astype(net.dtype)                                        # (P,)
        buf = to_host(gradient(params))                                     # (P + 2,)
        count[0] += 1
        seen[x.tobytes()] = (float(buf[P]) / samples, int(buf[P + 1]))
        while len(seen) > REMEMBERED:
            seen.pop(next(iter(seen)))
        return objective(net, params, buf, l2, samples)

    def at(x: np.ndarray) -> tuple[float, int]:
        """The loss and correct count of the point ``x`` (the line search's last point, as a
        rule: else evaluated again)."""
        if x.tobytes() not in seen:
            fun(x)
        return seen[x.tobytes()]

    def callback(intermediate_result: Any) -> None:
        loss, correct = at(np.asarray(intermediate_result.x))
        now = time.perf_counter()
        done.append(Iteration(loss, correct, float(intermediate_result.fun), count[0],
                              now - clock[0]))
        clock[0] = now
        if after is not None:
            after(len(done))

    with threadpool_limits(limits=1):
        found = scipy_minimize(fun, np.asarray(start, dtype=np.float64), jac=True,
                               method="L-BFGS-B", callback=callback,
                               options={"maxiter": iterations, "maxfun": cfg.max_fun,
                                        "gtol": cfg.gtol})
    loss = done[-1].loss if done else at(np.asarray(found.x, dtype=np.float64))[0]
    return Minimized(found.x.astype(net.dtype), loss, tuple(done), count[0],
                     int(found.status), str(found.message))
