"""The command line as a user meets it: exit codes, one-line errors, run directories."""
from __future__ import annotations

import json

from conftest import run_cli


def test_train_writes_a_run_directory(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("--set", "train.epochs=3", "--workers", "2", "--out", str(out),
                   "--dashboard-address", "127.0.0.1:0")
    assert proc.returncode == 0, proc.stderr
    assert "epoch 3/3" in proc.stdout and "test_accuracy" in proc.stdout
    assert f"run directory: {out}" in proc.stdout
    assert json.loads((out / "summary.json").read_text())["epochs"] == 3
    assert "Traceback" not in proc.stderr


def test_default_run_directory_is_under_runs(tmp_path):
    proc = run_cli("--set", "train.epochs=1", "--set", "graph.strategy=serial", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-iris") and (run / "summary.json").exists()
