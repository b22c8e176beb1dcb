"""``python -m benchmarks.model --across`` (issue 36): the cost model of a window that spans
workers, refitted to the worker-to-worker mesh and predicted at scale.

The engine runs such a window as a task per worker, its crossings sent worker to worker
(:mod:`dtrain.taskgraph.span`).  This measures what one message costs
(:mod:`benchmarks.p2p`: dtrain's mesh over TCP and Unix sockets, and mpi4py
point-to-point where mpiexec is here) and what dtrain's chain spends per task beyond the
task, checks the model (:func:`benchmarks.costacross.across`) against dtrain runs of P3
and iris on 1, 2 and 4 worker processes here, and predicts 16, 64 and 256 nodes of 16
cores (a worker per node) on a cluster network (``--net-latency``, ``--net-bandwidth``)
beside an MPI program that runs the same tree with MPI's per-message cost, and beside a
bandwidth-optimal MPI Allreduce (formula).  The constants and the measured runs come from
:mod:`benchmarks.model`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from benchmarks import costacross, costmodel
from benchmarks.measured import _epochs, _hop, compute_rates, measured_step


ACROSS_MODELS = {"P3": ((784, 128, 10), 16), "P2": ((784, 1024, 10), 64)}   # rows per core


def node_seconds(n: int = 20000) -> float:
    """What dtrain's chain spends per task beyond the task's own work
    (:func:`dtrain.taskgraph.fuse.run_chain` over ``n`` tasks that do nothing)."""
    from dask.task_spec import TaskRef

    from dtrain.taskgraph import fuse

    nodes = [("k-0", None, (0,))] + [(f"k-{i}", _hop, (TaskRef(f"k-{i - 1}"),))
                                    for i in range(1, n)]
    chain = fuse.chain_of(nodes, [None] * n, (f"k-{n - 1}",), 1)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        fuse.run_chain(chain)
        best = min(best, time.perf_counter() - start)
    return best / n


def _tasks_per_step(cfg: Any, steps: int = 16) -> float:
    """Tasks per step of ``cfg``'s window on one worker, as its fused chain runs them."""
    from dask.task_spec import TaskRef

    from dtrain.taskgraph import fuse
    from dtrain.training.plan import plan

    p = plan(cfg)
    placement = p.builder.place(["w0"])
    refs = [TaskRef(f"load-shard-{i}") for i in range(len(p.ranges))]
    win = p.builder.window([p.schedule[t] for t in range(steps)], p.initial_state(), refs,
                           None, placement, "m")
    return len(fuse.steps(win, 0, steps - 1, "m").steps_fused.nodes) / steps


def add_seconds(n: int = 1 << 20) -> float:
    """Seconds NumPy takes to add one float32 number into another (``a += b`` over ``n``),
    on this machine: what a sum of gradients costs per number."""
    import numpy as np

    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        a += b
        best = min(best, time.perf_counter() - start)
    return best / n


def main(args: Any) -> int:
    """``--across``: the wires measured here, the model checked here, predictions at scale
    (and, with ``--json``, the model's file)."""
    import json

    from benchmarks import p2p
    from benchmarks.run import DEFAULT_DATA
    from benchmarks.workloads import load_workloads

    repeat = 100
    measured = p2p.on_cluster(False, repeat, kinds=("unix", "tcp"))
    mpi = p2p.mpi(repeat)
    node = node_seconds()
    add = add_seconds()
    wires = {"dtrain": costmodel.Wire(*p2p.wire(measured["tcp"]), node)}
    local = costmodel.Wire(*p2p.wire(measured["unix"]), node)
    if mpi is not None:
        wires["mpi"] = costmodel.Wire(*p2p.wire(mpi), 0.0)
    for name, w in [("dtrain, TCP", wires["dtrain"]), ("dtrain, Unix socket", local),
                    *([("MPI", wires["mpi"])] if mpi is not None else [])]:
        print(f"wire {name}: {w.alpha * 1e6:.1f} us + bytes at {w.bandwidth / 1e9:.2f} GB/s; "
              f"{w.node * 1e6:.1f} us per task in a chain")
    print(f"a sum: {add * 1e9:.2f} ns a float32 number; an action of a step's sum's program: "
          f"{node * 1e6:.1f} us (a chain's no-op task)")
    if mpi is None:
        print("no mpiexec/mpi4py here: the MPI columns are left out")
    # the model against dtrain here: a worker process per "node", the cores shared
    from distributed import Client, LocalCluster
    import dask
    from dtrain.deploy import tuning
    from dtrain.deploy.layout import machine_cores
    from dtrain.deploy.options import LOOPBACK, NO_DASHBOARD
    from dtrain.training.plan import plan

    data_dir = args.data_dir or DEFAULT_DATA
    table = load_workloads()
    print()
    print("| workload | workers | chain's own cost per task (us, from 1 worker) | "
          "predicted ms/step | measured ms/step | measured / predicted |")
    print("|---|---|---|---|---|---|")
    fitted = {}
    for name in ("P3", "iris"):
        w = table[name]
        if w.cannot_run(2, data_dir):
            print(f"| {name} | - | - | - | - | skipped: {w.cannot_run(2, data_dir)} |")
            continue
        for workers in (1, 2, 4):
            cfg = _epochs(w.config_for(workers, "allreduce", workers, data_dir),
                          args.epochs).replace(graph={"update": "auto"})
            p = plan(cfg)
            rows = max(1, round(p.train_samples / p.schedule.steps_per_epoch / workers))
            with dask.config.set({"distributed.scheduler.work-stealing": False}), \
                    tuning.allocator_env(), \
                    LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                 host=LOOPBACK, dashboard_address=NO_DASHBOARD) as lc, \
                    Client(lc) as client:
                rate = client.run(compute_rates, cfg, rows).popitem()[1]
                got = measured_step(cfg, client)
            # each worker a node of one core, but the machine's cores are shared: a core's
            # rate divided by the workers over its cores
            share = min(1.0, machine_cores() / workers)
            layers = tuple(cfg.model.layers)
            if workers == 1:        # one worker: the fused chain, what it costs beyond maths
                bare = costacross.across(layers, rows, 1, 1, {"bare": local}, rate["flops"],
                                        rate["update"])["bare"]
                fitted[name] = node + max(got - bare, 0.0) / _tasks_per_step(cfg)
                continue
            wire = dataclasses.replace(local, node=fitted[name])
            pred, _ = costacross.described(layers, rows, workers, 1, wire, rate["flops"] * share,
                                          rate["update"] / share, add / share, node / share)
            print(f"| {name} | {workers} | {fitted[name] * 1e6:.1f} | {pred * 1e3:.2f} | "
                  f"{got * 1e3:.2f} | {got / pred:.2f} |", flush=True)
    if "P3" in fitted:                     # the chain's own cost of a P3-sized step, at scale
        wires = {k: dataclasses.replace(w, node=fitted["P3"]) if k == "dtrain" else w
                 for k, w in wires.items()}
    with tuning.allocator_env(), LocalCluster(n_workers=1, threads_per_worker=1,
                                              processes=True, host=LOOPBACK,
                                              dashboard_address=NO_DASHBOARD) as lc, \
            Client(lc) as client:
        rates = {m: client.run(compute_rates, costmodel.config(layers, r, 1), r).popitem()[1]
                 for m, (layers, r) in ACROSS_MODELS.items()}
    models = {m: (layers, r, rates[m]["flops"], rates[m]["update"])
              for m, (layers, r) in ACROSS_MODELS.items()}
    latency, bandwidth = args.net_latency * 1e-6, args.net_bandwidth * 1e9
    nodes = costacross.NODES_JSON if args.json else costacross.NODES
    rows = costacross.across_rows(wires, models, latency, bandwidth, add, nodes, node)
    print()
    print(f"Predictions, not measurements: {costacross.NODE_CORE_COUNT}-core nodes, a worker per "
          f"node, a shard per core, fan-in 2, replicated updates; a network of "
          f"{args.net_latency:g} us and {args.net_bandwidth:g} GB/s; each message costs its "
          f"software's alpha (measured here) plus the network's latency, its bytes at the lesser "
          f"bandwidth; the FLOP rate per core as measured here.")
    for m, (layers, r, _, _) in models.items():
        print(f"* {m}: {'-'.join(map(str, layers))}, {r} rows per core and step")
    print()
    print(costacross.markdown_across(rows, ("dtrain", "mpi") if mpi is not None
                                    else ("dtrain", "dtrain")))
    if args.json:
        found = costacross.as_json(rows, wires, latency, bandwidth, add, node)
        found["strong"] = costacross.strong_rows(wires, models, latency, bandwidth, add, op=node)
        args.json.write_text(json.dumps(found, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 0
