"""Across workers (issue 36): a synchronous step that spans worker processes, beside MPI.

Each worker process stands for a node.  For every workload and worker count that
ran, one row: the mpi4py Allreduce loop (the anchor), PyTorch DDP, dtrain on a
LocalCluster of one process per worker (``dtrain-allreduce``; ``-tcp``: its
worker-to-worker messages over TCP, as between machines, instead of a Unix
socket between processes of one machine), dtrain under mpiexec with TLS
(``dtrain-mpi-allreduce``, ``-tcp`` likewise: TLS on those sockets too), and
Dask's floor (the per-step graph with the maths taken out, through the
scheduler).  Ratios are of median epoch times in this one invocation; the
scheduler's tasks per training step are what the scheduler counted
(``summary.json`` ``scheduler_tasks_per_step``), per worker.

    python -m benchmarks --workloads P3,iris,P2 --workers 2,4 --repeat 3 \\
        --contenders mpi-allreduce,torch-ddp,dtrain-allreduce,dtrain-mpi-allreduce,dask-floor
"""
from __future__ import annotations

from typing import Any

Table = tuple[str, list[str], list[list[str]], str]

MPI, DDP, FLOOR = "mpi-allreduce", "torch-ddp", "dask-floor"
LOCAL, LOCAL_TCP = "dtrain-allreduce", "dtrain-allreduce-tcp"
SEGMENTS = "dtrain-allreduce-segments"
ON_MPI, ON_MPI_TCP = "dtrain-mpi-allreduce", "dtrain-mpi-allreduce-tcp"
DTRAIN = (LOCAL, LOCAL_TCP, SEGMENTS, ON_MPI, ON_MPI_TCP)
COLUMNS = (MPI, DDP, *DTRAIN, FLOOR)
# (contender, workloads, worker counts, what, goal): the issue's goals
GOALS = [(LOCAL, ("P2", "P3"), (2, 4), "x MPI", 1.5),
         (LOCAL, ("iris",), (2, 4), "x MPI", 3.0),
         (LOCAL, ("P2", "P3", "iris"), (2, 4), "x DDP", 1.0),
         (ON_MPI, ("P2", "P3"), (2,), "x MPI", 1.5),
         (LOCAL, ("P2", "P3", "iris"), (2, 4), "scheduler tasks / step / worker", 0.1)]


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def measures(rows: list[dict[str, Any]], workload: str, workers: int, name: str
             ) -> dict[str, float | None]:
    """A contender's ratios to MPI and DDP and its scheduler tasks per step and worker."""
    at = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    row = at.get((workload, workers, name)) or {}
    epoch = row.get("epoch_s")
    tasks = row.get("sched_tasks_per_step")
    return {"x MPI": _ratio(epoch, (at.get((workload, workers, MPI)) or {}).get("epoch_s")),
            "x DDP": _ratio(epoch, (at.get((workload, workers, DDP)) or {}).get("epoch_s")),
            "scheduler tasks / step / worker": None if tasks is None else tasks / workers,
            "head CPU ms / step": row.get("head_cpu_ms")}


def goal_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every goal of :data:`GOALS` whose cell ran."""
    out = []
    for name, workloads, counts, what, goal in GOALS:
        for wl in workloads:
            for n in counts:
                value = measures(rows, wl, n, name)[what]
                if value is not None:
                    out.append({"contender": name, "workload": wl, "workers": n, "what": what,
                                "goal": goal, "value": value, "met": value <= goal})
    return out


def tables(results: dict[str, Any]) -> list[Table]:
    rows = [r for r in results["rows"] if r["contender"] in COLUMNS and r["workers"] > 1]
    if not any(r["contender"] in DTRAIN for r in rows):
        return []
    at = {(r["workload"], r["workers"], r["contender"]): r for r in rows}
    cells = sorted({(r["workload"], r["workers"]) for r in rows},
                   key=lambda c: (list(results["workloads"]).index(c[0]), c[1]))
    shown = [c for c in COLUMNS if any(r["contender"] == c for r in rows)]
    body = []
    for wl, n in cells:
        line = [wl, str(n)] + [_f((at.get((wl, n, c)) or {}).get("epoch_s"), ".4f")
                               for c in shown]
        for name in (c for c in shown if c in DTRAIN):
            m = measures(rows, wl, n, name)
            line.append(f"{_f(m['x MPI'], '.2f')} / {_f(m['x DDP'], '.2f')} / "
                        f"{_f(m['scheduler tasks / step / worker'], '.3f')} / "
                        f"{_f(m['head CPU ms / step'], '.3f')}")
        body.append(line)
    header = ["workload", "workers", *(f"{c} s" for c in shown),
              *(f"{c}: x MPI / x DDP / sched. tasks per step and worker / head CPU ms per "
                f"step" for c in shown if c in DTRAIN)]
    out: list[Table] = [(
        "Across workers (issue 36): median epoch seconds, dtrain's ratios and scheduler tasks",
        header, body,
        "Each worker process stands for a node (and the machine's cores are shared by all: "
        "where dtrain's workers outnumber them, each is pinned to one, neighbours together). "
        "dtrain-allreduce: a LocalCluster of one single-thread process per worker, a window "
        "one task per worker, the step's sums sent worker to worker (a Unix socket between "
        "processes of one machine); -tcp: over TCP, as between machines; -segments: "
        "each step's sums reduced in segments (graph.reduce = segments); "
        "dtrain-mpi-allreduce: the same under mpiexec with the cluster on TLS (-tcp: the "
        "worker-to-worker sockets on TLS too); dask-floor: the per-step graph with no maths "
        "through the scheduler. Scheduler tasks: counted by the scheduler over the whole run "
        "(loading, evaluation and windows), per training step and worker. Head CPU: the "
        "driver's process (with a LocalCluster's scheduler, or the head rank's) between its "
        "first and last epoch rows, per step (summary.json head_cpu_ms_per_step).")]
    checks = goal_checks(rows)
    if checks:
        out.append(("Across workers: the goals (issue 36)",
                    ["contender", "workload", "workers", "measure", "goal", "value", "met"],
                    [[c["contender"], c["workload"], str(c["workers"]), c["what"],
                      f"<= {c['goal']:g}", f"{c['value']:.3f}", "yes" if c["met"] else "NO"]
                     for c in checks],
                    "Ratios of median epoch times in this run."))
    return out
