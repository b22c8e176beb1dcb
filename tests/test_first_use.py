"""What a new user meets first, run as they would run it: the documentation's Python example
(docs/python-and-dask.md, "Python API") saved as a script, the same script without its ``__main__`` guard, a learning rate that explodes."""
from __future__ import annotations

import pickle
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

import dtrain
from conftest import REPO, run_cli
from dtrain.core.config import OptimConfig
from dtrain.core.errors import Diverged, exit_code
from dtrain.maths.model import Network
from dtrain.maths.optim import Optimizer, Step, TrainState, update

GUARD_LINE = ("put the code that calls dtrain.train() or an estimator's fit() under "
              'if __name__ == "__main__":')


def _docs_example() -> str:
    """The Python block of the "Python API" section of docs/python-and-dask.md."""
    section = (REPO / "docs" / "python-and-dask.md").read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _run_script(path: Path, tag: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python path`` from the repository root, as a user runs a saved example; its
    processes carry ``DTRAIN_TEST_TAG=tag`` in their environment."""
    env = {**__import__("os").environ, "DTRAIN_TEST_TAG": tag}
    return subprocess.run([sys.executable, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _tagged(tag: str) -> list[int]:
    """Processes still alive whose environment carries ``tag``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DTRAIN_TEST_TAG") == tag:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def _no_stray_processes(tag: str) -> None:
    deadline = time.monotonic() + 10
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _tagged(tag) == []


@pytest.mark.slow
def test_docs_python_example_runs_as_a_script(tmp_path):
    code = _docs_example()
    assert 'if __name__ == "__main__":' in code
    script = tmp_path / "example.py"
    script.write_text(code)
    tag = uuid.uuid4().hex
    proc = _run_script(script, tag)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val, test, shape = proc.stdout.strip().splitlines()[-1].split(" ", 2)
    assert 0.5 < float(val) <= 1 and 0.5 < float(test) <= 1 and shape == "(32, 64)"
    _no_stray_processes(tag)


@pytest.mark.slow
def test_readme_example_prints_what_it_says(tmp_path):
    """README.md's one example, saved as a script: it prints the score its comment gives."""
    code = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    said = re.search(r"print\(clf\.score\(X, y\)\)\s+# (\d\.\d+)", code).group(1)
    script = tmp_path / "first.py"
    script.write_text(code)
    tag = uuid.uuid4().hex
    proc = _run_script(script, tag)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{float(proc.stdout.strip().splitlines()[-1]):.4f}" == said
    _no_stray_processes(tag)


@pytest.mark.slow
def test_a_script_without_the_main_guard_gets_one_line(tmp_path):
    lines = [line.removeprefix("    ") for line in _docs_example().splitlines()
             if line and not line.startswith(("def main", "if __name__", "    main()"))]
    script = tmp_path / "unguarded.py"
    script.write_text("\n".join(lines).replace("train.epochs=5", "train.epochs=1") + "\n")
    assert "__main__" not in script.read_text()
    tag = uuid.uuid4().hex
    proc = _run_script(script, tag, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dtrain: error: the worker processes re-ran unguarded.py")
    assert line.endswith(GUARD_LINE)
    _no_stray_processes(tag)


@pytest.mark.slow
def test_an_estimator_fit_without_the_main_guard_gets_one_line(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text("import dtrain\nfrom sklearn.datasets import load_iris\n"
                      "x, y = load_iris(return_X_y=True)\n"
                      "print(dtrain.MLPClassifier(max_iter=2).fit(x, y).score(x, y))\n")
    tag = uuid.uuid4().hex
    proc = _run_script(script, tag, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("dtrain: error: the worker processes re-ran fit.py")
    assert line.endswith(GUARD_LINE)
    _no_stray_processes(tag)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allreduce", "local-sgd", "model-parallel",
                                      "parameter-server", "serial"])
def test_an_exploding_loss_diverges_at_its_step(tmp_path, strategy):
    out = tmp_path / "run"
    proc = run_cli("--set", "optim.lr=1e6", "--set", f"graph.strategy={strategy}",
                   "--workers", "2", "--out", str(out), "--dashboard-address", "")
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    # local SGD: each shard runs the round's steps alone and the first shard to explode says
    # so, which may be at step 1
    step = "[12]" if strategy == "local-sgd" else "2"
    assert re.fullmatch(r"dtrain: error: training diverged at step " + step +
                        r" \(epoch 1\): the mean loss per sample is [0-9.e+]+, above "
                        r"train\.max_loss = 1e\+06; lower optim\.lr or raise model\.l2", line), line
    assert not out.exists()          # nothing recorded: the run leaves no directory


NET = Network((2, 2), "tanh", "cross-entropy", "float64")


def _step(count: int) -> Step:
    return Step(index=4, epoch=1, position=0, lr=0.1, count=count, first=False, last=False,
                bounds=())


def test_max_loss_is_a_bound_on_the_mean_loss_per_sample():
    opt = Optimizer(OptimConfig(name="sgd"), NET, max_loss=10.0)
    state = TrainState(np.zeros(NET.size))
    grad = np.zeros(NET.size + 2)                               # (P + 2,)
    grad[NET.size] = 20.0                                       # 10 per sample: not above
    assert update(opt, _step(2), True, state, grad).epoch_loss == 20.0
    grad[NET.size] = 20.5
    with pytest.raises(Diverged) as caught:
        update(opt, _step(2), True, state, grad)
    exc = caught.value
    assert (exc.step, exc.epoch, exc.loss, exc.limit) == (4, 1, 10.25, 10.0)
    assert str(pickle.loads(pickle.dumps(exc))) == str(exc)     # as it comes from a worker
    assert exit_code(exc) == 3
    assert "the mean loss per sample is 10.25, above train.max_loss = 10" in str(exc)
    assert "the loss is nan" in str(Diverged(4, 1, float("nan")))


def test_the_default_jobs_workers_import_no_bokeh_and_no_scikit_learn(tmp_path):
    """Most of the default job's fixed cost was its workers importing the whole package
    (the reports, Bokeh) to run a task, and scikit-learn to read iris: now a task imports
    the part it runs, and iris is read from scikit-learn's file without importing it."""
    from distributed import Client, LocalCluster
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:
        dtrain.train(dtrain.load_config(None, ["train.epochs=1"]), client=c, echo=None,
                     out=tmp_path / "run")
        loaded = c.run(lambda: sorted(m for m in ("bokeh", "sklearn", "dtrain.training",
                                                  "dtrain.observe.htmlreport")
                                      if m in sys.modules))
    assert list(loaded.values()) == [[]], loaded
