"""Every script in examples/ run as a user runs it (fewer epochs where it takes an argument for
them), and its output checked against what docs/examples.md shows: a stale example or a stale
page fails here.  Runs are seeded and dtrain's results do not depend on the workers, so the
lines the page shows are the lines a run prints."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from dtrain.core.arrays import gpu_count
from helpers import mpirun

EXAMPLES = REPO / "examples"
PAGE = REPO / "docs" / "examples.md"


def _run(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    runner = [sys.executable] if name.endswith(".py") else ["bash"]
    proc = subprocess.run([*runner, str(EXAMPLES / name), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _shown(name: str) -> list[str]:
    """The output docs/examples.md shows for ``$ python examples/NAME``."""
    block = re.search(rf"```\n\$ python examples/{re.escape(name)}[^\n]*\n(.*?)```",
                      PAGE.read_text(), re.S)
    assert block, f"docs/examples.md shows no output of {name}"
    return block.group(1).splitlines()


@pytest.mark.slow
def test_pipeline_gridsearch(tmp_path):
    """13 fits on one shared embedded cluster; the page's table of scores is this run's."""
    lines = _run("pipeline_gridsearch.py", cwd=tmp_path).stdout.splitlines()
    assert lines == _shown("pipeline_gridsearch.py")
    assert len([line for line in lines if line.startswith("0.")]) == 4      # the candidates


@pytest.mark.slow
def test_dataframe_parquet(tmp_path):
    lines = _run("dataframe_parquet.py", cwd=tmp_path).stdout.splitlines()
    assert lines == _shown("dataframe_parquet.py")
    assert len(list((tmp_path / "digits-parquet").glob("*.parquet"))) == 4


@pytest.mark.slow
def test_predict_and_export(tmp_path):
    pytest.importorskip("onnx", reason="pip install -e '.[onnx]'")
    lines = _run("predict_and_export.py", cwd=tmp_path).stdout.splitlines()
    shown = _shown("predict_and_export.py")
    assert lines[:-1] == shown[:-1]
    # the export's agreement with dtrain: labels equal, probabilities within float32's rounding
    match = re.fullmatch(r"onnx: runs/iris-example/model.onnx, labels agree: True, largest "
                         r"probability difference (\S+)", lines[-1])
    assert match and float(match.group(1)) < 1e-5, lines[-1]
    assert (tmp_path / "runs" / "iris-example" / "model.onnx").stat().st_size > 0


@pytest.mark.slow
def test_mnist_cnn(tmp_path, mnist_dir):
    """LeNet-5 for 2 epochs (the page shows that run): its lines are the page's, and the
    ONNX export's probabilities are within 1e-4 of dtrain's."""
    pytest.importorskip("onnxruntime", reason="pip install -e '.[onnx]'")
    lines = _run("mnist_cnn.py", str(mnist_dir), "2", cwd=tmp_path).stdout.splitlines()
    shown = _shown("mnist_cnn.py")
    assert lines[:-1] == shown[:-1]
    match = re.fullmatch(r"onnx: runs/mnist-cnn-example/model.onnx, labels agree: True, "
                         r"largest probability difference (\S+)", lines[-1])
    assert match and float(match.group(1)) <= 1e-4, lines[-1]


@pytest.mark.slow
def test_cpu_and_gpu(tmp_path):
    lines = _run("cpu_and_gpu.py", cwd=tmp_path).stdout.splitlines()
    if gpu_count():
        assert "GPU(s) here" in lines[0] and "'device': 'gpu'" in "\n".join(lines)
    else:                                       # says so, and trains on the CPU alone
        assert lines == _shown("cpu_and_gpu.py")


# --- MPI and SLURM ---------------------------------------------------------------------------

def _mpi_env(tmp_path: Path) -> dict[str, str]:
    exe, env = mpirun.launcher()
    return {**env, "EPOCHS": "1", "OUT": str(tmp_path / "run"), "PYTHON": sys.executable,
            "MPIEXEC": " ".join(exe), "DTRAIN_VENV": str(Path(sys.executable).parent.parent),
            "DTRAIN_MPIEXEC": " ".join(exe)}


def _finished(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.8 and summary["epochs"] == 1
    return summary


@pytest.mark.slow
@pytest.mark.mpi
def test_mnist_mpiexec(tmp_path, mnist_dir):
    proc = _run("mnist_mpiexec.sh", str(mnist_dir), cwd=tmp_path, env=_mpi_env(tmp_path))
    assert "1 worker rank(s)" in proc.stdout.splitlines()[0] and "Traceback" not in proc.stderr
    _finished(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.mpi
def test_slurm_mnist_as_the_batch_system_runs_it(tmp_path, mnist_dir):
    """The batch script on this node, with the variables SLURM would set (3 tasks)."""
    env = {**_mpi_env(tmp_path), "SLURM_NTASKS": "3", "SLURM_JOB_ID": "1234",
           "SLURM_SUBMIT_DIR": str(REPO)}
    proc = _run("slurm_mnist.sh", str(mnist_dir), cwd=tmp_path, env=env)
    assert "2 worker rank(s)" in proc.stdout.splitlines()[0]
    _finished(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.mpi
def test_slurm_mnist_submitted_with_sbatch(slurm, tmp_path, mnist_dir):
    """sbatch for real on one node (3 tasks): the job completes and trains."""
    env = _mpi_env(tmp_path)
    exports = ",".join(f"{k}={env[k]}" for k in ("EPOCHS", "OUT", "DTRAIN_VENV",
                                                  "DTRAIN_MPIEXEC"))
    submit = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=3", f"--output={tmp_path}/job.log",
         f"--export=ALL,{exports}", str(EXAMPLES / "slurm_mnist.sh"), str(mnist_dir)],
        cwd=REPO, capture_output=True, text=True, check=True)
    job = submit.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 240
    state = ""
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "show", "job", job], capture_output=True,
                              text=True).stdout
        found = re.search(r"JobState=(\w+)", info)
        state = found.group(1) if found else ""
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job])
    log = (tmp_path / "job.log").read_text() if (tmp_path / "job.log").exists() else ""
    assert state == "COMPLETED", log
    assert "2 worker rank(s)" in log and "Traceback" not in log
    _finished(tmp_path / "run")
