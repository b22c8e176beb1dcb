"""``python -m dtrain [options]``: train, resume, or be one rank of an MPI job."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from dtrain.cli import advice
from dtrain.cli.common import Parser, config_options
from dtrain.core import files
from dtrain.core.config import Config, DataConfig, load_config
from dtrain.core.errors import UserError
from dtrain.core.version import __version__
from dtrain.deploy import mpi
from dtrain.deploy.connect import check_address, running_scheduler
from dtrain.deploy.layout import local_shape
from dtrain.deploy.options import make_ahead
from dtrain.observe import tracking
from dtrain.taskgraph import strategies
from dtrain.training import checkpoint, collections
from dtrain.training.plan import partitioned, plan
from dtrain.training.trainer import (RunResult, check_resume, default_out_dir, resume_checked,
                                     train)


COMMANDS = """\
commands:
  python -m dtrain [options]         train (the options below), or continue a run: --resume DIR
  python -m dtrain report DIR...     rebuild report.html from run directories (report --help)
  python -m dtrain graph --out FILE  draw one training step's task graph (graph --help)
  python -m dtrain predict RUN ...   predict with a trained run (predict --help)
  python -m dtrain evaluate RUN      accuracy, loss, per-class figures of a run (evaluate --help)
  python -m dtrain export RUN ...    write a trained run as ONNX (export --help)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m dtrain", formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="python -m dtrain [options]\n       python -m dtrain {report,graph} ...",
        description="Data-parallel neural-network training; every minibatch a Dask task "
                    "graph.\n\n" + COMMANDS)
    parser.add_argument("--version", action="version", version=f"dtrain {__version__}")
    config_options(parser)
    parser.add_argument("--workers", type=int, metavar="N",
                        help="worker processes of the embedded LocalCluster (cluster.workers; "
                             "0, the default: as cluster.layout says)")
    parser.add_argument("--out", metavar="DIR", help="run directory (default: a new one under "
                        "runs/); an existing run there is refused unless --force")
    parser.add_argument("--force", action="store_true",
                        help="let --out replace the run already in DIR (its results and "
                             "checkpoint are deleted) or write into a non-empty directory")
    parser.add_argument("--scheduler-address", metavar="ADDR",
                        help="use a running Dask scheduler instead of starting a LocalCluster "
                             "(default: Dask's scheduler-address config, e.g. "
                             "DASK_SCHEDULER_ADDRESS, if set)")
    parser.add_argument("--scheduler-file", metavar="FILE",
                        help="use the running Dask scheduler whose address FILE holds, as "
                             "`dask scheduler --scheduler-file`, dask-mpi and dask-jobqueue "
                             "write it (cluster.scheduler_file)")
    parser.add_argument("--dashboard-address", metavar="HOST:PORT",
                        help="where the dashboard listens (cluster.dashboard_address)")
    parser.add_argument("--resume", metavar="DIR",
                        help="continue the interrupted run in DIR from its last checkpoint "
                             "(only [cluster] and [track] keys may be changed with --set)")
    parser.add_argument("--init-from", metavar="RUN",
                        help="start from a finished run's parameters and input normalization "
                             "(model.init_from), with a fresh optimizer, e.g. to fine-tune on "
                             "new data")
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
                            ("--scheduler-address", args.scheduler_address),
                            ("--scheduler-file", args.scheduler_file)):
            if value is not None:
                raise UserError(f"{flag} does not apply with --scheduler-rank: under MPI the "
                                f"workers are the mpirun ranks other than the head")
    if args.workers is not None:
        if args.workers < 0:
            raise UserError(f"--workers {args.workers}: give a number of workers, or 0 for "
                            f"as many as cluster.layout says")
        extra.append(f"cluster.workers={args.workers}")
    if args.scheduler_address is not None:
        extra.append(f"cluster.scheduler_address={args.scheduler_address!r}".replace("'", '"'))
    if args.scheduler_file is not None:
        extra.append("cluster.scheduler_file=" + json.dumps(args.scheduler_file))
    if args.dashboard_address is not None:
        extra.append(f'cluster.dashboard_address="{args.dashboard_address}"')
    if args.cluster is not None:
        extra.append(f'cluster.kind="{args.cluster}"')
    if args.init_from is not None:
        extra.append(f"model.init_from={args.init_from!r}".replace("'", '"'))
    return list(args.overrides) + extra


def check_out(out: Path, force: bool) -> None:
    """Refuse an ``--out`` that cannot be a new run's directory, or (without ``--force``)
    would overwrite a run or mix with other files; before anything is created."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; give a directory for the run")
    there = next(p for p in (out, *out.parents, Path(".")) if p.exists())
    if not there.is_dir():
        raise UserError(f"--out {out}: {there} is a file, not a directory")
    if not os.access(there, os.W_OK | os.X_OK):
        raise UserError(f"--out {out}: cannot write in {there} (permission denied)")
    if force or there != out or not any(out.iterdir()):
        return
    if not (out / files.CONFIG).is_file():
        raise UserError(f"--out {out} is not empty and holds no dtrain run; give a new or "
                        f"empty directory (or add --force to write into it anyway)")
    if (out / files.SUMMARY).exists():
        raise UserError(f"--out {out} holds a finished run; give a new directory, train it "
                        f"longer with --resume {out} --set train.epochs=N, or add --force to "
                        f"replace its results")
    raise UserError(f"--out {out} holds an unfinished run; continue it with --resume {out}, "
                    f"or give a new directory (or add --force to start it over)")


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
        if args.force:
            raise UserError(f"--force with --resume: a resumed run keeps its files; to start "
                            f"{args.resume} over, use --out {args.resume} --force")
        run_dir = Path(args.resume)
        checkpoint.started(run_dir)               # config.toml is there
        point = check_resume(
            run_dir, load_config(args.config or run_dir / "config.toml", _overrides(args)))
        config = point.config

        def job(client):
            return resume_checked(point, client=client)
    else:
        config = load_config(args.config, _overrides(args))
        if args.out:
            check_out(Path(args.out), args.force)

        def job(client):
            if args.out:
                return train(config, client=client, out=Path(args.out))
            return _in_new_run_dir(args.config or config.data,
                                   lambda out: train(config, client=client, out=out))
    if config.cluster.scheduler_address:
        check_address(config.cluster.scheduler_address)
    if not running_scheduler(config.cluster) and \
            not strategies.get(config.graph.strategy).in_process:
        make_ahead(config.cluster)      # the cluster's credentials, while the run is planned
    if partitioned(config.data):   # read by the workers: what its metadata says, for now
        collections.check_files(config.data, config.model.layers, config.model.input_shape)
        planned = None
    else:                          # the data and the model sizes, before anything starts
        planned = plan(config)
    tracking.check(config.track)        # the trackers' packages, too
    strategy = strategies.get(config.graph.strategy)
    if args.scheduler_rank is None and planned is not None:
        _warn_layout(config, strategy, planned.leaves)
    running = running_scheduler(config.cluster) if args.scheduler_rank is None else ""
    if args.workers is not None and running:
        print(f"dtrain: warning: --workers {args.workers} does nothing with a running "
              f"scheduler: the run uses the workers of {running}", file=sys.stderr)
    return mpi.Job(config, job, strategy.ranks, strategy.workers_word,
                   planned.leaves if planned is not None else 0)


def _in_new_run_dir(named: str | DataConfig, run: Callable[[Path], RunResult]) -> RunResult:
    """``run(out)`` in a new directory under ``runs/``, named after ``named`` (the config
    file given, else the data: :func:`~dtrain.training.trainer.default_out_dir`); if the
    run fails and leaves it empty
    (it removes what it wrote when it recorded nothing), the directory goes, and ``runs/``
    too if this made it."""
    base_was_there = Path("runs").exists()
    out = default_out_dir(named)
    try:
        return run(out)
    except BaseException:
        for folder in (out, *([] if base_was_there else [out.parent])):
            try:
                folder.rmdir()                  # only if empty
            except OSError:
                break
        raise


def _warn_layout(config: Config, strategy: strategies.Strategy, leaves: int) -> None:
    """One line on stderr for each way the embedded cluster's layout wastes time (the
    worker and thread counts :func:`dtrain.deploy.layout.local_shape` starts)."""
    c = config.cluster
    if strategy.in_process or c.kind != "local" or running_scheduler(c) or c.device != "cpu":
        return
    shape = local_shape(c, strategy.min_workers, leaves)
    leaf = "slice" if strategy.leaf == "slice" else "shard"
    for line in advice.layout_warnings(shape.workers, shape.threads, leaves, advice.cores(),
                                       leaf, spare=strategy.min_workers - 1):
        print(f"dtrain: warning: {line}", file=sys.stderr)


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
    running = running_scheduler(job.config.cluster)
    if running and not job.config.cluster.scheduler_address:     # not named on this line
        print(f"scheduler: {running}")
    print(f"run directory: {job.run(None).out}")
    return 0
