"""``mpirun -n N python -m dtrain --scheduler-rank 0``, launched for real with mpiexec."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from distributed import Client, Security

import dtrain
from conftest import REPO
from dtrain.core import internals
from dtrain.deploy import layout, mpi
from dtrain.training import checkpoint
from helpers import mpirun
from helpers.sockets import family, listening, outside_loopback

pytestmark = pytest.mark.mpi

QUICK = ["train.epochs=4", "optim.name=momentum", "data.shards=5", "graph.fan_in=2"]
QUIET = ["--dashboard-address", "127.0.0.1:0"]     # 8787 may be taken on a shared machine
FAULT = REPO / "tests" / "helpers" / "mpi_fault.py"


def _log_noise(stderr: str) -> list[str]:
    """stderr lines, less distributed's warning that a loaded machine stalled an event loop."""
    return [line for line in stderr.splitlines() if "Event loop was unresponsive" not in line]


def _sets(sets: list[str]) -> list[str]:
    return [arg for s in sets for arg in ("--set", s)]


CORES = min(layout.machine_cores(), 5)        # a hybrid worker's threads here: cores, <= shards


SLOW = pytest.mark.slow


@pytest.mark.parametrize("ranks, extra, workers, threads", [
    pytest.param(3, [], 1, CORES, id="3-ranks-hybrid"),
    pytest.param(3, ["cluster.layout=flat", "cluster.p2p=tcp"], 2, 1,
                 id="3-ranks-flat-tls-worker-to-worker", marks=SLOW),
    pytest.param(4, ["cluster.tls=off", "cluster.layout=flat"], 3, 1,
                 id="4-ranks-flat-no-tls", marks=SLOW),
    pytest.param(3, ["cluster.layout=flat", "cluster.threads_per_worker=2"], 2, 2,
                 id="3-ranks-2x2", marks=SLOW),
    pytest.param(4, ["cluster.layout=flat", "cluster.p2p=mpi", "model.layers=[4, 4096, 3]"],
                 3, 1, id="4-ranks-flat-over-mpi", marks=SLOW),
    pytest.param(3, ["graph.strategy=parameter-server"], 2,
                 max(1, layout.machine_cores() // 2), id="3-ranks-parameter-server",
                 marks=SLOW)])
def test_mpi_run_equals_the_localcluster_run(client, tmp_path, ranks, extra, workers, threads):
    """Same config and shards: params.npz byte for byte equal to a LocalCluster run of 2
    processes x 1 thread, for MPI's workers x threads (hybrid: the first worker rank of the
    node serves with its cores, the other waits; flat: every worker rank serves; a
    parameter server needs two workers, so two ranks serve); a clean log."""
    job = mpirun.run(ranks, *_sets(QUICK + extra), "--out", str(tmp_path / "mpi"), *QUIET)
    assert job.returncode == 0, job.stdout + job.stderr
    assert _log_noise(job.stderr) == [], job.stderr          # no tracebacks, no shutdown noise
    here = [e for e in extra if e != "cluster.p2p=mpi"]      # (no MPI on a LocalCluster)
    local = dtrain.train(dtrain.load_config(None, QUICK + here), client=client,
                         out=tmp_path / "local", echo=None)
    assert (tmp_path / "mpi" / "params.npz").read_bytes() == \
        (tmp_path / "local" / "params.npz").read_bytes()
    summary = json.loads((tmp_path / "mpi" / "summary.json").read_text())
    assert (summary["workers"], summary["threads"]) == (workers, workers * threads)
    assert local.summary["workers"] == 2
    protocol = "tcp" if "cluster.tls=off" in extra else "tls"
    # a window on several workers: a task per worker, its sums worker to worker, over TLS
    # where the cluster has it (a Unix socket between the processes of one machine)
    assert (summary["spanned_windows"] > 0) == (workers > 1)
    if workers > 1:
        via = "mpi" if "cluster.p2p=mpi" in extra else \
            "unix" if "cluster.p2p=tcp" not in extra else protocol
        assert summary["worker_to_worker"] == [via], summary
    assert f"scheduler: {protocol}://" in job.stdout and f"{ranks - 1} worker rank(s)" in job.stdout
    said = [line for line in job.stdout.splitlines() if line.startswith("layout: ")]
    assert len(said) == 1 and f"{workers} Dask worker(s) on 1 node(s)" in said[0], said
    assert ("start no worker" in said[0]) == (workers < ranks - 1), said
    assert "dashboard: http://127.0.0.1:" in job.stdout and "epoch 4/4" in job.stdout


@SLOW
def test_flat_ranks_that_outnumber_their_cores_are_pinned_and_keep_the_bytes(client, tmp_path):
    """The job started on one core (its affinity, which mpiexec and the ranks inherit): the
    two flat worker ranks share it, pinned, and the head says so; the bytes are a
    LocalCluster run's."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity here")
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        job = mpirun.run(3, *_sets(QUICK + ["cluster.layout=flat"]), "--out",
                         str(tmp_path / "mpi"), *QUIET)
    finally:
        os.sched_setaffinity(0, before)
    assert job.returncode == 0, job.stdout + job.stderr
    said = [line for line in job.stdout.splitlines() if line.startswith("layout: ")]
    assert len(said) == 1 and said[0].endswith(
        "more worker ranks than cores: pinned 2 rank(s) to 1 core(s), neighbours together"), said
    local = dtrain.train(dtrain.load_config(None, QUICK + ["cluster.layout=flat"]),
                         client=client, out=tmp_path / "local", echo=None)
    assert local.summary["workers"] == 2
    assert (tmp_path / "mpi" / "params.npz").read_bytes() == \
        (tmp_path / "local" / "params.npz").read_bytes()


# Too few ranks, a GPU where there is none and resuming a finished run are rows of the
# bad-input table (test_bad_input.py); these are the MPI job's own plumbing.
BAD = [
    (3, ["--set", "optim.lr=-1"], "optim.lr = -1.0"),
    (3, ["--set", "data.dataset=mnist", "--set", "data.path=/nonexistent/mnist",
         "--set", "model.layers=[784, 10]"], "MNIST directory /nonexistent/mnist not found"),
    (3, ["--scheduler-rank", "3"], "--scheduler-rank 3: the head's rank must be one of this "
                                   "job's ranks, 0 to 2"),
    (3, ["--workers", "4"], "--workers does not apply with --scheduler-rank"),
    (3, ["--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("ranks, args, message", [
    pytest.param(*row, id=name, marks=SLOW) for row, name in
    zip(BAD, ["bad-config", "missing-data", "bad-head-rank", "workers-flag", "unknown-flag"])])
def test_bad_input_stops_every_rank_with_one_line(tmp_path, ranks, args, message):
    job = mpirun.run(ranks, *args, "--out", str(tmp_path / "run"), *QUIET, timeout=60)
    assert job.returncode == 2, job.stdout + job.stderr
    assert job.seconds < 30
    lines = job.stderr.strip().splitlines()
    assert len(lines) == 1, job.stderr                       # printed once, by the head
    assert lines[0].startswith("dtrain: error: ") and message in lines[0], lines[0]
    assert job.stdout == "" and not (tmp_path / "run").exists()


@pytest.mark.slow      # the fast tier: a user's error mid-run, the same way out
def test_a_driver_exception_ends_every_rank(tmp_path):
    out = tmp_path / "run"
    job = mpirun.run(3, *_sets(["train.epochs=200", "graph.window=7"]), "--out", str(out),
                     *QUIET, script=(str(FAULT), "driver-raises"))
    assert job.returncode != 0 and job.seconds < 30, job.stderr
    assert job.stderr.count("Traceback") == 1, job.stderr    # once, by the head
    assert job.stderr.count("RuntimeError: injected driver failure at epoch 2") == 1
    assert "epoch   1/200" in job.stdout and "epoch   3/200" not in job.stdout
    assert not (out / "summary.json").exists() and not mpirun.leftovers(str(out))


def test_a_user_error_mid_run_ends_every_rank_with_code_2(tmp_path):
    out = tmp_path / "run"
    job = mpirun.run(3, *_sets(["train.epochs=200", "graph.window=7"]), "--out", str(out),
                     *QUIET, script=(str(FAULT), "driver-user-error"))
    assert job.returncode == 2 and job.seconds < 30, job.stderr
    assert "dtrain: error: injected user error at epoch 2" in job.stderr.splitlines()
    assert "Traceback" not in job.stderr
    assert not (out / "summary.json").exists() and not mpirun.leftovers(str(out))


@pytest.mark.slow      # the fast tier: a worker lost on a LocalCluster (test_reliability)
@pytest.mark.parametrize("how", ["killed", "leaves"])
def test_a_lost_worker_rank_ends_the_job(client, tmp_path, how):
    """A worker rank killed mid-training: mpiexec ends the other ranks (MPI's own rule), and
    ``--resume`` under mpiexec finishes the run from its checkpoint with the bytes of an
    undisturbed LocalCluster run.  A worker that leaves while its process lives on: the head
    notices and aborts the job."""
    out = tmp_path / "run"
    # killed: long enough to be killed mid-run, short enough to resume and compare in seconds
    sets = ["train.epochs=60" if how == "killed" else "train.epochs=500", "graph.window=7",
            "cluster.tls=off", "cluster.layout=flat"]         # every worker rank a worker
    proc = subprocess.Popen(mpirun.command(3, *_sets(sets), "--out", str(out), *QUIET),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpirun.environment())
    try:
        for line in proc.stdout:
            if line.startswith("scheduler: "):
                address = line.split()[1]
            if line.startswith("epoch") and (how == "leaves" or (out / checkpoint.FILE).exists()):
                break
        if how == "killed":
            mpirun.rank_processes(proc.pid)[2].send_signal(signal.SIGKILL)
        else:
            with Client(address, timeout=10) as outsider:
                workers = internals.scheduler_workers(outsider)   # not a cached answer
                (leaver,) = [a for a, w in workers.items() if w["name"] == 2]
                with contextlib.suppress(OSError):   # the job may end before the reply
                    outsider.retire_workers([leaver], close_workers=True)
        lost = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - lost < 15
    finally:
        proc.kill()
    assert proc.returncode != 0
    if how == "leaves":
        assert "dtrain: error: MPI rank 2 (Dask worker tcp://" in err, err
    assert not (out / "summary.json").exists() and not mpirun.leftovers(str(out))
    if how == "leaves":
        return
    step = checkpoint.load(out)[0].step
    assert step > 0
    job = mpirun.run(3, "--resume", str(out), *QUIET, timeout=240)
    assert job.returncode == 0, job.stdout + job.stderr
    assert f"resuming {out} at step {step} of " in job.stdout, job.stdout
    assert _log_noise(job.stderr) == [], job.stderr
    dtrain.train(dtrain.load_config(None, sets), client=client, out=tmp_path / "local",
                 echo=None)
    assert (out / "params.npz").read_bytes() == (tmp_path / "local" / "params.npz").read_bytes()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 61))
    assert json.loads((out / "summary.json").read_text())["workers"] == 2
    assert not mpirun.leftovers(str(out))


def _paused_job(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """A 3-rank job that pauses at epoch 2 until the file ``resume`` appears."""
    out, resume = tmp_path / "run", tmp_path / "resume"
    proc = subprocess.Popen(mpirun.command(3, *_sets(["train.epochs=3", "graph.window=7"]),
                                           "--out", str(out), *QUIET,
                                           script=(str(FAULT), "pause")),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpirun.environment(DTRAIN_RESUME_FILE=str(resume)))
    return proc, out, resume


def _answers_http(host: str, port: int) -> bool:
    """Whether an HTTP server answers on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            return sock.recv(8).startswith(b"HTTP/")
    except OSError:                          # refused, closed, or no answer: a TLS port
        return False


@pytest.mark.slow
def test_tls_keeps_strangers_out(tmp_path):
    """While a run is paused at epoch 2, a plain client and a TLS client with another
    certificate cannot attach to its scheduler, and the dashboard answers on 127.0.0.1 only."""
    proc, out, resume = _paused_job(tmp_path)
    try:
        said = {}
        for line in proc.stdout:
            key, _, rest = line.partition(": ")
            said[key] = rest.split()[0] if rest else ""
            if line.startswith("epoch"):
                break
        address, dashboard = said["scheduler"], said["dashboard"]
        assert address.startswith("tls://"), address
        host_port = address.removeprefix("tls://")
        strangers = [("tcp://" + host_port, None),                 # plain
                     (address, Security.temporary())]                # another certificate
        for addr, security in strangers:
            with pytest.raises(OSError):      # CommClosedError / FatalCommClosedError
                Client(addr, security=security, timeout=5)
        assert urllib.request.urlopen(dashboard, timeout=10).status == 200
        host, port = host_port.rsplit(":", 1)
        outside = dashboard.replace("127.0.0.1", host)
        with pytest.raises(OSError):
            urllib.request.urlopen(outside, timeout=5)
        # what the ranks open to the network is TLS (and MPI's own): no HTTP server, the
        # worker ranks' /health and /metrics included
        ranks = mpirun.rank_processes(proc.pid).values()
        found = listening(p for rank in ranks for p in family(rank.pid))
        assert len(found) >= 4, found       # the scheduler, its HTTP server, a worker's two
        others = {item[2] for item in outside_loopback(found)} - {int(port)}
        assert [p for p in sorted(others) if _answers_http(host, p)] == [], found
        resume.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    # refused above; said once each at DEBUG, not as a warning on the job's console
    assert "TLS handshake failed" not in err and "SSL Error" not in err, err
    assert (out / "summary.json").exists()


@pytest.mark.slow
def test_a_rank_that_starts_no_worker_waits_as_long_as_the_run(tmp_path):
    """Hybrid layout: rank 2 shares rank 1's node and starts no worker; it waits for the exit
    code however long the run takes (here paused past the ranks' 10 s shutdown deadline)."""
    proc, out, resume = _paused_job(tmp_path)
    try:
        for line in proc.stdout:
            if line.startswith("layout: "):
                assert "rank(s) 2 start no worker" in line, line
            if line.startswith("epoch"):
                break
        time.sleep(mpi.SHUTDOWN_S + 2)
        resume.touch()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert _log_noise(err) == [] and (out / "summary.json").exists()


LOCAL_RANKS = """
from mpi4py import MPI
from dtrain.deploy import rankgpus
comm = MPI.COMM_WORLD
index = rankgpus.local_worker_index(comm, is_worker=comm.rank != 0)
row = [comm.rank, rankgpus.local_rank(), index, rankgpus.pin_gpu("gpu", index),
       rankgpus.pin_gpu("cpu", index)]
rows = comm.gather(row)
if comm.rank == 0:
    print(rows)
"""


def test_each_worker_rank_gets_its_own_gpu():
    """local ranks on one node; worker ranks take the GPUs listed in CUDA_VISIBLE_DEVICES in
    turn (the head takes none); device 'cpu' leaves them alone."""
    exe, _ = mpirun.launcher()
    proc = subprocess.run([*exe, "-n", "4", sys.executable, "-c", LOCAL_RANKS], text=True,
                          capture_output=True, timeout=60,
                          env=mpirun.environment(CUDA_VISIBLE_DEVICES="5,7"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([[0, 0, None, None, None], [1, 1, 0, "5", None],
                                       [2, 2, 1, "7", None], [3, 3, 2, "5", None]])


def test_only_comms_cut_by_the_jobs_close_are_silenced(caplog):
    """distributed logs a heartbeat cut short by the worker's own close, and a transfer whose
    asker went away, as errors with a traceback (seen at the end of mpirun jobs, and when a
    LocalCluster's driver is killed mid-gather); dtrain drops the heartbeat once the head
    has said the job is closing (or the worker is closing), and only then, and logs the
    transfer at DEBUG at any time."""
    import asyncio
    import logging

    from distributed import Scheduler, Worker

    from dtrain.deploy import logs

    log = logging.getLogger("distributed.worker")
    heartbeat = "Failed to communicate with scheduler during heartbeat."
    transfer = "failed during get data with %s -> %s"

    async def run() -> list[str]:
        async with Scheduler(port=0, dashboard=False) as scheduler:
            worker = await Worker(scheduler.address, nthreads=1)
            log.addFilter(noise := logs.CutByClose(worker))
            internals.add_worker_handler(worker, logs.CLOSING_OP, noise.mark_closing)
            try:
                log.error(heartbeat + " (running)")
                log.error(transfer + " (running)", "a", "b")
                await scheduler.broadcast(msg={"op": logs.CLOSING_OP})   # the head's word
                log.error(transfer + " (job closing)", "a", "b")
                log.error("Some other error (job closing)")
                await worker.close()
                log.error(heartbeat + " (closed)")
                log.error("Some other error (closed)")
            finally:
                log.removeFilter(noise)
        return [r.getMessage() for r in caplog.records if r.name == "distributed.worker"]

    with caplog.at_level(logging.ERROR, logger="distributed.worker"):
        messages = asyncio.run(run())
    assert messages == [heartbeat + " (running)", "Some other error (job closing)",
                        "Some other error (closed)"]
    with caplog.at_level(logging.DEBUG, logger="distributed.worker"):
        caplog.clear()
        asyncio.run(run())
        shown = [(r.levelname, r.getMessage()) for r in caplog.records
                 if r.name == "distributed.worker" and "get data" in r.getMessage()]
    assert shown == [("DEBUG", "failed during get data with a -> b (running)"),
                     ("DEBUG", "failed during get data with a -> b (job closing)")]
