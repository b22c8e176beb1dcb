"""Clusters dtrain did not start, launched for real.

``dask scheduler --scheduler-file`` with ``dask worker``, ``mpiexec -n N dask-mpi
--scheduler-file F`` and a script that calls ``dask_mpi.initialize()`` under ``mpiexec``
(the MPICH wheel's, as tests/helpers/mpirun.py finds it): dtrain trains on each, by the scheduler
file or by the ``scheduler-address`` that Dask's config holds, leaves the cluster running
(the scheduler file ones) without its plugins, and nothing hangs when the script fails."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client

from conftest import REPO
from helpers import mpirun

QUICK = ["--set", "train.epochs=2", "--set", "data.shards=2", "--dashboard-address", ""]
BIN = Path(sys.executable).parent


def _dtrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})})


def _wait_for(path: Path, workers: int, timeout: float = 60) -> Client:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
    client = Client(scheduler_file=str(path), timeout=timeout)
    client.wait_for_workers(workers, timeout=timeout)
    return client


def _no_dtrain_plugins(client: Client) -> None:
    on_scheduler = client.run_on_scheduler(
        lambda dask_scheduler: [n for n in dask_scheduler.plugins if "dtrain" in str(n)])
    on_workers = client.run(lambda dask_worker: [n for n in dask_worker.plugins
                                                 if "dtrain" in str(n)])
    assert on_scheduler == [] and all(v == [] for v in on_workers.values()), \
        (on_scheduler, on_workers)


@contextlib.contextmanager
def _processes(*commands: list[str], env: dict[str, str] | None = None
               ) -> Iterator[list[subprocess.Popen]]:
    procs = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **(env or {})}) for c in commands]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.mark.slow
def test_dask_scheduler_file_and_dask_scheduler_address(tmp_path):
    """`dask scheduler --scheduler-file` and `dask worker`, as a user starts them: dtrain by
    the file, then by DASK_SCHEDULER_ADDRESS; the cluster keeps running, plugins gone."""
    path = tmp_path / "scheduler.json"
    with _processes([str(BIN / "dask"), "scheduler", "--scheduler-file", str(path),
                     "--no-dashboard", "--port", "0"],
                    [str(BIN / "dask"), "worker", "--scheduler-file", str(path), "--nthreads",
                     "1", "--no-dashboard"]):
        with _wait_for(path, 1) as client:
            done = _dtrain("--scheduler-file", str(path), *QUICK, "--out", str(tmp_path / "a"))
            assert done.returncode == 0, done.stderr
            assert f"scheduler: the scheduler of {path}" in done.stdout
            by_env = _dtrain(*QUICK, "--out", str(tmp_path / "b"),
                             env={"DASK_SCHEDULER_ADDRESS": client.scheduler.address})
            assert by_env.returncode == 0, by_env.stderr
            assert f"scheduler: {client.scheduler.address} (Dask's scheduler-address " \
                   f"config)" in by_env.stdout
            for run in "ab":
                summary = json.loads((tmp_path / run / "summary.json").read_text())
                assert summary["workers"] == 1
            assert len(client.scheduler_info()["workers"]) == 1      # still up
            _no_dtrain_plugins(client)
            client.shutdown()


@pytest.mark.mpi
@pytest.mark.slow
def test_a_dask_mpi_cluster_trains_by_its_scheduler_file(tmp_path):
    """`mpiexec -n 3 dask-mpi --scheduler-file F`: rank 0 the scheduler, ranks 1-2 workers;
    `python -m dtrain --scheduler-file F` trains on both, and the job ends when shut down."""
    path = tmp_path / "scheduler.json"
    exe, env = mpirun.launcher()
    with _processes([*exe, "-n", "3", str(BIN / "dask-mpi"), "--scheduler-file", str(path),
                     "--no-dashboard", "--nthreads", "1"], env=env) as (job,):
        with _wait_for(path, 2) as client:
            done = _dtrain("--scheduler-file", str(path), *QUICK, "--out", str(tmp_path / "run"))
            assert done.returncode == 0, done.stderr
            summary = json.loads((tmp_path / "run" / "summary.json").read_text())
            assert summary["workers"] == 2 and summary["test_accuracy"] > 0.3
            names = sorted(client.run(lambda dask_worker: str(dask_worker.name)).values())
            assert names == ["dask_mpi-1", "dask_mpi-2"]
            _no_dtrain_plugins(client)
            client.shutdown()
        assert job.wait(60) == 0, job.stderr.read()[-2000:]


SCRIPT = """\
import sys
from dask_mpi import initialize

initialize(dashboard=False)        # rank 0: scheduler; rank 1: this script; others: workers

import dtrain

cfg = dtrain.load_config(None, ["train.epochs=2", "data.shards=2",
                                "cluster.dashboard_address=", *sys.argv[2:]])
result = dtrain.train(cfg, out=sys.argv[1])
print("workers", result.summary["workers"])
"""


@pytest.mark.mpi
@pytest.mark.slow
def test_dask_mpi_initialize_in_a_script_trains_and_ends_even_on_an_error(tmp_path):
    """A script under `mpiexec -n 4` that calls dask_mpi.initialize(): dtrain.train(cfg) uses
    the scheduler-address it sets (two workers, not a LocalCluster's one); a script that
    fails ends every rank (dask-mpi closes the cluster at exit) instead of hanging."""
    script = tmp_path / "train_here.py"
    script.write_text(SCRIPT)
    exe, env = mpirun.launcher()
    run = subprocess.run([*exe, "-n", "4", sys.executable, str(script), str(tmp_path / "run")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180,
                         env=mpirun.environment())
    assert run.returncode == 0, run.stderr[-3000:]
    assert "workers 2" in run.stdout
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["workers"] == 2
    start = time.monotonic()
    failed = subprocess.run([*exe, "-n", "3", sys.executable, str(script), str(tmp_path / "x"),
                             "optim.lr=-1"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, env=mpirun.environment())
    assert failed.returncode != 0 and "optim.lr = -1.0" in failed.stderr
    assert time.monotonic() - start < 60
