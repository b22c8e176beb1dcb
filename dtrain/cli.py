"""``python -m dtrain``: a thin layer over :func:`dtrain.train`.

User errors print one line on stderr and exit with code 2; anything else is
a bug and keeps its traceback.  With ``--scheduler-rank`` the process is one
rank of an MPI job and :mod:`dtrain.mpi` takes over.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from dtrain.config import DEFAULT_CONFIG, Config, load_config
from dtrain.errors import UserError

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are user errors too: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see python -m dtrain --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m dtrain",
        description="Data-parallel neural-network training; every minibatch a Dask task graph.")
    parser.add_argument("--config", metavar="FILE",
                        help=f"TOML run config (default: {DEFAULT_CONFIG.relative_to(Path.cwd()) if DEFAULT_CONFIG.is_relative_to(Path.cwd()) else DEFAULT_CONFIG})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes of the embedded LocalCluster (cluster.workers)")
    parser.add_argument("--out", metavar="DIR", help="run directory (default: a new one under runs/)")
    parser.add_argument("--scheduler-address", metavar="ADDR",
                        help="use a running Dask scheduler instead of starting a LocalCluster")
    parser.add_argument("--dashboard-address", metavar="HOST:PORT",
                        help="where the dashboard listens (cluster.dashboard_address)")
    parser.add_argument("--cluster", choices=("local", "slurm", "pbs"),
                        help="start workers as a LocalCluster or as SLURM/PBS batch jobs "
                             "(cluster.kind)")
    parser.add_argument("--scheduler-rank", type=int, metavar="R",
                        help="run as one rank of `mpirun -n N python -m dtrain`: rank R runs the "
                             "scheduler and the driver, the other N-1 ranks are workers")
    return parser


def _scheduler_rank(argv: list[str]) -> str | None:
    """The ``--scheduler-rank`` text if given ('' if unreadable): are we one rank of an MPI job?"""
    pre = _Parser(add_help=False)
    pre.add_argument("--scheduler-rank")
    try:
        return pre.parse_known_args(argv)[0].scheduler_rank
    except UserError:
        return ""


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the dedicated flags, which are shorthands for config keys."""
    extra = []
    if args.scheduler_rank is not None:
        for flag, value in (("--workers", args.workers), ("--cluster", args.cluster),
                            ("--scheduler-address", args.scheduler_address)):
            if value is not None:
                raise UserError(f"{flag} does not apply with --scheduler-rank: under MPI the "
                                f"workers are the mpirun ranks other than the head")
    if args.workers is not None:
        if args.workers < 1:
            raise UserError(f"--workers {args.workers}: needs at least 1 worker")
        extra.append(f"cluster.workers={args.workers}")
    if args.scheduler_address is not None:
        extra.append(f"cluster.scheduler_address={args.scheduler_address!r}".replace("'", '"'))
    if args.dashboard_address is not None:
        extra.append(f'cluster.dashboard_address="{args.dashboard_address}"')
    if args.cluster is not None:
        extra.append(f'cluster.kind="{args.cluster}"')
    return list(args.overrides) + extra


def prepare(argv: list[str]) -> tuple[Config, Callable[[], Path]]:
    """Parse and load: the config, and a function that creates the run directory."""
    from dtrain.trainer import default_out_dir

    args = build_parser().parse_args(argv)
    config = load_config(args.config, _overrides(args))
    return config, lambda: Path(args.out) if args.out else default_out_dir(args.config)


def run(argv: list[str]) -> int:
    from dtrain.trainer import train

    rank_text = _scheduler_rank(argv)
    if rank_text is not None:
        from dtrain import mpi
        return mpi.main(rank_text, lambda: prepare(argv))
    config, make_out = prepare(argv)
    result = train(config, out=make_out())
    print(f"run directory: {result.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("dtrain: interrupted", file=sys.stderr)
        return 130
