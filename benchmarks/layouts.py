"""The layout study (issue 22): hybrid beside flat, per shard count, in one run.

For every workload and shard count (``--workers``) that ran, one row per
layout contender: ms per step, dtrain's overhead per step (``summary.json``
``overhead_per_step``: wall time beyond the step's critical-path compute), the
tasks and the transfers between workers per step (from dtrain's graphs), and
the ratios to the mpi4py Allreduce trainer at the same core count and to a bare
Dask chain of the same width.  Then the layout goal: with 16 shards of a tiny
net, the default layout's step at least 5 times shorter than 16 single-thread
worker processes'.

    python -m benchmarks --workloads iris,P3,P2,P1 --workers 1,2,4,8,16 --repeat 2 \\
        --contenders mpi-allreduce,dtrain-default,dtrain-threads,dtrain-threads-tasks,\\
dtrain-threads-fused,dtrain-allreduce,dask-chain,dask-chain-threads
"""
from __future__ import annotations

from typing import Any

Table = tuple[str, list[str], list[list[str]], str]

HYBRID, FLAT, DEFAULT = "dtrain-threads", "dtrain-allreduce", "dtrain-default"
CHAIN, MPI = "dask-chain", "mpi-allreduce"
CONTENDERS = (DEFAULT, HYBRID, "dtrain-threads-tasks", "dtrain-threads-fused", FLAT, MPI,
              CHAIN, "dask-chain-threads")
GOAL = ("iris", 16, 5.0)        # workload, shards, least flat / default ratio (issue 22)


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def goal_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """flat / default and flat / hybrid ms per step at every workload and shard count where
    they ran; the (workload, shards) of :data:`GOAL` carries its goal."""
    at = {(r["workload"], r["workers"], r["contender"]): r["ms_per_step"] for r in rows}
    out = []
    for wl, n in sorted({(r["workload"], r["workers"]) for r in rows}):
        flat = at.get((wl, n, FLAT))
        default, hybrid = at.get((wl, n, DEFAULT)), at.get((wl, n, HYBRID))
        if flat is None or (default is None and hybrid is None) or n < 2:
            continue
        goal = GOAL[2] if (wl, n) == GOAL[:2] else None
        value = _ratio(flat, default)
        out.append({"workload": wl, "shards": n, "flat_ms": flat, "default_ms": default,
                    "hybrid_ms": hybrid, "flat_over_default": value,
                    "flat_over_hybrid": _ratio(flat, hybrid), "goal": goal,
                    "met": None if goal is None or value is None else value >= goal})
    return out


def tables(results: dict[str, Any]) -> list[Table]:
    """The side-by-side table and the goal table (none if fewer than two layout contenders
    ran)."""
    rows = [r for r in results["rows"] if r["contender"] in CONTENDERS and r["ms_per_step"]]
    if len({r["contender"] for r in rows}) < 2:
        return []
    at = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    order = {name: i for i, name in enumerate(CONTENDERS)}
    rows.sort(key=lambda r: (list(results["workloads"]).index(r["workload"]), r["workers"],
                             order[r["contender"]]))
    body = []
    for r in rows:
        mpi = at.get((r["workload"], r["workers"], MPI), {}).get("ms_per_step")
        chain = at.get((r["workload"], r["workers"], CHAIN), {}).get("ms_per_step")
        body.append([r["workload"], str(r["workers"]), r["contender"],
                     f"{r['processes']}{'*' if r['oversubscribed'] else ''}",
                     _f(r["ms_per_step"], ".2f"), _f(r.get("overhead_ms"), ".2f"),
                     _f(r.get("tasks_per_step"), ".2f"), _f(r.get("transfers_per_step"), ".2f"),
                     _f(_ratio(r["ms_per_step"], mpi), ".2f"),
                     _f(_ratio(r["ms_per_step"], chain), ".2f")])
    side = ("Layouts side by side (issue 22): ms per step by shard count",
            ["workload", "shards", "contender", "procs", "ms/step", "overhead ms/step",
             "tasks/step", "transfers/step", "x MPI", "x chain"], body,
            "shards = --workers: dtrain-threads is the hybrid layout (one worker process, a "
            "thread per shard), dtrain-allreduce the flat one (a single-thread process per "
            "shard), dtrain-default what python -m dtrain starts on this machine "
            "(cluster.layout = hybrid: a thread per core, at most one per shard); -tasks and "
            "-fused force graph.fuse_shards off and on (dtrain-threads: auto).  overhead "
            "ms/step: wall time per step minus its critical-path compute (summary.json "
            "overhead_per_step, over the whole run, epoch 1 included, so it can exceed the "
            "median ms/step of the later epochs); tasks/step and transfers/step: from "
            "dtrain's graphs "
            "(summary.json), dask-chain's 2 W.  x MPI: over mpi4py Allreduce at the same "
            "core count; x chain: over dask-chain, a bare Dask chain of the same width on "
            "W processes.  procs marked *: oversubscribed.")
    checks = goal_checks(results["rows"])
    if not checks:
        return [side]
    gbody = [[c["workload"], str(c["shards"]), _f(c["flat_ms"], ".2f"),
              _f(c["default_ms"], ".2f"), _f(c["hybrid_ms"], ".2f"),
              _f(c["flat_over_default"], ".2f"), _f(c["flat_over_hybrid"], ".2f"),
              "-" if c["goal"] is None else
              f">= {c['goal']:g}: {'-' if c['met'] is None else 'yes' if c['met'] else 'NO'}"]
             for c in checks]
    goal = ("Layout goal (issue 22): flat / default ms per step",
            ["workload", "shards", "flat ms", "default ms", "hybrid ms", "flat / default",
             "flat / hybrid", "goal"], gbody,
            f"Goal: with {GOAL[1]} shards of {GOAL[0]}'s tiny net, the default layout's step "
            f"at least {GOAL[2]:g} times shorter than {GOAL[1]} single-thread worker "
            f"processes' (dtrain-allreduce).")
    return [side, goal]
