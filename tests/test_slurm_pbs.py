"""Batch systems (SLURM and PBS): the jobqueue route's worker job scripts, and the mpirun-form
scripts."""
from __future__ import annotations

import gc
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from distributed import Client

import dtrain
from conftest import REPO, run_cli
from dtrain.core.config import ClusterConfig
from dtrain.core.errors import UserError
from dtrain.deploy import jobqueue
from dtrain.deploy.options import security_for
from helpers import mpirun
from helpers.sockets import family, listening, outside_loopback

pytest.importorskip("dask_jobqueue", reason="pip install -e '.[jobqueue]'")


@pytest.fixture
def site(tmp_path) -> Path:
    """The shipped jobqueue.yaml, with the TLS key written under tmp_path instead of ~."""
    data = yaml.safe_load(jobqueue.DEFAULT_FILE.read_text())
    for section in data["jobqueue"].values():
        section["shared-temp-directory"] = str(tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _job_script(site: Path, kind: str, *sets: str) -> str:
    cfg = dtrain.load_config(None, [f"cluster.kind={kind}", f"cluster.jobqueue_file={site}",
                                    "cluster.dashboard_address=127.0.0.1:0", *sets]).cluster
    with jobqueue.settings(cfg), jobqueue.make_cluster(cfg, security_for(cfg)) as jobs:
        return jobs.job_script()


def test_slurm_worker_job_script(site):
    script = _job_script(site, "slurm", "cluster.threads_per_worker=2")
    for line in ("#SBATCH -J dtrain-worker", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=15G",
                 "#SBATCH -t 01:00:00",
                 "export MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=1073741824 "
                 "MALLOC_ARENA_MAX=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "
                 "MKL_NUM_THREADS=1"):     # before the site's own lines, which may override it
        assert line in script, line
    command = script.strip().splitlines()[-1]
    assert command.startswith(f"{sys.executable} -m distributed.cli.dask_worker tls://")
    assert "--nthreads 2 " in command and "--protocol tls://" in command
    assert "--nworkers" not in command                      # one worker per job


def test_pbs_worker_job_script(site):
    """The hybrid layout (default): one worker per job, a Dask thread per booked core."""
    script = _job_script(site, "pbs", "cluster.interface=lo")
    for line in ("#PBS -N dtrain-worker", "#PBS -l select=1:ncpus=8:mem=16GB",
                 "#PBS -l walltime=01:00:00", "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"):
        assert line in script, line
    command = script.strip().splitlines()[-1]
    assert "--nthreads 8 " in command and "--nworkers" not in command
    assert "--interface lo" in command
    assert re.search(r"dask_worker tls://127\.0\.0\.1:\d+ ", command), command


def test_flat_layout_jobs_run_a_worker_per_booked_core(site):
    command = _job_script(site, "slurm", "cluster.layout=flat").strip().splitlines()[-1]
    assert "--nthreads 1 " in command and "--nworkers 8 " in command


def test_a_worker_job_serves_http_on_loopback_only(site, tmp_path):
    """The PBS job script's worker command, run here beside its scheduler with
    ``cluster.interface = lo``: the worker's and the scheduler's HTTP servers (Dask's worker
    dashboard would take every interface) listen on 127.0.0.1, like everything else."""
    cfg = dtrain.load_config(None, ["cluster.kind=pbs", f"cluster.jobqueue_file={site}",
                                    "cluster.interface=lo", "cluster.dashboard_address="]).cluster
    security = security_for(cfg)
    with jobqueue.settings(cfg), jobqueue.make_cluster(cfg, security) as jobs, \
            Client(jobs, security=security) as client:
        command = jobs.job_script().strip().splitlines()[-1]
        assert "--no-dashboard --dashboard-address 127.0.0.1:0" in command, command
        worker = subprocess.Popen(shlex.split(command.replace("$TMPDIR", str(tmp_path))),
                                  cwd=tmp_path, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            client.wait_for_workers(1, timeout=60)
            found = listening(family(worker.pid))
            http = jobs.scheduler.http_server.port
            scheduler_http = {ip for _, ip, port in listening([psutil.Process()]) if port == http}
        finally:
            worker.terminate()
            worker.wait(30)
    assert len({pid for pid, _, _ in found}) == 2 and len(found) >= 3, found   # nanny, worker
    assert outside_loopback(found) == [] and scheduler_http == {"127.0.0.1"}, found


def test_worker_jobs_get_the_per_run_key_privately_and_briefly(site, tmp_path):
    """The key is written for the jobs mode 0600 in the shared directory, and removed with
    the cluster."""
    cfg = dtrain.load_config(None, ["cluster.kind=slurm", f"cluster.jobqueue_file={site}",
                                    "cluster.dashboard_address=127.0.0.1:0"]).cluster
    with jobqueue.settings(cfg), jobqueue.make_cluster(cfg, security_for(cfg)) as jobs:
        key = Path(re.search(r"--tls-key (\S+)", jobs.job_script()).group(1))
        assert key.parent == tmp_path / "shared"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and "PRIVATE KEY" in key.read_text()
    del jobs
    gc.collect()
    assert not key.exists() and list(key.parent.iterdir()) == []


def test_no_tls_means_no_certificate_options(site):
    command = _job_script(site, "slurm", "cluster.tls=off").strip().splitlines()[-1]
    assert "--tls" not in command and "tcp://" in command


def test_a_site_file_without_the_section_is_one_clear_error(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("jobqueue:\n  slurm: {}\n")
    cfg = dtrain.load_config(None, ["cluster.kind=pbs", f"cluster.jobqueue_file={path}"]).cluster
    with pytest.raises(UserError, match=r"has no 'jobqueue: pbs:' table"):
        with jobqueue.settings(cfg):
            pass
    missing = ClusterConfig(kind="slurm", jobqueue_file=str(tmp_path / "nope.yaml"))
    with pytest.raises(UserError, match=r"jobqueue file .*nope.yaml not found"):
        with jobqueue.settings(missing):
            pass


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="sbatch is installed here")
def test_cluster_slurm_without_sbatch_is_one_line(tmp_path):
    proc = run_cli("--cluster", "slurm", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "dtrain: error: --cluster slurm submits worker jobs with sbatch, which is not on PATH; "
        "run dtrain on a SLURM login node, or use mpirun inside an allocation "
        "(jobqueue/slurm.sh)"]


# --- the mpirun-form batch scripts ----------------------------------------------------------

def _directives(script: str, prefix: str) -> list[str]:
    return [line.removeprefix(prefix).strip() for line in script.splitlines()
            if line.startswith(prefix)]


def test_slurm_script_asks_for_one_rank_per_node_plus_the_head():
    sbatch = dict(d.lstrip("-").split("=", 1) for d in
                  _directives((REPO / "jobqueue" / "slurm.sh").read_text(), "#SBATCH")
                  if "=" in d)
    assert int(sbatch["ntasks"]) == int(sbatch["nodes"]) + 1 and "time" in sbatch


def test_pbs_script_asks_for_one_rank_per_node_plus_the_head():
    (select,) = [d for d in _directives((REPO / "jobqueue" / "pbs.sh").read_text(), "#PBS")
                 if "select=" in d]
    nodes = ranks = 0
    for chunk in select.split("select=", 1)[1].split("+"):      # N:ncpus=..:mpiprocs=..
        count, *resources = chunk.split(":")
        nodes += int(count)
        ranks += int(count) * int(dict(r.split("=") for r in resources)["mpiprocs"])
    assert ranks == nodes + 1


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("system", ["slurm", "pbs"])
def test_batch_script_runs_the_mpirun_form(tmp_path, system):
    """The script as the batch system would run it (its variables set by hand), on this node."""
    exe, env = mpirun.launcher()
    out = tmp_path / "run"
    args = f"--set train.epochs=2 --out {out} --dashboard-address 127.0.0.1:0"
    nodefile = tmp_path / "nodes"
    nodefile.write_text("localhost\n" * 3)
    env = {**os.environ, **env, "DTRAIN_VENV": str(Path(sys.executable).parent.parent),
           "DTRAIN_MPIEXEC": " ".join(exe), "SLURM_NTASKS": "3", "SLURM_CPUS_ON_NODE": "1",
           "PBS_NODEFILE": str(nodefile), "NCPUS": "1", "DTRAIN_ARGS": args}
    script = [str(REPO / "jobqueue" / f"{system}.sh")] + (args.split() if system == "slurm"
                                                          else [])
    proc = subprocess.run(["bash", *script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 worker rank(s)" in proc.stdout and (out / "summary.json").exists()


# --- against a real SLURM (.ci/slurm.sh starts a single-node one; skipped without) ------------

def _wait_for_job(job_id: str, timeout: float = 180) -> str:
    """Poll until the job leaves the queue; its final state.  A requeued job waits for a
    begin time SLURM sets about two minutes ahead; the test moves it, once, to 3 s from now,
    as an admin's `scontrol update` would, rather than wait (not to now: a batch job started
    within the second of its requeue is killed, "Job credential revoked")."""
    deadline, nudged = time.monotonic() + timeout, False
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                              text=True).stdout
        state = re.search(r"JobState=(\w+)", info)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state.group(1)
        if state and state.group(1) == "PENDING" and "Reason=BeginTime" in info and not nudged:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now+3"],
                           capture_output=True)
            nudged = True
        elif state and state.group(1) == "RUNNING":
            nudged = False                      # a later requeue gets its own nudge
        time.sleep(0.5)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"SLURM job {job_id} did not finish in {timeout} s")


@pytest.mark.slow
@pytest.mark.mpi
def test_sbatch_runs_the_mpirun_form(slurm, client, tmp_path):
    """jobqueue/slurm.sh submitted for real (one node, 3 tasks): same params as LocalCluster."""
    exe, _ = mpirun.launcher()
    out = tmp_path / "run"
    submit = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=3", f"--output={tmp_path}/job.log",
         f"--export=ALL,DTRAIN_VENV={Path(sys.executable).parent.parent},"
         f"DTRAIN_MPIEXEC={' '.join(exe)}",
         str(REPO / "jobqueue" / "slurm.sh"), "--set", "train.epochs=2", "--out", str(out),
         "--dashboard-address", "127.0.0.1:0"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    state = _wait_for_job(submit.stdout.strip().split(";")[0])
    log = (tmp_path / "job.log").read_text()
    assert state == "COMPLETED", log
    assert "2 worker rank(s)" in log and "Traceback" not in log
    local = dtrain.train(dtrain.load_config(None, ["train.epochs=2"]), client=client,
                         out=tmp_path / "local", echo=None)
    assert (out / "params.npz").read_bytes() == (tmp_path / "local" / "params.npz").read_bytes()
    assert local.summary["workers"] == 2


@pytest.mark.slow
@pytest.mark.mpi
def test_sbatch_requeues_at_its_walltime_signal_and_resumes_to_the_same_bytes(slurm, client,
                                                                               tmp_path):
    """The walltime warning (--signal=B:USR1@120, sent here at once with scancel, as SLURM
    sends it): dtrain checkpoints and exits 75, the script requeues the job, the requeued
    job resumes the same run directory, and the result is an uninterrupted run's."""
    exe, _ = mpirun.launcher()
    out = tmp_path / "run"
    # windows of 100 steps: an edge to stop at soon after the signal (by default the last
    # window of this 2,100-step run would be 1,600 steps, and the run would just finish)
    sets = ["--set", "train.epochs=300", "--set", "graph.window=100"]
    submit = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=3", f"--output={tmp_path}/job.log",
         f"--export=ALL,DTRAIN_VENV={Path(sys.executable).parent.parent},"
         f"DTRAIN_MPIEXEC={' '.join(exe)}",
         str(REPO / "jobqueue" / "slurm.sh"), *sets, "--out", str(out),
         "--dashboard-address", "127.0.0.1:0"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    job = submit.stdout.strip().split(";")[0]
    log = tmp_path / "job.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count("\nepoch") >= 5):
        assert time.monotonic() < deadline, "the job did not start training"
        time.sleep(0.2)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    state = _wait_for_job(job, timeout=300)
    text = log.read_text()
    assert state == "COMPLETED", text
    assert "dtrain: stopped by SIGUSR1 after step" in text and "requeueing job" in text
    assert f"resuming {out}" in text and "Traceback" not in text
    dtrain.train(dtrain.load_config(None, ["train.epochs=300"]), client=client,
                 out=tmp_path / "local", echo=None)
    assert (out / "params.npz").read_bytes() == (tmp_path / "local" / "params.npz").read_bytes()


@pytest.mark.slow
def test_cluster_slurm_trains_on_worker_jobs(slurm, client, site, tmp_path):
    """python -m dtrain --cluster slurm: two worker jobs over TLS, cancelled at the end, and the
    LocalCluster's params."""
    data = yaml.safe_load(site.read_text())
    data["jobqueue"]["slurm"].update({"memory": "1GB", "job-cpu": 1, "walltime": "00:10:00",
                                      "local-directory": str(tmp_path),
                                      "log-directory": str(tmp_path / "logs")})
    site.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    proc = run_cli("--cluster", "slurm", "--workers", "2", "--set", f"cluster.jobqueue_file={site}",
                   "--set", "cluster.timeout=120", "--set", "train.epochs=2", "--out", str(out),
                   "--dashboard-address", "127.0.0.1:0", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dashboard: http://127.0.0.1:" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2
    dtrain.train(dtrain.load_config(None, ["train.epochs=2"]), client=client,
                 out=tmp_path / "local", echo=None)
    assert (out / "params.npz").read_bytes() == (tmp_path / "local" / "params.npz").read_bytes()
    logs = sorted((tmp_path / "logs").glob("*.err"))
    assert len(logs) == 2 and all("Start worker at:      tls://" in p.read_text() for p in logs)
    assert list((tmp_path / "shared").iterdir()) == []          # the key is gone
    jobs = {p.stem for p in logs}                               # dtrain-worker-<job id>
    deadline = time.monotonic() + 30                            # and so are the jobs
    while _queued() & jobs and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _queued() & jobs


def _queued() -> set[str]:
    return set(subprocess.run(["squeue", "-h", "-o", "%j-%i"], capture_output=True,
                              text=True).stdout.split())
