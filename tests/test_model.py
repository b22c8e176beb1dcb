from __future__ import annotations

import pickle

import numpy as np
import pytest

from dtrain.core.arrays import aligned
from dtrain.core.config import OptimConfig
from dtrain.maths.model import Network, l2_penalty
from dtrain.maths.optim import Optimizer, Step, TrainState


def _objective(net: Network, l2: float, params, x, y) -> float:
    """The training objective: mean per-sample loss + 0.5 * l2 * ||W||^2."""
    return float(net.loss_and_grad(params, x, y)[net.size]) / len(y) + l2_penalty(net, params, l2)


def _analytic(net: Network, l2: float, params, x, y):
    """The gradient the optimizer steps along: the reduced buffer / batch + l2 * W."""
    opt = Optimizer(OptimConfig(name="sgd", lr=1.0), net, l2)
    step = Step(0, 0, 0, 1.0, len(y), True, True, ())
    new = opt.apply(TrainState(params.copy()), net.loss_and_grad(params, x, y), step)
    return params - new.vector           # lr = 1: the step is the gradient


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
@pytest.mark.parametrize("loss", ["cross-entropy", "mse", "squared-error"])
@pytest.mark.parametrize("layers", [(5, 4), (5, 7, 4), (5, 6, 6, 4)], ids=["0h", "1h", "2h"])
def test_gradient_matches_central_differences(activation, loss, layers):
    net = Network(layers, activation, loss, "float64")
    rng = np.random.default_rng(3)
    params = net.init(1) + 0.1 * rng.standard_normal(net.size)   # nonzero biases too
    x = rng.standard_normal((9, layers[0]))
    y = 2 * rng.standard_normal((9, layers[-1])) if net.regression \
        else rng.integers(0, layers[-1], 9)                      # real targets (B, T) or classes
    l2 = 0.03
    grad = _analytic(net, l2, params, x, y)
    eps = 1e-6
    numeric = np.empty(net.size)
    for i in range(net.size):
        e = np.zeros(net.size)
        e[i] = eps
        numeric[i] = (_objective(net, l2, params + e, x, y)
                      - _objective(net, l2, params - e, x, y)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_buffer_layout_and_views():
    net = Network((3, 4, 2), "tanh", "cross-entropy", "float64")
    assert net.size == 3 * 4 + 4 + 4 * 2 + 2
    flat = np.arange(net.size, dtype=float)
    (W1, b1), (W2, b2) = net.unflatten(flat)
    assert W1.shape == (4, 3) and b1.shape == (4,) and W2.shape == (2, 4) and b2.shape == (2,)
    assert np.shares_memory(W1, flat) and np.shares_memory(b2, flat)   # views, not copies
    W2[0, 0] = -1
    assert flat[16] == -1
    named = net.named(flat)
    assert list(named) == ["W1", "b1", "W2", "b2"]
    assert not np.shares_memory(named["W1"], flat)


def test_loss_sums_are_additive_over_rows():
    """Shard buffers add up to the whole batch's buffer: what the reduce relies on."""
    net = Network((6, 5, 3), "sigmoid", "cross-entropy", "float64")
    rng = np.random.default_rng(0)
    x, y, p = rng.standard_normal((10, 6)), rng.integers(0, 3, 10), net.init(0)
    whole = net.loss_and_grad(p, x, y)
    parts = net.loss_and_grad(p, x[:4], y[:4]) + net.loss_and_grad(p, x[4:], y[4:])
    np.testing.assert_allclose(parts, whole, rtol=1e-12, atol=1e-14)
    assert not net.loss_and_grad(p, x[:0], y[:0]).any()      # an empty slice adds nothing


def test_buffer_tail_is_the_loss_then_the_correct_count():
    """``[grad (P) | loss | correct]``: the count is what evaluate counts on the same rows,
    an exact integer in the buffer's dtype, summed over shards like the rest."""
    for dtype in ("float64", "float32"):
        net = Network((4, 8, 3), "tanh", "cross-entropy", dtype)
        rng = np.random.default_rng(2)
        x, y, p = rng.standard_normal((50, 4)).astype(dtype), rng.integers(0, 3, 50), net.init(0)
        buf = net.loss_and_grad(p, x, y)
        assert buf.shape == (net.size + 2,) == (net.buffer_size,)
        loss, correct, n = net.evaluate(p, x, y)
        assert buf[net.size] == pytest.approx(loss, rel=1e-5)
        assert buf[net.size + 1] == correct and 0 < correct < n
        halves = net.loss_and_grad(p, x[:20], y[:20]) + net.loss_and_grad(p, x[20:], y[20:])
        assert halves[net.size + 1] == correct


def test_init_is_seeded_and_typed():
    net = Network((4, 8, 3), "relu", "cross-entropy", "float32")
    a, b, c = net.init(0), net.init(0), net.init(1)
    assert a.dtype == np.float32 and (a == b).all() and not (a == c).all()
    (_, b1), _ = net.unflatten(a)
    assert not b1.any()


def test_float32_stays_float32():
    net = Network((4, 8, 3), "tanh", "cross-entropy", "float32")
    x = np.ones((5, 4), np.float32)
    buf = net.loss_and_grad(net.init(0), x, np.zeros(5, dtype=np.int64))
    assert buf.dtype == np.float32


def test_evaluate_counts_correct_predictions():
    net = Network((2, 2), "tanh", "cross-entropy", "float64")
    params = np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])          # logits = x
    x = np.array([[2.0, 1.0], [0.0, 3.0], [5.0, 4.0]])
    loss, correct, n = net.evaluate(params, x, np.array([0, 1, 1]), chunk=2)
    assert (correct, n) == (2, 3)
    assert loss == pytest.approx(np.log1p(np.exp(-1.0)) + np.log1p(np.exp(-3.0))
                                 + np.log1p(np.exp(1.0)))


def test_misaligned_buffers_are_realigned_on_unpickle():
    """Dask can hand a task an array that starts at any byte of a network frame; BLAS then
    rounds differently.  TrainState re-aligns on unpickle, keeping results bit-exact."""
    net = Network((4, 16, 3), "tanh", "cross-entropy", "float64")
    rng = np.random.default_rng(1)
    x, y, p = rng.standard_normal((16, 4)), rng.integers(0, 3, 16), net.init(0)
    raw = bytearray(p.nbytes + 8)
    odd = np.frombuffer(memoryview(raw)[3:3 + p.nbytes], dtype=np.float64)
    odd[:] = p
    assert not odd.flags.aligned
    assert aligned(odd).flags.aligned and (aligned(odd) == p).all()
    frames: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(TrainState(p), protocol=5, buffer_callback=frames.append)
    raw = bytearray(p.nbytes + 8)                    # the frame lands 3 bytes into a buffer
    memoryview(raw)[3:3 + p.nbytes] = frames[0].raw()
    restored = pickle.loads(blob, buffers=[memoryview(raw)[3:3 + p.nbytes]])
    assert restored.vector.flags.aligned
    ref = net.loss_and_grad(p, x, y)
    assert (net.loss_and_grad(restored.vector, x, y) == ref).all()
