"""The GPU peer: a plain PyTorch training loop of the same network on one GPU.

``python -m benchmarks.torch_gpu RUN_DIR`` trains ``RUN_DIR/config.toml``'s
network with ``torch.nn`` layers on the GPU: the same architecture, float32,
initial parameters, data, minibatch rows (dtrain's schedule, every shard's
rows of a step in shard order) and learning rate as dtrain, the loss the
minibatch's summed cross-entropy over its size.  The training set lives on the
GPU and each epoch's row order is one index array there, so a step is what a
PyTorch user would write: index, forward, backward, ``optimizer.step()``.  An
epoch is timed from its first step to a synchronize after its last; the first
epoch (CUDA's warm-up) is reported and left out of the medians, as every
contender's is.  Writes ``metrics.jsonl`` and ``params.npz`` as dtrain does.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from dtrain.observe.rundir import RunDir

from benchmarks.common import epoch_row, load_run, own_shards, peak_rss_mb, write_rss
from benchmarks.contenders import torch_unsupported
from benchmarks.torch_ddp import build_model


def epoch_rows(the_plan, shards, epoch: int) -> list[np.ndarray]:
    """The row numbers, into the shards laid end to end, of each step of ``epoch``: each
    shard's rows of the step in shard order, as dtrain takes them."""
    starts = np.cumsum([0] + [len(s) for s in shards[:-1]])
    seed, per = the_plan.recipe.shuffle_seed, the_plan.schedule.steps_per_epoch
    out = []
    for t in range(per):
        step = the_plan.schedule[epoch * per + t]
        out.append(np.concatenate([np.arange(len(s))[s.rows(step.epoch, lo, hi, seed)] + at
                                   for s, (lo, hi), at in zip(shards, step.bounds, starts)]))
    return out


def main(run_dir: Path) -> None:
    import torch
    from torch import nn

    cfg, p = load_run(run_dir)
    reason = torch_unsupported(cfg)
    if reason:
        raise SystemExit(reason)
    if not torch.cuda.is_available():
        raise SystemExit("torch-gpu: torch sees no CUDA GPU")
    dev = torch.device("cuda")
    shards = own_shards(p, 1, 0)
    x = torch.from_numpy(np.concatenate([s.x for s in shards])).to(dev)
    y = torch.from_numpy(np.concatenate([s.y for s in shards]).astype(np.int64)).to(dev)
    model = build_model(p).to(dev)
    optim = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr,
                            momentum=cfg.optim.momentum if cfg.optim.name == "momentum" else 0)
    out = RunDir(run_dir, cfg)
    for epoch in range(p.schedule.epochs):
        rows = [torch.from_numpy(r).to(dev) for r in epoch_rows(p, shards, epoch)]
        torch.cuda.synchronize()
        began = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=dev)
        for t, idx in enumerate(rows):
            step = p.schedule[epoch * p.schedule.steps_per_epoch + t]
            for group in optim.param_groups:
                group["lr"] = step.lr
            optim.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx], reduction="sum")
            (loss / step.count).backward()
            optim.step()
            loss_sum += loss.detach()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - began
        out.add_epoch(epoch_row(p, epoch + 1, seconds, float(loss_sum), p.train_samples))
    params = [t.detach().cpu().numpy() for t in model.parameters()]
    out.finish({f"{'Wb'[i % 2]}{i // 2 + 1}": a for i, a in enumerate(params)},
               {"strategy": "torch-gpu", "workers": 1, "steps": len(p.schedule)})
    write_rss(run_dir, None, [peak_rss_mb()])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
