"""The command line run in this process, through its own entry point (``dtrain.cli.main``)."""
from __future__ import annotations

from dtrain import cli


def run_main(capfd, *args: str) -> tuple[int, str, list[str]]:
    """``python -m dtrain ARGS`` in this process: the exit code, stdout, and stderr's lines
    (``capfd``: pytest's fixture, which captured them)."""
    code = cli.main(list(args))
    seen = capfd.readouterr()
    return code, seen.out, seen.err.strip().splitlines()
