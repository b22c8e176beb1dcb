"""The industry peer: PyTorch DistributedDataParallel over gloo on CPU.

``python -m benchmarks.torch_ddp RUN_DIR WORLD`` spawns ``WORLD`` processes
(one thread each) that train the network of ``RUN_DIR/config.toml`` with
``torch.nn`` layers: the same architecture, float32, initial parameters,
data, shards, minibatch rows and learning rate as dtrain.  Each process
loads its own shards (the launcher holds no data).  The loss of a rank is
its rows' summed cross-entropy scaled by ``world / batch``, so DDP's
gradient average equals dtrain's mean gradient over the global minibatch.
Rank 0 writes ``metrics.jsonl`` and ``params.npz`` as dtrain does; the
launcher, which never imports torch (a second or two saved per run), writes
``rss.json``.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

from dtrain.data.shards import minibatch
from dtrain.observe.rundir import RunDir

from benchmarks.common import epoch_row, load_run, own_shards, peak_rss_mb, write_rss
from benchmarks.contenders import torch_unsupported


def build_model(the_plan):
    """``Linear`` layers with dtrain's activation between them, holding dtrain's initial
    parameters; a convolutional net's ``Conv2d``, pooling, ``Flatten`` and ``Dropout``
    layers too, taking the same flat rows (an ``Unflatten`` to (C, H, W) first)."""
    import torch
    from torch import nn

    activations = {"sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "relu": nn.ReLU}
    net = the_plan.net
    init = net.unflatten(the_plan.opt.params(the_plan.initial_state()))
    if not net.dense:
        return _image_model(torch, nn, net, init, activations[net.activation])
    layers: list[nn.Module] = []
    for n, (W, b) in enumerate(init):
        linear = nn.Linear(W.shape[1], W.shape[0], dtype=torch.float32)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(W, dtype=np.float32)))
            linear.bias.copy_(torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32)))
        layers.append(linear)
        if n < len(init) - 1:
            layers.append(activations[net.activation]())
    return nn.Sequential(*layers)


def _image_model(torch, nn, net, init, activation):
    """``build_model`` of a net with layer specs, in the order of its ops."""
    from dtrain.core.layerspec import Pool

    layers: list[nn.Module] = [nn.Unflatten(1, net.walk[0].shape_in)]
    for kind, st, p in net.ops:
        layer = st.layer
        if kind in ("dense", "conv"):
            W, b = (np.ascontiguousarray(a, dtype=np.float32) for a in init[p])
            module = nn.Linear(W.shape[1], W.shape[0]) if kind == "dense" else \
                nn.Conv2d(W.shape[1], W.shape[0], W.shape[2], stride=layer.stride,
                          padding=layer.padding)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(W))
                module.bias.copy_(torch.from_numpy(b))
            layers.append(module)
        elif kind == "act":
            layers.append(activation())
        elif kind == "pool":
            cls = nn.MaxPool2d if isinstance(layer, Pool) and layer.pool == "max" \
                else nn.AvgPool2d
            layers.append(cls(layer.size, layer.step))
        elif kind == "flatten":
            layers.append(nn.Flatten())
        else:
            layers.append(nn.Dropout(layer.dropout))
    return nn.Sequential(*layers)


def train_rank(rank: int, world: int, run_dir: Path, port: int) -> None:
    """One DDP process: its shards, the schedule's minibatches, rank 0 records."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg, p = load_run(run_dir)
        shards = own_shards(p, world, rank)
        model = DistributedDataParallel(build_model(p))
        optim = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr,
                                momentum=cfg.optim.momentum if cfg.optim.name == "momentum" else 0)
        out = RunDir(run_dir, cfg) if rank == 0 else None
        loss_sum = torch.zeros(1, dtype=torch.float64)
        dist.barrier()
        for t in range(len(p.schedule)):
            step = p.schedule[t]
            if step.first:
                began, loss_sum[0] = time.perf_counter(), 0.0
            x, y = minibatch(shards, step.epoch, [step.bounds[s.index] for s in shards],
                             p.recipe.shuffle_seed)
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            for group in optim.param_groups:
                group["lr"] = step.lr
            optim.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y, reduction="sum")
            (loss * (world / step.count)).backward()
            optim.step()
            loss_sum += loss.detach()
            if step.last:
                seconds = time.perf_counter() - began
                dist.all_reduce(loss_sum)              # once per epoch, outside the timing
                if out is not None:
                    out.add_epoch(epoch_row(p, step.epoch + 1, seconds, float(loss_sum[0]),
                                            p.train_samples))
        if out is not None:
            params = [t.detach().numpy() for t in model.module.parameters()]  # W1, b1, W2, ...
            out.finish({f"{'Wb'[i % 2]}{i // 2 + 1}": a for i, a in enumerate(params)},
                       {"strategy": "torch-ddp", "workers": world, "steps": len(p.schedule)})
        (run_dir / f"rss-{rank}.json").write_text(json.dumps(peak_rss_mb()))
        dist.barrier()     # every rank done before any tears gloo down: a rank that left
        #                    first sometimes died in teardown ("terminate called without an
        #                    active exception") while rank 0 still wrote its files
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def finished(ranks: list, files: list[Path]) -> tuple[list[int], list[int]]:
    """The ranks that failed, and those that exited non-zero only after their last file
    (``files[r]``, written once a rank's training and rank 0's results are done): gloo now
    and then aborts a process as it tears down, which changes nothing already written."""
    bad = [r for r, proc in enumerate(ranks) if proc.exitcode]
    return [r for r in bad if not files[r].exists()], [r for r in bad if files[r].exists()]


def main(run_dir: Path, world: int) -> None:
    cfg, _ = load_run(run_dir)
    reason = torch_unsupported(cfg)
    if reason:
        raise SystemExit(reason)
    ctx, port = multiprocessing.get_context("spawn"), free_port()
    ranks = [ctx.Process(target=train_rank, args=(r, world, run_dir, port)) for r in range(world)]
    for proc in ranks:
        proc.start()
    for proc in ranks:
        proc.join()
    files = [run_dir / f"rss-{r}.json" for r in range(world)]
    failed, torn = finished(ranks, files)
    if failed:
        raise SystemExit(f"torch-ddp: rank(s) {failed} failed")
    if torn:
        print(f"torch-ddp: rank(s) {torn} died in torch's teardown after writing everything "
              f"(gloo's \"terminate called without an active exception\"): the run stands",
              file=sys.stderr)
    write_rss(run_dir, peak_rss_mb(), [json.loads(f.read_text()) for f in files])
    for f in files:
        f.unlink()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
