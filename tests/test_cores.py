"""A worker's core processes (:mod:`dtrain.taskgraph.cores`): a step's shards computed in
processes of their own and summed in the reduce tree's order, the bytes of one process;
their environment, their faults and their end; a GPU group's one-pass gather."""
from __future__ import annotations

import gc
import signal

import numpy as np
import psutil
import pytest

from dtrain.core import allocator
from dtrain.data.shards import Shard
from dtrain.maths.model import Network
from dtrain.taskgraph import cores
from dtrain.taskgraph.treesum import collapsed, flat, nested_sum

NET = Network((30, 64, 5), "sigmoid", "cross-entropy", "float32")


def _shards(n=5, rows=40, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    return [Shard(i, rng.standard_normal((rows, 30)).astype(dtype), rng.integers(0, 5, rows))
            for i in range(n)]


def _reference(net, shards, rows, tree, params, epoch=1, seed=3):
    bufs = [net.loss_and_grad(params, *s.batch(epoch, *r, seed)) for s, r in zip(shards, rows)]
    return nested_sum(tree, bufs)


@pytest.fixture
def pool():
    p = cores.Pool(2)
    yield p
    p.close()


def _helpers(pool):
    return [p.popen for p in pool.procs]


@pytest.mark.skipif(not cores.supported(), reason="needs memfd_create (Linux)")
def test_core_processes_give_the_bytes_of_one_process(pool):
    rows = [(0, 9), (3, 12), (0, 0), (5, 40), (1, 2)]          # an empty one among them
    tree = ((0, 1), (2, (3, 4)))
    for dtype in ("float32", "float64"):
        net = Network(NET.layers, NET.activation, NET.loss, dtype)
        params = net.init(7)
        data = _shards(dtype=dtype)
        got = pool.group_sum(net, 1, 3, rows, tree, params, data)
        assert got.tobytes() == _reference(net, data, rows, tree, params).tobytes()
    assert len(pool.procs) == 2 and all(p.poll() is None for p in _helpers(pool))


@pytest.mark.skipif(not cores.supported(), reason="needs memfd_create (Linux)")
def test_a_long_buffer_is_summed_in_ranges_by_every_process(pool, monkeypatch):
    monkeypatch.setattr(cores, "SUM_SPLIT_MIN", 64)        # split even this small net's sum
    params = NET.init(1)
    shards = _shards(n=4)
    rows = [(0, 10)] * 4
    got = pool.group_sum(NET, 0, None, rows, ((0, 1), (2, 3)), params, shards)
    assert got.tobytes() == _reference(NET, shards, rows, ((0, 1), (2, 3)), params, 0,
                                       None).tobytes()


def test_what_is_left_of_the_tree_once_each_process_summed_its_own_subtrees():
    """Each process sums the largest subtrees among its consecutive positions into their
    first slot; the rest of the sum takes those slots as leaves."""
    assert collapsed(((0, 1), (2, 3)), (range(0, 2), range(2, 4))) == (0, 2)
    assert collapsed(((0, 1), (2, (3, 4))), (range(0, 1), range(1, 3), range(3, 5))) \
        == ((0, 1), (2, 3))
    assert collapsed((0, 1, 2, 3), (range(0, 2), range(2, 4))) == (0, 1, 2, 3)
    assert collapsed(((0, 1, 2), (3, 4, 5)), (range(0, 3), range(3, 6))) == (0, 3)


@pytest.mark.skipif(not cores.supported(), reason="needs memfd_create (Linux)")
@pytest.mark.parametrize("helpers, tree", [(1, ((0, 1), (2, 3))), (1, ((0, 1, 2), (3, 4, 5))),
                                           (3, (((0, 1), (2, 3)), (4, 5)))])
def test_subtrees_summed_where_their_shards_were_computed_give_the_same_bytes(
        helpers, tree, monkeypatch):
    """Parts that hold whole subtrees sum them in place (the helper's pair, this process's
    pair), alone and with the rest split by ranges: the bytes of the tree summed in one go."""
    shards = _shards(n=len(flat(tree)))
    rows = [(0, 13)] * len(shards)
    params = NET.init(5)
    want = _reference(NET, shards, rows, tree, params).tobytes()
    p = cores.Pool(helpers)
    try:
        assert p.group_sum(NET, 1, 3, rows, tree, params, shards).tobytes() == want
        monkeypatch.setattr(cores, "SUM_SPLIT_MIN", 64)     # the rest split by ranges too
        assert p.group_sum(NET, 1, 3, rows, tree, params, shards).tobytes() == want
    finally:
        p.close()


@pytest.mark.skipif(not cores.supported(), reason="needs memfd_create (Linux)")
def test_a_dead_core_process_costs_a_retry_not_the_run(pool):
    shards = _shards()
    rows, tree = [(0, 8)] * 5, (0, 1, 2, 3, 4)
    params = NET.init(2)
    want = _reference(NET, shards, rows, tree, params).tobytes()
    assert pool.group_sum(NET, 1, 3, rows, tree, params, shards).tobytes() == want
    victim = _helpers(pool)[0]
    victim.send_signal(signal.SIGKILL)
    victim.wait(5)
    with pytest.raises(cores.Broken, match="died"):
        pool.group_sum(NET, 1, 3, rows, tree, params, shards)
    assert pool.procs == []                             # stopped: started afresh next time
    assert pool.group_sum(NET, 1, 3, rows, tree, params, shards).tobytes() == want
    assert victim.pid not in [p.pid for p in _helpers(pool)]


@pytest.mark.skipif(not cores.supported(), reason="needs memfd_create (Linux)")
def test_core_processes_end_with_their_worker_and_forget_freed_shards(pool):
    shards = _shards()
    params = NET.init(0)
    pool.group_sum(NET, 0, 1, [(0, 4)] * 5, (0, 1, 2, 3, 4), params, shards)
    assert len(pool.slots) == 5
    del shards
    gc.collect()
    other = _shards(n=2, seed=1)
    pool.group_sum(NET, 0, 1, [(0, 4)] * 2, (0, 1), params, other)
    assert len(pool.slots) == 2                         # the freed shards' copies are gone
    helpers = _helpers(pool)
    pool.close()
    for h in helpers:
        assert h.wait(5) == 0
    # helpers never outlive a worker that dies without closing them: they read EOF
    assert not [c for c in psutil.Process().children() if c.pid in {h.pid for h in helpers}]


def test_the_helper_environment_has_one_blas_thread_and_keeps_freed_memory(monkeypatch):
    """Dask's nanny's allocator variable is replaced by dtrain's (a step's temporaries come
    from the heap, not fresh mappings), and BLAS gets one thread (a shard's bytes)."""
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    env = cores._env()
    assert {k: v for k, v in env.items() if k.startswith("MALLOC_")} == allocator.ALLOCATOR_ENV
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 30
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "1"


def test_a_gpu_group_is_gathered_in_one_pass_as_minibatch_lays_it_out():
    """group_batch (a GPU worker's shards in one pass; NumPy here) gives the rows minibatch
    gives: each shard's rows of the step, in its epoch order, in shard order."""
    from dtrain.data.shards import group_batch, minibatch
    shards = _shards(n=3, rows=11)
    for seed in (None, 5):
        bounds = [(2, 6), (0, 3), (7, 11)]
        x, y = group_batch(shards, 4, bounds, seed)
        want = minibatch(shards, 4, bounds, seed)
        assert np.array_equal(x, want[0]) and np.array_equal(y, want[1])
