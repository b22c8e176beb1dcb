"""``python -m dtrain``: a thin layer over :func:`dtrain.train`.

``python -m dtrain [options]`` trains; ``python -m dtrain report DIR...``
rebuilds ``report.html`` (overlaying several runs); ``python -m dtrain graph
--out FILE`` draws one step's task graph.  User errors print one line on
stderr and exit with code 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dtrain.config import DEFAULT_CONFIG, load_config
from dtrain.errors import Diverged, UserError

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3


def _config_options(parser: argparse.ArgumentParser) -> None:
    """``--config`` and ``--set``, shared by training and ``graph``."""
    parser.add_argument("--config", metavar="FILE",
                        help=f"TOML run config (default: {DEFAULT_CONFIG.relative_to(Path.cwd()) if DEFAULT_CONFIG.is_relative_to(Path.cwd()) else DEFAULT_CONFIG})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set train.epochs=5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    return parser


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the dedicated flags, which are shorthands for config keys."""
    extra = []
    if args.workers is not None:
        if args.workers < 1:
            raise UserError(f"--workers {args.workers}: needs at least 1 worker")
        extra.append(f"cluster.workers={args.workers}")
    if args.scheduler_address is not None:
        extra.append(f"cluster.scheduler_address={args.scheduler_address!r}".replace("'", '"'))
    if args.dashboard_address is not None:
        extra.append(f'cluster.dashboard_address="{args.dashboard_address}"')
    return list(args.overrides) + extra


def run(argv: list[str]) -> int:
    from dtrain.trainer import default_out_dir, resume, train

    args = build_parser().parse_args(argv)
    if args.resume:
        if args.out:
            raise UserError(f"--out {args.out} with --resume: a resumed run stays in its own "
                            f"directory ({args.resume})")
        run_dir = Path(args.resume)
        if not (run_dir / "config.toml").is_file():
            raise UserError(f"cannot resume {run_dir}: no config.toml there; pass the "
                            f"directory of a run started by dtrain")
        config = load_config(args.config or run_dir / "config.toml", _overrides(args))
        result = resume(run_dir, config=config)
    else:
        config = load_config(args.config, _overrides(args))
        out = Path(args.out) if args.out else default_out_dir(args.config)
        result = train(config, out=out)
    print(f"run directory: {result.out}")
    return 0


def report(argv: list[str]) -> int:
    """``python -m dtrain report DIR [DIR...] [--out FILE]``."""
    from dtrain import htmlreport

    parser = argparse.ArgumentParser(
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

    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        if argv and argv[0] in SUBCOMMANDS:
            return SUBCOMMANDS[argv[0]](argv[1:])
        return run(argv)
    except UserError as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Diverged as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print("dtrain: interrupted", file=sys.stderr)
        return 130
