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
  ``tasks(W) * task``;
* ``transfer``: the scheduler's CPU per value that crosses workers, and
  ``task_cpu``, ``transfer_cpu``: what all processes together (scheduler,
  client, workers) spend per task and per transfer (pairs of tiny tasks,
  the second on the same worker or on the other).

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
workers to compare.

``python -m benchmarks.model --across`` (issue 36; :mod:`benchmarks.across_model`) refits
the model of a window that
spans workers, which the engine runs as a task per worker with the crossings sent
worker to worker: it measures what one message costs (``benchmarks.p2p``: dtrain's
mesh over TCP, and mpi4py point-to-point where mpiexec is here) and what dtrain's
chain spends per task beyond the task, checks the model against dtrain runs of
P3 and iris on 2 and 4 worker processes here, and predicts 16, 64 and 256 nodes of
16 cores (a worker per node) on a cluster network (``--net-latency``,
``--net-bandwidth``) beside an MPI program that runs the same tree with MPI's
per-message cost, and beside a bandwidth-optimal MPI Allreduce (formula).

The layout model (:mod:`benchmarks.costmodel`, issue 22) counts every task
and transfer of dtrain's own graph for each strategy and layout, and
predicts the default (replicated) step from them and the same constants.  It
is checked here against dtrain runs of 1 to 16 shards (``--widths``), in one
worker process of a thread per shard (hybrid) and in a single-thread process
per shard (flat), and predicts 64, 256 and 1,024 cores on 16- and 64-core
nodes with a cluster network's figures (``--net-bandwidth``, ``--net-fetch``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import costmodel
from benchmarks.costmodel import CHECK_MODELS
from benchmarks.measured import _epochs, _hop, compute_rates, measured_run, measured_step
from dtrain.deploy.options import LOOPBACK, NO_DASHBOARD

DEFAULT_WORKLOADS = "iris,P3,P2,P1"


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


def constants(client: Any) -> dict[str, float]:
    """hop, fetch and bandwidth on this cluster's first two workers, the CPU a task and a
    transfer cost, and a message's alpha and bandwidth between them on dtrain's mesh."""
    from dtrain.deploy.workers import worker_addresses

    a, b = worker_addresses(client)[:2]
    hop = chain_seconds(client, [a], 200, 1024)
    small = chain_seconds(client, [a, b], 200, 1024)
    big_bytes = 8 << 20
    big = chain_seconds(client, [a, b], 40, big_bytes)
    wall, cpu = wide_seconds(client, 2000)
    from benchmarks import p2p          # a window across workers: its messages' wire
    alpha, bandwidth = p2p.wire({label: p2p.mesh_round_trip(client, a, b, nbytes, 100, True)
                                 for label, nbytes in p2p.SIZES.items() if "400" not in label})
    return {"hop": hop, "fetch": small - hop,
            "bandwidth": (big_bytes - 1024) / max(big - small, 1e-9), "task": cpu,
            "task_wall": wall, "p2p_alpha": alpha, "p2p_bandwidth": bandwidth,
            **transfer_costs(client, a, b, 1000)}


def _cpu(dask_worker: Any = None, dask_scheduler: Any = None) -> float:
    return time.process_time()


def _all_cpu(client: Any) -> float:
    """CPU seconds of the scheduler's process (the client's too, on a LocalCluster) and of
    every worker, so far."""
    return client.run_on_scheduler(_cpu) + sum(client.run(_cpu).values())


def transfer_costs(client: Any, a: str, b: str, n: int) -> dict[str, float]:
    """Per task and per transfer: the scheduler thread's CPU (``transfer``) and every
    process's (``task_cpu``, ``transfer_cpu``), from ``n`` pairs of tiny tasks whose second
    runs on worker ``a`` (no transfer) or ``b`` (one); best of three."""
    import dask

    from dtrain.deploy import tuning

    inline = tuning.inline_executor(client)
    best: dict[str, float] = {}
    for r in range(3):
        for where in ("local", "cross"):
            dsk = {f"{where}-{r}-src-{i}": (_payload, 64) for i in range(n)}
            dsk |= {f"{where}-{r}-dst-{i}": (_hop, f"{where}-{r}-src-{i}") for i in range(n)}
            place = {k: [b if where == "cross" and "-dst-" in k else a] for k in dsk}
            before, sched = _all_cpu(client), client.run_on_scheduler(_thread_cpu)
            with dask.annotate(workers=place.__getitem__, allow_other_workers=False,
                               executor=tuning.INLINE if inline else "default"):
                client.get(dsk, list(dsk)[n:])
            spent = (_all_cpu(client) - before, client.run_on_scheduler(_thread_cpu) - sched)
            best[where] = min(best.get(where, (math.inf, math.inf)), spent)
    (local_all, local_s), (cross_all, cross_s) = best["local"], best["cross"]
    return {"transfer": max(cross_s - local_s, 0.0) / n, "task_cpu": local_all / (2 * n),
            "transfer_cpu": max(cross_all - local_all, 0.0) / n}


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
    ap.add_argument("--widths", default="1,2,4",
                    help="shard counts of the layout check (issue 22: 1,2,4,8,16)")
    ap.add_argument("--across", action="store_true",
                    help="issue 36: windows that span workers, worker-to-worker messages "
                         "(measured), predicted at 16, 64 and 256 nodes beside MPI")
    ap.add_argument("--json", type=Path, default=None,
                    help="--across: also write the predictions (16 to 1,024 nodes, strong "
                         "scaling) and the measured constants to this JSON file")
    ap.add_argument("--net-latency", type=float, default=2.0,
                    help="--across: microseconds a message across the network adds "
                         "(default 2: InfiniBand)")
    ap.add_argument("--scales", default=",".join(map(str, costmodel.SCALES)),
                    help="cores of the layout model's predictions (default: 64,256,1024)")
    ap.add_argument("--check-models", default=",".join(CHECK_MODELS),
                    help=f"networks of the layout check, of {', '.join(CHECK_MODELS)} "
                         f"('' for none)")
    args = ap.parse_args(argv)
    bad = [m for m in args.check_models.split(",") if m and m not in CHECK_MODELS]
    if bad or not _widths(args.widths) or not _widths(args.scales):
        what = f"--check-models {bad[0]!r}" if bad else f"--widths {args.widths!r}" \
            if not _widths(args.widths) else f"--scales {args.scales!r}"
        print(f"benchmarks.model: error: {what}: expected {', '.join(CHECK_MODELS)} and "
              f"positive shard or core counts, e.g. --widths 1,2,4,8,16", file=sys.stderr)
        return 2
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"                   # as the benchmark contenders; workers inherit it
    if args.across:
        from benchmarks.across_model import main as across
        return across(args)

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
                         host=LOOPBACK, dashboard_address=NO_DASHBOARD) as lc, \
            Client(lc) as client:
        tuning.low_latency(client)
        c = constants(client)
        print(f"constants (this machine, 2 worker processes): hop {c['hop'] * 1e3:.2f} ms, "
              f"fetch {c['fetch'] * 1e3:.2f} ms, bandwidth {c['bandwidth'] / 1e9:.2f} GB/s, "
              f"scheduler CPU {c['task'] * 1e3:.3f} ms per task "
              f"({c['task_wall'] * 1e3:.3f} ms of wall time per task over the cluster) and "
              f"{c['transfer'] * 1e3:.3f} ms per transfer; all processes' CPU "
              f"{c['task_cpu'] * 1e3:.3f} ms per task, {c['transfer_cpu'] * 1e3:.3f} ms per "
              f"transfer")
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
                                     host=LOOPBACK, dashboard_address=NO_DASHBOARD) as one, \
                        Client(one) as c1:
                    got = measured_step(_epochs(cfg, args.epochs), c1)
            else:
                got = measured_step(_epochs(cfg, args.epochs), runner)
            print(f"| {name} | {workers} | {batch:.0f} | {params:,} | {rate['flops'] / 1e9:.1f} | "
                  f"{pred * 1e3:.2f} | {got * 1e3:.2f} | {got / pred:.2f} |", flush=True)
        net = dict(c, bandwidth=args.net_bandwidth * 1e9,
                   fetch=(args.net_fetch / 1e3) if args.net_fetch is not None else c["fetch"])
        checks = [m for m in args.check_models.split(",") if m]
        scale = {"tiny": (CHECK_MODELS["tiny"][0], CHECK_MODELS["tiny"][1])} | {
            name: (tuple(p.config.model.layers), max(1, round(batch / 2)))
            for name, workers, batch, params, rate, pred, p in rows if workers == 1}
        rates = {name: client.run(compute_rates, costmodel.config(layers, r, 1), r,
                                  workers=worker_addresses(client)[:1]).popitem()[1]
                 for name, (layers, r) in ({m: CHECK_MODELS[m] for m in checks} | scale).items()}
    print()
    print(layout_check(c, checks, _widths(args.widths), rates, args.epochs))
    print()
    print(f"Predictions, not measurements (issue 22's layout model): a shard per core of the "
          f"rows below, hop {net['hop'] * 1e3:.2f} ms, fetch {c['fetch'] * 1e3:.2f} ms within a "
          f"node and {net['fetch'] * 1e3:.2f} ms across nodes, {args.net_bandwidth:g} GB/s "
          f"between nodes, fan-in 2, the scheduler's CPU per task and transfer and the FLOP "
          f"rate per thread as measured here; local SGD with sync_every = "
          f"{costmodel.LOCAL_SGD_EVERY}:")
    models = {name: (layers, r, rates[name]["flops"], rates[name]["update"])
              for name, (layers, r) in scale.items()}
    for name, (layers, r, _, _) in models.items():
        print(f"* {name}: {'-'.join(map(str, layers))}, {r} rows per core and step")
    print()
    print(costmodel.markdown_scale(costmodel.scale_rows(c, models, net,
                                                        scales=tuple(_widths(args.scales)))))
    return 0


def _widths(text: str) -> list[int]:
    try:
        widths = sorted({int(w) for w in text.split(",")})
    except ValueError:
        return []
    return widths if widths and widths[0] >= 1 else []


def layout_check(c: dict[str, float], models: list[str], widths: list[int],
                 rates: dict[str, dict[str, float]], epochs: int) -> str:
    """The layout model against dtrain runs here: each check model at each width, hybrid (one
    worker process, a thread per shard) and flat (a single-thread process per shard), the
    default replicated allreduce step, a shard's rows fixed (the batch grows with the width)."""
    from distributed import Client, LocalCluster

    from dtrain.deploy import tuning
    from dtrain.deploy.layout import machine_cores

    cores = machine_cores()
    lines = [f"Layout check on this machine ({cores} cores): predicted and measured ms per step",
             "", "| model | layout | shards | tasks/step (graph) | tasks/step (run) | bound | "
             "predicted ms/step | measured ms/step | measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in models:
        layers, rows = CHECK_MODELS[name]
        params = sum(a * b + b for a, b in zip(layers[:-1], layers[1:]))
        for hybrid in (True, False):
            for n in widths:
                shape = costmodel.Layout(1, n, hybrid)        # one machine, a shard per thread
                step = costmodel.count(layers, rows, shape)
                pred = costmodel.predict(c, step, shape, params, rows, rates[name]["flops"],
                                         rates[name]["update"], cores=cores)
                cfg = costmodel.config(layers, rows, n, steps=40).replace(
                    train={"epochs": epochs})
                with tuning.allocator_env(), \
                        LocalCluster(n_workers=1 if hybrid else n,
                                     threads_per_worker=n if hybrid else 1, processes=True,
                                     host=LOOPBACK, dashboard_address=NO_DASHBOARD) as lc, \
                        Client(lc) as client:
                    got, summary = measured_run(cfg, client)
                lines.append(f"| {name} | {shape.name} | {n} | {step.tasks:.2f} | "
                             f"{summary.get('tasks_per_step') or 0:.2f} | {pred['bound']} | "
                             f"{pred['seconds'] * 1e3:.2f} | {got * 1e3:.2f} | "
                             f"{got / pred['seconds']:.2f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
