"""``python -m dtrain [options]``: train, resume, or be one rank of an MPI job."""
from __future__ import annotations

import argparse
from pathlib import Path

from dtrain.cli.common import Parser, config_options
from dtrain.core.config import load_config
from dtrain.core.errors import UserError
from dtrain.deploy import mpi
from dtrain.taskgraph import strategies
from dtrain.training import checkpoint
from dtrain.training.plan import plan
from dtrain.training.trainer import check_resume, default_out_dir, resume_checked, train


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m dtrain",
        description="Data-parallel neural-network training; every minibatch a Dask task graph. "
                    "Subcommands: `report DIR...` (rebuild report.html), `graph --out FILE` "
                    "(draw a step's task graph); see `python -m dtrain report --help`.")
    config_options(parser)
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes of the embedded LocalCluster (cluster.workers)")
    parser.add_argument("--out", metavar="DIR", help="run directory (default: a new one under runs/)")
    parser.add_argument("--scheduler-address", metavar="ADDR",
                        help="use a running Dask scheduler instead of starting a LocalCluster")
    parser.add_argument("--dashboard-address", metavar="HOST:PORT",
                        help="where the dashboard listens (cluster.dashboard_address)")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the interrupted run in DIR from its last checkpoint "
                             "(only [cluster] keys may be changed with --set)")
    parser.add_argument("--cluster", choices=("local", "slurm", "pbs"),
                        help="start workers as a LocalCluster or as SLURM/PBS batch jobs "
                             "(cluster.kind)")
    parser.add_argument("--scheduler-rank", type=int, metavar="R",
                        help="run as one rank of `mpirun -n N python -m dtrain`: rank R runs the "
                             "scheduler and the driver, the other N-1 ranks are workers")
    return parser


def _scheduler_rank(argv: list[str]) -> str | None:
    """The ``--scheduler-rank`` text if given ('' if unreadable): are we one rank of an MPI job?"""
    pre = Parser(add_help=False)
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


def prepare(argv: list[str]) -> mpi.Job:
    """Parse, load and plan: the job, whose ``run(client)`` trains or resumes on that client
    (or on its own cluster with None), and the MPI ranks it would need.

    With ``--resume`` the run directory is checked here too (a run dtrain started, not
    finished, the same config, a readable checkpoint), before any cluster starts.
    """
    args = build_parser().parse_args(argv)
    if args.resume:
        if args.out:
            raise UserError(f"--out {args.out} with --resume: a resumed run stays in its own "
                            f"directory ({args.resume})")
        run_dir = Path(args.resume)
        checkpoint.resumable(run_dir, None)       # a run dtrain started: config.toml is there
        point = check_resume(
            run_dir, load_config(args.config or run_dir / "config.toml", _overrides(args)))
        config = point.config

        def job(client):
            return resume_checked(point, client=client)
    else:
        config = load_config(args.config, _overrides(args))

        def job(client):
            return train(config, client=client,
                         out=Path(args.out) if args.out else default_out_dir(args.config))
    planned = plan(config)      # the data and the model sizes, before anything starts
    strategy = strategies.get(config.graph.strategy)
    return mpi.Job(config, job, strategy.ranks, strategy.workers_word, planned.leaves)


def resume_command(argv: list[str]) -> str:
    """How to resume what ``argv`` started: under MPI with the same ranks' launcher."""
    if _scheduler_rank(argv) is None:
        return "python -m dtrain --resume"
    return f"mpiexec -n {mpi.world_size()} python -m dtrain --scheduler-rank " \
           f"{_scheduler_rank(argv)} --resume"


def run(argv: list[str]) -> int:
    """Train (or resume) as ``argv`` says; returns the exit code."""
    rank_text = _scheduler_rank(argv)
    if rank_text is not None:
        return mpi.main(rank_text, lambda: prepare(argv))
    job = prepare(argv)
    print(f"run directory: {job.run(None).out}")
    return 0
