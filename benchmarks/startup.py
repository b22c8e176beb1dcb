"""Where the default job's wall time goes, beside scikit-learn training the same net (issue 19).

Runs, ``--repeat`` times each and interleaved, in fresh processes as a user would:

* ``python -m dtrain`` (the Quickstart's default iris job, dashboard included), timed from
  outside, with its ``summary.json`` giving the cluster's start, the data's loading
  (``setup_seconds``) and the training (``seconds``);
* ``import dtrain.cli.main``, alone: the interpreter and imports before anything runs;
* ``python -m dtrain report RUN``: writing ``report.html`` (minus the same imports);
* scikit-learn's ``MLPClassifier`` on the same split with the same net, optimizer, batch
  and epochs, import included.

The rest of dtrain's wall time (validation, the test evaluation, closing the cluster,
writing the run directory) is what is left.  Prints a table of medians; exit code 0 when
the default job's median wall time is at most ``--target`` seconds.

    python -m benchmarks.startup --repeat 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SKLEARN = """
import time
t0 = time.perf_counter()
import numpy as np
from sklearn.datasets import load_iris
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler
x, y = load_iris(return_X_y=True)
order = np.random.default_rng(0).permutation(len(y))
train = order[45:]                                   # dtrain's 70/10/20 split sizes
xt = StandardScaler().fit_transform(x[train])
MLPClassifier((16,), activation="tanh", solver="sgd", learning_rate_init=0.1, momentum=0,
              batch_size=16, max_iter=40, n_iter_no_change=1000, tol=0,
              random_state=0).fit(xt, y[train])
print(time.perf_counter() - t0)
"""


def _wall(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - start, done


def one_round(tmp: Path, n: int) -> dict[str, float]:
    """Every measurement once."""
    out = tmp / f"run{n}"
    py = sys.executable
    job, _ = _wall([py, "-m", "dtrain", "--out", str(out)], REPO)
    summary = json.loads((out / "summary.json").read_text())
    imports, _ = _wall([py, "-c", "import dtrain.cli.main"], REPO)
    report, _ = _wall([py, "-m", "dtrain", "report", str(out)], REPO)
    _, sk = _wall([py, "-c", SKLEARN], REPO)
    phases = summary.get("phases", {})
    return {"dtrain default job (wall)": job, "imports": imports,
            "cluster start": phases.get("cluster_seconds", float("nan")),
            "data loading": summary["setup_seconds"], "training": summary["seconds"],
            "report.html": report - imports,
            "scikit-learn MLPClassifier (wall, import included)": float(sk.stdout.split()[-1]),
            "test accuracy": summary["test_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.startup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", type=float, default=5.0, metavar="S")
    args = parser.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeat):
            rounds.append(one_round(Path(tmp), n))
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    known = sum(median[k] for k in ("imports", "cluster start", "data loading", "training",
                                    "report.html") if median[k] == median[k])
    width = max(map(len, median)) + 2
    print(f"{'what':<{width}}median of {args.repeat} (s)")
    for k, v in median.items():
        print(f"{k:<{width}}{v:.2f}" if k != "test accuracy" else f"{k:<{width}}{v:.4f}")
    print(f"{'the rest (evaluations, closing, files)':<{width}}"
          f"{median['dtrain default job (wall)'] - known:.2f}")
    ok = median["dtrain default job (wall)"] <= args.target
    print(f"default job within {args.target:g} s: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
