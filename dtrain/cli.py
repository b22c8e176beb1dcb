"""``python -m dtrain``: a thin layer over :func:`dtrain.train`.

User errors print one line on stderr and exit with code 2; anything else is
a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dtrain.config import DEFAULT_CONFIG, load_config
from dtrain.errors import Diverged, UserError

EXIT_USER_ERROR = 2
EXIT_DIVERGED = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Diverged as exc:
        print(f"dtrain: error: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print("dtrain: interrupted", file=sys.stderr)
        return 130
