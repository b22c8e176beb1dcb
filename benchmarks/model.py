"""``python -m benchmarks.model``: dtrain's step time predicted from measured constants.

On a LocalCluster of two worker processes (one thread each, dtrain's
low-latency settings) it measures

* ``hop``: one task after another on the same worker, no data moved: the
  scheduler round trip (finished -> scheduler -> next task sent -> started);
* ``fetch`` and ``bandwidth``: the same chain alternating between the two
  workers with a payload of 1 KiB and of 8 MiB: what a dependency that
  crosses workers adds (fixed cost, then bytes / bandwidth);
* ``flops``: forward-backward rate of the workload's network on a worker
  (``loss_and_grad`` timed in the worker process);
* ``update``: one optimizer step over the flat state on a worker;
* ``task``: CPU seconds of the scheduler's thread per task, from 2000
  independent tiny tasks: one scheduler cannot run steps faster than
  ``tasks(W) * task``.

and predicts a data-parallel ``allreduce`` step (one shard per worker, fan-in
k, the update fused into the root of the tree)::

    W = 1:  2 hop + fb(B) + upd
    W > 1:  hop + fetch + (W - 1) S / bw            the new state reaches every leaf worker
          + fb(B / W)                               the shards' forward-backward, in parallel
          + depth (hop + fetch + (k - 1) G / bw)    each tree level: its inputs arrive
          + upd                                     sum + optimizer step at the root
    and at least tasks(W) * task                    the scheduler's throughput

with ``S`` the state's and ``G`` a gradient's bytes, ``depth = ceil(log_k W)``
and ``fb(b) = 6 b P / flops``.  Then it trains each workload at 1 and 2
workers to compare, and extrapolates to 8, 64 and 512 nodes with a cluster
network's figures (``--net-bandwidth``, ``--net-fetch``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_WORKLOADS = "iris,P3,P2,P1"


def _hop(x: Any) -> Any:
    return x


def _payload(nbytes: int) -> np.ndarray:
    return np.ones(nbytes // 8)


def chain_seconds(client: Any, workers: list[str], n: int, nbytes: int) -> float:
    """Seconds per link of an ``n``-task chain cycling over ``workers`` (payload ``nbytes``)."""
    import dask

    best = math.inf
    for r in range(3):                        # fresh keys: a repeat must not find results
        dsk: dict[str, Any] = {f"hop-{r}-0": (_payload, nbytes)}
        where = {f"hop-{r}-0": workers[0]}
        for i in range(1, n + 1):
            dsk[f"hop-{r}-{i}"] = (_hop, f"hop-{r}-{i - 1}")
            where[f"hop-{r}-{i}"] = workers[i % len(workers)]
        with dask.annotate(workers=where.__getitem__, allow_other_workers=False):
            start = time.perf_counter()
            client.get(dsk, f"hop-{r}-{n}")
        best = min(best, time.perf_counter() - start)
    return best / n


def compute_rates(cfg: Any, rows: int, repeat: int = 5) -> dict[str, float]:
    """Forward-backward FLOP/s on ``rows`` rows and seconds per update of ``cfg``'s network,
    timed in this process (run it on a worker with ``client.run``)."""
    from dtrain.maths.optim import update
    from dtrain.training.plan import plan

    p = plan(cfg)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, p.net.layers[0])).astype(p.net.dtype)   # (b, D)
    y = rng.integers(0, p.net.layers[-1], rows)                              # (b,)
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


def tasks_per_step(workers: int, k: int = 2) -> int:
    """forward-backward tasks, reduce tasks below the root, and the update."""
    depth = math.ceil(math.log(workers, k) - 1e-9) if workers > 1 else 0
    reduces, level = 0, workers
    for _ in range(max(depth - 1, 0)):          # the last level is the update itself
        reduces += level // k + (level % k > 1)   # a group of one passes through, no task
        level = math.ceil(level / k)
    return workers + reduces + 1


def predict(c: dict[str, float], workers: int, batch: int, params: int, state_bytes: int,
            grad_bytes: int, flops: float, update_s: float, k: int = 2) -> float:
    """Seconds per allreduce step at ``workers`` workers (see the module docstring)."""
    fb = 6 * (batch / workers) * params / flops
    if workers == 1:
        path = 2 * c["hop"] + fb + update_s
    else:
        depth = math.ceil(math.log(workers, k) - 1e-9)
        bcast = c["hop"] + c["fetch"] + (workers - 1) * state_bytes / c["bandwidth"]
        tree = depth * (c["hop"] + c["fetch"] + (k - 1) * grad_bytes / c["bandwidth"])
        path = bcast + fb + tree + update_s
    return max(path, tasks_per_step(workers, k) * c["task"])


def measured_step(cfg: Any, client: Any) -> float:
    """Median seconds per step of a dtrain run (epochs after the first)."""
    import dtrain

    with tempfile.TemporaryDirectory() as d:
        dtrain.train(cfg, client=client, out=Path(d) / "run", echo=None)
        rows = [json.loads(line) for line in open(Path(d) / "run" / "metrics.jsonl")]
    rows = [r for r in rows if r.get("seconds")][1:]
    return statistics.median(r["seconds"] / r["steps"] for r in rows)


def constants(client: Any) -> dict[str, float]:
    """hop, fetch and bandwidth on this cluster's first two workers."""
    from dtrain.deploy.workers import worker_addresses

    a, b = worker_addresses(client)[:2]
    hop = chain_seconds(client, [a], 200, 1024)
    small = chain_seconds(client, [a, b], 200, 1024)
    big_bytes = 8 << 20
    big = chain_seconds(client, [a, b], 40, big_bytes)
    wall, cpu = wide_seconds(client, 2000)
    return {"hop": hop, "fetch": small - hop,
            "bandwidth": (big_bytes - 1024) / max(big - small, 1e-9), "task": cpu,
            "task_wall": wall}


def _thread_cpu(dask_scheduler: Any = None) -> float:
    return time.thread_time()


def wide_seconds(client: Any, n: int) -> tuple[float, float]:
    """Seconds per task of ``n`` independent tiny tasks: wall time over the whole cluster,
    and CPU time of the scheduler's own thread (what one scheduler can sustain)."""
    wall = cpu = math.inf
    for r in range(3):
        dsk = {f"wide-{r}-{i}": (_hop, i) for i in range(n)}
        before = client.run_on_scheduler(_thread_cpu)
        start = time.perf_counter()
        client.get(dsk, list(dsk))
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, client.run_on_scheduler(_thread_cpu) - before)
    return wall / n, cpu / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.model", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--epochs", type=int, default=3, help="epochs per measured run")
    ap.add_argument("--net-bandwidth", type=float, default=10.0,
                    help="GB/s of the cluster network for the extrapolation (default 10: HDR IB)")
    ap.add_argument("--net-fetch", type=float, default=None,
                    help="ms a dependency that crosses nodes adds (default: as measured here)")
    args = ap.parse_args(argv)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"                   # as the benchmark contenders; workers inherit it

    import dask
    from distributed import Client, LocalCluster

    from dtrain.deploy import tuning
    from dtrain.deploy.workers import worker_addresses
    from dtrain.training.plan import plan
    from benchmarks.run import DEFAULT_DATA
    from benchmarks.workloads import load_workloads

    data_dir = args.data_dir or DEFAULT_DATA
    table = load_workloads()
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"benchmarks.model: error: unknown workload {unknown[0]!r}; known: "
              f"{', '.join(table)}", file=sys.stderr)
        return 2
    # dtrain's own worker settings: its allocator environment, then its low-latency streams
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            tuning.allocator_env(), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                         dashboard_address=":0") as lc, Client(lc) as client:
        tuning.low_latency(client)
        c = constants(client)
        print(f"constants (this machine, 2 worker processes): hop {c['hop'] * 1e3:.2f} ms, "
              f"fetch {c['fetch'] * 1e3:.2f} ms, bandwidth {c['bandwidth'] / 1e9:.2f} GB/s, "
              f"scheduler CPU {c['task'] * 1e3:.3f} ms per task "
              f"({c['task_wall'] * 1e3:.3f} ms of wall time per task over the cluster)")
        rows = []
        for name in names:
            w = table[name]
            if w.cannot_run(2, data_dir):
                print(f"{name}: skipped: {w.cannot_run(2, data_dir)}")
                continue
            for workers in (1, 2):
                cfg = w.config_for(workers, "allreduce", 2, data_dir)
                p = plan(cfg)
                batch = p.train_samples / p.schedule.steps_per_epoch   # mean rows per step
                # on as many workers at once as will compute at once: cores are shared
                rates = client.run(compute_rates, cfg, math.ceil(batch / workers),
                                   workers=worker_addresses(client)[:workers])
                rate = min(rates.values(), key=lambda r: r["flops"])
                pred = predict(c, workers, batch, p.net.size, p.recipe.state_bytes,
                               p.recipe.leaf_bytes, rate["flops"], rate["update"])
                rows.append((name, workers, batch, p.net.size, rate, pred, p))
        print()
        print("| workload | W | rows/step | params | fb GFLOP/s | predicted ms/step | measured ms/step | measured / predicted |")
        print("|---|---|---|---|---|---|---|---|")
        for name, workers, batch, params, rate, pred, p in rows:
            runner = client if workers == 2 else None
            cfg = table[name].config_for(workers, "allreduce", 2, data_dir)
            if runner is None:
                with tuning.allocator_env(), \
                        LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                     dashboard_address=":0") as one, Client(one) as c1:
                    got = measured_step(_epochs(cfg, args.epochs), c1)
            else:
                got = measured_step(_epochs(cfg, args.epochs), runner)
            print(f"| {name} | {workers} | {batch:.0f} | {params:,} | {rate['flops'] / 1e9:.1f} | "
                  f"{pred * 1e3:.2f} | {got * 1e3:.2f} | {got / pred:.2f} |", flush=True)
        net = dict(c, bandwidth=args.net_bandwidth * 1e9,
                   fetch=(args.net_fetch / 1e3) if args.net_fetch is not None else c["fetch"])
        print()
        print(f"extrapolated (hop {net['hop'] * 1e3:.2f} ms, fetch {net['fetch'] * 1e3:.2f} ms, "
              f"{args.net_bandwidth:g} GB/s, fan-in 2, per-worker FLOP rate as measured):")
        print("| workload | W | predicted ms/step | compute share | speedup vs 1 |")
        print("|---|---|---|---|---|")
        for name, workers, batch, params, rate, pred, p in rows:
            if workers != 1:
                continue
            one = predict(net, 1, batch, params, p.recipe.state_bytes, p.recipe.leaf_bytes,
                          rate["flops"], rate["update"])
            for n in (8, 64, 512):
                t = predict(net, n, batch, params, p.recipe.state_bytes, p.recipe.leaf_bytes,
                            rate["flops"], rate["update"])
                fb = 6 * batch / n * params / rate["flops"]
                print(f"| {name} | {n} | {t * 1e3:.2f} | {fb / t:.0%} | {one / t:.2f} |")
    return 0


def _epochs(cfg: Any, epochs: int) -> Any:
    """``cfg`` for ``epochs`` epochs, with the update on the tree's root: the graph the model
    describes (replicated updates drop its broadcast term; see benchmarks/README.md)."""
    return cfg.replace(train={"epochs": epochs}, graph={"update": "root"})


if __name__ == "__main__":
    sys.exit(main())
