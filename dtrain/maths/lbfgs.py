"""Full-batch L-BFGS: scipy's L-BFGS-B over a network's flat parameters, as scikit-learn runs it.

``minimize`` asks ``gradient(params)`` for the summed buffer ``[grad (P) | loss |
correct]`` of the parameters ``params`` (P,) over the whole training set (a task graph's
fixed-order reduce, or one worker's shards summed in the same order: the same bytes) and
hands scipy scikit-learn's objective::

    f(params) = loss / n + 0.5 * l2 * sum ||W||^2         (l2 = alpha / n: scikit-learn's)
    grad f    = grad / n + l2 * W                         (biases unpenalised)

with ``n`` the training rows (sample weights are scaled to sum to them).  The update
itself is scipy's ``minimize(method="L-BFGS-B")``, scikit-learn's and dask-glm's,
stopped by ``maxiter`` (iterations), ``maxfun`` (evaluations) and ``gtol``.  ``gtol`` is
judged on the problem as the user gave it: where the network sees normalized inputs
``(x - shift) / scale``, the gradient is first taken back to the raw features' units
(:func:`raw_units`), so ``tol`` stops a standardized fit where it would stop one on the raw
features (scipy's own test, in the normalized units, stopped digits' 0-16 pixels ~7 times
above scikit-learn's objective).  It runs on
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
STOPPED_BY_CALLBACK = 99        # scipy's status where the callback raised StopIteration
CONVERGED = "CONVERGENCE: NORM OF PROJECTED GRADIENT <= PGTOL (in the raw features' units)"


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


def raw_units(net: Network, shift: np.ndarray | None,
              scale: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """The objective's gradient (P,) in the parameters of the same network acting on raw
    features, where it sees ``(x - shift) / scale`` (None where it sees them raw).

    Only the first layer changes: its raw weights are ``W / scale`` and its raw biases
    ``b - W @ (shift / scale)``, so by the chain rule::

        dW_raw = dW * scale + outer(db, shift)          # (O, I)
        db_raw = db                                     # (O,)
    """
    if shift is None or scale is None:
        return None
    (w, b), (O, I) = net.slices[0], net.shapes[0]
    s = np.asarray(scale, dtype=np.float64)                                 # (I,)
    m = np.asarray(shift, dtype=np.float64)                                 # (I,)

    def raw(grad: np.ndarray) -> np.ndarray:
        out = np.array(grad, dtype=np.float64)                              # (P,)
        out[w] = (grad[w].reshape(O, I) * s + np.outer(grad[b], m)).ravel()
        return out
    return raw


def minimize(gradient: Callable[[np.ndarray], Any], start: np.ndarray, net: Network,
             cfg: OptimConfig, l2: float, samples: float, iterations: int,
             after: Callable[[int], None] | None = None,
             units: Callable[[np.ndarray], np.ndarray] | None = None) -> Minimized:
    """Run scipy's L-BFGS-B from ``start`` (P,) for at most ``iterations`` iterations and
    ``cfg.max_fun`` evaluations of ``gradient`` (see the module's docstring);
    ``after(done)`` is called after each iteration (it may raise to stop the run).
    ``units``: :func:`raw_units`'s map, where ``gtol`` is judged in the raw features' units
    (then here, after each iteration; scipy's own test is off); None: scipy judges it."""
    from scipy.optimize import minimize as scipy_minimize
    from threadpoolctl import threadpool_limits

    P = net.size
    seen: dict[bytes, tuple[float, int, float, np.ndarray]] = {}    # point -> loss, correct,
    done: list[Iteration] = []                                      # objective, its gradient
    count, clock = [0], [time.perf_counter()]

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        if x.tobytes() in seen:                     # evaluated already: the same bytes again
            f, g = seen[x.tobytes()][2:]
            return f, g.copy()
        params = x.astype(net.dtype)                                        # (P,)
        buf = to_host(gradient(params))                                     # (P + 2,)
        count[0] += 1
        f, g = objective(net, params, buf, l2, samples)
        seen[x.tobytes()] = (float(buf[P]) / samples, int(buf[P + 1]), f, g)
        while len(seen) > REMEMBERED:
            seen.pop(next(iter(seen)))
        return f, g.copy()                          # scipy's to keep; ours stays as found

    def at(x: np.ndarray) -> tuple[float, int, float, np.ndarray]:
        """What ``fun`` found at the point ``x`` (the line search's last point, as a rule:
        else evaluated again)."""
        if x.tobytes() not in seen:
            fun(x)
        return seen[x.tobytes()]

    def converged(x: np.ndarray) -> bool:
        """scipy's ``gtol`` test at ``x``, in the raw features' units."""
        assert units is not None
        return float(np.max(np.abs(units(at(x)[3])), initial=0.0)) <= cfg.gtol

    def callback(intermediate_result: Any) -> None:
        x = np.asarray(intermediate_result.x)
        loss, correct, _, _ = at(x)
        now = time.perf_counter()
        done.append(Iteration(loss, correct, float(intermediate_result.fun), count[0],
                              now - clock[0]))
        clock[0] = now
        if units is not None and converged(x):
            raise StopIteration         # scipy ends the run here, at this iterate
        if after is not None:
            after(len(done))

    x0 = np.asarray(start, dtype=np.float64)                                # (P,)
    with threadpool_limits(limits=1):
        if units is not None and converged(x0):
            return Minimized(x0.astype(net.dtype), at(x0)[0], (), count[0], 0, CONVERGED)
        found = scipy_minimize(fun, x0, jac=True, method="L-BFGS-B", callback=callback,
                               options={"maxiter": iterations, "maxfun": cfg.max_fun,
                                        "gtol": cfg.gtol if units is None else 0.0})
    status, message = int(found.status), str(found.message)
    if status == STOPPED_BY_CALLBACK:
        status, message = 0, CONVERGED
    loss = done[-1].loss if done else at(np.asarray(found.x, dtype=np.float64))[0]
    return Minimized(found.x.astype(net.dtype), loss, tuple(done), count[0], status, message)
