"""Convolution, pooling, flatten and dropout (``dtrain/maths/conv.py``) and convolutional
``Network``s: gradients against central differences and against PyTorch's autograd in
float64, and the bytes rules the dense layers keep (a stack of shards, float32)."""
from __future__ import annotations

import numpy as np
import pytest

from dtrain.core import layerspec
from dtrain.core.layerspec import Conv, Dropout, Flatten, Pool
from dtrain.maths import conv as cv
from dtrain.maths.model import Network
from helpers.gradients import central_differences

LENET = (Conv(6, 5, padding=2), Pool("max", 2), Conv(16, 5), Pool("max", 2), Flatten(),
         400, 120, 84, 10)




def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


# --- the layers alone, against PyTorch ---------------------------------------------------

@pytest.mark.parametrize("C, F, K, stride, padding, H, W", [
    (1, 6, 5, 1, 2, 12, 12), (3, 4, 3, 2, 1, 9, 7), (2, 3, 2, 3, 0, 8, 8), (4, 2, 1, 1, 0, 5, 6)])
def test_conv2d_forward_and_backward_match_torch(C, F, K, stride, padding, H, W):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, C, H, W))
    Wt, b = rng.standard_normal((F, C, K, K)), rng.standard_normal(F)
    z, cols = cv.conv2d_forward(np, x, Wt, b, stride, padding)            # (N, F, OH, OW)
    dz = rng.standard_normal(z.shape)
    dW, db = np.empty_like(Wt), np.empty_like(b)
    dx = cv.conv2d_backward(np, dz, cols, x.shape, Wt, dW, db, stride, padding)

    tx, tW, tb = (torch.tensor(a, requires_grad=True) for a in (x, Wt, b))
    tz = torch.nn.functional.conv2d(tx, tW, tb, stride=stride, padding=padding)
    tz.backward(torch.tensor(dz))
    assert z.shape == tuple(tz.shape)
    assert _rel(z, tz.detach().numpy()) < 1e-12
    for ours, theirs in ((dx, tx.grad), (dW, tW.grad), (db, tb.grad)):
        assert _rel(ours, theirs.numpy()) < 1e-12


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("size, stride, H, W", [(2, 2, 8, 8), (3, 2, 9, 7), (2, 1, 5, 5),
                                                 (3, 3, 10, 11)])
def test_pooling_matches_torch(kind, size, stride, H, W):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, H, W))
    out = cv.pool_forward(np, x, kind, size, stride)
    dout = rng.standard_normal(out.shape)
    dx = cv.pool_backward(np, dout, x, out, kind, size, stride)
    tx = torch.tensor(x, requires_grad=True)
    pool = torch.nn.functional.max_pool2d if kind == "max" else torch.nn.functional.avg_pool2d
    tout = pool(tx, size, stride)
    tout.backward(torch.tensor(dout))
    assert _rel(out, tout.detach().numpy()) < 1e-12
    assert _rel(dx, tx.grad.numpy()) < 1e-12


def test_max_pooling_sends_a_tie_to_the_first_entry_as_torch_does():
    torch = pytest.importorskip("torch")
    x = np.zeros((1, 1, 4, 4))
    out = cv.pool_forward(np, x, "max", 2, 2)
    dx = cv.pool_backward(np, np.ones_like(out), x, out, "max", 2, 2)
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2, 2).sum().backward()
    np.testing.assert_array_equal(dx, tx.grad.numpy())
    assert dx.sum() == 4


# --- whole nets ------------------------------------------------------------------------

def _torch_lenet(torch, net: Network, params: np.ndarray):
    """The same LeNet-5 in PyTorch, holding ``params``."""
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                          nn.Linear(84, 10)).double()
    weighted = [m for m in model if hasattr(m, "weight")]
    with torch.no_grad():
        for m, (W, b) in zip(weighted, net.unflatten(params)):
            m.weight.copy_(torch.tensor(W))
            m.bias.copy_(torch.tensor(b))
    return model, weighted


def test_lenet_gradient_matches_torch_autograd_in_float64():
    """LeNet-5 as PyTorch's tutorials write it: the summed loss and every parameter's
    gradient within 1e-9 relative of autograd's."""
    torch = pytest.importorskip("torch")
    net = Network(LENET, "relu", "cross-entropy", "float64", input_shape=(1, 28, 28))
    rng = np.random.default_rng(2)
    params = net.init(0) + 0.01 * rng.standard_normal(net.size)
    x = rng.standard_normal((16, 784))
    y = rng.integers(0, 10, 16)
    buf = net.loss_and_grad(params, x, y)

    model, weighted = _torch_lenet(torch, net, params)
    z = model(torch.tensor(x).reshape(16, 1, 28, 28))
    loss = torch.nn.functional.cross_entropy(z, torch.tensor(y), reduction="sum")
    loss.backward()
    theirs = np.concatenate([t.grad.numpy().ravel() for m in weighted for t in (m.weight, m.bias)])
    assert abs(buf[net.size] - loss.item()) / loss.item() < 1e-12
    assert _rel(buf[:net.size], theirs) < 1e-9
    assert buf[net.size + 1] == (z.argmax(1).numpy() == y).sum()


@pytest.mark.parametrize("layers, shape", [
    ((Conv(2, 3, padding=1), Pool("max", 2), Flatten(), 18, 3), (1, 6, 6)),
    ((Conv(3, 2, stride=2), Pool("avg", 2, 1), Flatten(), 12, 4, 3), (2, 7, 7)),
    ((Conv(2, 3), Dropout(0.5), Conv(2, 2), Flatten(), 8, 3), (1, 5, 5)),
    ((12, Dropout(0.3), 5, 3), ()),
], ids=["conv-max", "strided-avg", "dropout", "dense-dropout"])
@pytest.mark.parametrize("activation", ["tanh", "sigmoid"])
def test_conv_gradients_match_central_differences(layers, shape, activation):
    """Each layer's backward is its forward's derivative; dropout with a fixed mask (the
    same ``noise`` key each call) is a fixed linear map."""
    net = Network(layers, activation, "cross-entropy", "float64", input_shape=shape, seed=4)
    rng = np.random.default_rng(3)
    params = net.init(1) + 0.1 * rng.standard_normal(net.size)
    x = rng.standard_normal((5, net.features))
    y = rng.integers(0, 3, 5)
    noise = (((0, 7, 1), 5),)
    grad = net.loss_and_grad(params, x, y, noise=noise)[:net.size]
    numeric = central_differences(
        lambda p: float(net.loss_and_grad(p, x, y, noise=noise)[net.size]), params)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_stack_of_conv_shards_gives_each_shard_its_own_bytes(dtype):
    net = Network(LENET, "relu", "cross-entropy", dtype, input_shape=(1, 28, 28))
    rng = np.random.default_rng(5)
    params = net.init(0).astype(dtype)
    x = rng.standard_normal((3, 4, 784)).astype(dtype)                      # (S, B, I)
    y = rng.integers(0, 10, (3, 4))
    stack = net.loss_and_grad(params, x, y)
    assert stack.dtype == np.dtype(dtype)
    for s in range(3):
        assert stack[s].tobytes() == net.loss_and_grad(params, x[s], y[s]).tobytes()


def test_float32_stays_float32_through_every_layer():
    layers = (Conv(2, 3, padding=1), Pool("avg", 2), Dropout(0.2), Conv(3, 2), Pool("max", 2),
              Flatten(), 3, 4, 2)
    net = Network(layers, "relu", "cross-entropy", "float32", input_shape=(1, 8, 8))
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    buf = net.loss_and_grad(net.init(0), x, np.array([0, 1, 0, 1]), noise=(((1, 2), 4),))
    assert buf.dtype == np.float32
    assert net.forward(net.init(0), x)[-1].dtype == np.float32


def test_dropout_masks_come_from_the_seed_step_and_shard_alone():
    """A mask is a function of its key: the same bytes however the rows are grouped
    (one shard alone or shards laid end to end, as a GPU computes them), another key
    another mask, and no noise no dropout."""
    net = Network((10, Dropout(0.5), 6, 3), "tanh", "cross-entropy", "float64", seed=9)
    rng = np.random.default_rng(0)
    params, x, y = net.init(0), rng.standard_normal((8, 10)), rng.integers(0, 3, 8)
    a = net.loss_and_grad(params, x[:5], y[:5], noise=(((0, 0, 0), 5),))
    b = net.loss_and_grad(params, x[5:], y[5:], noise=(((0, 5, 1), 3),))
    both = net.loss_and_grad(params, x, y, noise=(((0, 0, 0), 5), ((0, 5, 1), 3)))
    np.testing.assert_allclose(both, a + b, rtol=1e-12)
    again = net.loss_and_grad(params, x[:5], y[:5], noise=(((0, 0, 0), 5),))
    assert a.tobytes() == again.tobytes()
    other = net.loss_and_grad(params, x[:5], y[:5], noise=(((1, 0, 0), 5),))
    assert a.tobytes() != other.tobytes()
    plain = Network((10, 6, 3), "tanh", "cross-entropy", "float64")
    assert net.loss_and_grad(params, x, y).tobytes() == plain.loss_and_grad(params, x, y).tobytes()
    mask = cv.dropout_mask(np, (4000, 5), 0.25, (((1, 2, 3), 4000),), np.float64)
    assert abs((mask > 0).mean() - 0.75) < 0.02 and mask.max() == 1 / 0.75


def test_lenet_layout_and_shapes():
    net = Network(LENET, "relu", "cross-entropy", "float32", input_shape=(1, 28, 28))
    assert net.shapes == [(6, 1, 5, 5), (16, 6, 5, 5), (120, 400), (84, 120), (10, 84)]
    assert net.size == 61706 and net.features == 784 and net.outputs == 10
    named = net.named(net.init(0))
    assert named["W1"].shape == (6, 1, 5, 5) and named["b5"].shape == (10,)


@pytest.mark.parametrize("layers, shape, says", [
    ((Conv(6, 9), Flatten(), 36, 10), (1, 8, 8), "9x9 kernel is larger than its 8x8 input"),
    ((Conv(6, 5), Flatten(), 100, 10), (1, 8, 8), "'flatten' gives 96 features"),
    ((Conv(6, 5), 10), (1, 8, 8), "put 'flatten' before it"),
    ((Conv(6, 5), Flatten(), 96, 10), (), "set model.input_shape"),
    ((64, Pool("max", 2), 10), (), "takes images"),
    ((Conv(6, 3), Flatten()), (1, 8, 8), "end with the dense"),
    ((784, 10), (1, 28, 27), "holds 756 features"),
])
def test_shapes_that_do_not_fit_are_one_line(layers, shape, says):
    with pytest.raises(ValueError, match=says) as e:
        layerspec.walk(layers, shape)
    assert "\n" not in str(e.value)


def test_layer_tables_parse_and_round_trip():
    for text, spec in [({"conv": 6, "kernel": 5, "padding": 2}, Conv(6, 5, 1, 2)),
                       ({"pool": "avg", "size": 3, "stride": 2}, Pool("avg", 3, 2)),
                       ("flatten", Flatten()), ({"flatten": True}, Flatten()),
                       ({"dropout": 0.5}, Dropout(0.5)), (7, 7)]:
        assert layerspec.parse(text) == spec
        assert layerspec.parse(layerspec.to_value(spec)) == spec
    for bad, says in [({"conv": 6}, "needs conv, kernel"), ({"pool": "min", "size": 2}, "'max'"),
                      ({"dense": 3}, "unknown layer"), ({"conv": 6, "kernel": 5, "pad": 1},
                                                        "unknown key 'pad'"),
                      ({"dropout": 1.0}, r"\[0, 1\)"), ("flat", "not a layer")]:
        with pytest.raises(ValueError, match=says):
            layerspec.parse(bad)
