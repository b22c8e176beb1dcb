"""What a ``step`` event per training step costs: the same cluster, alternating runs.

    python tools/measure_step_events.py [REPEATS]

Trains iris with a near-zero-compute model (``model.layers = [4, 3]``, 2
shards, 210 steps) on one LocalCluster of 2 worker processes, alternating
``graph.step_events = 0`` and ``= 1``, and prints ms/step for each run, the
medians, and the median of the paired differences.  Timings only: not a test.
"""
from __future__ import annotations

import logging
import statistics
import sys

from distributed import Client, LocalCluster

import dtrain

BASE = ["model.layers=[4, 3]", "train.epochs=30", "data.shards=2", "train.batch_size=16",
        "graph.window=100"]


def ms_per_step(client: Client, every: int) -> float:
    cfg = dtrain.load_config(None, [*BASE, f"graph.step_events={every}"])
    summary = dtrain.train(cfg, client=client, echo=None).summary
    return summary["seconds"] / summary["steps"] * 1e3


def main(repeats: int) -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        ms_per_step(client, 1)                                    # warm-up
        runs = {0: [], 1: []}
        for _ in range(repeats):
            for every in runs:
                runs[every].append(ms_per_step(client, every))
    for every, ms in runs.items():
        print(f"step_events={every}: median {statistics.median(ms):.2f} ms/step "
              f"(runs: {', '.join(f'{m:.2f}' for m in ms)})")
    diffs = [b - a for a, b in zip(runs[0], runs[1])]
    print(f"paired difference (events - none): median {statistics.median(diffs):+.2f} ms/step")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
