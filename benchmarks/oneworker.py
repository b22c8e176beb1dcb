"""One worker beside the serial strategy, each pair in one run: issue 27's per-step ratios.

``python -m benchmarks.oneworker [--repeat R] [--epochs N] [--data-dir DIR] [--only NAME]``

Each case is ``python -m dtrain`` as a user runs it (the embedded cluster: one worker
process, a thread per core), then the same config with ``graph.strategy = serial``
(one process, NumPy on the whole batch), one after the other, ``R`` times.  A step's
time is the median of ``seconds / steps`` over the epochs from the second on, read
from each run's ``metrics.jsonl``.  The cases: iris's default run; P3 (784-128-10,
batch 256, MNIST) on 1 shard, 2 shards (one per core here) and 4 (``data.shards``'
default); and a 784-2048-2048-10 net, which must train without distributed's
"Sending large graph" warning (the state stays on the worker).

Goals (issue 27, the 2-core machine): iris at most 2 times serial, P3 at most 1.15.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import OneLineParser, positive
from benchmarks.run import DEFAULT_DATA

P3 = ["data.dataset=mnist", "data.split=[1.0,0.0,0.0]", "model.layers=[784,128,10]",
      "model.activation=sigmoid", "model.loss=cross-entropy", "model.dtype=float32",
      "model.l2=0.0", "optim.name=sgd", "optim.lr=0.1", "optim.schedule=constant",
      "train.batch_size=256", "data.normalize=standardize"]
CASES = {                                   # name -> (--set overrides, goal: dtrain / serial)
    "iris": ([], 2.0),
    "P3-1": (P3 + ["data.shards=1"], 1.15),
    "P3-2": (P3 + ["data.shards=2"], 1.15),
    "P3-4": (P3 + ["data.shards=4"], 1.15),
}
BIG = ["data.dataset=mnist", "data.split=[1.0,0.0,0.0]", "model.layers=[784,2048,2048,10]",
       "model.dtype=float32", "train.batch_size=512", "train.epochs=2", "graph.window=5"]
LARGE_GRAPH = "large graph"


def step_ms(sets: list[str]) -> tuple[float, str]:
    """A run's median milliseconds a step, epochs 2 on, and what it wrote to stderr."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dtrain", "--out", f"{tmp}/run", "--force",
               "--dashboard-address", ""]
        for s in sets:
            cmd += ["--set", s]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: "
                               f"{done.stderr.strip().splitlines()[-1:]}")
        rows = [json.loads(line) for line in Path(tmp, "run", "metrics.jsonl").open()]
    return statistics.median(r["seconds"] / r["steps"] for r in rows[1:]) * 1e3, done.stderr


def measure(names: list[str], repeat: int, epochs: int, data: Path) -> list[dict]:
    """Each case's dtrain and serial step, ``repeat`` pairs, each pair run back to back."""
    out = []
    for _ in range(repeat):
        for name in names:
            sets, goal = CASES[name]
            sets = [*sets, f"train.epochs={epochs}"] + \
                ([f"data.path={data / 'mnist'}"] if name != "iris" else [])
            ours, _ = step_ms(sets)
            serial, _ = step_ms([*sets, "graph.strategy=serial"])
            out.append({"case": name, "dtrain_ms": ours, "serial_ms": serial, "goal": goal})
    return out


def table(rows: list[dict], big: tuple[float, str] | None) -> str:
    lines = ["### One worker beside the serial strategy (issue 27)", "",
             "| case | serial ms/step | dtrain ms/step | dtrain / serial | goal |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = r["dtrain_ms"] / r["serial_ms"]
        lines.append(f"| {r['case']} | {r['serial_ms']:.3f} | {r['dtrain_ms']:.3f} | "
                     f"{ratio:.2f} | <= {r['goal']:g} {'yes' if ratio <= r['goal'] else 'NO'} |")
    if big is not None:
        ms, err = big
        warned = LARGE_GRAPH in err.lower()
        verdict = "distributed warned of a large graph: NO" if warned \
            else "no large-graph warning: yes"
        lines += ["", f"784-2048-2048-10: {ms:.1f} ms/step, {verdict}"]
    lines += ["", "Median ms a step of epochs 2 on, each dtrain run beside its serial run."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.oneworker",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=positive, default=2, help="pairs of each case")
    parser.add_argument("--epochs", type=positive, default=6, help="epochs a run (>= 2)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA,
                        help="holds mnist/ (default ../shared/data)")
    parser.add_argument("--only", choices=sorted(CASES), action="append",
                        help="this case only (again for several); the big net is then skipped")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: epoch 1 is left out of the medians")
    names = args.only or list(CASES)
    if any(n != "iris" for n in names) and \
            not (args.data_dir / "mnist" / "t10k-images-idx3-ubyte.gz").exists():
        parser.error(f"no MNIST under {args.data_dir / 'mnist'}; pass --data-dir")
    rows = measure(names, args.repeat, args.epochs, args.data_dir)
    big = None if args.only else step_ms([*BIG, f"data.path={args.data_dir / 'mnist'}"])
    print(table(rows, big))
    return 0


if __name__ == "__main__":
    sys.exit(main())
