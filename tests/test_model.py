from __future__ import annotations

import pickle

import numpy as np
import pytest

from dtrain.core.arrays import aligned
from dtrain.core.config import OptimConfig
from dtrain.maths.model import Network, l2_penalty
from dtrain.maths.optim import Optimizer, Step, TrainState
from helpers.gradients import central_differences


def _objective(net: Network, l2: float, params, x, y) -> float:
    """The training objective: mean per-sample loss + 0.5 * l2 * ||W||^2."""
    return float(net.loss_and_grad(params, x, y)[net.size]) / len(y) + l2_penalty(net, params, l2)


def _analytic(net: Network, l2: float, params, x, y):
    """The gradient the optimizer steps along: the reduced buffer / batch + l2 * W."""
    opt = Optimizer(OptimConfig(name="sgd", lr=1.0), net, l2)
    step = Step(0, 0, 0, 1.0, len(y), True, True, ())
    new = opt.apply(TrainState(params.copy()), net.loss_and_grad(params, x, y), step)
    return params - new.vector           # lr = 1: the step is the gradient


def _targets(net: Network, rng: np.random.Generator, rows: int) -> np.ndarray:
    """Real targets (B, T), 0/1 label indicators (B, L) of logistic outputs, two classes
    (B,) of one logistic output, or class indices (B,)."""
    outputs = net.layers[-1]
    if net.regression:
        return 2 * rng.standard_normal((rows, outputs))
    if net.loss == "binary-cross-entropy":
        return rng.integers(0, 2, rows) if outputs == 1 else \
            rng.integers(0, 2, (rows, outputs)).astype(float)
    return rng.integers(0, outputs, rows)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu", "identity"])
@pytest.mark.parametrize("loss", ["cross-entropy", "mse", "squared-error", "binary-cross-entropy"])
@pytest.mark.parametrize("layers", [(5, 4), (5, 7, 4), (5, 6, 6, 4)], ids=["0h", "1h", "2h"])
def test_gradient_matches_central_differences(activation, loss, layers):
    net = Network(layers, activation, loss, "float64")
    rng = np.random.default_rng(3)
    params = net.init(1) + 0.1 * rng.standard_normal(net.size)   # nonzero biases too
    x = rng.standard_normal((9, layers[0]))
    y = _targets(net, rng, 9)                     # real targets (B, T), indicators or classes
    l2 = 0.03
    grad = _analytic(net, l2, params, x, y)
    numeric = central_differences(lambda p: _objective(net, l2, p, x, y), params)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu", "identity"])
@pytest.mark.parametrize("loss", ["cross-entropy", "mse", "squared-error", "binary-cross-entropy"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layers, shards, rows", [((4, 16, 3), 4, 4), ((5, 7, 4), 3, 1),
                                                  ((5, 6, 6, 1), 2, 17), ((64, 33, 10), 5, 9),
                                                  ((13, 2), 2, 40)])
def test_a_stack_of_shards_gives_each_shard_its_own_bytes(activation, loss, dtype, layers,
                                                           shards, rows):
    """``x`` (S, B, I) in one call: each shard's buffer is the bytes of that shard alone
    (what a worker computing several tiny shards at once relies on), weighted or not, for
    odd sizes that leave SIMD tails, and a row of one (BLAS's matrix-vector case)."""
    net = Network(layers, activation, loss, dtype)
    rng = np.random.default_rng(7)
    params = (net.init(1) + 0.1 * rng.standard_normal(net.size)).astype(dtype)
    x = rng.standard_normal((shards, rows, layers[0])).astype(dtype)        # (S, B, I)
    y = np.stack([_targets(net, rng, rows) for _ in range(shards)])          # (S, B, ...)
    w = rng.uniform(0, 2, (shards, rows))                                    # (S, B)
    stacked = net.loss_and_grad(params, x, y)                               # (S, P + 2)
    weighted = net.loss_and_grad(params, x, y, w)
    wide = np.full((shards + 1, net.buffer_size + 5), np.nan, dtype)      # rows apart, as
    net.loss_and_grad(params, x, y, out=wide[:shards, :net.buffer_size])   # core processes'
    assert stacked.shape == weighted.shape == (shards, net.buffer_size)
    for s in range(shards):
        assert stacked[s].tobytes() == net.loss_and_grad(params, x[s], y[s]).tobytes()
        assert weighted[s].tobytes() == net.loss_and_grad(params, x[s], y[s], w[s]).tobytes()
        assert wide[s, :net.buffer_size].tobytes() == stacked[s].tobytes()
    assert np.isnan(wide[:, net.buffer_size:]).all() and np.isnan(wide[shards]).all()
    one_class = loss == "cross-entropy" and layers[-1] == 1     # a softmax of one: no gradient
    assert np.isfinite(stacked).all() and (stacked[:, :net.size] != 0).any() != one_class


@pytest.mark.parametrize("loss, outputs", [("cross-entropy", 3), ("mse", 3),
                                           ("squared-error", 2), ("binary-cross-entropy", 1),
                                           ("binary-cross-entropy", 3)])
def test_weighted_loss_and_gradient_match_central_differences(loss, outputs):
    """With sample weights the buffer holds sum_i w_i loss_i and its gradient: checked
    against central differences of the weighted loss written out row by row, and, for
    integer weights, against the rows repeated that many times (a weight 0 drops a row)."""
    net = Network((4, 6, outputs), "tanh", loss, "float64")
    rng = np.random.default_rng(7)
    params = net.init(3) + 0.1 * rng.standard_normal(net.size)
    x, y = rng.standard_normal((8, 4)), _targets(net, rng, 8)
    w = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 1.0, 4.0, 1.5])
    P = net.size

    def weighted(p: np.ndarray) -> float:
        return sum(w[i] * float(net.loss_and_grad(p, x[i:i + 1], y[i:i + 1])[P])
                   for i in range(len(w)))

    buf = net.loss_and_grad(params, x, y, w)
    assert buf[P] == pytest.approx(weighted(params), rel=1e-12)
    np.testing.assert_allclose(buf[:P], central_differences(weighted, params), rtol=1e-6,
                               atol=1e-8)
    assert buf[P + 1] == net.loss_and_grad(params, x, y)[P + 1]      # rows, not weights
    counts = np.array([0, 1, 2, 3, 0, 1, 4, 1])
    repeated = net.loss_and_grad(params, x.repeat(counts, axis=0), y.repeat(counts, axis=0))
    by_weight = net.loss_and_grad(params, x, y, counts.astype(float))
    np.testing.assert_allclose(by_weight[:P + 1], repeated[:P + 1], rtol=1e-12, atol=1e-12)
    ones = net.loss_and_grad(params, x, y, np.ones(8))
    np.testing.assert_allclose(ones, net.loss_and_grad(params, x, y), rtol=1e-15, atol=0)


def test_binary_cross_entropy_is_scikit_learns_log_loss():
    """One logistic output for two classes: scikit-learn's log loss of the probability of
    the second class; several outputs: its binary log loss summed over the labels."""
    from sklearn.metrics import log_loss
    from sklearn.neural_network._base import binary_log_loss

    from dtrain.maths.model import binary_cross_entropy, sigmoid

    rng = np.random.default_rng(0)
    z, y = 3 * rng.standard_normal((20, 1)), rng.integers(0, 2, 20)
    loss, dz = binary_cross_entropy(np, z, y)
    p = sigmoid(np, z)[:, 0]
    assert loss / 20 == pytest.approx(log_loss(y, p), rel=1e-12)
    np.testing.assert_allclose(dz[:, 0], p - y, rtol=1e-15)
    z, t = 3 * rng.standard_normal((20, 4)), rng.integers(0, 2, (20, 4)).astype(float)
    loss, _ = binary_cross_entropy(np, z, t)
    assert loss / 20 == pytest.approx(binary_log_loss(t, sigmoid(np, z)), rel=1e-12)
    big = binary_cross_entropy(np, np.array([[800.0], [-800.0]]), np.array([0, 1]))[0]
    assert big == pytest.approx(1600.0)                       # no overflow, no log(0)
    net = Network((3, 1), "tanh", "binary-cross-entropy", "float64")
    z = np.array([[2.0], [-1.0], [0.5]])
    assert net.correct(z, np.array([1, 1, 0])) == 1           # z > 0 predicts the second class


@pytest.mark.parametrize("activation", ["relu", "sigmoid"])
def test_scikit_learn_init_is_scikit_learns_numbers(activation):
    """model.init = "scikit-learn": the very weights and biases scikit-learn's MLPs start
    from with the same integer random_state (its RandomState, its order, its bounds)."""
    from sklearn.neural_network import MLPRegressor

    layers = (5, 7, 6, 2)
    net = Network(layers, activation, "squared-error", "float64", "scikit-learn")
    sk = MLPRegressor(activation="logistic" if activation == "sigmoid" else activation)
    sk._random_state = np.random.RandomState(11)
    sk._initialize(np.zeros((1, 2)), list(layers), np.float64)
    ours = net.unflatten(net.init(11))
    for (W, b), coef, intercept in zip(ours, sk.coefs_, sk.intercepts_):
        assert (W.T == coef).all() and (b == intercept).all()
    assert net.init(2 ** 40).shape == (net.size,)             # seeds beyond 32 bits work
    assert Network(layers, activation, "squared-error", "float32",
                   "scikit-learn").init(11).dtype == np.float32


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


def test_lbfgs_raw_units_are_the_gradient_on_raw_features():
    """``raw_units`` takes a gradient on normalized inputs ``(x - shift) / scale`` to the
    gradient of the same objective in the parameters acting on the raw ``x`` (what
    ``solver="lbfgs"``'s ``tol`` is judged on): central differences in the raw parameters."""
    from dtrain.maths.lbfgs import raw_units
    net = Network((5, 7, 3), "tanh", "cross-entropy", "float64")
    rng = np.random.default_rng(5)
    shift, scale = rng.standard_normal(5) * 3, rng.uniform(0.2, 9.0, 5)     # (I,)
    x = rng.standard_normal((11, 5)) * scale + shift                        # raw rows (B, I)
    y = _targets(net, rng, 11)
    (w, b), (O, I) = net.slices[0], net.shapes[0]

    def normalized(raw: np.ndarray) -> np.ndarray:
        """The parameters acting on normalized inputs that compute what ``raw`` does on x."""
        out = raw.copy()
        W = raw[w].reshape(O, I)
        out[w], out[b] = (W * scale).ravel(), raw[b] + W @ shift
        return out

    raw = net.init(2) + 0.1 * rng.standard_normal(net.size)
    inputs = (x - shift) / scale
    numeric = central_differences(lambda p: _objective(net, 0.03, normalized(p), inputs, y),
                                  raw)
    grad = raw_units(net, shift, scale)(_analytic(net, 0.03, normalized(raw), inputs, y))
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert raw_units(net, None, None) is None
