"""What the cost model's commands measure on this machine: a net's compute rates, a dtrain
run's step, and the window's no-op task (shared by :mod:`benchmarks.model` and
:mod:`benchmarks.across_model`, which import it and not each other)."""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _hop(x: Any) -> Any:
    return x


def compute_rates(cfg: Any, rows: int, repeat: int = 5) -> dict[str, float]:
    """Forward-backward FLOP/s on ``rows`` rows and seconds per update of ``cfg``'s network,
    timed in this process (run it on a worker with ``client.run``)."""
    from dtrain.maths.optim import update
    from dtrain.training.plan import plan

    p = plan(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, p.net.features)).astype(p.net.dtype)    # (b, D)
    y = rng.integers(0, p.net.outputs, rows)                                 # (b,)
    state = p.opt.init_state(p.net.init(0))
    fb, upd = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        grad = p.net.loss_and_grad(p.opt.params(state), x, y)
        t1 = time.perf_counter()
        update(p.opt, p.schedule[0], True, state, grad)
        fb.append(t1 - t0)
        upd.append(time.perf_counter() - t1)
    return {"flops": p.net.flops(rows) / statistics.median(fb),
            "update": statistics.median(upd)}


def measured_run(cfg: Any, client: Any) -> tuple[float, dict[str, Any]]:
    """Median seconds per step of a dtrain run (epochs after the first), and its summary
    (``client``: of the benchmark's own cluster on loopback, which dtrain need not warn of)."""
    import dtrain
    from dtrain.deploy.options import started_by_dtrain

    started_by_dtrain(client)
    with tempfile.TemporaryDirectory() as d:
        result = dtrain.train(cfg, client=client, out=Path(d) / "run", echo=None)
        rows = [json.loads(line) for line in open(Path(d) / "run" / "metrics.jsonl")]
    rows = [r for r in rows if r.get("seconds")][1:] or rows
    return statistics.median(r["seconds"] / r["steps"] for r in rows), result.summary


def measured_step(cfg: Any, client: Any) -> float:
    """Median seconds per step of a dtrain run (epochs after the first)."""
    return measured_run(cfg, client)[0]


def _epochs(cfg: Any, epochs: int) -> Any:
    """``cfg`` for ``epochs`` epochs, with the update on the tree's root: the graph the model
    describes (replicated updates drop its broadcast term; see benchmarks/README.md)."""
    return cfg.replace(train={"epochs": epochs}, graph={"update": "root"})
