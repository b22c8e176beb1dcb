"""Faults injected for real: SIGKILLed, stopped, retired and joining workers, a cluster that
empties, stalled windows; what a run says of each.  (Checkpoints and resumes: test_resume.py.)"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import pytest
from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster, get_task_stream
from distributed.comm import CommClosedError

import dtrain
from dtrain.core.broadcast import on_workers
from dtrain.core.errors import UserError
from dtrain.deploy.workers import gather, wait_for_workers, worker_addresses
from dtrain.deploy.workers import workers as worker_info
from dtrain.observe.metrics import worker_peak_rss_mb
from dtrain.training import checkpoint

from helpers.faults import LONG, reference as _reference


def _kill_at_epoch(epoch: int, victim):
    """An echo callback that SIGKILLs ``victim()`` when epoch ``epoch`` is reported."""
    def echo(line: str) -> None:
        if line.startswith(f"epoch {epoch:>2}/") or line.startswith(f"epoch {epoch}/"):
            os.kill(victim(), signal.SIGKILL)
    return echo


def _stop_at_epoch(epoch: int, pid: int, then_kill: bool, said: list[str]):
    """An echo callback that SIGSTOPs ``pid`` when epoch ``epoch`` is reported (the next
    window is in flight then, and cannot end without it: it holds shards), and SIGKILLs it
    half a second later (``then_kill``) or leaves it stopped: a worker that says nothing,
    while the scheduler still lists it.  Every line goes to ``said``."""
    def echo(line: str) -> None:
        said.append(line)
        if line.startswith(f"epoch {epoch:>2}/"):
            os.kill(pid, signal.SIGSTOP)
            if then_kill:
                threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    return echo


@pytest.mark.parametrize("victim", [0, pytest.param(1, marks=pytest.mark.slow)],
                         ids=["the root", "another worker"])
def test_worker_sigkill_on_a_local_cluster(client, tmp_path, victim):
    """A worker process SIGKILLed mid-window (the window runs as a task per worker, its sums
    worker to worker): every task of the window ends at once, the window runs again from
    its start on the workers there (the lost worker's shards rebuilt, its restarted
    successor used once it is back), and the bytes are those of an undisturbed run."""
    reference = _reference(tmp_path, client)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        lost = worker_addresses(c)[victim]            # 0 holds shard 0: the root
        pid = c.run(os.getpid, workers=[lost])[lost]
        said: list[str] = []
        began = time.monotonic()
        result = dtrain.train(dtrain.load_config(None, LONG), client=c, out=tmp_path / "killed",
                              echo=_stop_at_epoch(3, pid, True, said))
        assert lost not in worker_addresses(c)     # it really died (and was replaced)
    assert time.monotonic() - began < 60
    s = result.summary
    assert s["epochs"] == 12 and s["spanned_windows"] > 0
    assert s["window_reruns"] and any("running it again" in line for line in said), said
    assert (tmp_path / "killed" / "params.npz").read_bytes() == reference


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_left_out_within_the_timeout(client, tmp_path):
    """A worker stopped mid-window (SIGSTOP: its process lives, its sockets stay open, the
    scheduler still lists it): no one says it left, yet its peer's window task ends after
    the window's wait (here cluster.timeout, 3 s), and the window runs again without it.
    (Distributed's own calls to every worker would wait for it until its heartbeat times
    out, minutes later: once the run has said so, the test ends the stopped process.)"""
    reference = _reference(tmp_path, client)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        quiet = worker_addresses(c)[1]                # not the root, which holds load-val
        pid = c.run(os.getpid, workers=[quiet])[quiet]
        said: list[str] = []
        stop = _stop_at_epoch(3, pid, False, said)
        stopped = []

        def echo(line: str) -> None:
            stop(line)
            if line.startswith("epoch  3/"):
                stopped.append(time.monotonic())
            if "left out" in line:
                stopped.append(time.monotonic())
                os.kill(pid, signal.SIGKILL)

        try:
            result = dtrain.train(dtrain.load_config(None, [*LONG, "cluster.timeout=3"]),
                                  client=c, out=tmp_path / "quiet", echo=echo)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert len(stopped) == 2 and stopped[1] - stopped[0] < 20, (stopped, said)
    (rerun,) = result.summary["window_reruns"]
    assert quiet in rerun and "within 3 s" in rerun and "left out" in rerun, rerun
    assert result.summary["epochs"] == 12
    assert (tmp_path / "quiet" / "params.npz").read_bytes() == reference


@pytest.mark.slow
def test_a_worker_that_joins_is_used_from_the_next_window(client, tmp_path):
    """One worker, and a second joins mid-run: the windows before it ran as one task on the
    first, those after as a task on each with their sums worker to worker; the bytes are
    those of a run on two workers all along."""
    reference = _reference(tmp_path, client)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        def echo(line: str) -> None:
            if line.startswith("epoch  3/"):
                lc.scale(2)
                c.wait_for_workers(2, timeout=30)   # (the run would end before it started)
        result = dtrain.train(dtrain.load_config(None, LONG), client=c, out=tmp_path / "grown",
                              echo=echo)
        assert len(worker_addresses(c)) == 2
    s = result.summary
    assert s["fused_windows"] > 0 and s["spanned_windows"] > 0, s
    assert s["window_reruns"] == []
    assert (tmp_path / "grown" / "params.npz").read_bytes() == reference


@pytest.mark.slow
def test_a_worker_retired_by_its_lifetime_is_a_lost_worker_with_no_loss(client, tmp_path):
    """What dask-jobqueue's ``--lifetime`` does to a batch job's worker: it closes
    gracefully after its time (here 2 s) and its nanny starts a new one, again and again,
    mid-run; the run goes on on the workers there and ends with the bytes of an undisturbed
    run."""
    spec = {"0": {"cls": Nanny, "options": {"nthreads": 1}},
            "1": {"cls": Nanny, "options": {"nthreads": 1, "lifetime": "2s",
                                            "lifetime_restart": True}}}
    overrides = [*LONG, "train.epochs=150"]    # several seconds: outlasts the 2 s lifetime
    with SpecCluster(workers=spec, scheduler={"cls": Scheduler, "options": {
            "dashboard_address": None}}) as lc, Client(lc) as c:
        c.wait_for_workers(2)
        first = set(worker_addresses(c))
        result = dtrain.train(dtrain.load_config(None, overrides), client=c,
                              out=tmp_path / "retired", echo=None)
        assert len(first - set(worker_addresses(c))) == 1     # the mortal one was retired
    straight = dtrain.train(dtrain.load_config(None, overrides), client=client,
                            out=tmp_path / "straight", echo=None)
    assert result.summary["epochs_run"] == straight.summary["epochs_run"] == 150
    assert (tmp_path / "retired" / "params.npz").read_bytes() == \
        (tmp_path / "straight" / "params.npz").read_bytes()


@pytest.mark.slow
def test_a_cluster_whose_workers_all_retire_ends_the_run_with_one_line(tmp_path):
    """Every worker retires for good mid-run (a batch job's ``--lifetime`` without a
    successor): the scheduler would hold the tasks until a worker comes; dtrain waits
    ``cluster.timeout`` and stops with one line, keeping the checkpoint it saved.  (On a
    slow machine they may all retire before the run has placed anything: then the line says
    that no worker came.)"""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, lifetime="4s", lifetime_stagger="0s") as lc, \
            Client(lc) as c:
        c.wait_for_workers(2)
        began = time.monotonic()
        with pytest.raises(UserError, match=r"every Dask worker left the cluster and none "
                           r"joined within 2 s \(cluster.timeout\)|needs 1 Dask worker\(s\), "
                           r"found 0 after 2 s") as lost:
            dtrain.train(dtrain.load_config(None, [*LONG, "train.epochs=2000",
                                                   "cluster.timeout=2"]),
                         client=c, out=tmp_path / "orphaned", echo=None)
        assert time.monotonic() - began < 60
    said = str(lost.value)
    assert "\n" not in said
    if said.startswith("needs 1 Dask worker(s), found 0"):      # gone before the first window
        assert not (tmp_path / "orphaned").exists(), said        # nothing recorded: no run
        return
    kept = re.search(r"the last good checkpoint \(step (\d+)\) is kept in (\S+): resume it "
                     r"with python -m dtrain --resume (\S+) once workers are back$", said)
    assert "\n" not in said and kept, said
    assert Path(kept[3]) == tmp_path / "orphaned"                     # the line's claims,
    assert Path(kept[2]) == tmp_path / "orphaned" / checkpoint.FILE     # checked on disk
    assert checkpoint.load(tmp_path / "orphaned")[0].step == int(kept[1]) > 0


@contextlib.contextmanager
def _at_call(function, action, nth: int):
    """While entered, ``action()`` runs in this thread at the instant ``function`` is called
    for the ``nth`` time (a profile hook: a real fault at a chosen instant of the driver's
    own code, which runs as it is)."""
    calls = 0

    def hook(frame, event, arg) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is function.__code__:
            calls += 1
            if calls == nth:
                sys.setprofile(None)
                action()

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


@pytest.mark.slow
def test_every_worker_gone_at_the_instant_of_a_placement_is_one_line(tmp_path):
    """Every worker leaves at the very instant the engine asks which workers there are to
    place a window (the fifth placement: a checkpoint is saved by then): that is a lost
    cluster like any other, waited for ``cluster.timeout`` and said in one line with the
    checkpoint kept, not ``placement.blocks([], 4)``'s IndexError (a slower machine's CI
    hit it when a LocalCluster's workers had all retired between the wait for workers and
    their list), nor that 0 workers stopped answering."""
    from dtrain.training.cluster_data import ClusterData

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        c.wait_for_workers(1)

        def all_gone() -> None:         # for good (retire_workers keeps one holding data)
            lc.scale(0)
            deadline = time.monotonic() + 30
            while worker_addresses(c) and time.monotonic() < deadline:
                time.sleep(0.05)

        with _at_call(ClusterData._workers, all_gone, 5), pytest.raises(UserError) as lost:
            dtrain.train(dtrain.load_config(None, [*LONG, "cluster.timeout=1"]), client=c,
                         out=tmp_path / "run", echo=None)
    said = str(lost.value)
    kept = re.fullmatch(r"every Dask worker left the cluster and none joined within 1 s "
                        r"\(cluster.timeout\); the last good checkpoint \(step (\d+)\) is kept "
                        r"in (\S+): resume it with python -m dtrain --resume (\S+) once workers "
                        r"are back", said)
    assert kept, said
    assert Path(kept[3]) == tmp_path / "run" and Path(kept[2]) == tmp_path / "run" / \
        checkpoint.FILE
    assert checkpoint.load(tmp_path / "run")[0].step == int(kept[1]) > 0


def test_placing_on_no_worker_is_a_clear_error_not_an_index_error():
    from dtrain.taskgraph.placement import blocks, place

    with pytest.raises(ValueError, match="no worker to place 4 shard"):
        blocks([], 4)
    with pytest.raises(ValueError, match="no worker to place 4 shard"):
        place([], 4)


def _leave_if_second(dask_worker) -> str:
    if dask_worker.name == 1:
        os._exit(1)                                 # lost mid-call, as a SIGKILL would
    return "here"


def _fails(dask_worker) -> None:
    raise ValueError("a bug in the function")


def _both_back(lc: LocalCluster, c: Client) -> None:
    """Both workers up, as the scheduler and the cluster object see them: a worker killed
    before the cluster's own watcher saw it come back makes distributed's LocalCluster fail
    its close with a KeyError (its ``_update_worker_status``; a CI run failed so)."""
    wait_for_workers(c, 2, 30)
    deadline = time.monotonic() + 30
    while set(lc.scheduler_info["workers"]) != set(worker_addresses(c)):
        assert time.monotonic() < deadline, "the cluster never saw both workers back"
        time.sleep(0.05)


def test_a_call_on_every_worker_leaves_out_one_that_leaves_during_it():
    """A worker lost (or retired by its lifetime) while dtrain asks every worker something
    is left out of the answers, not raised: a CI run died of a CommClosedError when a
    lifetime-retired worker closed during the placement's ``client.run``.  An error of the
    function itself is still raised."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        c.wait_for_workers(2)
        first = worker_addresses(c)[0]
        with pytest.raises(CommClosedError):        # what plain client.run does
            c.run(_leave_if_second)
        _both_back(lc, c)                           # its nanny brought it back
        assert on_workers(c, _leave_if_second) == {first: "here"}
        _both_back(lc, c)
        with pytest.raises(ValueError, match="a bug in the function"):
            on_workers(c, _fails)


def test_worker_lists_are_asked_fresh_not_read_from_the_clients_cache(client):
    """The client's cached scheduler identity is refreshed every
    ``scheduler-info-interval`` with one that lists no workers; placement once read it
    empty (IndexError under mpiexec).  With the refresh every millisecond, every list
    dtrain takes of the workers still holds both of them."""
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}), \
            Client(client.scheduler.address, timeout=30) as c:
        c.wait_for_workers(2, timeout=30)
        seen = [len(worker_info(c)) for _ in range(300)]
        assert min(seen) == 2, f"{seen.count(0)} of {len(seen)} lists were empty"
        assert all(len(worker_addresses(c)) == 2 for _ in range(100))
        assert all(set(worker_peak_rss_mb(c)) == {"0", "1"} for _ in range(30))
        for _ in range(3):
            with pytest.raises(UserError, match="needs 3 Dask worker.*found 2 after"):
                wait_for_workers(c, 3, 0.05)


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distributed.cli." + args[0], *args[1:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _plus_one(x: int) -> int:
    return x + 1


def test_a_window_left_waiting_on_nothing_that_runs_is_run_again_not_waited_for(client):
    """A window's wait (``stalls``) whose tasks wait on a task no worker can run (pinned to
    a worker that is gone, as a lost worker can leave one): after ``timeout`` seconds it
    raises Stalled, a Broken (the engine runs the window again), naming the waiting tasks;
    a wait without ``stalls`` leaves that to its caller."""
    from dtrain.deploy.p2p import Broken
    from dtrain.deploy.workers import Stalled
    lost = client.submit(_plus_one, 1, workers=["tcp://127.0.0.1:9"], allow_other_workers=False,
                         pure=False)
    end = client.submit(_plus_one, lost, pure=False)
    began = time.monotonic()
    with pytest.raises(Stalled, match=r"waited 2 s with none of them running \(.*no-worker"):
        gather(client, [end], timeout=2, stalls=True)
    assert 2 <= time.monotonic() - began < 15 and issubclass(Stalled, Broken)
    client.cancel([end, lost])


@pytest.mark.slow
def test_values_lost_with_the_last_worker_while_fetched_end_in_one_line(tmp_path):
    """The futures are done, then the only worker dies while their values are being fetched
    (stopped first, so the fetch is under way when it dies): the data is gone and would be
    made again by a worker that never comes; the wait ends after ``timeout`` with the
    one-line error, as when the workers leave before the futures are done."""
    import numpy as np
    from distributed import wait
    with LocalCluster(n_workers=0, dashboard_address=None) as lc, Client(lc) as c:
        worker = _spawn("dask_worker", lc.scheduler_address, "--no-nanny", "--nthreads", "1")
        try:
            c.wait_for_workers(1, timeout=30)
            done = c.submit(np.arange, 100_000, pure=False)
            wait(done)
            os.kill(worker.pid, signal.SIGSTOP)
            threading.Timer(1.0, os.kill, (worker.pid, signal.SIGKILL)).start()
            got: list[BaseException] = []
            began = time.monotonic()

            def fetch() -> None:
                try:
                    gather(c, [done], timeout=2)
                except BaseException as exc:
                    got.append(exc)

            waiting = threading.Thread(target=fetch, daemon=True)
            waiting.start()
            waiting.join(60)
            assert not waiting.is_alive(), "gather waits for ever for values no worker holds"
            assert isinstance(got[0], UserError) and "every Dask worker left" in str(got[0])
            assert time.monotonic() - began < 30
        finally:
            worker.kill()
            worker.wait(10)


@pytest.mark.slow
def test_external_cluster_loses_a_worker_and_gains_one(client, tmp_path):
    """`dask scheduler` + `dask worker` processes without nannies: one worker is SIGKILLed
    for good; the run goes on with the other; a worker that joins later takes shards."""
    reference = _reference(tmp_path, client)
    sched_file = tmp_path / "scheduler.json"
    procs = [_spawn("dask_scheduler", "--scheduler-file", str(sched_file), "--port", "0",
                    "--dashboard-address", ":0")]
    try:
        for _ in range(200):
            if sched_file.exists():
                break
            time.sleep(0.05)
        address = json.loads(sched_file.read_text())["address"]
        workers = {name: _spawn("dask_worker", address, "--no-nanny", "--nthreads", "1",
                                "--name", name) for name in ("a", "b")}
        procs += workers.values()
        joined: list[subprocess.Popen] = []

        def echo(line: str) -> None:
            if line.startswith("epoch  3/"):
                workers["a"].send_signal(signal.SIGKILL)     # "a" holds shard 0: the root
            if line.startswith("epoch  6/"):
                joined.append(_spawn("dask_worker", address, "--no-nanny", "--nthreads", "1",
                                     "--name", "c"))
                # the driver waits for it here (the window in flight runs on): a fast run
                # could end before a worker process starts
                c.wait_for_workers(2, timeout=30)

        cfg = dtrain.load_config(None, LONG + [f"cluster.scheduler_address={address}"])
        with Client(address) as c:
            c.wait_for_workers(2, timeout=30)
            with get_task_stream(client=c) as ts:
                result = dtrain.train(cfg, client=c, out=tmp_path / "ext", echo=echo)
            names = {addr: info["name"] for addr, info in worker_info(c).items()}
        procs += joined
        ran_on_c = [t for t in ts.data if names.get(t["worker"]) == "c"       # a window's
                    and t["key"].startswith(("forward-backward-", "window-"))]   # task
        assert workers["a"].wait(5) == -signal.SIGKILL
        assert ran_on_c, "the worker that joined mid-run was never used"
        assert result.summary["workers"] == 2
        assert (tmp_path / "ext" / "params.npz").read_bytes() == reference
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
