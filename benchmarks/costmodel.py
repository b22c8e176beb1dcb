"""The layout cost model (issue 22): a step's time from its graph and measured constants.

:mod:`benchmarks.model` measures the constants; this module counts and predicts.
A step of ``S`` shards (one per core) on ``W`` workers of ``t`` threads each
(hybrid: a worker per node, ``t`` = the node's cores; flat: a single-thread
worker per core) is dtrain's own graph, built with its own builders on fake
workers, so the counts are exact for every strategy and layout:

* ``tasks`` and ``transfers`` per step (values that cross workers; a local
  SGD round counts once per ``sync_every`` steps),
* the critical path: the longest chain of tasks through a window of steps,
  each task costing ``hop`` (a scheduler round trip), each value that crosses
  workers ``fetch`` plus its bytes over the bandwidth (within a node: as
  measured here; across nodes: the cluster network's).  A window whose tasks all
  sit on one worker runs as one task (the engine's fuse pass,
  :mod:`dtrain.taskgraph.fuse`): no task, hop or transfer a step.

Then, in seconds per step::

    path  = critical path + fb_worker + upd      fb_worker = ceil(s / min(t, cores)) fb(rows)
    sched = tasks * task + transfers * transfer   one scheduler's CPU: its event loop is serial
    cpu   = (tasks * task_cpu + transfers * transfer_cpu + S fb(rows) + W upd) / cores
    T     = max(path, sched, cpu)

with ``s`` a worker's shards, ``fb(b) = 6 b P / flops`` (one thread's rate),
``task``/``transfer`` the scheduler's CPU per task and per transfer, and
``task_cpu``/``transfer_cpu`` what every process together spends on each (the
scheduler, the client, the workers).  ``cpu`` is what the machine's ``cores``
can do at all: it binds where more processes than cores share the machine.
``overhead = T - fb_worker``: what the step costs beyond its compute.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dask.task_spec import TaskRef

from dtrain.core import keys
from dtrain.taskgraph import fuse, span
from dtrain.taskgraph.dataparallel import TINY_FLOPS

CHECK_MODELS = {"tiny": ((16, 16, 2), 8), "P3-shaped": ((784, 128, 10), 128)}
SCALES = (64, 256, 1024)                # cores in all
NODE_CORES = (16, 64)                   # cores per node
LOCAL_SGD_EVERY = 8                     # graph.sync_every of the local SGD predictions
NEGLIGIBLE = 0.10                       # overhead share called negligible


@dataclass(frozen=True)
class Layout:
    """A cluster's shape for the model: ``nodes`` nodes of ``node_cores`` cores, run
    ``hybrid`` (a worker per node, a thread per core) or flat (a worker per core); a
    shard per core."""

    nodes: int
    node_cores: int
    hybrid: bool

    @property
    def cores(self) -> int:
        return self.nodes * self.node_cores

    @property
    def workers(self) -> int:
        return self.nodes if self.hybrid else self.cores

    @property
    def threads(self) -> int:
        return self.node_cores if self.hybrid else 1

    def node_of(self, worker: int) -> int:
        return worker if self.hybrid else worker // self.node_cores

    @property
    def name(self) -> str:
        return "hybrid" if self.hybrid else "flat"


@dataclass(frozen=True)
class Step:
    """One strategy's step on one layout, from dtrain's graph."""

    tasks: float                          # per step
    transfers: float                      # per step: values crossing workers
    bytes: float                          # per step, crossing workers
    fused: bool                           # a worker's shards in one task
    shards_per_worker: int
    steps: int                            # steps in the window built
    dag: list[tuple[int | None, int, tuple[tuple[int, int], ...]]]  # (leaf's step, worker,
    node_of: Any = None                                                #  deps (i, bytes))
    chains: Any = None          # a window cut into a task per worker (span.cut): its seconds
    #                             per step over a Wire, (wire, flops, params, update, threads)

    def path(self, c: dict[str, float], net: dict[str, float]) -> float:
        """Seconds per step on the longest chain of tasks and transfers (compute aside):
        ``hop`` per task, ``fetch`` + bytes / bandwidth per value crossing workers (``net``'s
        figures where it crosses nodes); from the first step's leaves to the last step's,
        so the window's edges (its starting state, its final update) do not count."""
        if not self.dag:                    # a window of steps is one task: no hop a step
            return 0.0
        done: list[float] = []
        last: dict[int, float] = {}
        for step, worker, deps in self.dag:
            start = 0.0
            for i, nbytes in deps:
                w = self.dag[i][1]
                if w == worker:
                    arrive = done[i]
                else:
                    k = net if self.node_of(w) != self.node_of(worker) else c
                    arrive = done[i] + k["fetch"] + nbytes / k["bandwidth"]
                start = max(start, arrive)
            done.append(start + c["hop"])
            if step is not None:
                last[step] = max(last.get(step, 0.0), done[-1])
        first, final = min(last), max(last)
        return (last[final] - last[first]) / (final - first)


def config(layers: tuple[int, ...], rows: int, shards: int, strategy: str = "allreduce",
           sync_every: int = LOCAL_SGD_EVERY, steps: int = 16, fan_in: int = 2,
           fuse_steps: bool = True) -> Any:
    """A dtrain config of ``shards`` shards of ``rows`` rows a step (synthetic data, enough
    for ``steps`` steps in one epoch, not normalized: 16 flat workers would each read the
    whole set to normalize it), float32, as the benchmark workloads; ``fuse_steps``: a
    window runs as a task per worker (else each step through the scheduler)."""
    import dtrain

    batch = rows * shards
    return dtrain.load_config({
        "data": {"dataset": "synthetic", "samples": batch * steps, "features": layers[0],
                 "classes": layers[-1], "split": [1.0, 0.0, 0.0], "shards": shards,
                 "normalize": "none"},   # each worker draws its own rows, not the whole set
        "model": {"layers": list(layers), "dtype": "float32", "activation": "sigmoid"},
        "train": {"epochs": 1, "batch_size": batch},
        "graph": {"strategy": strategy, "fan_in": fan_in, "sync_every": sync_every,
                  "fuse_steps": fuse_steps}})


def count(layers: tuple[int, ...], rows: int, layout: Layout, strategy: str = "allreduce",
          sync_every: int = LOCAL_SGD_EVERY, cut: bool = True) -> Step:
    """Build windows of dtrain's graph for ``layout`` (a shard per core) and count them: the
    tasks and transfers of a window of ``2 n`` steps less those of ``n`` steps, over ``n``
    (``n``: 8, the default ``graph.state_every``, or a local SGD round), so a window's edges
    (its starting state, its final update) cancel and kept states count as in a long run.
    A window on one worker is one task; one that spans workers is a task per worker, its
    crossings messages (``cut``, as the engine runs it), or (not ``cut``) each step's tasks
    and transfers through the scheduler, as before windows were cut (issue 22's model)."""
    from dtrain.training.plan import plan

    n = sync_every if strategy == "local-sgd" else 8
    p = plan(config(layers, rows, layout.cores, strategy, sync_every, 2 * n + 1,
                    fuse_steps=cut))
    names = [f"w{i}" for i in range(layout.workers + (strategy == "parameter-server"))]
    placement = p.builder.place(names)
    refs = [TaskRef(f"load-shard-{i}") for i in range(layout.cores)]
    located = {ref.key: w for ref, w in zip(refs, placement.leaves)}
    wins, moves = [], []
    for steps in (n, 2 * n):
        win = p.builder.window([p.schedule[t] for t in range(steps)], p.initial_state(), refs,
                               None, placement, "m")
        wins.append(win)
        moves.append(win.transfers(located))
    win = wins[1]
    width = max(placement.leaves.count(w) for w in set(placement.leaves))
    node_of = lambda w: layout.node_of(w) if w < layout.workers else 0   # noqa: E731
    if fuse.one_worker(win) is not None:    # the engine runs the window as one task
        fused = [fuse.steps(w, 0, steps - 1, "m") for w, steps in zip(wins, (n, 2 * n))]
        return Step((fused[1].step_tasks() - fused[0].step_tasks()) / n, 0.0, 0.0,
                    bool(win.fused and win.fused[0]), width, 2 * n, [], node_of)
    if cut:                                 # the engine cuts it into a task per worker
        rank = {w: r for r, w in enumerate(names)}
        cuts = [span.cut(w, rank) for w in wins]
        sent = [sum(w.nbytes.get(key, 0) * len(args[0])
                    for chain, kinds in zip(c.nodes.values(), c.kinds.values())
                    for (key, _, args), kind in zip(chain, kinds) if kind == span.SEND)
                for c, w in zip(cuts, wins)]

        def seconds(wire: Wire, flops: float, params: int, update: float, threads: int
                    ) -> float:
            took = [simulate(c, w.nbytes, wire, flops, params, update, threads)
                    for c, w in zip(cuts, wins)]
            return (took[1] - took[0]) / n

        # a task per worker and window, whatever its steps: none per step; no Dask transfer
        return Step(0.0, 0.0, (sent[1] - sent[0]) / n, bool(win.fused and win.fused[0]),
                    width, 2 * n, [], node_of, seconds)
    order = _topological({k: [d for d in node.dependencies if d in win.dsk]
                          for k, node in win.dsk.items()})
    index = {name: i for i, name in enumerate(order)}
    leaf = {name: int(k.step) for name in order
            if (k := keys.parse(name)) is not None and k.kind in keys.LEAVES}
    dag = [(leaf.get(name), int(win.where[name][0][1:]),
            tuple((index[d], win.nbytes.get(d, 0)) for d in win.dsk[name].dependencies
                  if d in index)) for name in order]
    nbytes = [sum(w.nbytes.get(k, 0) for k, _, _ in m) for w, m in zip(wins, moves)]
    return Step((wins[1].step_tasks() - wins[0].step_tasks()) / n,
                (len(moves[1]) - len(moves[0])) / n, (nbytes[1] - nbytes[0]) / n,
                bool(win.fused and win.fused[0]), width, 2 * n, dag,
                lambda w: layout.node_of(w) if w < layout.workers else 0)


def _topological(deps: dict[str, list[str]]) -> list[str]:
    """The keys in an order where every key comes after its dependencies."""
    order: list[str] = []
    seen: set[str] = set()
    for root in deps:
        stack = [(root, iter(deps[root]))]
        if root in seen:
            continue
        seen.add(root)
        while stack:
            key, todo = stack[-1]
            nxt = next((d for d in todo if d not in seen), None)
            if nxt is None:
                order.append(key)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(deps[nxt])))
    return order


def predict(c: dict[str, float], step: Step, layout: Layout, params: int, rows: int,
            flops: float, update: float, net: dict[str, float] | None = None,
            cores: int | None = None) -> dict[str, float]:
    """Seconds per step, and its parts (see the module docstring).  ``net``: the cluster
    network's ``fetch`` and ``bandwidth`` (default: as ``c``); ``cores``: the cores the
    processes share (default: the layout's)."""
    net = net or c
    cores = cores or layout.cores
    fb = 6 * rows * params / flops
    # a fused task computes tiny shards in turn, on one thread (dataparallel._group)
    alone = step.fused and 6 * rows * params <= TINY_FLOPS
    ways = 1 if alone else min(layout.threads, step.shards_per_worker, cores)
    fb_worker = math.ceil(step.shards_per_worker / max(ways, 1)) * fb
    path = step.path(c, net) + fb_worker + update
    if step.chains is not None:     # a task per worker, its messages on dtrain's mesh
        wire = Wire(c["p2p_alpha"], c["p2p_bandwidth"])
        if layout.nodes > 1:        # the network's latency and bandwidth between nodes
            wire = wire.across(max(net["fetch"] - c["fetch"], 0.0), net["bandwidth"])
        path = step.chains(wire, flops, params, update, layout.threads)
    sched = step.tasks * c["task"] + step.transfers * c["transfer"]
    cpu = (step.tasks * c["task_cpu"] + step.transfers * c["transfer_cpu"]
           + layout.cores * fb + layout.workers * update) / cores
    total = max(path, sched, cpu)
    return {"seconds": total, "path": path, "sched": sched, "cpu": cpu, "compute": fb_worker,
            "overhead": total - fb_worker, "bound": max(("path", path), ("scheduler", sched),
                                                         ("cpu", cpu), key=lambda x: x[1])[0]}


def rows_for_negligible(pred: dict[str, float], params: int, flops: float, rows: int,
                        share: float = NEGLIGIBLE) -> float:
    """Rows per core a step would need for the overhead to be at most ``share`` of it, the
    overhead held at ``pred``'s: compute >= overhead (1 - share) / share."""
    per_row = 6 * params / flops
    need = pred["overhead"] * (1 - share) / share
    return max(rows, need / per_row) if pred["compute"] else math.inf


def scale_rows(c: dict[str, float], models: dict[str, tuple[tuple[int, ...], int, float, float]],
               net: dict[str, float], strategies: tuple[str, ...] = ("allreduce", "local-sgd"),
               scales: tuple[int, ...] = SCALES) -> list[dict[str, Any]]:
    """Predictions at ``scales`` cores on :data:`NODE_CORES`-core nodes, both layouts,
    for ``models`` (name -> (layers, rows per core, FLOP/s per thread, update seconds))."""
    out = []
    for name, (layers, rows, flops, update) in models.items():
        params = sum(a * b + b for a, b in zip(layers[:-1], layers[1:]))
        for strategy in strategies:
            for node_cores in NODE_CORES:
                for cores in scales:
                    for hybrid in (True, False):
                        layout = Layout(cores // node_cores, node_cores, hybrid)
                        step = count(layers, rows, layout, strategy)
                        pred = predict(c, step, layout, params, rows, flops, update, net)
                        out.append({"model": name, "strategy": strategy, "cores": cores,
                                    "node_cores": node_cores, "layout": layout.name,
                                    "tasks": step.tasks, "transfers": step.transfers,
                                    "fused": step.fused, **pred,
                                    "rows_negligible": rows_for_negligible(pred, params, flops,
                                                                           rows)})
    return out


def markdown_scale(rows: list[dict[str, Any]]) -> str:
    """The predictions as one Markdown table, every value marked as a prediction."""
    lines = ["| model | strategy | cores | cores/node | layout | tasks/step | transfers/step "
             "| predicted ms/step | predicted overhead | bound | rows/core for <= 10 % overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = r["overhead"] / r["seconds"] if r["seconds"] else 0.0
        need = "-" if math.isinf(r["rows_negligible"]) else f"{r['rows_negligible']:,.0f}"
        lines.append(f"| {r['model']} | {r['strategy']} | {r['cores']} | {r['node_cores']} | "
                     f"{r['layout']} | {r['tasks']:.1f} | {r['transfers']:.1f} | "
                     f"{r['seconds'] * 1e3:.2f} (prediction) | {share:.0%} | {r['bound']} | "
                     f"{need} |")
    return "\n".join(lines)


# --- a window across workers: each a task per worker, its crossings messages ------------------

@dataclass(frozen=True)
class Wire:
    """What a message between two workers costs: ``alpha`` seconds whatever its size, then
    its bytes over ``bandwidth`` (a sender's messages leave one after another); ``node``:
    the seconds a chain spends per task beyond the task's own work (dtrain's Python loop;
    0 for a compiled MPI program)."""

    alpha: float
    bandwidth: float
    node: float = 0.0

    def across(self, latency: float, bandwidth: float) -> Wire:
        """The same software between two nodes of a network: its latency added, its
        bandwidth the lesser."""
        return Wire(self.alpha + latency, min(self.bandwidth, bandwidth), self.node)


def _node_seconds(fn: Any, args: tuple, flops: float, params: int, update: float,
                  threads: int) -> float:
    """The work of one chain node: a group's forward-backward (its shards on up to
    ``threads`` cores side by side, and the one new update it applies first: a worker
    computes each replicated update once, :mod:`dtrain.taskgraph.tasks`), an update, or
    nothing to speak of (a reduce's sum, a state, an evaluation without held-out data)."""
    from dtrain.taskgraph.records import ForwardBackward, Update

    record = args[0] if args else None
    if isinstance(record, ForwardBackward):
        g = record.group
        rows = max(hi - lo for lo, hi in g.rows)
        ways = max(1, min(threads, len(g.shards)))
        applied = update if record.updates is not None else 0.0
        return math.ceil(len(g.shards) / ways) * 6 * rows * params / flops + applied
    if isinstance(record, Update):
        return update
    return 0.0


def simulate(c: Any, nbytes: dict[str, int], wire: Wire, flops: float, params: int,
             update: float, threads: int) -> float:
    """Seconds until every chain of the cut window ``c`` (:class:`dtrain.taskgraph.span.Cut`)
    has run: each worker runs its nodes in order; a ``recv`` waits for the message, which
    left its sender ``alpha`` plus its bytes over the bandwidth after the ``send`` (a send
    to several leaves them one after another)."""
    from dtrain.taskgraph import span

    clock = dict.fromkeys(c.nodes, 0.0)
    rank_of: dict[str, int] = {}
    for w in c.nodes:                         # the mesh's ranks: as the cut's sends name them
        rank_of[w] = len(rank_of)
    arrive: dict[tuple[str, int], float] = {}
    for w, i in c.sequence:
        key, fn, args = c.nodes[w][i]
        if fn is span.recv:
            clock[w] = max(clock[w], arrive[key, rank_of[w]]) + wire.node
            continue
        if fn is span.send:
            size = nbytes.get(key, 0)
            for j, to in enumerate(args[0]):
                arrive[key, to] = clock[w] + wire.alpha + (j + 1) * size / wire.bandwidth
            clock[w] += wire.node
            continue
        clock[w] += _node_seconds(fn, args, flops, params, update, threads) + wire.node
    return max(clock.values())
