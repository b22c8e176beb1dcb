"""What a ``step`` event per training step costs: the same cluster, alternating runs.

    python tools/measure_step_events.py [REPEATS]

Trains iris with a near-zero-compute model (``model.layers = [4, 3]``, 2
shards, 210 steps) on one LocalCluster of 2 worker processes, alternating no
step events (``graph.step_events = 0``), one every step (``= 1`` with
``graph.step_event_gap = 0``) and the default (one every step, at most one per
0.1 s), and prints ms/step for each run, the medians, and the median of the
paired differences from no events.  Timings only: not a test.
"""
from __future__ import annotations

import logging
import statistics
import sys

from distributed import Client, LocalCluster

import dtrain

BASE = ["model.layers=[4, 3]", "train.epochs=30", "data.shards=2", "train.batch_size=16",
        "graph.window=100"]
CONDITIONS = {"none": ["graph.step_events=0"],
              "every step": ["graph.step_events=1", "graph.step_event_gap=0"],
              "default": []}


def ms_per_step(client: Client, sets: list[str]) -> float:
    cfg = dtrain.load_config(None, [*BASE, *sets])
    summary = dtrain.train(cfg, client=client, echo=None).summary
    return summary["seconds"] / summary["steps"] * 1e3


def main(repeats: int) -> None:
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        ms_per_step(client, [])                                   # warm-up
        runs: dict[str, list[float]] = {name: [] for name in CONDITIONS}
        for _ in range(repeats):
            for name, sets in CONDITIONS.items():
                runs[name].append(ms_per_step(client, sets))
    for name, ms in runs.items():
        print(f"{name}: median {statistics.median(ms):.2f} ms/step "
              f"(runs: {', '.join(f'{m:.2f}' for m in ms)})")
    for name in list(CONDITIONS)[1:]:
        diffs = [b - a for a, b in zip(runs["none"], runs[name])]
        print(f"paired difference ({name} - none): median {statistics.median(diffs):+.2f} ms/step")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
