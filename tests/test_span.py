"""The passes for a window across workers: cut into a task per worker whose crossings are
messages over the mesh (dtrain.taskgraph.span), and a step's sums reduced in segments
(dtrain.taskgraph.segments): tested on structure (who sends what to whom) and on values
(the same bytes as the step-by-step graph), over real sockets in this process.  A window
is cut as the engine cuts it, through the pipeline (dtrain.taskgraph.passes.optimize); the
segments pass's own rewrite is also tested on its own."""
from __future__ import annotations

import copy
import time

import numpy as np
import pytest

from dtrain.core import keys
from dtrain.deploy import p2p
from dtrain.taskgraph import fuse, segments, span
from helpers.windows_here import RUN, built, cut_over_mesh, inputs, run_cut, run_here, run_pieces


# --- a window across workers: a task per worker, its crossings messages ----------------------

def _step_by_step(sets, workers):
    """The window of ``sets`` on ``workers`` as built, its inputs, and every value it makes
    run here step by step."""
    p, win = built(sets, workers=workers)
    values = inputs(p)
    return win, values, run_here(win, values)


def _same_as_step_by_step(plain, sets, workers, **options):
    """The window of ``sets`` on ``workers`` through the passes (``options``), cut over a
    mesh and run: its end state and evaluations are the step-by-step window's (``plain``,
    from :func:`_step_by_step`), to the bit.  Its meta, and what the passes made of it."""
    win, values, by_key = plain
    p, fresh = built(sets, workers=workers)
    done, nodes = cut_over_mesh(p, fresh, list(workers), **options)
    cut = done.win
    got = run_cut(cut, nodes, values)
    (end,), (kept,) = win.ends, cut.ends
    assert got[kept].vector.tobytes() == by_key[end].vector.tobytes()
    ran = got[cut.meta]
    assert list(ran.values) == [by_key[key] for key in win.evals.values()]
    return ran, done


def test_a_window_across_workers_is_a_task_per_worker_whose_crossings_are_messages():
    p, win = built(workers=("w0", "w1"))
    done, nodes = cut_over_mesh(p, win, ["w0", "w1"])
    for n in nodes.values():
        n.close()
    cut, pieces = done.win, [f"window-0-13-w{r}-{RUN}" for r in (0, 1)]
    assert cut.pieces == tuple(pieces)
    assert list(cut.dsk) == [*pieces, f"kept-14-{RUN}", f"window-0-13-meta-{RUN}"]
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
    "4 workers: the root's sum made on both makers": (["data.shards=4"],
                                                       ("w0", "w1", "w2", "w3")),
    "10 workers: each maker's half of the sum's readers down a binomial tree": (
        ["data.shards=10"], tuple(f"w{i}" for i in range(10))),
    "parameter server, 5 workers: its state relayed": (
        ["graph.strategy=parameter-server", "data.shards=5"],
        tuple(f"w{i}" for i in range(6))),
    "local SGD": (["graph.strategy=local-sgd", "graph.sync_every=3"], ("w0", "w1")),
}     # model parallelism: every worker holds every shard; tests/test_hashes.py runs it cut


@pytest.mark.parametrize("case", CUTS)
def test_a_cut_window_computes_the_bytes_of_the_step_by_step_graph(case):
    sets, workers = CUTS[case]
    plain = _step_by_step(sets, workers)
    assert len({w[0] for w in plain[0].where.values()}) == len(workers)
    ran, _ = _same_as_step_by_step(plain, sets, workers)
    assert ran.steps == 14 and ran.sent[0] > 0
    maths = sum(ran.seconds.get(k, 0) for k in (*keys.WORK, keys.REDUCE, keys.UPDATE))
    assert 0 < ran.seconds[fuse.CRITICAL] <= maths      # the longest chain's, not the sum


def test_a_value_read_on_many_workers_goes_down_a_binomial_tree():
    """Read on 5 other workers, a value is sent by its maker to 3 of them, one of which
    passes it on to the other 2 (each member reads it from one parent, once)."""
    p, win = built(["data.shards=6"], workers=tuple(f"w{i}" for i in range(6)))
    done, nodes = cut_over_mesh(p, win, [f"w{i}" for i in range(6)])
    for n in nodes.values():
        n.close()
    cut = done.win
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


def _sends(cut, step):
    """``{(key, sending rank, ranks sent to)}``: the messages of ``step`` in a cut window,
    and ``{key: ranks that compute it}``."""
    sent, made = set(), {}
    for name in cut.pieces:
        piece = cut.dsk[name].args[0]
        for key, fn, args in piece.chain.open().nodes:
            if keys.parse(key).step != step:
                continue
            if fn is span.send:
                sent.add((key, piece.rank, args[0]))
            elif fn is not span.recv:
                made.setdefault(key, set()).add(piece.rank)
    return sent, made


def test_a_step_on_4_workers_sends_6_buffers():
    """The root level's two sums are exchanged by their makers, which each add them (the
    root's sum, made twice, the same bytes) and send the sum on to half of the others: 6
    buffers a step, the sum two hops after the pairs' (each pair's sum sent to the 3 other
    workers would be 8 buffers); on 2 workers the two exchange their gradients."""
    four = ("w0", "w1", "w2", "w3")
    p, win = built(["data.shards=4"], workers=four)
    root = keys.make(keys.REDUCE, 5, 2, 0, run=RUN)
    assert win.where[root] == ["w0"]                # the builder's: one sum, on the root
    done, nodes = cut_over_mesh(p, win, list(four))
    for n in nodes.values():
        n.close()
    fb, rd = keys.FORWARD_BACKWARD, keys.REDUCE
    sent, made = _sends(done.win, 5)
    assert sent == {(keys.make(fb, 5, 1, run=RUN), 1, (0,)),       # to its pair's first
                    (keys.make(fb, 5, 3, run=RUN), 3, (2,)),
                    (keys.make(rd, 5, 1, 0, run=RUN), 0, (2,)),    # the pairs' sums
                    (keys.make(rd, 5, 1, 2, run=RUN), 2, (0,)),    # exchanged
                    (root, 0, (1,)), (root, 2, (3,))}              # the sum, to the others
    assert made[root] == {0, 2}
    p, win = built([], workers=("w0", "w1"))
    done, nodes = cut_over_mesh(p, win, ["w0", "w1"])
    for n in nodes.values():
        n.close()
    assert _sends(done.win, 5)[0] == {(keys.make(fb, 5, 2 * i, run=RUN), i, (1 - i,))
                                 for i in (0, 1)}


# --- a step's sums reduced in segments --------------------------------------------------------

def _segmented(sets, workers, monkeypatch):
    """A window of ``sets`` on ``workers`` and the segments pass's rewrite of it, on its own
    (any buffer counts as big enough: the default net's is tiny)."""
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    p, win = built(["graph.reduce=segments", *sets], workers=workers)
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
    _, win = built(["data.shards=4", "graph.reduce=segments"], workers=four)
    assert segments.split(win, RUN, 4) is win           # the default net's 133 numbers
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    assert segments.split(win, RUN, 4) is not win       # (any buffer big enough)
    for sets, workers in (([], ("w0", "w1")),           # 2 readers: the tree's 2 messages
                          (["graph.strategy=parameter-server"], ("w0", "w1", "w2")),
                          (["graph.update=root"], four)):   # its sums read on one worker
        _, win = built(sets, workers=workers)
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
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    sets = ["graph.reduce=segments", *sets]
    plain = _step_by_step(sets, workers)
    by_tree, tree = _same_as_step_by_step(plain, sets, workers)
    ran, seg = _same_as_step_by_step(plain, sets, workers, segments=True)
    assert seg.segmented and not tree.segmented
    # what the passes predict is sent, beside the chains' reports to the collector (the
    # sent bytes less the tree's), and fewer bytes in all
    reports = by_tree.sent[1] - tree.nbytes
    assert ran.sent[1] - reports == seg.nbytes
    if n > 3:
        assert ran.sent[1] < by_tree.sent[1]


def test_a_cut_window_whose_task_fails_stops_its_peers_at_once():
    """One worker's task fails (here: its shard is not a shard): the other, waiting for its
    message, stops with PeerLost at once instead of waiting out the timeout, and the
    failing task raises its own error."""
    p, win = built(workers=("w0", "w1"))
    values = inputs(p)
    values[f"load-shard-3-{RUN}"] = None
    done, nodes = cut_over_mesh(p, win, ["w0", "w1"])
    cut = done.win
    start = time.monotonic()
    errors = run_pieces(cut, nodes, dict(values), 30)
    for n in nodes.values():
        n.close()
    assert time.monotonic() - start < 5
    w0, w1 = cut.pieces
    assert isinstance(errors[w0], p2p.PeerLost) and not isinstance(errors[w1], p2p.Broken)


def test_a_segmented_window_whose_task_fails_stops_its_peers_at_once(monkeypatch):
    """The same in a window whose sums are reduced in segments: each of the three others,
    waiting inside an allreduce node for the failed worker's segments, stops at once."""
    workers = ("w0", "w1", "w2", "w3")
    monkeypatch.setattr(segments, "MIN_SEGMENT_BYTES", 0)
    p, win = built(["data.shards=4", "graph.reduce=segments"], workers=workers)
    values = inputs(p)
    values[f"load-shard-3-{RUN}"] = None
    done, nodes = cut_over_mesh(p, win, list(workers), segments=True)
    assert done.segmented
    cut = done.win
    start = time.monotonic()
    errors = run_pieces(cut, nodes, dict(values), 30)
    for n in nodes.values():
        n.close()
    assert time.monotonic() - start < 5
    *others, failed = cut.pieces
    assert all(isinstance(errors[k], p2p.PeerLost) for k in others), errors
    assert not isinstance(errors[failed], p2p.Broken)
