"""Between two workers: what one message costs each way a window task could send it.

``python -m benchmarks.p2p [--repeat N]`` times, between the task threads of the
two workers of a 2-worker LocalCluster (one thread each, dtrain's allocator
settings), a message of 1 KiB, 400 KiB (P3's gradient buffer) and 3.2 MiB (P2's)
there and back (median of ``--repeat`` round trips, milliseconds), sent:

* through distributed: the peer's RPC handler called from the task thread
  (``sync(worker.loop, worker.rpc(peer).handler(...))``), each hop through the
  worker's event loop;
* over dtrain's mesh (:mod:`dtrain.deploy.p2p`): a Unix socket (two workers of one
  machine), TCP (as between machines), TLS (the same on a cluster with TLS, its
  certificates from ``distributed.Security.temporary``);
* and MPI point-to-point (mpi4py ``Send``/``Recv`` between two ranks under
  mpiexec), where mpiexec and mpi4py are installed: what the workers could use
  where they are MPI ranks.

Each row also gives the bytes a second that the round trip makes.  The numbers
decide the transport (ARCHITECTURE.md, "Across workers").
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from distributed import WorkerPlugin

from benchmarks.common import OneLineParser, positive

SIZES = {"1 KiB": 1 << 10, "400 KiB (P3)": 400 << 10, "3.2 MiB (P2)": 3_260_000}
RPC_OP = "dtrain_bench_echo"


def _allocator(dask_worker) -> None:
    from dtrain.core.allocator import keep_freed_memory
    keep_freed_memory()


class _Echo(WorkerPlugin):
    """A worker plugin: an RPC handler that answers a message with itself."""

    name = "dtrain-bench-echo"

    def setup(self, worker) -> None:
        async def echo(data=None):
            return {"data": data}
        worker.handlers[RPC_OP] = echo


def _mesh_pingpong(mesh, rank: int, nbytes: int, repeat: int) -> float:
    from dtrain.deploy import p2p

    node = p2p.node(mesh.run, rank)
    link = node.link(mesh, [1 - rank], [1 - rank], 30.0)
    value = np.ones(nbytes // 4, np.float32)
    took = []
    for i in range(repeat + 3):
        start = time.perf_counter()
        if rank == 0:
            link.send([1], f"a{i}", value)
            link.recv(1, f"b{i}")
        else:
            link.send([0], f"b{i}", link.recv(0, f"a{i}"))
        took.append(time.perf_counter() - start)
    return statistics.median(took[3:]) * 1e3


def _rpc_pingpong(peer: str, nbytes: int, repeat: int) -> float:
    from distributed import get_worker
    from distributed.utils import sync

    worker = get_worker()
    value = np.ones(nbytes // 4, np.float32)
    took = []
    for _ in range(repeat + 3):
        start = time.perf_counter()
        sync(worker.loop, getattr(worker.rpc(peer), RPC_OP), data=value)
        took.append(time.perf_counter() - start)
    return statistics.median(took[3:]) * 1e3


def on_cluster(tls: bool, repeat: int, kinds: tuple[str, ...] = ()
               ) -> dict[str, dict[str, float]]:
    """The round trips (ms by size) of ``kinds`` (default: every way but MPI's) on a
    2-worker LocalCluster, on TLS if ``tls``."""
    from distributed import Client, LocalCluster, Security

    security = Security.temporary() if tls else None
    out: dict[str, dict[str, float]] = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, protocol="tls" if tls else "tcp",
                      security=security) as lc, Client(lc, security=security) as c:
        c.run(_allocator)
        a, b = sorted(c.scheduler_info()["workers"])
        kinds = kinds or (("tls",) if tls else ("rpc", "unix", "tcp"))
        if "rpc" in kinds:
            c.register_plugin(_Echo())
        for kind in kinds:
            row = out.setdefault(kind, {})
            for label, nbytes in SIZES.items():
                if kind == "rpc":
                    row[label] = c.submit(_rpc_pingpong, b, nbytes, repeat, workers=[a],
                                          pure=False).result()
                    continue
                row[label] = mesh_round_trip(c, a, b, nbytes, repeat, kind == "unix")
    return out


def mesh_round_trip(client: Any, a: str, b: str, nbytes: int, repeat: int, local: bool
                    ) -> float:
    """Median milliseconds of a round trip of ``nbytes`` between workers ``a`` and ``b``
    over a dtrain mesh (``local``: Unix sockets, else TCP)."""
    from dtrain.deploy import p2p

    mesh = p2p.open_mesh(client, [a, b], 10.0, local=local)
    try:
        times = [client.submit(_mesh_pingpong, mesh, r, nbytes, repeat, workers=[w],
                               pure=False) for r, w in enumerate((a, b))]
        took = times[0].result()
        times[1].result()
        return took
    finally:
        p2p.close_mesh(client, mesh, 10.0)


def _mpi_side(repeat: int) -> None:
    """Run under mpiexec -n 2: rank 0 prints the medians as JSON."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = {}
    for label, nbytes in SIZES.items():
        buf = np.ones(nbytes // 4, np.float32)
        got = np.empty_like(buf)
        took = []
        for _ in range(repeat + 3):
            start = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, 1)
                comm.Recv(got, 1)
            else:
                comm.Recv(got, 0)
                comm.Send(got, 0)
            took.append(time.perf_counter() - start)
        out[label] = statistics.median(took[3:]) * 1e3
    if comm.rank == 0:
        print(json.dumps(out))


def mpi(repeat: int) -> dict[str, float] | None:
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.is_file() else shutil.which("mpiexec")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if mpiexec is None:
        return None
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "benchmarks.p2p",
                           "--mpi-side", "--repeat", str(repeat)], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def wire(row: dict[str, float]) -> tuple[float, float]:
    """``(alpha seconds, bytes/s)`` of one way from a row's round trips: half the smallest
    message's, and the bytes the largest adds over that."""
    small, big = SIZES["1 KiB"], SIZES["3.2 MiB (P2)"]
    alpha = row["1 KiB"] / 2e3
    return alpha, (big - small) / max(row["3.2 MiB (P2)"] / 2e3 - alpha, 1e-9)


ROWS = {"rpc": "distributed RPC from the task thread (each hop through an event loop)",
        "unix": "dtrain mesh, Unix socket (two workers of one machine)",
        "tcp": "dtrain mesh, TCP (as between machines)",
        "tls": "dtrain mesh, TLS (a cluster on TLS)",
        "mpi": "mpi4py Send/Recv between two MPI ranks"}


def table(found: dict[str, dict[str, float]]) -> str:
    lines = ["| way | " + " | ".join(f"{s} ms (GB/s)" for s in SIZES) + " |",
             "|---|" + "---|" * len(SIZES)]
    for kind, row in found.items():
        cells = [f"{row[s]:.3f} ({2 * n / (row[s] / 1e3) / 1e9:.2f})" if s in row else "-"
                 for s, n in SIZES.items()]
        lines.append(f"| {ROWS[kind]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks.p2p", description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=positive, default=200, help="round trips per cell")
    parser.add_argument("--mpi-side", action="store_true", help="(internal: the mpiexec part)")
    args = parser.parse_args(argv)
    if args.mpi_side:
        _mpi_side(args.repeat)
        return 0
    found = {**on_cluster(False, args.repeat), **on_cluster(True, args.repeat)}
    over_mpi = mpi(args.repeat)
    if over_mpi is not None:
        found["mpi"] = over_mpi
    print(f"A message there and back between two workers' task threads, median of "
          f"{args.repeat} (ms; GB/s counts both ways):\n")
    print(table(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
