"""Experiment tracking for real: runs logged to TensorBoard event files and an MLflow file
store, read back with each tool's own reader (TensorBoard's EventAccumulator, MLflow's
MlflowClient), resumed runs that continue the same MLflow run, missing packages."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

import dtrain
from conftest import REPO, run_cli
from dtrain.core.config import ConfigError
from dtrain.core.errors import Diverged, UserError
from dtrain.observe.tracking import METRICS, flat_config
from dtrain.training import checkpoint

DETERMINISTIC = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr")


def _tracked(tmp_path: Path, *more: str) -> list[str]:
    return ["track.tensorboard=true", "track.mlflow=true", "track.experiment=tests",
            f"track.mlflow_uri={tmp_path / 'mlruns'}", "cluster.dashboard_address=", *more]


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _mlflow(tmp_path: Path, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")     # MLflow 3 reading a file store
    return MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _events(logdir: Path) -> EventAccumulator:
    """Every event as written: no purging of steps that a later file repeats, so duplicates
    would show."""
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0},
                           purge_orphaned_data=False)
    acc.Reload()
    return acc


def _scalars(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_track_keys_are_checked_and_a_local_store_is_made_absolute(tmp_path, monkeypatch):
    track = dtrain.load_config().track
    assert (track.tensorboard, track.mlflow, track.experiment) == (False, False, "dtrain")
    monkeypatch.chdir(tmp_path)
    assert dtrain.load_config().track.mlflow_uri == (tmp_path / "mlruns").as_uri()
    assert dtrain.load_config(None, ["track.mlflow_uri=file:store"]).track.mlflow_uri == \
        (tmp_path / "store").as_uri()
    for uri in ("sqlite:///mlflow.db", "http://127.0.0.1:5000", "databricks"):
        assert dtrain.load_config(None, [f"track.mlflow_uri={uri}"]).track.mlflow_uri == uri
    with pytest.raises(ConfigError, match=r"unknown key 'track.wandb'.*tensorboard, mlflow"):
        dtrain.load_config(None, ["track.wandb=true"])
    with pytest.raises(ConfigError, match="track.mlflow = 'yes'.*expected true or false"):
        dtrain.load_config(None, ["track.mlflow=yes"])
    with pytest.raises(ConfigError, match="track.experiment = ' '.*a non-empty name"):
        dtrain.load_config(None, ['track.experiment=" "'])


def test_tracking_needs_a_run_directory():
    cfg = dtrain.load_config(None, ["track.tensorboard=true", "graph.strategy=serial"])
    with pytest.raises(UserError, match=r"track.tensorboard = true .*pass out=DIR"):
        dtrain.train(cfg, echo=None)


def test_with_tracking_off_neither_package_is_imported(tmp_path):
    code = textwrap.dedent(f"""
        import sys, dtrain
        cfg = dtrain.load_config(None, ["train.epochs=1", "graph.strategy=serial"])
        dtrain.train(cfg, out={str(tmp_path / 'run')!r}, echo=None)
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'tensorboard')))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == \
        ["checkpoint.npz", "config.toml", "metrics.jsonl", "model.json", "params.npz",
         "report.html", "summary.json"]


@pytest.mark.parametrize("package", [pytest.param("mlflow", marks=pytest.mark.slow),
                                     "tensorboard"])
def test_a_missing_package_is_one_line_naming_the_extra_before_anything_starts(tmp_path,
                                                                                package):
    """The package made unimportable for real (None in sys.modules, as Python's import
    system reads it), then the command line as a user runs it."""
    out = tmp_path / "run"
    code = (f"import sys; sys.modules[{package!r}] = None; from dtrain.cli import main; "
            f"sys.exit(main(['--set', 'track.{package}=true', '--out', {str(out)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"dtrain: error: track.{package} = true but {package} "
                                  f"cannot be imported")
    assert f"pip install 'dtrain[{package}]'" in proc.stderr
    assert not out.exists()                   # checked before the run directory, or a cluster


@pytest.mark.slow
def test_a_dask_run_reads_back_in_tensorboard_and_mlflow(client, tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = dtrain.load_config(None, ["train.epochs=4", *_tracked(tmp_path)])
    lines: list[str] = []
    result = dtrain.train(cfg, client=client, out=out, echo=lines.append)
    rows, summary = _rows(out), json.loads((out / "summary.json").read_text())
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]
    assert not any("mlflow" in line.lower() or "tensorboard" in line.lower() for line in lines)

    # TensorBoard: every epoch metric at step = epoch, as float32; test metrics at the end
    acc = _events(out / "tensorboard")
    for key in METRICS:
        assert _scalars(acc, key) == [(r["epoch"], float(np.float32(r[key]))) for r in rows]
    for key in ("test_loss", "test_accuracy"):
        assert _scalars(acc, key) == [(4, float(np.float32(summary[key])))]
    (text,) = acc.Tensors("config")
    shown = tensor_util.make_ndarray(text.tensor_proto).item().decode()
    assert "".join(line[4:] + "\n" for line in shown.splitlines()) == \
        (out / "config.toml").read_text()
    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert set(hparams) == set(flat_config(cfg))
    assert hparams["optim.lr"].number_value == cfg.optim.lr
    assert hparams["graph.strategy"].string_value == "allreduce"

    # MLflow: the same numbers unrounded, the config as params, the model as artifacts
    ml = _mlflow(tmp_path, monkeypatch)
    run_id = (out / "mlflow_run_id").read_text().strip()
    run = ml.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == out.name
    assert ml.get_experiment(run.info.experiment_id).name == "tests"
    for key in METRICS:
        assert _history(ml, run_id, key) == [(r["epoch"], r[key]) for r in rows]
    assert {k: run.data.metrics[k] for k in ("test_loss", "test_accuracy")} == \
        {k: summary[k] for k in ("test_loss", "test_accuracy")}
    assert run.data.params == {k: str(v) for k, v in flat_config(cfg).items()}
    names = {a.path for a in ml.list_artifacts(run_id)}
    assert {"params.npz", "config.toml", "summary.json"} <= names
    assert ("model.json" in names) == (out / "model.json").exists()
    got = Path(ml.download_artifacts(run_id, "params.npz", str(tmp_path)))
    assert got.read_bytes() == (out / "params.npz").read_bytes()
    with np.load(got) as saved:
        assert np.array_equal(saved["W1"], result.params["W1"])


def _script(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run_and_tensorboard_files_without_repeats(
        tmp_path, monkeypatch):
    """Killed after epoch 3 with its checkpoint at epoch 2 (so epoch 3 is trained twice),
    stopped by SIGTERM after epoch 6, then resumed to the end: one MLflow run, each epoch
    once in both trackers."""
    out = tmp_path / "run"
    overrides = ["train.epochs=8", "graph.strategy=serial", "graph.window=14",  # 2 epochs
                 *_tracked(tmp_path)]

    def stopping(sig: str, at: int, call: str) -> str:
        return f"""
            import os, signal, sys, dtrain
            from dtrain.core.errors import Stopped
            def echo(line):
                if line.startswith("epoch {at}/"):
                    os.kill(os.getpid(), signal.{sig})
            try:
                {call}
            except Stopped:
                sys.exit(5)
        """
    killed = _script(stopping("SIGKILL", 3, f"dtrain.train(dtrain.load_config(None, "
                                            f"{overrides!r}), out={str(out)!r}, echo=echo)"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert checkpoint.load(out)[0].epochs_done == 2 and len(_rows(out)) == 3
    ml = _mlflow(tmp_path, monkeypatch)
    run_id = (out / "mlflow_run_id").read_text().strip()
    assert ml.get_run(run_id).info.status == "RUNNING"           # no one could say otherwise
    assert [s for s, _ in _history(ml, run_id, "train_loss")] == [1, 2, 3]

    stopped = _script(stopping("SIGTERM", 5, f"dtrain.resume({str(out)!r}, echo=echo)"))
    assert stopped.returncode == 5, stopped.stderr
    assert checkpoint.load(out)[0].epochs_done in (5, 6)   # at the next step (or window) edge
    assert ml.get_run(run_id).info.status == "KILLED"

    done = run_cli("--resume", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""                      # dtrain's console stays its own
    assert not any("mlflow" in line.lower() or "tensorboard" in line.lower()
                   for line in done.stdout.splitlines())
    assert (out / "mlflow_run_id").read_text().strip() == run_id
    run = ml.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [r.info.run_id for r in ml.search_runs([run.info.experiment_id])] == [run_id]

    rows = _rows(out)
    assert [r["epoch"] for r in rows] == list(range(1, 9))
    acc = _events(out / "tensorboard")
    assert len(list((out / "tensorboard").glob("events.out.tfevents.*"))) == 3
    assert len(acc.Tensors("config")) == 1
    for key in DETERMINISTIC:    # epoch 3, trained twice, has the same numbers both times
        assert _history(ml, run_id, key) == [(r["epoch"], r[key]) for r in rows]
        assert _scalars(acc, key) == [(r["epoch"], float(np.float32(r[key]))) for r in rows]
    assert [s for s, _ in _history(ml, run_id, "samples_per_second")] == list(range(1, 9))
    assert [s for s, _ in _scalars(acc, "samples_per_second")] == list(range(1, 9))
    test_accuracy = json.loads((out / "summary.json").read_text())["test_accuracy"]
    assert _history(ml, run_id, "test_accuracy") == [(8, test_accuracy)]


def test_a_diverged_run_is_marked_failed(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = dtrain.load_config(None, ["optim.lr=1e3", "model.activation=relu",
                                    "model.dtype=float32", "graph.strategy=serial",
                                    "train.max_loss=1e300",    # on to inf: epochs logged first
                                    *_tracked(tmp_path)])
    with pytest.raises(Diverged):
        dtrain.train(cfg, out=out, echo=None)
    run = _mlflow(tmp_path, monkeypatch).get_run((out / "mlflow_run_id").read_text().strip())
    assert run.info.status == "FAILED"
    assert _scalars(_events(out / "tensorboard"), "train_loss") == \
        [(r["epoch"], float(np.float32(r["train_loss"]))) for r in _rows(out)]


def test_a_tracker_that_fails_mid_run_is_turned_off_in_one_line_and_the_run_goes_on(tmp_path):
    """The MLflow store removed after epoch 1, as a lost disk would: one console line, the
    run finishes, TensorBoard still gets every epoch."""
    out, lines = tmp_path / "run", []

    def echo(line: str) -> None:
        lines.append(line)
        if line.startswith("epoch 1/"):
            shutil.rmtree(tmp_path / "mlruns")

    cfg = dtrain.load_config(None, ["train.epochs=3", "graph.strategy=serial",
                                    *_tracked(tmp_path)])
    dtrain.train(cfg, out=out, echo=echo)
    warned = [line for line in lines if "logging off" in line]
    assert len(warned) == 1 and warned[0].startswith("mlflow logging off: ")
    assert "mlruns" in warned[0] and "\n" not in warned[0]
    assert (out / "summary.json").exists()
    assert [s for s, _ in _scalars(_events(out / "tensorboard"), "train_loss")] == [1, 2, 3]


def test_a_new_run_in_an_old_run_directory_starts_its_own_tracking(tmp_path, monkeypatch):
    out = tmp_path / "run"
    cfg = dtrain.load_config(None, ["train.epochs=2", "graph.strategy=serial",
                                    *_tracked(tmp_path)])
    dtrain.train(cfg, out=out, echo=None)
    first = (out / "mlflow_run_id").read_text()
    dtrain.train(cfg.replace(train={"epochs": 3}), out=out, echo=None)
    second = (out / "mlflow_run_id").read_text().strip()
    assert second != first.strip()
    ml = _mlflow(tmp_path, monkeypatch)
    assert [s for s, _ in _history(ml, first.strip(), "train_loss")] == [1, 2]
    assert [s for s, _ in _history(ml, second, "train_loss")] == [1, 2, 3]
    acc = _events(out / "tensorboard")
    assert [s for s, _ in _scalars(acc, "train_loss")] == [1, 2, 3]
    assert len(acc.Tensors("config")) == 1
