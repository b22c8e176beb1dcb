"""Many workers on one machine: ``python -m benchmarks.many [--workers 1,2,8,16,32]``.

Each worker process stands for a node.  A small net (784-32-10, batch 256, 32 shards)
trains on the MNIST files with ``cluster.layout = "flat"`` on each worker count, through
the CLI as a user runs it, twice: a short run and a long one.  Printed per worker count:

* whether ``params.npz`` has the bytes of the 1-worker run (each count's long run);
* the scheduler's tasks per step and worker;
* the head process's CPU per training step in steady state: the driver, with the
  LocalCluster's scheduler inside it, as the long run's summary measures it
  (``head_cpu_ms_per_step``: between its first and last epoch rows), and as the extra CPU
  of the long run over the short one (``getrusage`` of the head alone), per extra step;
* the step time.

These are measurements on this machine, not predictions; with more worker processes than
cores the step time says little about a cluster, the driver's CPU a lot.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import OneLineParser
from benchmarks.run import DEFAULT_DATA

LAYERS = "[784, 32, 10]"
SHARDS = 32


def _run(workers: int, epochs: int, out: Path, data: Path) -> dict:
    """One CLI run; its summary, with the head's CPU seconds (its own, not its workers')."""
    cmd = [sys.executable, "-c", _HEAD, str(out), "--config", "configs/mnist.toml",
           "--set", f"data.path={data}", "--set", f"model.layers={LAYERS}",
           "--set", "train.batch_size=256", "--set", f"data.shards={SHARDS}",
           "--set", f"train.epochs={epochs}", "--set", f"cluster.workers={workers}",
           "--set", "cluster.layout=flat", "--set", "optim.name=sgd",
           "--dashboard-address", "", "--out", str(out)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parents[1],
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks.many: {workers} workers, {epochs} epochs failed "
                         f"(exit {done.returncode}): {done.stderr.strip()[-400:]}")
    summary = json.loads((out / "summary.json").read_text())
    summary["head_cpu_s"] = json.loads((out / "head-cpu.json").read_text())["cpu"]
    summary["wall_s"] = time.perf_counter() - start
    return summary


# the CLI in this process, its CPU (threads included, children not) written when it exits
_HEAD = """
import json, resource, sys
from pathlib import Path
out = Path(sys.argv.pop(1))
from dtrain.__main__ import entry
try:
    entry()
finally:
    r = resource.getrusage(resource.RUSAGE_SELF)
    (out / "head-cpu.json").write_text(json.dumps({"cpu": r.ru_utime + r.ru_stime}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m benchmarks.many", description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="1,2,8,16,32")
    ap.add_argument("--epochs", default="3,12", help="the short and the long run's epochs")
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs of runs per worker count; the head CPU figures are their "
                         "medians (the long-minus-short one moves with the cluster's start, "
                         "whose CPU varies by more than the difference at 32 workers)")
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    short, long_ = (int(e) for e in args.epochs.split(","))
    data = (args.data_dir or DEFAULT_DATA) / "mnist"
    if not (data / "t10k-images-idx3-ubyte.gz").is_file():
        print(f"benchmarks.many: no MNIST files in {data}", file=sys.stderr)
        return 2
    print(f"{LAYERS} on MNIST, batch 256, {SHARDS} shards, flat workers; runs of {short} and "
          f"{long_} epochs (measured on this machine)")
    print()
    print("| workers | same bytes as 1 worker | scheduler tasks per step and worker | head CPU "
          "ms/step (summary) | head CPU ms/step (long - short run) | step ms | its sum |")
    print("|---|---|---|---|---|---|---|")
    ref = None
    with tempfile.TemporaryDirectory(prefix="dtrain-many-") as tmp:
        for w in counts:
            extras, heads, same = [], [], True
            for r in range(args.repeat):
                a = _run(w, short, Path(tmp) / f"{w}-short-{r}", data)
                b = _run(w, long_, Path(tmp) / f"{w}-long-{r}", data)
                blob = (Path(tmp) / f"{w}-long-{r}" / "params.npz").read_bytes()
                ref = blob if ref is None else ref
                same = same and blob == ref
                extras.append((b["head_cpu_s"] - a["head_cpu_s"]) * 1e3 /
                              (b["steps"] - a["steps"]))
                heads.append(b.get("head_cpu_ms_per_step"))
            tasks = b.get("scheduler_tasks_per_step")
            per_worker = None if tasks is None else tasks / w
            head = None if None in heads else statistics.median(heads)
            extra = f"{statistics.median(extras):.3f}" + \
                (f" ({min(extras):.3f}-{max(extras):.3f})" if len(extras) > 1 else "")
            print(f"| {w} | {'yes' if same else 'NO'} | "
                  f"{'-' if per_worker is None else f'{per_worker:.3f}'} | "
                  f"{'-' if head is None else f'{head:.3f}'} | {extra} | "
                  f"{b['step_seconds'] * 1e3:.2f} | {b.get('step_sum') or 'one worker'} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
