"""Inside one node: a step's forward-backward over S shards, each way of using the cores.

``python -m benchmarks.innode [S ...] [--shapes P3,P2,P1]`` (default: this machine's
cores) times, for the P3, P2 and P1 shapes of ``workloads.toml`` with a batch cut
into S shards, one step of dtrain's own maths
(:meth:`~dtrain.maths.model.Network.loss_and_grad` per shard) done:

* on S threads of one process (one BLAS thread each): what a hybrid worker's
  threads can do under the GIL;
* in S processes, each timing its own shard (no messages): the bound;
* by dtrain's core processes (:mod:`dtrain.taskgraph.cores`): S - 1 helpers and
  the calling process, with the parameters written to shared memory, the
  per-step messages and the fixed-order tree sum (fan-in 2) included: what a
  hybrid worker's fused task pays;
* the whole batch at once, BLAS on all cores and on one thread (not the same
  bytes as the shards' sum: for scale only).

Prints one Markdown table (milliseconds, median of 30 steps after 3 warm-ups), then
what a message to a core process and back costs (microseconds, two processes, each
polling for the other's message): with :func:`dtrain.taskgraph.cores.wait` (one
poller per connection, ``sched_yield`` between polls) and with what it replaced
(``Connection.poll`` and ``time.sleep(0)``, which sleeps out the kernel's timer slack).
The 16-core machine of ``../shared/notes/in-node.md`` measured, for P3 at 16
shards, 3.66 ms on threads against 0.11 ms in processes.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.common import OneLineParser
from dtrain.data.shards import Shard
from dtrain.maths.model import Network
from dtrain.taskgraph import cores

SHAPES = {"P3": ((784, 128, 10), 256), "P2": ((784, 1024, 10), 1024),
          "P1": ((784, 1024, 10), 8192)}
REPEATS = 30


def _data(layers: tuple[int, ...], batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    net = Network(layers, "sigmoid", "cross-entropy", "float32")
    x = rng.standard_normal((batch, layers[0])).astype(np.float32)
    y = rng.integers(0, layers[-1], batch)
    return net, net.init(0), x, y


def _ms(f, n: int = REPEATS) -> float:
    for _ in range(3):
        f()
    took = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        took.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(took), 3)


def _own_shard(args) -> float:
    layers, rows = args
    with threadpool_limits(1):
        net, params, x, y = _data(layers, rows)
        return _ms(lambda: net.loss_and_grad(params, x, y))


def _tree(n: int) -> int | tuple:
    """Positions 0..n-1 nested as a fan-in 2 reduce tree does."""
    level: list = list(range(n))
    while len(level) > 1:
        level = [tuple(level[i:i + 2]) if len(level[i:i + 2]) > 1 else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]


def measure(shards: int, shapes: list[str] | None = None) -> list[dict[str, object]]:
    out = []
    all_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    pool = cores.Pool(shards - 1) if shards > 1 and cores.supported() else None
    try:
        for name in shapes or list(SHAPES):
            layers, batch = SHAPES[name]
            rows = batch // shards
            net, params, x, y = _data(layers, rows * shards)
            parts = [Shard(i, x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows])
                     for i in range(shards)]
            bounds = [(0, rows)] * shards
            row: dict[str, object] = {"shape": name, "rows per shard": rows}
            with threadpool_limits(1):
                with ThreadPoolExecutor(shards) as ex:
                    row["threads"] = _ms(lambda: list(ex.map(
                        lambda s: net.loss_and_grad(params, s.x, s.y), parts)))
                if pool is not None:
                    row["dtrain core processes"] = _ms(lambda: pool.group_sum(
                        net, 0, None, bounds, _tree(shards), params, parts))
                row["whole batch, 1 thread"] = _ms(lambda: net.loss_and_grad(params, x, y))
            with mp.get_context("spawn").Pool(shards) as procs:
                own = procs.map(_own_shard, [(layers, rows)] * shards)
            row["processes (median / slowest)"] = f"{statistics.median(own):.3f} / {max(own):.3f}"
            with threadpool_limits(all_cores):
                row[f"whole batch, BLAS {all_cores} threads"] = \
                    _ms(lambda: net.loss_and_grad(params, x, y))
            out.append(row)
    finally:
        if pool is not None:
            pool.close()
    return out


def _old_wait(conn: Connection, spin: float) -> None:
    """How core processes waited for a message before ``cores.wait``."""
    if conn.poll(0):
        return
    end = time.perf_counter() + spin
    while time.perf_counter() < end:
        if conn.poll(0):
            return
        time.sleep(0)
    conn.poll(None)


def round_trip_us(old: bool, n: int = 2000) -> float:
    """Median microseconds of a small message to another process and its answer, both
    waiting as core processes do (``old``: as they did before ``cores.wait``)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    conn = Connection(os.dup((theirs if pid == 0 else mine).fileno()))
    ready = cores.ready(conn)

    def wait() -> None:
        _old_wait(conn, cores.SPIN_SECONDS) if old else cores.wait(ready, cores.SPIN_SECONDS)

    if pid == 0:                                    # the echo: a core process's loop
        try:
            while True:
                wait()
                if conn.recv_bytes() == b"q":
                    break
                conn.send_bytes(b"ok")
        finally:
            os._exit(0)
    took = []
    for _ in range(n):
        start = time.perf_counter()
        conn.send_bytes(b"S" * 64)
        wait()
        conn.recv_bytes()
        took.append(time.perf_counter() - start)
    conn.send_bytes(b"q")
    os.waitpid(pid, 0)
    return round(1e6 * statistics.median(took[n // 10:]), 1)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard count: give whole numbers >= 1")
    return int(text)


def _shapes(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown shape {', '.join(unknown) or repr(text)}: choose from {', '.join(SHAPES)}")
    return names


def table(shards: int, rows: list[dict[str, object]]) -> str:
    header = list(rows[0])
    lines = [f"### Inside one node: one step's forward-backward over {shards} shards (ms)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(r.get(h, "-")) for h in header) + " |" for r in rows]
    lines += ["", "dtrain's maths (float32, sigmoid, cross-entropy) per shard; dtrain core "
              "processes: S - 1 helpers and the caller, parameters through shared memory, "
              "messages and the fixed-order fan-in 2 sum included; processes: each times its "
              "own shard, no messages (the bound); the whole batch is not the shards' bytes."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="python -m benchmarks.innode",
                           description="one step's shards, each way of using the cores")
    parser.add_argument("shards", nargs="*", type=_count, metavar="S",
                        help="shard counts (default: this machine's cores)")
    parser.add_argument("--shapes", type=_shapes, default=list(SHAPES),
                        help=f"comma-separated, of {', '.join(SHAPES)} (default all)")
    args = parser.parse_args(argv)
    for s in args.shards or [os.cpu_count() or 1]:
        print(table(s, measure(s, args.shapes)), flush=True)
        print()
    if cores.supported():
        print(f"A message to a core process and back: {round_trip_us(False)} us with "
              f"cores.wait; {round_trip_us(True)} us with Connection.poll and time.sleep(0)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
