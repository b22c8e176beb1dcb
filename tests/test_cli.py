"""The command line as a user meets it: exit codes, one-line errors, run directories."""
from __future__ import annotations

import json

import pytest

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


BAD = [
    (["--set", "data.colour=red"], "unknown key 'data.colour'"),
    (["--set", "train.epochs=many"], "train.epochs = 'many'"),
    (["--set", "optim.lr=-1"], "optim.lr = -1.0"),
    (["--set", "train.batch_size=0"], "train.batch_size = 0"),
    (["--set", "model.activation=gelu"], "model.activation = 'gelu'"),
    (["--set", "model.loss=hinge"], "model.loss = 'hinge'"),
    (["--set", "graph.strategy=ring"], "graph.strategy = 'ring'"),
    (["--set", "model.layers=[5, 8, 3]"], "model.layers[0] = 5 but iris has 4 input features"),
    (["--set", "model.layers=[4, 8, 2]"], "model.layers[-1] = 2 but iris has 3 classes"),
    (["--set", "data.shards=500"], "data.shards = 500 but there are only 105 training samples"),
    (["--config", "nope.toml"], "config file nope.toml not found"),
    (["--workers", "0"], "--workers 0"),
    (["--set", "data.dataset=mnist", "--set", "data.path=/nonexistent/mnist",
      "--set", "model.layers=[784, 10]"], "MNIST directory /nonexistent/mnist not found"),
    (["--set", "graph.strategy=parameter-server", "--workers", "1"], "needs 2 workers"),
    (["--scheduler-address", "tcp://127.0.0.1:1", "--set", "cluster.timeout=2"],
     "cannot reach the Dask scheduler at tcp://127.0.0.1:1 within 2 s"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[m.split(" ")[0] for _, m in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    out = tmp_path / "run"
    proc = run_cli(*args, "--out", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dtrain: error: ") and message in lines[0], lines[0]
    assert not (out / "summary.json").exists() and not (out / "params.npz").exists()
