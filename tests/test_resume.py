"""A run's checkpoints and resumes: the whole job killed and resumed, resumes refused,
checkpoints written atomically, a diverging run stopped at its last good checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import dtrain
from dtrain.training import checkpoint
from dtrain.training.plan import plan
from conftest import REPO, run_cli
from helpers.faults import LONG, reference as _reference


@pytest.mark.slow
def test_resume_after_the_whole_job_is_killed(client, tmp_path):
    """SIGKILL the driver and its workers (as a batch system would), then --resume: the final
    params.npz is byte-for-byte that of an uninterrupted run."""
    reference = _reference(tmp_path, client)
    out = tmp_path / "run"
    args = [a for kv in LONG for a in ("--set", kv)]
    job = subprocess.Popen([sys.executable, "-m", "dtrain", *args, "--out", str(out),
                            "--dashboard-address", ""], cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            saved = checkpoint.load(out) if (out / checkpoint.FILE).exists() else None
            if saved and saved[0].epochs_done >= 4:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint after epoch 4 within 120 s")
    finally:
        os.killpg(job.pid, signal.SIGKILL)                   # driver, nannies, workers
        job.wait(10)
    assert not (out / "summary.json").exists()
    step = checkpoint.load(out)[0].step
    proc = run_cli("--resume", str(out), "--set", "cluster.dashboard_address=''", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"resuming {out} at step {step}" in proc.stdout
    assert (out / "params.npz").read_bytes() == reference
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == list(range(1, 13))
    final = checkpoint.load(out)[0]               # kept, to go on from: the last step's state
    assert final.epochs_done == 12 and final.step == 12 * rows[-1]["steps"]


@pytest.mark.slow
def test_resume_refuses_finished_runs_and_changed_configs(tmp_path):
    out = tmp_path / "run"
    assert run_cli("--set", "train.epochs=2", "--set", "graph.strategy=serial",
                   "--out", str(out)).returncode == 0
    proc = run_cli("--resume", str(out))
    assert proc.returncode == 2 and "already finished" in proc.stderr
    (out / "summary.json").unlink()
    proc = run_cli("--resume", str(out), "--set", "optim.lr=0.5")
    assert proc.returncode == 2
    assert "changed config (optim.lr: 0.1 -> 0.5)" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = run_cli("--resume", str(out), "--set", "train.epochs=1")
    assert proc.returncode == 2 and "epochs can only be added" in proc.stderr
    proc = run_cli("--resume", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "no config.toml" in proc.stderr


def test_checkpoints_are_written_atomically(tmp_path):
    """Every checkpoint on disk is complete: the writer renames a finished temporary file."""
    state = plan(dtrain.load_config()).initial_state()
    ckpt = checkpoint.Checkpoint(7, 1, state)
    cfg = dtrain.load_config()
    stop = threading.Event()
    seen: list[int] = []

    def reader():
        while not stop.is_set():
            if (tmp_path / checkpoint.FILE).exists():
                got, config = checkpoint.load(tmp_path)
                seen.append(got.step)
                assert (got.state.vector == state.vector).all()

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(200):
        checkpoint.save(tmp_path, ckpt, cfg)
    stop.set()
    t.join()
    assert seen and set(seen) == {7}
    assert not list(tmp_path.glob(".*.tmp"))


def test_divergence_stops_at_the_step_and_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("--set", "optim.lr=1e3", "--set", "model.activation=relu",
                   "--set", "model.dtype=float32", "--set", "graph.window=3",
                   "--set", "train.max_loss=1e300",       # let it run on until the loss is inf
                   "--out", str(out), "--dashboard-address", "")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("dtrain: error: training diverged at step 7 (epoch 2): the loss is inf")
    assert f"the last good checkpoint (step 6) is kept in {out / checkpoint.FILE}" in line
    assert checkpoint.load(out)[0].step == 6
    assert not (out / "summary.json").exists() and not (out / "params.npz").exists()
