"""What TLS costs dtrain, measured two ways (README, "On a cluster": the figures).

``steps``: the same mpirun job with ``cluster.tls`` on and off, in turns (on, off, on, ...)
so both see the same machine; prints seconds per training step (wall time / steps, from
summary.json) and the medians.  Uses the mpiexec next to this Python.

``transfer``: one message of a gradient's size sent over distributed's TCP and TLS comms
between two endpoints, best of several rounds: the cost TLS adds per message moved.

    python benchmarks/tls_cost.py steps --ranks 3 --repeats 5 -- --set train.epochs=30
    python benchmarks/tls_cost.py transfer --sizes 1000 400000 800000
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed import Security
from distributed.comm import connect, listen

REPO = Path(__file__).resolve().parents[1]


def one_run(ranks: int, tls: str, extra: list[str], out: Path) -> float:
    """Seconds per step of one ``mpiexec -n ranks python -m dtrain`` run."""
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(ranks), sys.executable,
           "-m", "dtrain", "--scheduler-rank", "0", "--set", f"cluster.tls={tls}",
           "--dashboard-address", "127.0.0.1:0", "--out", str(out), *extra]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True)
    summary = json.loads((out / "summary.json").read_text())
    return summary["seconds"] / summary["steps"]


def steps(args: argparse.Namespace) -> None:
    times: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for tls in ("on", "off"):
                step = one_run(args.ranks, tls, args.extra, Path(tmp) / f"{tls}-{i}")
                times[tls].append(step)
                print(f"run {i + 1} tls={tls:3}  {step * 1e3:8.2f} ms/step", flush=True)
    on, off = (statistics.median(times[k]) for k in ("on", "off"))
    print(f"median: tls=on {on * 1e3:.2f} ms/step, tls=off {off * 1e3:.2f} ms/step, "
          f"TLS costs {(on - off) * 1e3:+.2f} ms/step ({(on / off - 1) * 100:+.1f} %)")


async def one_way(security: Security | None, nbytes: int, rounds: int = 200) -> float:
    """Seconds for one message of ``nbytes`` (half a round trip), best of three batches."""
    async def echo(comm):
        with contextlib.suppress(OSError):     # the client hangs up at the end
            while True:
                await comm.write(await comm.read())

    proto = "tls" if security else "tcp"
    listener = listen(f"{proto}://127.0.0.1:0", echo,
                      **(security.get_listen_args("scheduler") if security else {}))
    await listener.start()
    comm = await connect(listener.contact_address,
                         **(security.get_connection_args("worker") if security else {}))
    message = {"x": bytes(nbytes)}
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(rounds):
            await comm.write(message)
            await comm.read()
        best = min(best, (time.perf_counter() - start) / rounds / 2)
    await comm.close()
    listener.stop()
    return best


async def transfer(args: argparse.Namespace) -> None:
    security = Security.temporary()
    for nbytes in args.sizes:
        tcp, tls = await one_way(None, nbytes), await one_way(security, nbytes)
        print(f"{nbytes:>10,} bytes: tcp {tcp * 1e6:7.0f} us, tls {tls * 1e6:7.0f} us, "
              f"TLS adds {(tls - tcp) * 1e6:+6.0f} us per message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p_steps = sub.add_parser("steps", help="mpirun jobs with TLS on and off, in turns")
    p_steps.add_argument("--ranks", type=int, default=3)
    p_steps.add_argument("--repeats", type=int, default=5)
    p_steps.add_argument("extra", nargs="*", help="dtrain arguments (after --)")
    p_transfer = sub.add_parser("transfer", help="one message over TCP and over TLS")
    p_transfer.add_argument("--sizes", type=int, nargs="+", default=[1_000, 400_000, 800_000])
    args = parser.parse_args()
    if args.what == "steps":
        steps(args)
    else:
        asyncio.run(transfer(args))


if __name__ == "__main__":
    main()
