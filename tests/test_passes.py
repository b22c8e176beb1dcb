"""The engine's graph passes (a window on one worker fused into one task; one across workers
cut into a task per worker; the state handed over between windows): tested on structure
(keys, pinning, what crosses) and on values (the same bytes as without them).  The core
processes a worker computes its shards on: tests/test_cores.py."""
from __future__ import annotations

import copy
import pickle
import threading
import time

import numpy as np
import pytest
from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.core.config import load_config
from dtrain.data.shards import load_shard
from dtrain.deploy import p2p
from dtrain.maths.optim import TrainState
from dtrain.taskgraph import fuse, handoff, segments, span
from dtrain.taskgraph.placement import Worker
from dtrain.training.plan import plan

RUN = "t0"


def _window(sets=(), workers=("w0",), steps=range(14), val=True):
    p = plan(load_config(None, ["train.epochs=2", *sets]))
    placement = p.builder.place([Worker(w, False, 1.0, 2) for w in workers])
    refs = [TaskRef(f"load-shard-{i}-{RUN}") for i in range(len(p.ranges))]
    win = p.builder.window([p.schedule[t] for t in steps], p.initial_state(), refs,
                           TaskRef(f"load-val-{RUN}") if val else None, placement, RUN)
    return p, win


def _run(win, p, values):
    """Run a window's graph in this process, in an order that respects its edges."""
    cache = dict(values)
    for key in fuse.in_order(win.dsk):
        cache[key] = win.dsk[key](cache)
    return cache


def _inputs(p):
    shards = {f"load-shard-{i}-{RUN}": load_shard(s) for i, s in enumerate(p.sources)}
    from dtrain.data.shards import load_part
    return {**shards, f"load-val-{RUN}": load_part(p.config.data, "val", p.config.model.dtype,
                                                    norm=p.norm)}


# --- fusing a window on one worker ---------------------------------------------------------

def test_a_window_on_one_worker_is_one_task_that_keeps_the_keys_the_engine_reads():
    p, win = _window(["graph.update=root"])
    fused = fuse.steps(win, 0, 13, RUN)
    body = f"window-0-13-{RUN}"
    assert list(fused.dsk) == [body, *win.ends, f"window-0-13-meta-{RUN}"]   # evals: in meta
    assert keys.kind_of(body) == keys.WINDOW and keys.label(body) == "window\\nsteps 0-13"
    assert all(w == ["w0"] for w in fused.where.values())
    # the one task reads the shards and the held-out data, nothing of its own graph
    assert fused.dsk[body].dependencies == {f"load-shard-{i}-{RUN}" for i in range(4)} | \
        {f"load-val-{RUN}"}
    assert all(fused.dsk[k].dependencies == {body} for k in (*win.ends, fused.meta))
    # it runs every step's tasks inside: as many updates as steps, each after its inputs
    chain = fused.steps_fused
    assert sum(k == keys.UPDATE for k in chain.kinds) == 14 == chain.steps
    at = {key: i for i, (key, _, _) in enumerate(chain.nodes)}
    assert all(at[a.key] < at[key] for key, _, args in chain.nodes for a in args
               if isinstance(a, TaskRef) and a.key in at)
    assert fused.step_tasks() == 2 and win.step_tasks() > 14
    # ... and travels as one pickled chain: the scheduler, which unpickles a graph to read it
    # and pickles each task again for its worker, sees bytes, not the window's tasks
    packed = fused.dsk[body].args[0]
    assert type(packed) is fuse.Packed and type(packed.data) is bytes
    opened = packed.open()
    assert [n[0] for n in opened.nodes] == [n[0] for n in chain.nodes]
    assert (opened.kinds, opened.inputs, opened.outputs) == (chain.kinds, chain.inputs,
                                                             chain.outputs)


def test_a_packed_chain_stays_bytes_but_in_a_worker_process(monkeypatch):
    """Unpickled where no worker runs (the scheduler), a window's chain stays bytes; in a
    worker's process (``OpenChains`` set it up) it is opened as its task arrives, as
    distributed unpickles any task, not later on the window's critical path."""
    _, win = _window(["graph.update=root"])
    packed = fuse.steps(win, 0, 13, RUN).dsk[f"window-0-13-{RUN}"].args[0]
    monkeypatch.setattr(fuse, "_open_here", False)      # (an in-process worker set it)
    assert type(pickle.loads(pickle.dumps(packed))) is fuse.Packed
    fuse.OpenChains().setup(None)
    assert type(pickle.loads(pickle.dumps(packed))) is fuse.Chain


def test_a_window_across_workers_is_left_as_it_is():
    _, win = _window(workers=("w0", "w1"))
    assert fuse.one_worker(win) is None
    assert fuse.steps(win, 0, 13, RUN) is win


def test_fused_and_unfused_windows_compute_the_same_bytes():
    """The pass only reorders who calls what: the end state and the evaluations equal the
    step-by-step graph's to the bit (replicated updates, whose builder adds a reduce tree
    before its leaves, included)."""
    for update in ("root", "replicated"):
        p, win = _window([f"graph.update={update}", "graph.fuse_shards=false"])
        values = _inputs(p)
        plain = _run(win, p, values)
        fused = fuse.steps(win, 0, 13, RUN)
        got = _run(fused, p, values)
        end = win.ends[0]
        assert got[end].vector.tobytes() == plain[end].vector.tobytes()
        ran = got[fused.meta]
        assert list(ran.values) == [plain[key] for key in win.evals.values()]
        assert ran.steps == 14 and ran.seconds[keys.FORWARD_BACKWARD] > 0
        assert len(ran.before_end) == 1 + len(win.evals)


def test_a_fused_window_drops_each_value_after_its_last_reader():
    """A long window holds a few buffers at a time, not one per step."""
    p, win = _window(["graph.fuse_shards=false", "graph.update=root"], steps=range(14))
    chain = fuse.steps(win, 0, 13, RUN).steps_fused
    held, peak = set(), 0
    left = dict(chain.uses)
    for key, _, args in chain.nodes:
        held.add(key)
        for dep in (a.key for a in args if isinstance(a, TaskRef)):
            left[dep] -= 1
            if not left[dep] and dep not in chain.outputs:
                held.discard(dep)
        peak = max(peak, len(held))
    assert peak <= 8 and len(chain.nodes) > 14 * 7     # 4 shards, 2 sums, the update


def test_epoch_ends_come_from_when_each_evaluation_was_done():
    p, win = _window()
    ran = fuse.Ran((), {}, (0.0, 0.5, 0.0), 14)       # the end, epoch 1's, epoch 2's
    assert fuse.epoch_ends(win, ran, 10.0) == {0: 9.5, 1: 10.0}


# --- a window across workers: a task per worker, its crossings messages ----------------------

def _cut(win, workers, steps=(0, 13)):
    """``win`` cut by the span pass over a mesh of real sockets in this process."""
    run, secret = p2p.new_run()
    nodes = {w: p2p.Node(run, secret, r, "127.0.0.1", None, None, True)
             for r, w in enumerate(workers)}
    mesh = p2p.Mesh(run, tuple(workers), tuple(nodes[w].place for w in workers))
    return span.steps(win, *steps, RUN, mesh, 10.0), nodes


def _run_pieces(cut, nodes, cache, wait):
    """Each worker's task of a cut window in a thread of its own (they talk over the mesh),
    its value into ``cache``; what each that failed raised."""
    errors = {}

    def piece(name):
        task = cut.dsk[name]
        try:
            cache[name] = span.run_on(nodes[cut.where[name][0]], task.args[0],
                                      *(cache[a.key] for a in task.args[1:]))
        except Exception as exc:
            errors[name] = exc

    threads = [threading.Thread(target=piece, args=(n,)) for n in cut.pieces]
    for t in threads:
        t.start()
    for t in threads:
        t.join(wait)
    return errors


def _run_cut(cut, nodes, values):
    """Run a cut window here: each worker's task, then the picks and the meta."""
    cache = dict(values)
    errors = _run_pieces(cut, nodes, cache, 60)
    try:
        if errors:
            raise next(iter(errors.values()))
        for key in cut.dsk:
            if key not in cut.pieces:
                cache[key] = cut.dsk[key](cache)
        return cache
    finally:
        for n in nodes.values():
            n.close()


def _same_as_step_by_step(win, rewritten, workers, values, plain):
    """Cut ``rewritten`` (``win`` or a pass's rewrite of it) over a mesh, run it, check its
    ends and evaluations are ``win``'s step-by-step values (``plain``); its meta."""
    cut, nodes = _cut(rewritten, list(workers))
    got = _run_cut(cut, nodes, values)
    for end in win.ends:
        assert got[end].vector.tobytes() == plain[end].vector.tobytes()
    ran = got[cut.meta]
    assert list(ran.values) == [plain[key] for key in win.evals.values()]
    return ran


def test_a_window_across_workers_is_a_task_per_worker_whose_crossings_are_messages():
    p, win = _window(workers=("w0", "w1"))
    cut, nodes = _cut(win, ["w0", "w1"])
    for n in nodes.values():
        n.close()
    pieces = [f"window-0-13-w{r}-{RUN}" for r in (0, 1)]
    assert cut.pieces == tuple(pieces)
    assert list(cut.dsk) == [*pieces, *win.ends, f"window-0-13-meta-{RUN}"]
    assert keys.kind_of(pieces[1]) == keys.WINDOW
    assert [cut.where[k] for k in pieces] == [["w0"], ["w1"]]
    # what the scheduler sees of 14 steps: a task per worker, the end, the meta, which
    # reads the root's task alone (the others report their timings to it, worker to worker)
    assert cut.step_tasks() == 3 and win.step_tasks() >= 14 * 2
    assert cut.dsk[cut.meta].dependencies == {pieces[0]}
    assert [cut.dsk[k].args[0].report for k in pieces] == [None, 0]
    assert [cut.dsk[k].args[0].collect for k in pieces] == [(1,), ()]
    # each task reads its own worker's shards, nothing of the other's
    assert cut.dsk[pieces[1]].dependencies == {f"load-shard-{i}-{RUN}" for i in (2, 3)}
    assert all(type(cut.dsk[k].args[0].chain) is fuse.Packed for k in pieces)  # bytes in transit
    chains = {r: cut.dsk[k].args[0].chain.open() for r, k in enumerate(pieces)}
    mine = {r: {k for k, w in win.where.items() if w == [f"w{r}"]} for r in (0, 1)}
    sent, got = set(), set()
    for r, chain in chains.items():
        for (key, fn, args), kind in zip(chain.nodes, chain.kinds):
            if fn is span.send:
                assert kind == span.SEND and key in mine[r]
                sent.update((key, to) for to in args[0])
            elif fn is span.recv:
                assert kind == span.RECV and key in mine[1 - r]
                got.add((key, r))
            else:
                assert key in mine[r]           # a task of this worker's
        assert {k for k, _, _ in chain.nodes} >= mine[r]     # ... and every one of them
    assert sent == got and len(sent) >= 14      # each message read once, where it goes
    # every value that crosses is one the step-by-step graph moves between the workers
    crossing = {(k, int(to[1:])) for k, _, to in win.transfers({}) if k in win.dsk}
    assert sent == crossing


CUTS = {
    "allreduce (replicated updates)": ([], ("w0", "w1")),
    "allreduce, the update on the root": (["graph.update=root"], ("w0", "w1")),
    "allreduce, fan-in 3 over 3 workers": (["graph.fan_in=3", "data.shards=5"],
                                            ("w0", "w1", "w2")),
    "parameter server": (["graph.strategy=parameter-server"], ("w0", "w1", "w2")),
    "6 workers: values for more than 3 relayed down a binomial tree": (
        ["data.shards=6"], tuple(f"w{i}" for i in range(6))),
    "parameter server, 5 workers: its state relayed": (
        ["graph.strategy=parameter-server", "data.shards=5"],
        tuple(f"w{i}" for i in range(6))),
    "local SGD": (["graph.strategy=local-sgd", "graph.sync_every=3"], ("w0", "w1")),
}     # model parallelism: every worker holds every shard; tests/test_hashes.py runs it cut


@pytest.mark.parametrize("case", CUTS)
def test_a_cut_window_computes_the_bytes_of_the_step_by_step_graph(case):
    sets, workers = CUTS[case]
    p, win = _window(sets, workers=workers)
    assert len({w[0] for w in win.where.values()}) == len(workers)
    values = _inputs(p)
    ran = _same_as_step_by_step(win, win, workers, values, _run(win, p, values))
    assert ran.steps == 14 and ran.sent[0] > 0
    maths = sum(ran.seconds.get(k, 0) for k in (*keys.WORK, keys.REDUCE, keys.UPDATE))
    assert 0 < ran.seconds[fuse.CRITICAL] <= maths      # the longest chain's, not the sum


def test_a_value_read_on_many_workers_goes_down_a_binomial_tree():
    """Read on 5 other workers, a value is sent by its maker to 3 of them, one of which
    passes it on to the other 2 (each member reads it from one parent, once)."""
    p, win = _window(["data.shards=6"], workers=tuple(f"w{i}" for i in range(6)))
    cut, nodes = _cut(win, [f"w{i}" for i in range(6)])
    for n in nodes.values():
        n.close()
    sends: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    reads: dict[str, list[tuple[int, int]]] = {}
    for name in cut.pieces:
        piece = cut.dsk[name].args[0]
        for key, fn, args in piece.chain.open().nodes:
            if fn is span.send:
                sends.setdefault(key, []).append((piece.rank, args[0]))
            elif fn is span.recv:
                reads.setdefault(key, []).append((piece.rank, args[0]))
    fanned = {k: v for k, v in sends.items() if sum(len(r) for _, r in v) == 5}
    assert fanned, sends                    # the root level's sums reach every other worker
    for key, by in fanned.items():
        maker = next(r for r, _ in by if all(r not in to for _, to in by))
        assert len(dict(by)[maker]) == 3 and len(by) == 2     # its maker and one relay
        got = dict(reads[key])
        assert len(got) == 5 and all(got[r] in dict(by) for r in got)   # each from a sender
    assert all(len(to) <= 3 for v in sends.values() for _, to in v)


# --- a step's sums reduced in segments --------------------------------------------------------

def _segmented(sets, workers, monkeypatch):
    """A window of ``sets`` on ``workers`` and the segments pass's rewrite of it (any buffer
    counts as big enough: the default net's is tiny)."""
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    p, win = _window(sets, workers=workers)
    itemsize = np.dtype(p.net.dtype).itemsize
    return p, win, segments.split(copy.deepcopy(win), RUN, itemsize), itemsize


def test_a_step_read_on_every_worker_is_one_allreduce_node_per_worker(monkeypatch):
    workers = ("w0", "w1", "w2", "w3")
    p, win, seg, itemsize = _segmented(["data.shards=4"], workers, monkeypatch)
    nodes = {k: v for k, v in seg.dsk.items() if keys.kind_of(k) == keys.ALLREDUCE}
    # steps 0-12 (the window's last is reduced to the root alone, as built): one each
    assert sorted(nodes) == sorted(keys.make(keys.ALLREDUCE, j, s, run=RUN)
                                   for j in range(13) for s in range(4))
    for key, node in nodes.items():
        task = node.args[0]
        assert (task.tree, task.holders, task.readers) == (((0, 1), (2, 3)), workers, workers)
        here = workers[task.index]
        assert seg.where[key] == [here] and task.index == int(keys.parse(key).parts[1])
        # it reads the buffers made on its own worker only: what crosses, it sends itself
        assert all(seg.where[d] == [here] for d in node.dependencies)
        assert task.n == p.net.buffer_size and task.tag == keys.make(keys.ALLREDUCE,
                                                                     keys.parse(key).step, run=RUN)
    # each reader's next forward-backward reads its own node, one buffer for the step
    for s, w in enumerate(workers):
        fb = seg.dsk[keys.make(keys.FORWARD_BACKWARD, 5, s, run=RUN)]
        assert keys.make(keys.ALLREDUCE, 4, s, run=RUN) in fb.dependencies
        assert fb.args[0].updates.widths == (1,) * len(fb.args[0].updates.steps)
    # no reduce reads across workers any more but the last step's, to the root
    crossing = {k for k, node in seg.dsk.items() if keys.kind_of(k) == keys.REDUCE and
                any(seg.where[d] != seg.where[k] for d in node.dependencies)}
    assert crossing and {keys.parse(k).step for k in crossing} == {13}
    assert {k for k in win.dsk if keys.kind_of(k) == keys.REDUCE and keys.parse(k).step == 13} \
        <= set(seg.dsk)
    # what it sends: each worker 3 segments of its buffer and its own segment's sum 3 times
    sent = 13 * 4 * 2 * 3 * (p.net.buffer_size // 4) * itemsize
    assert segments.traffic(seg, itemsize) == (13 * 4 * 6, pytest.approx(sent, abs=13 * 24 * itemsize))


def test_the_segments_pass_leaves_what_it_does_not_pay_on(monkeypatch):
    four = ("w0", "w1", "w2", "w3")
    _, win = _window(["data.shards=4"], workers=four)
    assert segments.split(win, RUN, 4) is win           # the default net's 133 numbers
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    assert segments.split(win, RUN, 4) is not win       # (any buffer big enough)
    for sets, workers in (([], ("w0", "w1")),           # 2 readers: the tree's 2 messages
                          (["graph.strategy=parameter-server"], ("w0", "w1", "w2")),
                          (["graph.update=root"], four)):   # its sums read on one worker
        _, win = _window(sets, workers=workers)
        assert segments.split(win, RUN, 4) is win, sets


SEGMENTED = {
    "4 workers": (["data.shards=4"], 4),
    "3 workers, fan-in 3": (["data.shards=6", "graph.fan_in=3"], 3),
    "5 workers": (["data.shards=5"], 5),
    "a reduce on its worker stays whole": (["data.shards=8", "graph.fuse_shards=false"], 4),
    "float64, states kept every 2 steps": (["data.shards=4", "model.dtype=float64",
                                            "graph.state_every=2"], 4),
}


@pytest.mark.parametrize("case", SEGMENTED)
def test_sums_reduced_in_segments_are_the_bytes_of_the_tree(case, monkeypatch):
    sets, n = SEGMENTED[case]
    workers = tuple(f"w{i}" for i in range(n))
    p, win, seg, itemsize = _segmented(sets, workers, monkeypatch)
    assert seg is not win
    values = _inputs(p)
    plain = _run(win, p, values)
    by_tree = _same_as_step_by_step(win, win, workers, values, plain)
    ran = _same_as_step_by_step(win, seg, workers, values, plain)
    # the messages the pass predicts are sent, beside the cut's own, and fewer bytes in all
    predicted = segments.traffic(seg, itemsize)[1] + sum(
        seg.nbytes.get(k, 0) for k, _, _ in seg.transfers({}) if k in seg.dsk)
    reports = by_tree.sent[1] - sum(
        win.nbytes.get(k, 0) for k, _, _ in win.transfers({}) if k in win.dsk)
    assert ran.sent[1] - reports == predicted
    if n > 3:
        assert ran.sent[1] < by_tree.sent[1]


def test_a_cut_window_whose_task_fails_stops_its_peers_at_once():
    """One worker's task fails (here: its shard is not a shard): the other, waiting for its
    message, stops with PeerLost at once instead of waiting out the timeout, and the
    failing task raises its own error."""
    p, win = _window(workers=("w0", "w1"))
    values = _inputs(p)
    values[f"load-shard-3-{RUN}"] = None
    cut, nodes = _cut(win, ["w0", "w1"])
    start = time.monotonic()
    errors = _run_pieces(cut, nodes, dict(values), 30)
    for n in nodes.values():
        n.close()
    assert time.monotonic() - start < 5
    w0, w1 = cut.pieces
    assert isinstance(errors[w0], p2p.PeerLost) and not isinstance(errors[w1], p2p.Broken)


def test_a_segmented_window_whose_task_fails_stops_its_peers_at_once(monkeypatch):
    """The same in a window whose sums are reduced in segments: each of the three others,
    waiting inside an allreduce node for the failed worker's segments, stops at once."""
    workers = ("w0", "w1", "w2", "w3")
    p, _, seg, _ = _segmented(["data.shards=4"], workers, monkeypatch)
    values = _inputs(p)
    values[f"load-shard-3-{RUN}"] = None
    cut, nodes = _cut(seg, list(workers))
    start = time.monotonic()
    errors = _run_pieces(cut, nodes, dict(values), 30)
    for n in nodes.values():
        n.close()
    assert time.monotonic() - start < 5
    *others, failed = cut.pieces
    assert all(isinstance(errors[k], p2p.PeerLost) for k in others), errors
    assert not isinstance(errors[failed], p2p.Broken)


# --- handing the state over ------------------------------------------------------------------

def test_the_state_is_kept_where_the_window_ends_and_taken_there_next():
    p, win = _window(steps=range(7))
    first = handoff.start_node(win)
    assert first == f"state-0-{RUN}" and isinstance(win.dsk[first], DataNode)
    win = handoff.rewrite(win, RUN, 0, 7, take_kept=False)
    assert win.ends == [f"kept-7-{RUN}"] and win.where[win.ends[0]] == ["w0"]
    assert handoff.literal_size(win) > 0
    _, nxt = _window(steps=range(7, 14))
    nxt = handoff.rewrite(nxt, RUN, 7, 14, take_kept=True)
    assert isinstance(nxt.dsk[f"state-7-{RUN}"], Task) and handoff.literal_size(nxt) == 0
    # values: run both windows here; the second starts from what the first kept
    values = _inputs(p)
    got = _run(win, p, values)
    kept = got[win.ends[0]]
    taken = _run(nxt, p, values)[f"state-7-{RUN}"]
    assert taken.vector.tobytes() == kept.vector.tobytes()
    assert handoff.drop(RUN) and not handoff.drop(RUN)


def test_a_worker_without_the_state_says_so():
    handoff.drop(RUN)
    with pytest.raises(handoff.StateGone, match="no state of run t0 before step 7"):
        handoff.take(handoff.Handed(RUN, 7))
    handoff.keep(handoff.Handed(RUN, 5), _window(steps=range(1))[0].initial_state())
    with pytest.raises(handoff.StateGone):          # a state of another step is not it
        handoff.take(handoff.Handed(RUN, 7))
    handoff.drop(RUN)


def test_model_parallel_windows_keep_their_literals():
    _, win = _window(["graph.strategy=model-parallel", "graph.slices=2"], steps=range(3))
    assert handoff.start_node(win) is None
    assert handoff.rewrite(win, RUN, 0, 3, take_kept=True) is win


# --- the two passes in real runs -------------------------------------------------------------

def test_a_state_gone_from_its_worker_is_sent_again_with_the_same_bytes(client, tmp_path,
                                                                       monkeypatch):
    """Each window ends kept on its worker and the next takes it there, where it is launched
    once the one before ended (as when the workers change: here every window, the next one
    never launched ahead); when the worker no longer holds it (left, restarted), ``take``
    raises StateGone and the engine submits the window again from the literal it fetched:
    the bytes of a run that lost nothing."""
    import dtrain
    from dtrain.training.engines import DaskEngine
    monkeypatch.setattr(DaskEngine, "_ahead", lambda *args: None)
    sets = ["train.epochs=4", "graph.window=7"]              # iris: one epoch a window
    plain = dtrain.train(load_config(None, sets), client=client, out=tmp_path / "a", echo=None)
    assert plain.summary["state_bytes_in_graphs"] == 0         # every window took its state

    def losing(on: bool) -> None:                   # the workers' take finds nothing at step 7
        from dtrain.taskgraph import handoff as h
        if on:
            h.real_take = h.take

            def take(handed):
                if handed.step == 7:
                    raise h.StateGone("gone, as if the worker had restarted")
                return h.real_take(handed)
            h.take = take
        else:
            h.take = h.real_take

    client.run(losing, True)
    try:
        lost = dtrain.train(load_config(None, sets), client=client, out=tmp_path / "b",
                            echo=None)
    finally:
        client.run(losing, False)
    assert lost.summary["state_bytes_in_graphs"] > 0           # sent again, from the driver
    assert (tmp_path / "a" / "params.npz").read_bytes() == \
        (tmp_path / "b" / "params.npz").read_bytes()
    assert not any(client.run(lambda: bool(handoff._kept.states)).values())   # run over: none


def test_the_next_window_starts_from_the_end_of_the_one_still_running(client, tmp_path):
    """A window is launched while the one before it runs (the edge between them off the
    critical path), its state the end of that window where it is: the same bytes, losses
    and epochs as windows launched one after another."""
    import dtrain
    from dtrain.training import engines
    sets = ["train.epochs=6", "graph.window=7", "optim.lr=0.3", "optim.name=momentum"]
    one_by_one = []
    real = engines.DaskEngine._ahead

    def counted(self, *args):
        got = real(self, *args)
        one_by_one.append(got is not None)
        return got

    engines.DaskEngine._ahead = counted
    try:
        ahead = dtrain.train(load_config(None, sets), client=client, out=tmp_path / "a",
                             echo=None)
    finally:
        engines.DaskEngine._ahead = real
    assert sum(one_by_one) >= 3, one_by_one         # most windows were launched ahead
    engines.DaskEngine._ahead = lambda *args: None
    try:
        after = dtrain.train(load_config(None, sets), client=client, out=tmp_path / "b",
                             echo=None)
    finally:
        engines.DaskEngine._ahead = real
    assert (tmp_path / "a" / "params.npz").read_bytes() == \
        (tmp_path / "b" / "params.npz").read_bytes()
    assert [r["val_loss"] for r in ahead.metrics] == [r["val_loss"] for r in after.metrics]
    assert ahead.summary["epochs_run"] == after.summary["epochs_run"] == 6
    assert ahead.summary["spanned_windows"] > 0


def _fails(x):
    raise ValueError("gone")


def _later(x):
    time.sleep(0.02)
    return x


@pytest.mark.slow
def test_a_graph_sent_again_under_its_keys_is_not_cancelled_by_the_old_ones_answer(client):
    """The engine sends a window again under the same keys after cancelling it (StateGone).
    The scheduler answers a cancel on the client's stream; ``forgotten`` waits for that
    answer too, which, arriving after the new graph, would cancel its futures.  Under load
    (busy processes beside the cluster), 40 rounds: before that wait, 5-13 % of rounds
    ended in FutureCancelledError."""
    import subprocess
    import sys

    from dtrain.deploy.workers import forgotten
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        for i in range(40):
            first = {f"a-{i}": (_fails, 1), f"b-{i}": (_later, f"a-{i}")}
            futures = client.get(first, [f"b-{i}"], sync=False)
            with pytest.raises(ValueError):
                client.gather(futures)
            client.cancel(futures)
            forgotten(client, list(first), 10)
            again = {f"a-{i}": (_later, 1), f"b-{i}": (_later, f"a-{i}")}
            assert client.gather(client.get(again, [f"b-{i}"], sync=False)) == [1], i
    finally:
        for p in busy:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_a_big_net_trains_without_sending_a_large_graph(client, recwarn):
    """A 784-2048-2048-10 net (5.8 M parameters, 23 MB a state): the first window makes the
    seeded state where it starts, the others take the state kept where the last ended, so
    no graph carries it and distributed never warns of a large graph."""
    import dtrain
    cfg = load_config(None, ["data.dataset=synthetic", "data.samples=600", "data.features=784",
                             "data.classes=10", "model.layers=[784,2048,2048,10]",
                             "model.dtype=float32", "train.batch_size=100", "train.epochs=2",
                             "graph.window=3"])
    r = dtrain.train(cfg, client=client, echo=None)
    assert r.summary["state_bytes_in_graphs"] == 0
    assert not [w for w in recwarn if "large graph" in str(w.message)]


def test_a_run_that_gave_up_an_attempt_refuses_its_old_windows_however_many_runs_follow():
    """A kept state of an attempt the run's engine gave up is not kept, and the run's
    record of its attempt stays among the newest however many runs the worker served
    before (it was once cleared with every other run's at the 64th)."""
    kept = handoff._Kept()
    for i in range(handoff.KEEP_ATTEMPTS - 1):
        kept.give_up(f"old-{i}", 1)
    kept.give_up("run", 2)
    kept.give_up("another", 1)                   # the map is full: the oldest run's goes
    stale = handoff.Handed("run", 5, 0.0, attempt=1)
    assert kept.stale(stale) and not kept.stale(handoff.Handed("run", 5, 0.0, attempt=2))
    kept.put(stale, TrainState(np.zeros(3)))
    assert "run" not in kept.states and len(kept.attempts) == handoff.KEEP_ATTEMPTS
