"""Shared fixtures: a real LocalCluster of worker processes, the shared datasets, a SLURM to
submit to, the CLI."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DTRAIN_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def client():
    """Two worker processes, one thread each: the layout of a small real cluster."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def mnist_dir() -> Path:
    path = SHARED_DATA / "mnist"
    if not (path / "t10k-images-idx3-ubyte.gz").exists():
        pytest.skip(f"MNIST not found under {path}")
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="module")
def slurm() -> None:
    """A SLURM with an idle node to submit to (.ci/slurm.sh starts a single-node one), else the
    test is skipped."""
    if shutil.which("sbatch") is None:
        pytest.skip("no sbatch here (.ci/slurm.sh starts a single-node SLURM)")
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                                timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        states = ""
    if not re.search(r"idle|mixed", states):
        pytest.skip("no SLURM with an idle node here (.ci/slurm.sh starts one)")


def run_cli(*args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dtrain ARGS`` in a fresh process, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "dtrain", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
