"""Batch systems: the jobqueue route's worker job scripts, and the mpirun-form scripts."""
from __future__ import annotations

import gc
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dtrain
import mpirun
from conftest import REPO, run_cli
from dtrain import batch, cluster
from dtrain.config import ClusterConfig
from dtrain.errors import UserError

pytest.importorskip("dask_jobqueue", reason="pip install -e '.[jobqueue]'")


@pytest.fixture
def site(tmp_path) -> Path:
    """The shipped jobqueue.yaml, with the TLS key written under tmp_path instead of ~."""
    data = yaml.safe_load(batch.DEFAULT_FILE.read_text())
    for section in data["jobqueue"].values():
        section["shared-temp-directory"] = str(tmp_path / "shared")
    (tmp_path / "shared").mkdir()
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _job_script(site: Path, kind: str, *sets: str) -> str:
    cfg = dtrain.load_config(None, [f"cluster.kind={kind}", f"cluster.jobqueue_file={site}",
                                    "cluster.dashboard_address=127.0.0.1:0", *sets]).cluster
    with batch.settings(cfg), batch.make_cluster(cfg, cluster.security_for(cfg, True)) as jobs:
        return jobs.job_script()


def test_slurm_worker_job_script(site):
    script = _job_script(site, "slurm", "cluster.threads_per_worker=2")
    for line in ("#SBATCH -J dtrain-worker", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=15G",
                 "#SBATCH -t 01:00:00", "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"):
        assert line in script, line
    command = script.strip().splitlines()[-1]
    assert command.startswith(f"{sys.executable} -m distributed.cli.dask_worker tls://")
    assert "--nthreads 2 " in command and "--protocol tls://" in command


def test_pbs_worker_job_script(site):
    script = _job_script(site, "pbs", "cluster.interface=lo")
    for line in ("#PBS -N dtrain-worker", "#PBS -l select=1:ncpus=8:mem=16GB",
                 "#PBS -l walltime=01:00:00", "export OMP_NUM_THREADS=${NCPUS:-1}"):
        assert line in script, line
    command = script.strip().splitlines()[-1]
    assert "--nthreads 1 " in command and "--interface lo" in command
    assert re.search(r"dask_worker tls://127\.0\.0\.1:\d+ ", command), command


def test_worker_jobs_get_the_per_run_key_privately_and_briefly(site, tmp_path):
    """The key is written for the jobs mode 0600 in the shared directory, and removed with
    the cluster."""
    cfg = dtrain.load_config(None, ["cluster.kind=slurm", f"cluster.jobqueue_file={site}",
                                    "cluster.dashboard_address=127.0.0.1:0"]).cluster
    with batch.settings(cfg), batch.make_cluster(cfg, cluster.security_for(cfg, True)) as jobs:
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
        with batch.settings(cfg):
            pass
    missing = ClusterConfig(kind="slurm", jobqueue_file=str(tmp_path / "nope.yaml"))
    with pytest.raises(UserError, match=r"jobqueue file .*nope.yaml not found"):
        with batch.settings(missing):
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
