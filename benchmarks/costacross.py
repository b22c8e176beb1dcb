"""Predictions for many nodes: dtrain's described windows (a task per worker, each step's
sum by the schedule the engine would pick, :func:`described`) beside MPI running the same
sum, the driver's work per window (:func:`driver_seconds`), and their tables.  A window's
chains are simulated by :func:`benchmarks.costmodel.simulate` over measured
:class:`~benchmarks.costmodel.Wire` costs; :mod:`benchmarks.across_model` measures them and
prints these predictions.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

from dask.task_spec import TaskRef

from dtrain.taskgraph import span

from benchmarks.costmodel import Wire, config, simulate

NODES = (16, 64, 256)                   # nodes of the across-workers predictions
NODE_CORE_COUNT = 16                    # cores per node there (a worker per node)


def across(layers: tuple[int, ...], rows: int, nodes: int, node_cores: int, wires: dict[str, Wire],
           flops: float, update: float, n: int = 8) -> dict[str, float]:
    """Seconds per allreduce step of a net of ``layers``, ``rows`` rows per core, on
    ``nodes`` workers of ``node_cores`` cores (a worker per node, a shard per core), for each
    of ``wires``: dtrain's own window, cut into a task per worker as the engine cuts it
    (:func:`dtrain.taskgraph.span.cut`), timed by :func:`simulate`; the difference of a
    ``2 n``-step and an ``n``-step window over ``n`` steps, so the window's edges cancel."""
    p, names, placement, refs = _spanning(layers, rows, nodes, node_cores, 2 * n + 1)
    rank = {w: r for r, w in enumerate(names)}
    out: dict[str, float] = {}
    for name, wire in wires.items():
        times = []
        for steps in (n, 2 * n):
            win = p.builder.window([p.schedule[t] for t in range(steps)], p.initial_state(),
                                   refs, None, placement, "m")
            times.append(simulate(span.cut(win, rank), win.nbytes, wire, flops, p.net.size,
                                  update, node_cores))
        out[name] = (times[1] - times[0]) / n
    return out


def described(layers: tuple[int, ...], rows: int, nodes: int, node_cores: int, wire: Wire,
              flops: float, update: float, add: float, op: float | None = None
              ) -> tuple[float, str]:
    """Seconds per allreduce step of a net of ``layers``, ``rows`` rows per core, on
    ``nodes`` workers of ``node_cores`` cores (a worker per node, a shard per core), as the
    engine runs it now: each worker's chain built from a description
    (:mod:`dtrain.taskgraph.expand`), its shards' forward-backward on its cores and their
    sum in the tree's order (``add`` seconds a number, the buffer's ranges split over the
    cores), then the step's sum over the workers by the schedule the engine picks
    (:func:`dtrain.taskgraph.collective.choose`, timed by its ``simulate`` on ``wire``),
    then the update; ``wire.node`` per node of the chain (three a step), ``op`` (default
    ``wire.node``) per action of the sum's program.  Returns the seconds and the
    schedule."""
    from dtrain.taskgraph import collective

    p, names, placement, _ = _spanning(layers, rows, nodes, node_cores, 2)
    n = p.net.buffer_size
    shards = node_cores
    ways = max(1, min(node_cores, shards))
    compute = math.ceil(shards / ways) * 6 * rows * p.net.size / flops + \
        (shards - 1) * n * add / ways + update + 3 * wire.node
    if nodes == 1:
        return compute, "none"
    rank = {w: r for r, w in enumerate(names)}
    rank_of = tuple(rank[w] for w in placement.leaves)
    cw = collective.Wire(wire.alpha, wire.bandwidth, wire.node if op is None else op, add)
    best, times = collective.choose(len(rank_of), p.recipe.fan_in, rank_of, nodes, n, 4, cw,
                                    rank[placement.root])
    return compute + times[best], best


def driver_seconds(layers: tuple[int, ...], rows: int, nodes: int, node_cores: int,
                   n: int = 500) -> float:
    """Seconds the driver takes, on this machine, per step of a window of ``n`` steps that
    spans ``nodes`` workers of ``node_cores`` shards: the engine's list of the window's
    steps and its description to each worker (:func:`dtrain.taskgraph.describe.window`),
    what it does each window; the contexts it makes once per set of workers are left out
    (a run's, not a step's).  The window after next is built while one runs, so no step
    runs faster than this for long."""
    from dtrain.deploy import p2p
    from dtrain.taskgraph import describe, handoff
    from dtrain.training.engines import gc_paused

    p, names, placement, _ = _spanning(layers, rows, nodes, node_cores, 2)
    mesh = p2p.Mesh("m", tuple(names), (p2p.Place("", 0),) * nodes)
    lay = describe.layout(p.recipe, placement, False, mesh.workers)
    contexts = [f"context-0-{r}-m" for r in range(nodes)]
    best = math.inf
    with gc_paused():
        for first in range(0, 6 * n, n):
            start = time.perf_counter()
            steps = [p.schedule[t % len(p.schedule)] for t in range(first, first + n)]
            evals = {s.epoch: f"evaluate-{s.epoch + 1}-m" for s in steps if s.last}
            describe.window(first, first + n - 1, "m", lay, contexts,
                            handoff.Handed("m", first), handoff.Handed("m", first + n), 30.0,
                            None, None, evals, p.recipe.state_bytes, (False, ""))
            best = min(best, (time.perf_counter() - start) / n)
    return best


@functools.lru_cache(maxsize=8)
def _spanning(layers: tuple[int, ...], rows: int, nodes: int, node_cores: int, steps: int
              ) -> tuple[Any, list[str], Any, list[TaskRef]]:
    """A plan of ``steps`` allreduce steps over ``nodes`` workers of ``node_cores`` shards,
    the workers' names, their placement and the shards' references (the windows
    :func:`across` and :func:`driver_seconds` build)."""
    from dtrain.training.plan import plan

    p = plan(config(layers, rows, nodes * node_cores, "allreduce", steps=steps))
    names = [f"w{i}" for i in range(nodes)]
    refs = [TaskRef(f"load-shard-{i}") for i in range(nodes * node_cores)]
    return p, names, p.builder.place(names), refs


NODES_JSON = (16, 64, 256, 1024)        # nodes of the model's file (--json)


def across_rows(wires: dict[str, Wire], models: dict[str, tuple[tuple[int, ...], int, float,
                float]], latency: float, bandwidth: float, add: float,
                nodes_list: tuple[int, ...] = NODES, op: float | None = None
                ) -> list[dict[str, Any]]:
    """Predictions at ``nodes_list`` nodes of :data:`NODE_CORE_COUNT` cores (``models``: name
    -> (layers, rows per core, FLOP/s per core, update seconds)), each wire taken across a
    network of ``latency`` seconds and ``bandwidth`` bytes/s: dtrain's step
    (:func:`described`), the same schedule run with MPI's per-message cost, the driver's
    build per step (measured), and an MPI Allreduce's formula (reduce-scatter and
    allgather: ``2 ceil(log2 W)`` messages, ``2 (W - 1) / W`` of the buffer)."""
    net = {name: w.across(latency, bandwidth) for name, w in wires.items()}
    out = []
    for model, (layers, rows, flops, update) in models.items():
        params = sum(a * b + b for a, b in zip(layers[:-1], layers[1:]))
        compute = 6 * rows * params / flops + update
        grad = (params + 2) * 4                     # float32 [grad | loss | correct]
        for nodes in nodes_list:
            got = {name: described(layers, rows, nodes, NODE_CORE_COUNT, w, flops, update, add,
                                   op if name == "dtrain" else None)
                   for name, w in net.items()}
            best = net.get("mpi", next(iter(net.values())))
            ring = compute + 2 * (nodes - 1) / nodes * grad / best.bandwidth + \
                2 * math.ceil(math.log2(nodes)) * best.alpha
            out.append({"model": model, "nodes": nodes, "cores": nodes * NODE_CORE_COUNT,
                        "compute": compute, "allreduce": ring,
                        **{name: t for name, (t, _) in got.items()},
                        "schedule": got["dtrain"][1],
                        "driver": driver_seconds(layers, rows, nodes, NODE_CORE_COUNT)})
    return out


def strong_rows(wires: dict[str, Wire], models: dict[str, tuple[tuple[int, ...], int, float,
                float]], latency: float, bandwidth: float, add: float,
                nodes_list: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                op: float | None = None) -> dict[str, list[dict[str, float]]]:
    """Strong scaling, as the seed studies drew it: each model's global minibatch (its rows
    per core on 16 nodes of :data:`NODE_CORE_COUNT` cores) split over more and more nodes;
    per node count dtrain's predicted step (:func:`described`) and an MPI Allreduce loop's
    (formula), and the speedup of each over its own step on one node."""
    net = {name: w.across(latency, bandwidth) for name, w in wires.items()}
    out: dict[str, list[dict[str, float]]] = {}
    for model, (layers, rows16, flops, update) in models.items():
        batch = rows16 * 16 * NODE_CORE_COUNT
        params = sum(a * b + b for a, b in zip(layers[:-1], layers[1:]))
        grad = (params + 2) * 4
        best = net.get("mpi", next(iter(net.values())))
        series = []
        for nodes in nodes_list:
            rows = max(1, batch // (nodes * NODE_CORE_COUNT))
            dt, _ = described(layers, rows, nodes, NODE_CORE_COUNT, net["dtrain"], flops,
                              update, add, op)
            mpi = 6 * rows * params / flops + update + (
                2 * (nodes - 1) / nodes * grad / best.bandwidth +
                2 * math.ceil(math.log2(nodes)) * best.alpha if nodes > 1 else 0.0)
            series.append({"nodes": nodes, "rows_per_core": rows, "dtrain_ms": dt * 1e3,
                           "mpi_allreduce_ms": mpi * 1e3})
        for row in series:
            row["dtrain_speedup"] = series[0]["dtrain_ms"] / row["dtrain_ms"]
            row["mpi_speedup"] = series[0]["mpi_allreduce_ms"] / row["mpi_allreduce_ms"]
        out[model] = series
    return out


def as_json(rows: list[dict[str, Any]], wires: dict[str, Wire], latency: float,
            bandwidth: float, add: float, op: float = 0.0) -> dict[str, Any]:
    """The predictions as ``{model: {nodes: {"dtrain_ms", "driver_ms", "mpi_allreduce_ms",
    ...}}}``, with the measured constants they came from under ``"constants"``."""
    out: dict[str, Any] = {}
    for r in rows:
        out.setdefault(r["model"], {})[str(r["nodes"])] = {
            "dtrain_ms": r["dtrain"] * 1e3, "driver_ms": r["driver"] * 1e3,
            "mpi_allreduce_ms": r["allreduce"] * 1e3, "compute_ms": r["compute"] * 1e3,
            **({"mpi_same_schedule_ms": r["mpi"] * 1e3} if "mpi" in r else {}),
            "schedule": r["schedule"],
            "ratio": max(r["dtrain"], r["driver"]) / r["allreduce"]}
    out["constants"] = {
        "wires": {name: {"alpha_us": w.alpha * 1e6, "bandwidth_gb_s": w.bandwidth / 1e9,
                         "per_node_us": w.node * 1e6} for name, w in wires.items()},
        "network": {"latency_us": latency * 1e6, "bandwidth_gb_s": bandwidth / 1e9},
        "add_ns_per_number": add * 1e9, "sum_op_us": op * 1e6, "node_cores": NODE_CORE_COUNT,
        "measured": "this machine (python -m benchmarks.model --across)"}
    return out


def markdown_across(rows: list[dict[str, Any]], names: tuple[str, str] = ("dtrain", "mpi")
                    ) -> str:
    """The across-workers predictions as one Markdown table (and the driver's pace, measured)."""
    a, b = names
    lines = ["| model | nodes | cores | compute ms/step | dtrain ms/step (prediction) | "
             "its sum | driver builds ms/step (measured here) | MPI, the same schedule, "
             "ms/step (prediction) | MPI Allreduce (formula) ms/step | dtrain, at the slower "
             "of the two, / MPI Allreduce |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        driver = r.get("driver", 0.0)
        lines.append(f"| {r['model']} | {r['nodes']} | {r['cores']:,} | "
                     f"{r['compute'] * 1e3:.2f} | {r[a] * 1e3:.2f} | {r['schedule']} | "
                     f"{driver * 1e3:.3f} | {r[b] * 1e3:.2f} | {r['allreduce'] * 1e3:.2f} | "
                     f"{max(r[a], driver) / r['allreduce']:.2f} |")
    return "\n".join(lines)
