"""``python -m dtrain``: a thin layer over :func:`dtrain.train`.

``python -m dtrain [options]`` trains (``--resume DIR`` continues a run);
``python -m dtrain report DIR...`` rebuilds ``report.html`` (overlaying
several runs); ``python -m dtrain graph --out FILE`` draws one step's task
graph.  With ``--scheduler-rank`` the process is one rank of an MPI job and
:mod:`dtrain.mpi` takes over.  User errors print one line on stderr and exit
with code 2 (a diverged run: 3); anything else is a bug and keeps its
traceback.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain.config import DEFAULT_CONFIG, Config, load_config
from dtrain.errors import Diverged, UserError

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3

Job = Callable[[Any], Any]          # client (or None) -> RunResult


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are user errors too: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{message} (see {self.prog} --help)")


def _config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--set``, shared by training and ``graph``."""
    default = DEFAULT_CONFIG.relative_to(Path.cwd()) if DEFAULT_CONFIG.is_relative_to(Path.cwd()) \
        else DEFAULT_CONFIG
    parser.add_argument("--config", metavar="FILE", help=f"TOML run config (default: {default})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m dtrain",
        description="Data-parallel neural-network training; every minibatch a Dask task graph. "
                    "Subcommands: `report DIR...` (rebuild report.html), `graph --out FILE` "
                    "(draw a step's task graph); see `python -m dtrain report --help`.")
    _config_options(parser)
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


def prepare(argv: list[str]) -> tuple[Config, Job]:
    """Parse and load: the config, and the job to run it (``job(client)`` trains or resumes
    on that client, or on its own cluster with None).

    With ``--resume`` the run directory is checked here too (a run dtrain started, not
    finished, the same config, a readable checkpoint), before any cluster starts.
    """
    from dtrain import checkpoint
    from dtrain.trainer import check_resume, default_out_dir, resume_checked, train

    args = build_parser().parse_args(argv)
    if args.resume:
        if args.out:
            raise UserError(f"--out {args.out} with --resume: a resumed run stays in its own "
                            f"directory ({args.resume})")
        run_dir = Path(args.resume)
        checkpoint.resumable(run_dir, None)       # a run dtrain started: config.toml is there
        point = check_resume(
            run_dir, load_config(args.config or run_dir / "config.toml", _overrides(args)))
        return point.config, lambda client: resume_checked(point, client=client)
    config = load_config(args.config, _overrides(args))
    return config, lambda client: train(
        config, client=client, out=Path(args.out) if args.out else default_out_dir(args.config))


def run(argv: list[str]) -> int:
    rank_text = _scheduler_rank(argv)
    if rank_text is not None:
        from dtrain import mpi
        return mpi.main(rank_text, lambda: prepare(argv))
    _, job = prepare(argv)
    print(f"run directory: {job(None).out}")
    return 0


def report(argv: list[str]) -> int:
    """``python -m dtrain report DIR [DIR...] [--out FILE]``."""
    from dtrain import htmlreport

    parser = _Parser(
        prog="python -m dtrain report",
        description="Rebuild report.html from run directories; several runs are overlaid.")
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directories")
    parser.add_argument("--out", metavar="FILE", help="where to write the report (default: "
                        "DIR/report.html for one run, ./report.html for several)")
    args = parser.parse_args(argv)
    runs = [htmlreport.RunData.read(d) for d in args.dirs]
    default = Path(args.dirs[0]) / "report.html" if len(runs) == 1 else Path("report.html")
    print(f"report: {htmlreport.write(runs, Path(args.out) if args.out else default)}")
    return 0


def draw(argv: list[str]) -> int:
    """``python -m dtrain graph [--config FILE] [--set KEY=VALUE] --out FILE``."""
    from dtrain import drawing

    parser = _Parser(
        prog="python -m dtrain graph",
        description="Draw one training step's task graph, coloured by task type, in a box per "
                    "worker (cluster.workers fake workers).")
    _config_options(parser)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", metavar="FILE", help=".svg, .png or .pdf (rendered by Graphviz's "
                       "dot), or .dot for the DOT source")
    where.add_argument("--gallery", metavar="DIR", help="write every strategy's picture (.dot "
                       "and .svg) to DIR, as kept in graphs/")
    args = parser.parse_args(argv)
    if args.gallery:
        for path in drawing.write_gallery(args.gallery):
            print(f"graph: {path}")
        return 0
    dot = drawing.step_graph(load_config(args.config, args.overrides))
    print(f"graph: {drawing.render(dot, args.out)}")
    return 0


SUBCOMMANDS = {"report": report, "graph": draw}


def exit_code(exc: BaseException) -> int:
    """The exit code of a run that ended with ``exc``: 2 for bad input, 3 for divergence."""
    return EXIT_DIVERGED if isinstance(exc, Diverged) else EXIT_USER_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return run(argv)
    except (UserError, Diverged) as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        print("dtrain: interrupted", file=sys.stderr)
        return 130
