"""dtrain called from a user's script, run as the user runs it: the documentation's Python
example (docs/python-and-dask.md, "Python API") and README.md's example saved as scripts print
what the pages say, and the same code without its ``__main__`` guard (a ``train()`` or an
estimator's ``fit``) is one line saying to add it (:mod:`dtrain.deploy.mainguard`); nothing is
left running after any of them.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import REPO


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


# --- the pages' examples ----------------------------------------------------------------------

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


# --- without the __main__ guard ---------------------------------------------------------------

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
