"""The engine's graph passes, chained by dtrain.taskgraph.passes.optimize, and each on its own:
a window on one worker fused into one task; the state handed over between windows; tested on
structure (keys, pinning) and on values (the same bytes as without them), on windows as the
builders make them and through the pipeline as the engine submits them.  A window across
workers (cut into a task per worker, its sums in segments): tests/test_span.py; the core
processes a worker computes its shards on: tests/test_cores.py."""
from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
from dask.task_spec import DataNode, Task, TaskRef

from dtrain.core import keys
from dtrain.core.config import load_config
from dtrain.deploy import p2p
from dtrain.maths.optim import TrainState
from dtrain.taskgraph import fuse, handoff, passes
from helpers.windows_here import RUN, built, inputs, run_here


# --- the pipeline --------------------------------------------------------------------------

def test_the_pipeline_hands_over_then_fuses_a_window_on_one_worker():
    p, win = built(["graph.update=root"])
    done = passes.optimize(win, passes.Options(RUN, 0, 14, take=True))
    assert list(done.win.dsk) == [f"window-0-13-w0-{RUN}", f"kept-14-{RUN}",
                                  f"window-0-13-meta-{RUN}"]
    chain = done.win.steps_fused
    assert chain.nodes[0][0] == f"state-0-{RUN}" and chain.nodes[0][1] is handoff.take
    assert (done.messages, done.nbytes, done.segmented, done.literal_bytes) == (0, 0, False, 0)


def test_the_pipeline_cuts_a_window_across_workers_on_the_mesh_it_is_given():
    p, win = built(["graph.strategy=parameter-server"], workers=("w0", "w1", "w2"))
    asked = []

    def mesh(workers):
        asked.append(workers)
        return p2p.Mesh("m", tuple(workers), (p2p.Place("", 0),) * len(workers))

    done = passes.optimize(win, passes.Options(RUN, 0, 14, mesh=mesh),
                           {f"load-shard-{i}-{RUN}": w for i, w in
                            enumerate(("w1", "w1", "w2", "w2"))})
    assert len(asked) == 1 and set(asked[0]) == {"w0", "w1", "w2"}
    assert done.win.pieces == tuple(f"window-0-13-w{r}-{RUN}" for r in range(3))
    assert done.messages > 0 and done.nbytes > 0 and done.literal_bytes > 0
    steps = passes.optimize(built(["graph.strategy=parameter-server"],
                                  workers=("w0", "w1", "w2"))[1],
                            passes.Options(RUN, 0, 14, fuse_steps=False))
    assert not steps.win.pieces and steps.win.meta is None      # every step's tasks, as built
    with pytest.raises(ValueError, match="needs a mesh"):
        passes.optimize(built(["graph.strategy=parameter-server"],
                              workers=("w0", "w1", "w2"))[1], passes.Options(RUN, 0, 14))


# --- fusing a window on one worker ---------------------------------------------------------

def _fused(sets=("graph.update=root",)):
    """A window of ``sets`` on one worker, steps 0-13, through the passes: one task."""
    return passes.optimize(built(list(sets))[1], passes.Options(RUN, 0, 14)).win


def test_a_window_on_one_worker_is_one_task_that_keeps_the_keys_the_engine_reads():
    p, win = built(["graph.update=root"])
    fused = passes.optimize(win, passes.Options(RUN, 0, 14)).win
    body = f"window-0-13-w0-{RUN}"
    assert list(fused.dsk) == [body, f"kept-14-{RUN}", f"window-0-13-meta-{RUN}"]  # evals: meta
    assert keys.kind_of(body) == keys.WINDOW and keys.label(body) == "window\\nsteps 0-13"
    assert all(w == ["w0"] for w in fused.where.values())
    # the one task reads the shards and the held-out data, nothing of its own graph
    assert fused.dsk[body].dependencies == {f"load-shard-{i}-{RUN}" for i in range(4)} | \
        {f"load-val-{RUN}"}
    assert all(fused.dsk[k].dependencies == {body} for k in (*fused.ends, fused.meta))
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
    packed = _fused().dsk[f"window-0-13-w0-{RUN}"].args[0]
    monkeypatch.setattr(fuse._runs(), "opens_chains", False)   # (an in-process worker set it)
    assert type(pickle.loads(pickle.dumps(packed))) is fuse.Packed
    fuse.OpenChains().setup(None)
    assert type(pickle.loads(pickle.dumps(packed))) is fuse.Chain


def test_a_window_across_workers_is_left_as_it_is():
    _, win = built(workers=("w0", "w1"))
    assert fuse.one_worker(win) is None
    assert fuse.steps(win, 0, 13, RUN) is win


def test_fused_and_unfused_windows_compute_the_same_bytes():
    """The passes only reorder who calls what: the end state and the evaluations equal the
    step-by-step graph's to the bit (replicated updates, whose builder adds a reduce tree
    before its leaves, included)."""
    for update in ("root", "replicated"):
        sets = [f"graph.update={update}", "graph.fuse_shards=false"]
        p, win = built(sets)
        values = inputs(p)
        plain = run_here(win, values)
        fused = _fused(sets)
        got = run_here(fused, values)
        assert got[fused.ends[0]].vector.tobytes() == plain[win.ends[0]].vector.tobytes()
        ran = got[fused.meta]
        assert list(ran.values) == [plain[key] for key in win.evals.values()]
        assert ran.steps == 14 and ran.seconds[keys.FORWARD_BACKWARD] > 0
        assert len(ran.before_end) == 1 + len(win.evals)


def test_a_fused_window_drops_each_value_after_its_last_reader():
    """A long window holds a few buffers at a time, not one per step."""
    chain = _fused(["graph.fuse_shards=false", "graph.update=root"]).steps_fused
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
    p, win = built()
    ran = fuse.Ran((), {}, (0.0, 0.5, 0.0), 14)       # the end, epoch 1's, epoch 2's
    assert fuse.epoch_ends(win, ran, 10.0) == {0: 9.5, 1: 10.0}


# --- handing the state over ------------------------------------------------------------------

def test_the_state_is_kept_where_the_window_ends_and_taken_there_next():
    p, win = built(steps=range(7))
    first = handoff.start_node(win)
    assert first == f"state-0-{RUN}" and isinstance(win.dsk[first], DataNode)
    done = passes.optimize(win, passes.Options(RUN, 0, 7, fuse_steps=False))
    win = done.win
    assert win.ends == [f"kept-7-{RUN}"] and win.where[win.ends[0]] == ["w0"]
    assert done.literal_bytes > 0
    _, nxt = built(steps=range(7, 14))
    done = passes.optimize(nxt, passes.Options(RUN, 7, 14, fuse_steps=False, take=True))
    nxt = done.win
    assert isinstance(nxt.dsk[f"state-7-{RUN}"], Task) and done.literal_bytes == 0
    # values: run both windows here; the second starts from what the first kept
    values = inputs(p)
    got = run_here(win, values)
    kept = got[win.ends[0]]
    taken = run_here(nxt, values)[f"state-7-{RUN}"]
    assert taken.vector.tobytes() == kept.vector.tobytes()
    assert handoff.drop(RUN) and not handoff.drop(RUN)


def test_a_take_waits_as_long_as_the_window_before_runs_here():
    """The next window, started while the one before runs here (a worker of several
    threads, or of one whose window left the pool), waits for its state past its own wait
    while that window runs, and no longer once only itself runs."""
    run, state = "take-waits", built(steps=range(1))[0].initial_state()
    fuse._runs().enter(run)                       # the window that takes ...
    fuse._runs().enter(run)                       # ... and the one before, keeping in 0.8 s
    try:
        threading.Timer(0.8, handoff.keep, args=(handoff.Handed(run, 7), state)).start()
        start = time.monotonic()
        taken = handoff.take(handoff.Handed(run, 7, wait=0.2))     # four waits: it waited
        assert 0.7 < time.monotonic() - start < 5
        assert taken.vector.tobytes() == state.vector.tobytes()
    finally:
        fuse._runs().leave(run)
    start = time.monotonic()
    try:
        with pytest.raises(handoff.StateGone):     # none runs before it: the wait holds
            handoff.take(handoff.Handed(run, 14, wait=0.2))
        assert time.monotonic() - start < 2
    finally:
        fuse._runs().leave(run)
        handoff.drop(run)


def test_two_windows_each_waiting_here_for_a_state_stop_waiting():
    """Two windows of a run on one worker, each waiting in its take for a state that only
    a window running here could keep (a window run again after a lost worker, and the one
    launched after it): neither counts the other as the window before that will keep it,
    so both end with StateGone after their wait (the engine runs the window again from
    its literal state) instead of waiting for ever."""
    run = "take-deadlock"
    got: list[BaseException] = []
    both = threading.Barrier(2)

    def window(step: int) -> None:         # a window's task: it runs, its first node takes
        fuse._runs().enter(run)
        try:
            both.wait(5)
            handoff.take(handoff.Handed(run, step, wait=0.3))
        except BaseException as exc:
            got.append(exc)
        finally:
            fuse._runs().leave(run)
    try:
        start = time.monotonic()
        threads = [threading.Thread(target=window, args=(s,), daemon=True) for s in (7, 14)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "two takes wait for each other for ever"
        assert [type(e) for e in got] == [handoff.StateGone] * 2
        assert time.monotonic() - start < 5
    finally:
        handoff.drop(run)


def test_a_worker_without_the_state_says_so():
    handoff.drop(RUN)
    with pytest.raises(handoff.StateGone, match="no state of run t0 before step 7"):
        handoff.take(handoff.Handed(RUN, 7))
    handoff.keep(handoff.Handed(RUN, 5), built(steps=range(1))[0].initial_state())
    with pytest.raises(handoff.StateGone):          # a state of another step is not it
        handoff.take(handoff.Handed(RUN, 7))
    handoff.drop(RUN)


def test_model_parallel_windows_keep_their_literals():
    _, win = built(["graph.strategy=model-parallel", "graph.slices=2"], steps=range(3))
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
    assert not any(client.run(lambda: bool(handoff._kept().states)).values())   # run over: none


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
