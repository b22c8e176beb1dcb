"""What the fault tests share: a run with many window edges, and its undisturbed bytes."""
from __future__ import annotations

from pathlib import Path

import dtrain

# iris, stochastic-ish minibatches: ~27 steps per epoch, many window edges
LONG = ["train.batch_size=4", "train.epochs=12", "graph.window=10", "optim.lr=0.02",
        "optim.name=momentum", "data.shards=4"]


def reference(tmp_path: Path, client) -> bytes:
    dtrain.train(dtrain.load_config(None, LONG), client=client, out=tmp_path / "ref", echo=None)
    return (tmp_path / "ref" / "params.npz").read_bytes()
