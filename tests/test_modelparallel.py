"""Model parallelism: the split, the graph's structure and bytes, and equality with serial."""
from __future__ import annotations

import numpy as np
import pytest
from dask.task_spec import TaskRef
from distributed import Client, LocalCluster

import dtrain
from dtrain.core.config import OptimConfig
from dtrain.core.keys import kind_of
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer
from dtrain.maths.slicing import Slicing
from dtrain.training.plan import plan
from helpers.transfers import assert_moved_as_predicted


@pytest.mark.parametrize("layers", [(5, 6, 3), (5, 7, 4, 3), (5, 6, 4, 7, 3), (5, 9, 4, 7, 6, 3)])
@pytest.mark.parametrize("slices", [1, 2, 3])
def test_split_and_join_are_inverse(layers, slices):
    net = Network(layers, "tanh", "cross-entropy", "float64")
    sl = Slicing(net, slices)
    every = np.concatenate([sl.root_index, *sl.index.values()])
    assert sorted(every) == list(range(net.size))                # each parameter owned once
    opt = Optimizer(OptimConfig(name="adam"), net)
    state = opt.init_state(net.init(0))
    state = type(state)(np.random.default_rng(0).standard_normal(state.vector.size), 1.5, 7, 5)
    root, parts = sl.split(state, opt.slots)
    back = sl.join(root, parts, opt.slots)
    assert (back.vector == state.vector).all()
    assert (back.epoch_loss, back.epoch_samples, back.epoch_correct) == (1.5, 7, 5)
    (W1, _), (W2, _), *_ = net.unflatten(state.vector[: net.size])
    u0, u1 = sl.units(0)[slices - 1]
    part = parts[0, slices - 1].vector
    np.testing.assert_array_equal(part[: (u1 - u0) * 5], W1[u0:u1].ravel())        # W1 rows
    np.testing.assert_array_equal(part[(u1 - u0) * 6:(u1 - u0) * 6 + W2.shape[0] * (u1 - u0)],
                                  W2[:, u0:u1].ravel())                            # W2 columns


def _window(sets, workers=("a", "b")):
    p = plan(dtrain.load_config(None, ["graph.strategy=model-parallel", *sets]))
    placement = p.builder.place(list(workers))
    refs = [TaskRef(f"load-train-{j}") for j in range(len(set(placement.leaves)))]
    win = p.builder.window([p.schedule[t] for t in range(2)], p.initial_state(), refs, None,
                           placement, "r")
    return p, win, placement


def test_graph_structure_and_pinning():
    p, win, placement = _window(["graph.slices=4", "model.layers=[4, 16, 8, 3]"])
    assert placement.leaves == ("a", "a", "b", "b") and placement.root == "a"
    kinds = sorted({kind_of(k) for k in win.dsk})
    assert kinds == ["backward", "forward", "loss", "reduce", "state", "update"]
    for m in range(4):
        assert win.where[f"forward-1-0-{m}-r"] == [placement.leaves[m]]
        assert win.where[f"backward-1-0-{m}-r"] == [placement.leaves[m]]
        # a slice's state stays on its worker from step to step
        assert f"backward-0-0-{m}-r" in win.dsk[f"forward-1-0-{m}-r"].dependencies
    assert all(win.where[k] == ["a"] for k in win.dsk if k.startswith(("loss", "update")))
    deep = _window(["graph.slices=2", "model.layers=[4, 16, 8, 12, 3]"])[1]
    assert {"combine-0-0-r", "back-combine-0-0-r", "input-grad-0-1-1-r"} <= set(deep.dsk)


def test_bytes_per_step_are_activations_not_weights():
    # iris, 4-16-3, batch 16, 2 slices on 2 workers: the partial logits of slice 1 go to the
    # root (16 x 3 doubles), the loss signal (dL/dZ and the bias gradient) comes back
    p, win, placement = _window(["graph.slices=2"])
    located = {"load-train-0": "a", "load-train-1": "b"}
    per_step = 16 * 3 * 8 + (16 * 3 + 3) * 8 + 64
    state_literal = win.nbytes["state-0-0-1-r"]                  # starts on its worker
    assert win.transfer_bytes(located) == 2 * per_step
    assert state_literal > 0 and ("state-0-0-1-r", "b", "a") not in win.transfers(located)


ARCHS = ["[4, 16, 3]", "[4, 16, 8, 3]", "[4, 16, 8, 12, 3]"]


@pytest.mark.parametrize("layers", ARCHS)
def test_matches_the_serial_reference(client, layers):
    sets = ["train.epochs=3", f"model.layers={layers}", "optim.name=momentum", "graph.slices=3",
            "graph.window=8"]
    mp = dtrain.train(dtrain.load_config(None, sets + ["graph.strategy=model-parallel"]),
                      client=client, echo=None)
    serial = dtrain.train(dtrain.load_config(None, sets + ["graph.strategy=serial"]), echo=None)
    for name, value in serial.params.items():
        np.testing.assert_allclose(mp.params[name], value, rtol=1e-10, atol=1e-13)
    assert_moved_as_predicted(mp.summary)
    assert mp.metrics[-1]["val_accuracy"] == serial.metrics[-1]["val_accuracy"]
    # the loss task counts the minibatch's correct predictions, as serial's buffer does
    assert [m["train_accuracy"] for m in mp.metrics] == \
        [m["train_accuracy"] for m in serial.metrics]


def test_bit_identical_on_one_or_two_workers(client, tmp_path):
    sets = ["train.epochs=2", "graph.strategy=model-parallel", "graph.slices=2"]
    dtrain.train(dtrain.load_config(None, sets), client=client, out=tmp_path / "two", echo=None)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        dtrain.train(dtrain.load_config(None, sets + ["graph.window=5"]), client=c,
                     out=tmp_path / "one", echo=None)
    assert (tmp_path / "one" / "params.npz").read_bytes() == \
        (tmp_path / "two" / "params.npz").read_bytes()
