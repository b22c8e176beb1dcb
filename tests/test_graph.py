"""Graph builders, tested on structure (keys, depth, pinning) and on values."""
from __future__ import annotations

import pickle

import dask
import numpy as np
import pytest
from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core.config import load_config
from dtrain.core.keys import kind_of, parse
from dtrain.data.shards import load_part, load_shard, minibatch
from dtrain.taskgraph import reduction, tasks
from dtrain.taskgraph.dataparallel import units, window_graph
from dtrain.taskgraph.placement import Worker, balance, place, row_blocks
from dtrain.taskgraph.records import ForwardBackward, Group, Update, Updates
from dtrain.taskgraph.window import TaskGraph
from dtrain.training.plan import CHAIN_BYTES, plan

RUN = "t0"


def _plan(shards=4, strategy="allreduce", fan_in=2, fuse=True, update="root",
          fuse_shards=False, **extra):
    """A plan; the update on the reduce root unless ``update`` says otherwise, and one task
    per shard unless ``fuse_shards`` (the structure tests below are about the tree; replicated
    updates and fused shards have their own)."""
    update = update if strategy == "allreduce" else "auto"
    sets = [f"data.shards={shards}", f"graph.strategy={strategy}", f"graph.fan_in={fan_in}",
            f"graph.fuse_update={'true' if fuse else 'false'}", "train.epochs=2",
            f"graph.update={update}", f"graph.fuse_shards={'true' if fuse_shards else 'false'}"]
    return plan(load_config(None, sets + [f"{k}={v}" for k, v in extra.items()]))


def _window(p, steps, workers=("w0", "w1"), shard_refs=None):
    placement = p.builder.place(list(workers))
    refs = shard_refs or [TaskRef(f"load-shard-{i}-{RUN}") for i in range(len(p.ranges))]
    win = p.builder.window([p.schedule[t] for t in steps], p.initial_state(), refs,
                           TaskRef(f"load-val-{RUN}"), placement, RUN)
    return win, placement


def _min_depth(n, k):
    d = 0
    while k ** d < n:
        d += 1
    return d


@pytest.mark.parametrize("n", range(1, 20))
@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_depth_is_ceil_log(n, k):
    assert reduction.tree_depth(n, k) == _min_depth(n, k)


@pytest.mark.parametrize("shards, k, fuse", [(1, 2, True), (2, 2, True), (4, 2, True),
                                             (5, 2, True), (8, 2, False), (9, 3, True),
                                             (7, 4, False), (16, 4, True)])
def test_step_structure(shards, k, fuse):
    p = _plan(shards=shards, fan_in=k, fuse=fuse)
    win, placement = _window(p, [0])
    keys = [key for key in win.dsk if not key.startswith("state-")]
    fb = [key for key in keys if key.startswith("forward-backward-")]
    reduces = [key for key in keys if key.startswith("reduce-")]
    updates = [key for key in keys if key.startswith("update-")]
    assert fb == [f"forward-backward-0-{i}-{RUN}" for i in range(shards)]
    assert updates == [f"update-0-{RUN}"]
    # one reduce task per tree node with >= 2 children; the fused root is the update itself
    nodes, width, depth = 0, shards, 0
    while width > 1:
        nodes, width, depth = nodes + width // k + (width % k > 1), -(-width // k), depth + 1
    assert depth == reduction.tree_depth(shards, k)
    assert len(reduces) == nodes - (1 if fuse and shards > 1 else 0)
    assert len(keys) == shards + len(reduces) + 1
    # the longest chain from a forward-backward task to the update has `depth` combining levels
    def height(key):
        deps = [d for d in win.dsk[key].dependencies if d.startswith(("reduce-", "forward-"))]
        return 0 if key.startswith("forward-") else 1 + max(height(d) for d in deps)
    expected = 1 if shards == 1 else depth if fuse else depth + 1   # levels of tasks on the path
    assert height(f"update-0-{RUN}") == expected


def test_forward_backward_tasks_are_pinned_to_their_shards_worker():
    p = _plan(shards=6)
    win, placement = _window(p, [0, 1], workers=("a", "b", "c"))
    assert placement.leaves == ("a", "a", "b", "b", "c", "c")
    for i in range(6):
        for s in (0, 1):
            key = f"forward-backward-{s}-{i}-{RUN}"
            assert win.where[key] == [placement.leaves[i]]
            assert f"load-shard-{i}-{RUN}" in win.dsk[key].dependencies
    assert win.where[f"update-1-{RUN}"] == ["a"] and placement.root == "a"
    # a reduce runs where its first child runs: shards 0+1 on a, 2+3 on b, 4+5 on c
    assert win.where[f"reduce-0-1-2-{RUN}"] == ["b"] and win.where[f"reduce-0-1-4-{RUN}"] == ["c"]


def test_parameter_server_reduces_flat_on_a_head_that_holds_no_shard():
    p = _plan(shards=4, strategy="parameter-server", fan_in=2)
    win, placement = _window(p, [0], workers=("head", "w1", "w2"))
    assert placement.root == "head" and "head" not in placement.leaves
    update = win.dsk[f"update-0-{RUN}"]
    assert not [k for k in win.dsk if k.startswith("reduce-")]
    assert {d for d in update.dependencies if d.startswith("forward-")} == {
        f"forward-backward-0-{i}-{RUN}" for i in range(4)}
    assert win.where[f"update-0-{RUN}"] == ["head"]


def test_window_chains_steps_from_a_literal_state():
    p = _plan(shards=2)
    steps = p.schedule.steps_per_epoch
    win, _ = _window(p, range(steps - 1, steps + 2))
    first = f"state-{steps - 1}-{RUN}"
    assert isinstance(win.dsk[first], DataNode)
    assert win.ends[0] == f"update-{steps + 1}-{RUN}"
    assert win.evals == {0: f"evaluate-1-{RUN}"}              # epoch 0 ends inside the window
    assert f"update-{steps - 1}-{RUN}" in win.dsk[f"evaluate-1-{RUN}"].dependencies
    assert f"update-{steps}-{RUN}" in win.dsk[f"forward-backward-{steps + 1}-1-{RUN}"].dependencies


def _execute(p, nsteps, workers=("w0", "w1")):
    """Run a window graph in-process (dask's synchronous scheduler) on real shards."""
    shards = [load_shard(src) for src in p.sources]
    refs = [DataNode(f"load-shard-{i}-{RUN}", s) for i, s in enumerate(shards)]
    win, _ = _window(p, range(nsteps), workers, shard_refs=[TaskRef(r.key) for r in refs])
    dsk = {**win.dsk, **{r.key: r for r in refs},
           f"load-val-{RUN}": DataNode(f"load-val-{RUN}", load_part(p.config.data, "val", "float64"))}
    return dask.get(dsk, win.ends[0])


def test_graph_values_match_the_serial_reference():
    p = _plan(shards=5, fan_in=2)
    n = p.schedule.steps_per_epoch + 2
    state = _execute(p, n)
    ref = p.initial_state()
    shards = [load_shard(src) for src in p.sources]
    for t in range(n):
        step = p.schedule[t]
        x, y = minibatch(shards, step.epoch, step.bounds, p.recipe.shuffle_seed)
        grad = p.net.loss_and_grad(ref.vector, x, y)
        ref = p.opt.apply(ref, grad, step)
    np.testing.assert_allclose(state.vector, ref.vector, rtol=1e-12, atol=1e-15)
    assert state.epoch_loss == pytest.approx(ref.epoch_loss, rel=1e-12)


def test_fusing_the_update_and_placement_change_nothing():
    fused = _execute(_plan(shards=6, fan_in=2, fuse=True), 5)
    unfused = _execute(_plan(shards=6, fan_in=2, fuse=False), 5, workers=("a", "b", "c"))
    assert (fused.vector == unfused.vector).all()


def _replicated(shards, k, workers, steps=3, state_every=1, **extra):
    p = _plan(shards=shards, fan_in=k, update="replicated",
              **{"graph.state_every": state_every}, **extra)
    assert p.recipe.replicated
    return p, *_window(p, range(steps), workers=workers)


def _reduce_levels(win, key):
    """Reduce tasks on the longest chain into ``key`` from the forward-backward tasks before."""
    deps = [d for d in win.dsk[key].dependencies if d.startswith("reduce-")]
    return max((1 + _reduce_levels(win, d) for d in deps), default=0)


def test_one_worker_needs_no_replicated_updates():
    """Every shard on one worker: its root update is every worker's, so a replicated plan
    builds the plain chain (update-<step>, each read by the next step), the same sums."""
    p, win, placement = _replicated(4, 2, ["w0"])
    assert [k for k in win.dsk if k.startswith("update-")] == \
        [f"update-{t}-{RUN}" for t in range(3)] and win.ends == [f"update-2-{RUN}"]


@pytest.mark.parametrize("steps_fused", [True, False])
@pytest.mark.parametrize("shards, k, workers", [(2, 2, 2), (4, 2, 2), (6, 2, 3),
                                                (8, 4, 2), (9, 3, 3), (16, 2, 4)])
def test_replicated_update_structure(shards, k, workers, steps_fused):
    names = [f"w{i}" for i in range(workers)]
    p, win, placement = _replicated(shards, k, names,
                                    **{"graph.fuse_steps": str(steps_fused).lower()})
    # a window cut into a task per worker (graph.fuse_steps) read on 3 or more workers: the
    # root's reduce task sums the root level once, and every worker reads that sum; on 2
    # workers (an exchange) or step by step (a task more per step), each reads the level
    rooted = steps_fused and workers > 2
    assert p.recipe.root_sum == steps_fused
    first = {w: placement.leaves.index(w) for w in names if w in placement.leaves}
    updates = [key for key in win.dsk if key.startswith("update-")]
    # step 0: one update per worker, on that worker, named by its first shard; step 1 is
    # read by the window's last step on every worker, but its updates' results only by the
    # root (for the last); the root's update of the last step makes the window's end
    assert updates == [f"update-0-{i}-{RUN}" for i in first.values()] + [
        f"update-1-0-{RUN}", f"update-2-0-{RUN}"]
    for w, i in first.items():
        assert win.where[f"update-0-{i}-{RUN}"] == [w]
    assert win.ends == [f"update-2-0-{RUN}"] and placement.root == placement.leaves[0]
    depth = reduction.tree_depth(shards, p.recipe.fan_in)
    for s in (1, 2):
        for i, w in enumerate(placement.leaves):
            fb = win.dsk[f"forward-backward-{s}-{i}-{RUN}"]
            assert win.where[fb.key] == [w]
            # one hop per step: the next forward-backward reads the partial sums and its own
            # worker's state, never an update task of the step before it
            base = f"state-0-{RUN}" if s == 1 else f"update-{s - 2}-{first[w]}-{RUN}"
            assert base in fb.dependencies and f"load-shard-{i}-{RUN}" in fb.dependencies
            assert not any(d.startswith(f"update-{s - 1}-") for d in fb.dependencies)
            assert _reduce_levels(win, fb.key) == (depth if rooted else max(depth - 1, 0))
            # the same partial sums as that step's update(s)
            def sums(key):
                return {d for d in win.dsk[key].dependencies
                        if d.startswith(("forward-backward-", "reduce-"))}
            top = shards
            for _ in range(depth - 1):
                top = -(-top // k)
            assert sums(fb.key) == sums(f"update-{s - 1}-0-{RUN}")
            if rooted:
                root_sum = f"reduce-{s - 1}-{depth}-0-{RUN}"
                assert sums(fb.key) == {root_sum} and win.where[root_sum] == [placement.root]
                assert len(win.dsk[root_sum].dependencies) == top
            else:
                assert len(sums(fb.key)) == top


def test_replicated_updates_equal_the_root_update_bit_for_bit():
    n = 9
    root = _execute(_plan(shards=6, fan_in=2), n, workers=("a", "b", "c"))
    for k, workers, every in ((2, ("a", "b", "c"), 1), (4, ("a", "b"), 3), (2, ("a",), 8)):
        p = _plan(shards=6, fan_in=k, update="replicated", **{"graph.state_every": every})
        same_k = _execute(_plan(shards=6, fan_in=k), n)
        state = _execute(p, n, workers=workers)
        assert state.vector.tobytes() == same_k.vector.tobytes()
        assert state.epoch_loss == same_k.epoch_loss
    assert _execute(_plan(shards=6, fan_in=2, update="replicated"), n,
                    workers=("a", "b", "c")).vector.tobytes() == root.vector.tobytes()


def test_a_workers_part_of_a_window_does_not_grow_with_the_cluster():
    """A step's rows stay with the tasks that read them: the steps that the replicated
    updates carry to every worker hold no rows (they once held every shard's, so each
    worker's share of a window grew with the cluster and all of them with its square: at 256
    nodes of 16 shards a window's tasks pickled to 8 MB a step, 25 times the time to build
    them)."""
    sizes = {}
    for workers in (4, 32):
        p = _plan(shards=4 * workers, fan_in=2, update="replicated", fuse_shards=True,
                  **{"data.dataset": "synthetic", "data.samples": 64 * workers, "data.features": 4,
                     "train.batch_size": 8 * workers})
        win, _ = _window(p, range(8), [f"w{i}" for i in range(workers)])
        carried = [s for node in win.dsk.values() if isinstance(node, Task)
                   for r in node.args[:1] if isinstance(r, (Update, ForwardBackward))
                   for s in (r.steps if isinstance(r, Update) else
                             r.updates.steps if r.updates else ())]
        assert carried and all(s.bounds == () for s in carried)
        groups = [node.args[0].group for node in win.dsk.values() if isinstance(node, Task)
                  and isinstance(node.args[0], ForwardBackward)]
        assert {len(g.rows) for g in groups} == {4}             # each group its own rows
        sizes[workers] = len(pickle.dumps({k: n for k, n in win.dsk.items()
                                           if win.where[k][0] == "w1"}))
    assert sizes[32] < 1.05 * sizes[4]


def test_a_windows_reduce_tree_is_worked_out_once_not_once_a_step():
    p = _plan(shards=8, fan_in=2, update="replicated", fuse_shards=True)
    reduction.shape.cache_clear()
    _window(p, range(6), ["w0", "w1", "w2"])
    info = reduction.shape.cache_info()       # the window's last step: read on the root only
    assert info.misses <= 2 and info.hits >= 4


def test_replicated_updates_are_the_allreduce_default():
    assert plan(load_config(None, [])).recipe.replicated
    assert not _plan(update="root").recipe.replicated
    assert not _plan(strategy="parameter-server").recipe.replicated


def test_the_states_a_worker_holds_between_kept_ones_are_capped():
    """A worker remembers every state of the chain since its last kept one: at most
    CHAIN_BYTES of them, whatever graph.state_every asks."""
    assert _plan(update="replicated").recipe.state_every == 8          # the default
    big = _plan(update="replicated", **{"model.layers": "[4,500000,3]"}).recipe   # 32 MB
    assert big.state_every == CHAIN_BYTES // big.state_bytes == 2
    huge = _plan(update="replicated", **{"model.layers": "[4,5000000,3]"}).recipe  # 320 MB
    assert huge.state_every == 1


def test_a_window_is_tokenized_by_its_own_token_not_task_by_task():
    from dask.tokenize import tokenize
    p = _plan(shards=4, update="replicated")
    one, _ = _window(p, range(3))
    two, _ = _window(p, range(3))
    assert one.dsk.keys() == two.dsk.keys()            # the same tasks, submitted twice
    assert tokenize(one.dsk) != tokenize(two.dsk)      # still two graphs
    stand_in = TaskGraph()                             # no tasks at all, one's token
    stand_in.token = one.dsk.token
    assert tokenize(stand_in) == tokenize(one.dsk)     # the token alone names the graph
    task = next(iter(t for t in one.dsk.values() if isinstance(t, dask.task_spec.Task)))
    assert getattr(task, "_token", None) is None       # no task was tokenized


def test_keys_read_well_in_the_dashboard():
    p = _plan(shards=4)
    win, _ = _window(p, range(p.schedule.steps_per_epoch))
    names = {kind_of(k) for k in win.dsk}
    assert names == {"state", "forward-backward", "reduce", "update", "evaluate"}
    assert all(k.startswith(("state-", "forward-backward-", "reduce-", "update-", "evaluate-"))
               for k in win.dsk)
    assert all(k.endswith(f"-{RUN}") and parse(k).step is not None for k in win.dsk)


def test_local_sgd_rounds_align_to_epochs():
    p = _plan(shards=3, strategy="local-sgd", **{"graph.sync_every": 3})
    per_epoch = p.schedule.steps_per_epoch                     # 7 for iris at batch 16
    rounds = units([p.schedule[t] for t in range(2 * per_epoch)], p.recipe)
    assert [len(r) for r in rounds] == [3, 3, 1, 3, 3, 1]      # a round never spans epochs
    win, placement = _window(p, range(per_epoch))
    leaves = [k for k in win.dsk if k.startswith("local-sgd-")]
    assert leaves[:3] == [f"local-sgd-0-{i}-{RUN}" for i in range(3)]
    assert [k for k in win.dsk if k.startswith("update-")] == [
        f"update-{s}-{RUN}" for s in (2, 5, 6)]
    assert all(win.where[f"local-sgd-0-{i}-{RUN}"] == [placement.leaves[i]] for i in range(3))


@pytest.mark.parametrize("strategy, update, expected", [
    # iris 4-16-3, float64, P = 131: a gradient [grad | loss | correct] is (P + 2) * 8 = 1064
    # bytes, a state 1112
    ("allreduce", "root", 3 * (1112 + 1064)),   # state to worker 1; one reduce edge back
    ("parameter-server", "auto", 3 * (1112 + 4 * 1064)),  # state out; 4 gradients to the head
    # the window's state to worker 1 once; then each worker reads the other's partial sum,
    # but after the last step only the root does
    ("allreduce", "replicated", 1112 + 2 * 2 * 1064 + 1064),
])
def test_bytes_per_step_from_the_graph(strategy, update, expected):
    p = _plan(shards=4, strategy=strategy, update=update)
    win, placement = _window(p, [0, 1, 2])
    located = {f"load-shard-{i}-{RUN}": w for i, w in enumerate(placement.leaves)}
    located[f"load-val-{RUN}"] = placement.root
    assert win.transfer_bytes(located) == expected
    assert all(src != dst for _, src, dst in win.transfers(located))


def test_a_worker_computes_each_replicated_update_once(monkeypatch):
    """The update task and the next steps' forward-backward tasks on one worker get the same
    input objects: each update is computed once among them, and it is the same update."""
    p = _plan(shards=2, update="replicated")
    calls = []
    real = tasks.update
    monkeypatch.setattr(tasks, "update", lambda *a: calls.append(a[1].index) or real(*a))
    shard = load_shard(p.sources[0])
    state, step, nxt = p.initial_state(), p.schedule[0], p.schedule[1]
    grads = tuple(tasks.forward_backward(ForwardBackward(p.net, None, 0, Group.one(0, rows),
                                                         False), state, shard)
                  for rows in [step.bounds[0], step.bounds[0]])
    then = ForwardBackward(p.net, None, 0, Group.one(0, nxt.bounds[0]), False,
                           Updates(p.opt, (step,), (2,)))
    out = [tasks.forward_backward(then, state, shard, *grads) for _ in range(2)]
    copy = tasks.update_state(Update(p.opt, (step,), False), state, *grads)
    assert calls == [0]                                   # three users, one update
    assert copy.vector.tobytes() == real(p.opt, step, False, state, *grads).vector.tobytes()
    assert out[0].tobytes() == out[1].tobytes()
    tasks.update_state(Update(p.opt, (step,), False), state, *(g.copy() for g in grads))
    assert calls == [0, 0]                                # other inputs: computed again
    tasks.update_state(Update(p.opt, (step,), True), state, *grads)
    assert calls == [0, 0, 0]                             # for the driver: always computed
    # a chain of two steps walks the remembered first update, then computes the second once
    chain = Update(p.opt, (step, nxt), False, widths=(2, 2))
    two = tasks.update_state(chain, state, *grads, *grads)
    again = tasks.update_state(chain, state, *grads, *grads)
    assert calls == [0, 0, 0, 1] and two is again
    direct = real(p.opt, nxt, False, real(p.opt, step, False, state, *grads), *grads)
    assert two.vector.tobytes() == direct.vector.tobytes()


@pytest.mark.parametrize("every", [2, 3, 8])
def test_replicated_states_are_kept_every_few_steps(every):
    """Between kept states a forward-backward applies the whole chain since its worker's
    last kept state; a state is kept every ``state_every`` steps and after an epoch's end."""
    p, win, placement = _replicated(4, 2, ["w0", "w1"], steps=7, state_every=every)
    assert p.recipe.state_every == every
    updates = [k for k in win.dsk if k.startswith("update-")]
    kept = sorted({parse(k).step for k in updates})
    assert kept == [s for s in range(every - 1, 6, every)] + [6]   # + the window's end
    base, chain = f"state-0-{RUN}", []
    for s in range(7):
        fb = win.dsk[f"forward-backward-{s}-0-{RUN}"]
        parts = {d for d in fb.dependencies if d.startswith(("forward-backward-", "reduce-"))}
        assert base in fb.dependencies and parts == set(chain) and len(chain) <= 2 * every
        if s - 1 in kept[:-1]:        # kept alongside this step, read from the next one on
            base, chain = f"update-{s - 1}-0-{RUN}", []
        chain += [f"reduce-{s}-1-{i}-{RUN}" for i in (0, 2)]     # the root level's sums
    assert win.ends == [f"update-6-0-{RUN}"]


@pytest.mark.parametrize("optimizer, slots", [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_replicated_updates_move_gradients_never_the_optimizer_slots(optimizer, slots):
    p = _plan(shards=4, update="replicated", **{"optim.name": optimizer})
    win, placement = _window(p, [0, 1, 2])
    located = {f"load-shard-{i}-{RUN}": w for i, w in enumerate(placement.leaves)}
    state = (1 + slots) * 131 * 8 + 64                     # the window's start, sent once
    assert win.transfer_bytes(located) == state + 2 * 2 * 1064 + 1064


# --- a worker's shards in one task (graph.fuse_shards) ------------------------------------------

def _fused(p, workers, steps=(0,)):
    win, placement = _window(p, list(steps), workers)
    fb = {k: win.dsk[k] for k in win.dsk if k.startswith("forward-backward-0-")}
    return win, placement, fb


def _group_of(task):
    """The group of shards a forward-backward task sums, None for a task of one shard."""
    group = task.args[0].group
    return group if len(group.shards) > 1 else None


@pytest.mark.parametrize("shards, k, workers, update, kept, tree, reduces", [
    # 2 shards per worker at fan-in 2: each pair is one task, the level-1 reduces are gone
    (4, 2, 2, "root", [0, 2], {0: (0, 1), 2: (0, 1)}, []),
    # 4 per worker: two levels inside each task, nested as the tree nests them
    (8, 2, 2, "root", [0, 4], {0: ((0, 1), (2, 3)), 4: ((0, 1), (2, 3))}, []),
    # [a a a b b b] at fan-in 4: the group (0-3) spans two workers and stays a reduce;
    # (4, 5) is b's alone
    (6, 4, 2, "root", [0, 1, 2, 3, 4], {4: (0, 1)}, ["reduce-0-1-0"]),
    # one worker: the whole tree, root level included, is one task; the update reads one sum
    (3, 2, 1, "replicated", [0], {0: ((0, 1), 2)}, []),
    # 5 shards on 2 workers [a a a b b]: (0, 1) on a; (2, 3) crosses; then 4 passes
    (5, 2, 2, "root", [0, 2, 3, 4], {0: (0, 1)}, ["reduce-0-1-2", "reduce-0-2-0"]),
])
def test_a_workers_reduce_subtree_is_one_forward_backward_task(shards, k, workers, update, kept,
                                                                tree, reduces):
    p = _plan(shards=shards, fan_in=k, update=update, fuse_shards=True)
    win, placement, fb = _fused(p, [f"w{i}" for i in range(workers)])
    assert list(fb) == [f"forward-backward-0-{i}-{RUN}" for i in kept]
    assert sorted(key[:-len(RUN) - 1] for key in win.dsk if key.startswith("reduce-0-")) \
        == sorted(reduces)
    for i in kept:
        task = fb[f"forward-backward-0-{i}-{RUN}"]
        group = _group_of(task)
        assert (group.tree if group else None) == tree.get(i)
        shards_read = sorted(parse(d).numbers[0] for d in task.dependencies
                             if kind_of(d) == "load-shard")
        assert shards_read == (list(group.shards) if group else [i])
        assert {placement.leaves[s] for s in shards_read} == set(win.where[task.key])
        if group:
            assert group.rows == tuple(p.schedule[0].bounds[s] for s in group.shards)
            assert group.threads == 1                      # iris shards are tiny: no threads


def test_fused_groups_share_threads_only_where_a_shard_is_worth_one():
    wide = {"model.layers": "[4,5000,3]", "train.batch_size": 64}     # 13 rows: 3 MFLOP
    for extra, threads in (({}, 1), (wide, 2)):
        p = _plan(shards=4, fan_in=2, fuse_shards=True, **extra)
        _, _, fb = _fused(p, ["w0", "w1"])
        assert {_group_of(t).threads for t in fb.values()} == {threads}
    p = _plan(shards=4, fan_in=2, fuse_shards=True, **wide)
    placement = place([Worker("g", gpu=True), Worker("c")], 4)
    win = window_graph([p.schedule[0]], p.initial_state(),
                       [TaskRef(f"load-shard-{i}-{RUN}") for i in range(4)], None, placement,
                       p.recipe, RUN)
    threads = {win.where[k][0]: _group_of(win.dsk[k]).threads for k in win.dsk
               if k.startswith("forward-backward-")}
    assert threads == {"g": 1, "c": 2}                     # a GPU computes its shards in turn


@pytest.mark.parametrize("shards, k, workers, update", [
    (4, 2, ("a", "b"), "root"), (6, 4, ("a", "b"), "root"), (5, 2, ("a", "b"), "replicated"),
    (6, 2, ("a",), "replicated"), (9, 3, ("a", "b", "c"), "replicated")])
def test_fused_shards_give_the_same_bits(shards, k, workers, update):
    n = 7
    fused_plan = _plan(shards=shards, fan_in=k, update=update, fuse_shards=True)
    assert len(_fused(fused_plan, workers)[2]) < shards      # some shards did share a task
    one_each = _execute(_plan(shards=shards, fan_in=k, update=update), n, workers)
    fused = _execute(fused_plan, n, workers)
    assert fused.vector.tobytes() == one_each.vector.tobytes()
    assert (fused.epoch_loss, fused.epoch_correct) == (one_each.epoch_loss, one_each.epoch_correct)


@pytest.mark.parametrize("rows, parts, edges", [
    ([1] * 8, 2, [0, 4, 8]), ([1] * 8, 3, [0, 3, 5, 8]), ([10, 1, 1, 1], 2, [0, 1, 4]),
    ([3, 3, 3, 3, 3], 2, [0, 2, 5]), ([1, 1], 3, [0, 0, 1, 2]), ([5] * 7, 7, list(range(8)))])
def test_row_blocks_cut_consecutive_items_into_blocks_of_about_equal_rows(rows, parts, edges):
    assert row_blocks(rows, parts) == edges


@pytest.mark.parametrize("holders, rows, moves", [
    ("ABAB", [1] * 4, 2),           # dealt out in turn: two move, into two blocks
    ("ABBABABA", [1] * 8, 4),
    ("AAAA", [1] * 4, 2),           # all on one: half move
    ("AABB", [1] * 4, 0),           # blocks already: nothing moves
    ("AAAB", [1] * 4, 1),           # blocks, but A holds 3 of 4 rows: over its share
    ("AAABB", [1] * 5, 0),          # 3 of 5 rows: within BALANCE_SLACK
    ("AACC", [1] * 4, 2),           # C is gone: its two go to B
    ("BBAA", [1] * 4, 0),           # any order of the blocks
])
def test_balance_gives_each_worker_a_block_moving_the_fewest_rows(holders, rows, moves):
    out = balance(list(holders), rows, ["A", "B"])
    assert sum(a != b for a, b in zip(holders, out)) == moves, out
    runs = [w for i, w in enumerate(out) if i == 0 or out[i - 1] != w]
    assert len(runs) == len(set(runs)) and set(out) <= {"A", "B"}, out
    assert balance(list(holders), rows, ["A", "B"]) == out          # deterministic
